//! The generated traffic: each mix is a list of attempts on one simulated
//! Monday. Every generator has its own seeded `Rng`, so a mix is the same
//! alone and superimposed on others.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bench::Rng;

pub const SECOND: u64 = 1_000_000;
pub const MINUTE: u64 = 60 * SECOND;
pub const HOUR: u64 = 60 * MINUTE;

/// Office users are accounts `u0..u22000`; the executive is `u0`.
pub const OFFICE_USERS: u32 = 22_000;
const UNIVERSITY_BASE: u32 = 100_000;
const UNIVERSITY_USERS: u32 = 3_000;
const MOBILE_BASE: u32 = 200_000;
const MOBILE_USERS: u32 = 40_000;
/// Accounts the attackers name that exist nowhere.
const GHOST_BASE: u32 = 1_000_000;

/// The class file the simulation runs with: carrier pools are `mobile`.
pub const CLASS_FILE: &str = "100.64.0.0/22,mobile\n2001:db8:cc00::/40,mobile\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    /// A person: counted against the false-positive budget.
    Human { user: u32 },
    /// A mail client retrying a stale password: a machine, reported apart.
    Machine { user: u32 },
    /// The targeted account's owner on the device they always use.
    Owner,
    /// An attack; `mix` indexes the run's mixes.
    Attacker { mix: u8 },
}

#[derive(Clone, Debug)]
pub struct Attempt {
    pub t_us: u64,
    pub actor: Actor,
    pub account: u32,
    /// A device id; `None` sends no device (unknown).
    pub device: Option<u64>,
    pub peer: IpAddr,
    /// The password's identity: equal numbers are equal passwords.
    pub password: u64,
    pub correct: bool,
}

/// One mix of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Office,
    University,
    Mobile,
    Spray24,
    SprayResidential,
    Stuffing,
    V6Rotation,
    Targeted,
    Flood,
}

impl Mix {
    pub const ALL: [Mix; 9] = [
        Mix::Office,
        Mix::University,
        Mix::Mobile,
        Mix::Spray24,
        Mix::SprayResidential,
        Mix::Stuffing,
        Mix::V6Rotation,
        Mix::Targeted,
        Mix::Flood,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mix::Office => "office",
            Mix::University => "university",
            Mix::Mobile => "mobile",
            Mix::Spray24 => "spray24",
            Mix::SprayResidential => "spray_resi",
            Mix::Stuffing => "stuffing",
            Mix::V6Rotation => "v6_rotation",
            Mix::Targeted => "targeted",
            Mix::Flood => "flood",
        }
    }

    pub fn parse(name: &str) -> Option<Mix> {
        Mix::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn is_attack(self) -> bool {
        !matches!(self, Mix::Office | Mix::University | Mix::Mobile)
    }
}

/// Passwords: a user's own, a typo of it, a stale one, the sprayed one,
/// and one per stuffing or guessing attempt, all distinct numbers.
pub fn own_password(user: u32) -> u64 {
    user as u64
}
fn typo(user: u32) -> u64 {
    (1 << 32) | user as u64
}
fn stale(user: u32) -> u64 {
    (2 << 32) | user as u64
}
pub const SPRAYED_PASSWORD: u64 = 3 << 32;
fn guessed(n: u64) -> u64 {
    (4 << 32) | n
}

/// About 1% of office users have a mail client retrying a stale password.
pub fn is_stale(user: u32) -> bool {
    user % 97 == 7
}

/// Such a user's mail client: a device known from before the password changed.
pub fn mail_client(user: u32) -> u64 {
    (2 << 40) | user as u64
}

/// A user's everyday device, known from before the simulated day.
pub fn usual_device(user: u32) -> u64 {
    user as u64
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn v6(bits: u128) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(bits))
}

/// Accounts whose usual device is known before the day starts.
pub fn known_users(mixes: &[Mix]) -> Vec<(u32, IpAddr)> {
    let mut users = Vec::new();
    for mix in mixes {
        match mix {
            Mix::Office | Mix::Targeted => users.extend((0..OFFICE_USERS).map(|u| (u, office_address(u)))),
            Mix::University => users.extend((0..UNIVERSITY_USERS).map(|u| (UNIVERSITY_BASE + u, v4(192, 0, 2, 1)))),
            Mix::Mobile => users.extend((0..MOBILE_USERS).map(|u| (MOBILE_BASE + u, v4(100, 64, 0, 1)))),
            _ => {}
        }
    }
    users.sort_unstable_by_key(|(u, _)| *u);
    users.dedup_by_key(|(u, _)| *u);
    users
}

fn office_address(user: u32) -> IpAddr {
    v4(198, 51, 100, 10 + (user % 4) as u8)
}

/// The morning peak: 60% of first logins between 8:00 and 10:00 (most
/// around 9:00), the rest from 6:00 to 20:00.
fn arrival(rng: &mut Rng, day: u64) -> u64 {
    if rng.unit() < 0.6 {
        let peak = (rng.unit() + rng.unit()) / 2.0; // triangular over 8:00-10:00, mode 9:00
        day + 8 * HOUR + (peak * 2.0 * HOUR as f64) as u64
    } else {
        day + 6 * HOUR + rng.below(14 * HOUR)
    }
}

/// One login: a typo first for `typo_share` of them, then success.
fn login(out: &mut Vec<Attempt>, rng: &mut Rng, t: u64, user: u32, peer: IpAddr, device: u64, typo_share: f64) {
    let human = Actor::Human { user };
    let mut t = t;
    if rng.unit() < typo_share {
        let attempt = Attempt {
            t_us: t,
            actor: human,
            account: user,
            device: Some(device),
            peer,
            password: typo(user),
            correct: false,
        };
        out.push(attempt);
        t += 5 * SECOND + rng.below(15 * SECOND);
    }
    out.push(Attempt {
        t_us: t,
        actor: human,
        account: user,
        device: Some(device),
        peer,
        password: own_password(user),
        correct: true,
    });
}

/// The attempts of `mix` on the day starting at `day` (00:00), over
/// `hours` from 6:00. Attacks start at 9:05, inside the office's peak.
pub fn generate(mix: Mix, index: u8, seed: u64, day: u64, hours: u64, flood_prefixes: u64) -> Vec<Attempt> {
    let mut rng = Rng((seed ^ (mix as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
    let rng = &mut rng;
    let start = day + 6 * HOUR;
    let end = start + hours * HOUR;
    let attack_start = day + 9 * HOUR + 5 * MINUTE;
    let attacker = Actor::Attacker { mix: index };
    // An attacker's attempt: no device (every one unknown).
    let guess = |t_us, account, peer, password, correct| Attempt {
        t_us,
        actor: attacker,
        account,
        device: None,
        peer,
        password,
        correct,
    };
    let mut out = Vec::new();
    match mix {
        Mix::Office => {
            for user in 0..OFFICE_USERS {
                let peer = office_address(user);
                let t = arrival(rng, day);
                login(&mut out, rng, t, user, peer, usual_device(user), 0.10);
                if rng.unit() < 0.6 {
                    let t = day + 10 * HOUR + rng.below(8 * HOUR);
                    login(&mut out, rng, t, user, peer, usual_device(user), 0.05);
                }
                // A new phone: unknown until its first success.
                if rng.unit() < 0.003 {
                    let t = day + 11 * HOUR + rng.below(6 * HOUR);
                    login(&mut out, rng, t, user, peer, (1 << 40) | user as u64, 0.0);
                }
                // A mail client still holding last month's password,
                // retrying every minute all day.
                if is_stale(user) {
                    let mut t = day + 8 * HOUR + rng.below(MINUTE);
                    while t < day + 20 * HOUR {
                        let actor = Actor::Machine { user };
                        let device = Some(mail_client(user));
                        out.push(Attempt {
                            t_us: t,
                            actor,
                            account: user,
                            device,
                            peer,
                            password: stale(user),
                            correct: false,
                        });
                        t += MINUTE;
                    }
                }
            }
        }
        Mix::University => {
            // 3,000 users on one /64, addresses changing per login; 50
            // shared lab kiosks are unknown devices to everyone.
            let net: u128 = 0x2001_0db8_5500_0001 << 64;
            for n in 0..UNIVERSITY_USERS {
                let user = UNIVERSITY_BASE + n;
                for _ in 0..2 {
                    let t = arrival(rng, day);
                    let peer = v6(net | rng.next_u64() as u128);
                    let device = if n % 60 == 0 { (3 << 40) | (n % 50) as u64 } else { usual_device(user) };
                    login(&mut out, rng, t, user, peer, device, 0.15);
                }
            }
        }
        Mix::Mobile => {
            // Carrier NAT: 200 addresses of one /22, a new one per login;
            // a fifth of the phones on IPv6, each its own /64 in one of 16
            // carrier /48s. The whole pool is class `mobile`.
            for n in 0..MOBILE_USERS {
                let user = MOBILE_BASE + n;
                let logins = if rng.unit() < 0.6 { 2 } else { 1 };
                let phone_48 = rng.below(16) as u128;
                let phone_64 = rng.next_u64() as u128 & 0xFFFF;
                for _ in 0..logins {
                    let t = start + rng.below(hours.min(16) * HOUR);
                    let peer = if n % 5 == 0 {
                        v6((0x2001_0db8_cc00 + phone_48) << 80 | phone_64 << 64 | rng.next_u64() as u128)
                    } else {
                        let a = 1 + rng.below(200) as u16;
                        v4(100, 64, (a >> 8) as u8, a as u8)
                    };
                    login(&mut out, rng, t, user, peer, usual_device(user), 0.08);
                }
            }
        }
        Mix::Spray24 | Mix::SprayResidential => {
            // One password against 10,000 accounts, 70% of them real, five
            // attempts a second: from the 256 addresses of one /24, or from
            // 1,000 residential addresses in 1,000 /24s, a new one each time.
            for i in 0..10_000u64 {
                let real = i % 10 < 7;
                let account = if real { rng.below(OFFICE_USERS as u64) as u32 } else { GHOST_BASE + i as u32 };
                let peer = match mix {
                    Mix::Spray24 => v4(203, 0, 113, i as u8),
                    _ => v4(11, ((i % 1000) >> 8) as u8, (i % 1000) as u8, 7),
                };
                let correct = real && account % 500 == 3;
                let t = attack_start + i * SECOND / 5;
                out.push(guess(t, account, peer, SPRAYED_PASSWORD, correct));
            }
        }
        Mix::Stuffing => {
            // 50,000 leaked (account, password) pairs from 2,000 addresses,
            // 25 each, twenty a second; 0.5% still valid.
            for i in 0..50_000u64 {
                let address = rng.below(2_000);
                let peer = v4(45, (address >> 8) as u8, address as u8, 9);
                let account = if rng.unit() < 0.7 {
                    rng.below(OFFICE_USERS as u64) as u32
                } else {
                    GHOST_BASE + 20_000 + i as u32
                };
                let correct = rng.unit() < 0.005;
                let t = attack_start + i * SECOND / 20;
                out.push(guess(t, account, peer, guessed(i), correct));
            }
        }
        Mix::V6Rotation => {
            // A fresh /64 of one /48 for every attempt, fifty a second, for
            // ten minutes: without widening every /64 has a fresh budget.
            let net: u128 = 0x2001_0db8_aa00 << 80;
            for i in 0..30_000u64 {
                let peer = v6(net | (rng.next_u64() as u128 & 0xFFFF) << 64 | rng.next_u64() as u128);
                let account = rng.below(OFFICE_USERS as u64) as u32;
                let t = attack_start + i * SECOND / 50;
                out.push(guess(t, account, peer, guessed(1 << 20 | i), false));
            }
        }
        Mix::Targeted => {
            // One executive (`u0`) from 500 addresses, one guess every 6 s.
            for i in 0..500u64 {
                let peer =
                    if i % 2 == 0 { v4(12, (i >> 8) as u8, i as u8, 1) } else { v4(13, 7, (i >> 8) as u8, i as u8) };
                let t = attack_start + i * 6 * SECOND;
                out.push(guess(t, 0, peer, guessed(2 << 20 | i), false));
            }
            // The owner: the office laptop every 30 minutes (a typo now and
            // then), and once a new phone.
            let peer = office_address(0);
            let owner = |t_us, password, correct| Attempt {
                t_us,
                actor: Actor::Owner,
                account: 0,
                device: Some(usual_device(0)),
                peer,
                password,
                correct,
            };
            let mut t = day + 8 * HOUR;
            while t < day + 18 * HOUR {
                let mut at = t;
                if rng.unit() < 0.05 {
                    out.push(owner(at, typo(0), false));
                    at += 10 * SECOND;
                }
                out.push(owner(at, own_password(0), true));
                t += 30 * MINUTE;
            }
            let phone = v4(100, 64, 0, 77);
            let t = day + 10 * HOUR;
            out.push(Attempt {
                t_us: t,
                actor: Actor::Human { user: 0 },
                account: 0,
                device: Some(1 << 41),
                peer: phone,
                password: own_password(0),
                correct: true,
            });
        }
        Mix::Flood => {
            // Memory: one failure from each of `flood_prefixes` /64s, each
            // in its own /48, a thousand a second.
            let n = flood_prefixes;
            for i in 0..n {
                let peer = v6((0x2a00_u128 << 112) | (rng.next_u64() as u128) << 64 | 1);
                let account = GHOST_BASE + 500_000 + rng.below(1_000_000) as u32;
                let t = attack_start + i * SECOND / 1000;
                out.push(guess(t, account, peer, guessed(3 << 20 | i), false));
            }
        }
    }
    out.retain(|a| a.t_us >= start && a.t_us < end);
    out
}
