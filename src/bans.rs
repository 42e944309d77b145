//! Manual bans: source networks an operator refuses outright for a while
//! (`tollgate ban --ip 203.0.113.0/24 --for 2h`). A ban is the operator's
//! answer to an attack the rules cannot see as one (a botnet rotating
//! through a hosting provider's range slowly enough to stay under every
//! per-source limit): every check from the network is denied, with the
//! reason `banned`, until the ban ends or `tollgate unlock --ip` lifts it.
//!
//! Bans are durable (a row each in the state file, written before the
//! reply), listed among the lockouts, and audited with the admin's uid. A
//! ban applies to the address the daemon picked (the peer, or the
//! right-most untrusted X-Forwarded-For hop), like every per-source rule,
//! and wins over a source exemption: the exemption is the file's standing
//! policy, the ban an operator's decision now.
//!
//! The request path reads one atomic while nothing is banned (the usual
//! case); otherwise it walks the tries of the covering networks under a
//! read lock, which only a ban, an unban and the sweep take for writing.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::PrefixMap;

use crate::source::canonical;
use crate::store::{Durable, Journal};
use crate::unpoisoned::UnpoisonedRw;

/// Bans held at once. Each is an operator's act, audited one by one: a
/// few dozen is a bad week; thousands means a feed of addresses, which
/// belongs in a class file (`[source] classes`) where it can be reviewed.
pub const BANS_MAX: usize = 1024;
/// The longest ban: a year. Longer is a permanent policy, which belongs in
/// the firewall or a class file, not in a state file nobody reads.
pub const BAN_FOR_MS_MAX: u64 = 366 * 24 * 3_600_000;
/// Bytes of a ban's reason: a sentence for the audit line and `lockouts`.
pub const BAN_REASON_BYTES_MAX: usize = 200;
/// What `lockouts` lists a ban as: its route (every route) and rule.
pub const LISTED_ROUTE: &str = "*";
pub const LISTED_RULE: &str = "ban";

/// One ban: the network, when it ends and began on the daemon's clock
/// (µs), who made it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ban {
    pub network: IpNet,
    pub until_us: u64,
    pub since_us: u64,
    pub uid: u32,
    pub reason: String,
}

/// Why a ban request is refused, in words for the operator.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BanError {
    #[error("{0}")]
    Network(String),
    #[error("a ban lasts from 1 ms to {max} days; {for_ms} ms is not in that range", max = BAN_FOR_MS_MAX / 86_400_000)]
    Duration { for_ms: u64 },
    #[error(
        "the reason is at most {BAN_REASON_BYTES_MAX} bytes, without control or invisible characters (it is \
         printed in logs)"
    )]
    Reason,
    #[error("{BANS_MAX} bans are held, the most there may be; lift some with `tollgate unlock --ip` first")]
    Full,
}

/// The network of a `Ban` or `Unban` request, checked as an exemption's
/// is: no wider than a /8 or a /32 (a typo must not ban the Internet), no
/// host bits, IPv4 written as IPv4.
pub fn network(address: IpAddr, prefix_len: u8) -> Result<IpNet, BanError> {
    crate::exemptions::parse_network(&format!("{address}/{prefix_len}"), "ban").map_err(BanError::Network)
}

/// A ban request's duration and reason, checked.
pub fn check_terms(for_ms: u64, reason: &str) -> Result<(), BanError> {
    if for_ms == 0 || for_ms > BAN_FOR_MS_MAX {
        return Err(BanError::Duration { for_ms });
    }
    if reason.len() > BAN_REASON_BYTES_MAX || reason.chars().any(hides_text) {
        return Err(BanError::Reason);
    }
    Ok(())
}

/// Control characters, and the invisible ones that reorder or hide what a
/// terminal shows (bidirectional overrides, zero-width characters): a
/// reason is printed in logs and `lockouts`, where it must read as written.
fn hides_text(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

/// The bans in force, a trie per family. Shared by every limiter a reload
/// builds: a ban is not configuration.
#[derive(Default)]
pub struct BanTable {
    /// Bans held, expired ones not yet swept included: the request path's
    /// whole cost while it is 0.
    held: AtomicUsize,
    tries: RwLock<Tries>,
}

#[derive(Default)]
struct Tries {
    ipv4: PrefixMap<Ipv4Net, Ban>,
    ipv6: PrefixMap<Ipv6Net, Ban>,
}

impl Tries {
    fn len(&self) -> usize {
        self.ipv4.len() + self.ipv6.len()
    }

    fn iter(&self) -> impl Iterator<Item = &Ban> {
        self.ipv4.iter().map(|(_, b)| b).chain(self.ipv6.iter().map(|(_, b)| b))
    }
}

impl BanTable {
    /// When the latest ban covering `address` ends, if one does at `now_us`.
    #[inline]
    pub fn banned_until(&self, address: impl FnOnce() -> Option<IpAddr>, now_us: u64) -> Option<u64> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let address = canonical(address()?);
        let tries = self.tries.read_locked();
        let live = |ban: &Ban| (ban.until_us > now_us).then_some(ban.until_us);
        match address {
            IpAddr::V4(v4) => tries.ipv4.cover(&Ipv4Net::from(v4)).filter_map(|(_, b)| live(b)).max(),
            IpAddr::V6(v6) => tries.ipv6.cover(&Ipv6Net::from(v6)).filter_map(|(_, b)| live(b)).max(),
        }
    }

    /// Holds `ban`, replacing one on the same network (returned), and
    /// queues its row durably. Every row edit is queued under the write
    /// lock, so the journal applies them in the order memory saw them (a
    /// sweep's delete can never land after a new ban of the same network).
    /// Ended bans make room; refused when `BANS_MAX` are in force.
    pub fn insert(&self, ban: Ban, now_us: u64, journal: &Journal) -> Result<(Option<Ban>, Option<Durable>), BanError> {
        let mut tries = self.tries.write_locked();
        let exists = match ban.network {
            IpNet::V4(v4) => tries.ipv4.contains_key(&v4),
            IpNet::V6(v6) => tries.ipv6.contains_key(&v6),
        };
        if !exists && tries.len() >= BANS_MAX {
            tries.remove_ended(now_us, journal);
            if tries.len() >= BANS_MAX {
                return Err(BanError::Full);
            }
        }
        let write = journal.write_ban(&ban, true);
        let replaced = match ban.network {
            IpNet::V4(v4) => tries.ipv4.insert(v4, ban),
            IpNet::V6(v6) => tries.ipv6.insert(v6, ban),
        };
        self.held.store(tries.len(), Ordering::Relaxed);
        Ok((replaced, write))
    }

    /// Lifts the ban on exactly `network`, returning it and its row's
    /// deletion, queued durably.
    pub fn remove(&self, network: IpNet, journal: &Journal) -> Option<(Ban, Option<Durable>)> {
        let mut tries = self.tries.write_locked();
        let removed = tries.remove(network)?;
        let write = journal.remove_ban(network, true);
        self.held.store(tries.len(), Ordering::Relaxed);
        Some((removed, write))
    }

    /// Forgets the bans that have ended by `now_us` and deletes their rows.
    /// Takes the write lock only when one has ended.
    pub fn sweep(&self, now_us: u64, journal: &Journal) {
        if self.held.load(Ordering::Relaxed) == 0 || self.tries.read_locked().iter().all(|b| b.until_us > now_us) {
            return;
        }
        let mut tries = self.tries.write_locked();
        tries.remove_ended(now_us, journal);
        self.held.store(tries.len(), Ordering::Relaxed);
    }

    /// Queues every ban in force (a rewrite of the state file), under the
    /// read lock: a ban or lift waits, so it lands after its row's copy.
    pub fn write_all(&self, now_us: u64, journal: &Journal) {
        for ban in self.tries.read_locked().iter().filter(|b| b.until_us > now_us) {
            journal.write_ban(ban, false);
        }
    }

    /// The bans in force at `now_us`, latest ending first.
    pub fn in_force(&self, now_us: u64) -> Vec<Ban> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut bans: Vec<Ban> = self.tries.read_locked().iter().filter(|b| b.until_us > now_us).cloned().collect();
        bans.sort_by(|a, b| b.until_us.cmp(&a.until_us).then_with(|| a.network.cmp(&b.network)));
        bans
    }

    /// Bans held, ended ones not yet swept included (for `status`).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Tries {
    fn remove(&mut self, network: IpNet) -> Option<Ban> {
        match network {
            IpNet::V4(v4) => self.ipv4.remove(&v4),
            IpNet::V6(v6) => self.ipv6.remove(&v6),
        }
    }

    fn remove_ended(&mut self, now_us: u64, journal: &Journal) {
        let ended: Vec<IpNet> = self.iter().filter(|b| b.until_us <= now_us).map(|b| b.network).collect();
        for network in ended {
            self.remove(network);
            journal.remove_ban(network, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn discard() -> Journal {
        Journal::discard()
    }

    fn ban(network: &str, until_us: u64) -> Ban {
        Ban { network: network.parse().unwrap(), until_us, since_us: 0, uid: 0, reason: String::new() }
    }

    fn at(text: &str) -> impl FnOnce() -> Option<IpAddr> + '_ {
        move || text.parse().ok()
    }

    #[test]
    fn a_ban_covers_its_network_until_it_ends() {
        let table = BanTable::default();
        assert_eq!(table.banned_until(at("203.0.113.9"), 0), None);
        table.insert(ban("203.0.113.0/24", 100), 0, &discard()).unwrap();
        assert_eq!(table.banned_until(at("203.0.113.9"), 0), Some(100));
        assert_eq!(table.banned_until(at("203.0.113.9"), 99), Some(100));
        assert_eq!(table.banned_until(at("203.0.113.9"), 100), None, "ended at its until");
        assert_eq!(table.banned_until(at("203.0.114.9"), 0), None, "a neighbour is not banned");
        assert_eq!(table.banned_until(at("::ffff:203.0.113.9"), 0), Some(100), "IPv4-mapped is IPv4");
        assert_eq!(table.banned_until(|| None, 0), None, "no address, no ban");
    }

    #[test]
    fn the_latest_of_overlapping_bans_decides_and_a_narrow_one_does_not_shorten_a_wide_one() {
        let table = BanTable::default();
        table.insert(ban("203.0.0.0/16", 500), 0, &discard()).unwrap();
        table.insert(ban("203.0.113.0/24", 100), 0, &discard()).unwrap();
        assert_eq!(table.banned_until(at("203.0.113.9"), 0), Some(500));
        assert_eq!(table.banned_until(at("203.0.113.9"), 200), Some(500));
        table.remove("203.0.0.0/16".parse().unwrap(), &discard()).unwrap();
        assert_eq!(table.banned_until(at("203.0.113.9"), 0), Some(100));
    }

    #[test]
    fn banning_again_replaces_and_lifting_takes_exactly_the_network() {
        let table = BanTable::default();
        assert_eq!(table.insert(ban("2001:db8::/48", 100), 0, &discard()).unwrap().0, None);
        let replaced = table.insert(ban("2001:db8::/48", 50), 0, &discard()).unwrap().0;
        assert_eq!(replaced.map(|b| b.until_us), Some(100));
        assert_eq!(table.banned_until(at("2001:db8::1"), 0), Some(50), "a shorter ban replaces a longer one");
        assert!(table.remove("2001:db8::/47".parse().unwrap(), &discard()).is_none(), "only the exact network");
        assert!(table.remove("2001:db8::/48".parse().unwrap(), &discard()).is_some());
        assert_eq!(table.banned_until(at("2001:db8::1"), 0), None);
        assert_eq!(table.held(), 0);
    }

    #[test]
    fn the_table_holds_at_most_bans_max_and_a_replacement_still_fits() {
        let table = BanTable::default();
        for i in 0..BANS_MAX {
            let network = format!("10.{}.{}.0/24", i / 256, i % 256);
            table.insert(ban(&network, 100), 0, &discard()).unwrap();
        }
        assert!(matches!(table.insert(ban("192.0.2.0/24", 100), 0, &discard()), Err(BanError::Full)));
        assert!(table.insert(ban("10.0.0.0/24", 200), 0, &discard()).is_ok(), "replacing a held ban needs no room");
        // Ended bans make room, swept or not.
        assert!(table.insert(ban("192.0.2.0/24", 300), 150, &discard()).is_ok(), "an ended ban made room");
        assert_eq!(table.held(), 2, "every ended ban went at once");
        table.sweep(250, &discard());
        assert_eq!(table.in_force(250).len(), 1);
        assert_eq!(table.held(), 1);
    }

    #[test]
    fn terms_and_networks_are_checked() {
        assert!(check_terms(1, "").is_ok());
        assert_eq!(check_terms(0, ""), Err(BanError::Duration { for_ms: 0 }));
        assert!(check_terms(BAN_FOR_MS_MAX + 1, "").is_err());
        assert_eq!(check_terms(1, "a\nb"), Err(BanError::Reason));
        assert_eq!(check_terms(1, "\u{202e}txet"), Err(BanError::Reason), "a bidi override");
        assert_eq!(check_terms(1, "a\u{200b}b"), Err(BanError::Reason), "a zero-width space");
        assert!(check_terms(1, "Vague d'attaques — AS64496").is_ok());
        assert_eq!(check_terms(1, &"x".repeat(BAN_REASON_BYTES_MAX + 1)), Err(BanError::Reason));
        assert!(network("203.0.113.0".parse().unwrap(), 24).is_ok());
        assert!(network("203.0.113.1".parse().unwrap(), 24).is_err(), "host bits");
        assert!(network("0.0.0.0".parse().unwrap(), 0).is_err(), "the Internet");
        assert!(network("203.0.113.1".parse().unwrap(), 33).is_err());
        assert!(network("::ffff:203.0.113.1".parse().unwrap(), 128).is_err(), "IPv4 as IPv4");
    }
}
