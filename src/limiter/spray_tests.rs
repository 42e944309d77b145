//! Red-team tests of spray detection against the limiter: what
//! an attacker can make the detectors do to other people.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;

use super::Limiter;
use crate::classes::ClassTable;
use crate::config::Config;
use crate::keys::{KeyDeriver, Secret, SECRET_BYTES};
use crate::protocol::{Decision, Outcome, Subject};
use crate::signals::pump::{channel, Pump};
use crate::store::Journal;

const SECOND: u64 = 1_000_000;
const T0: u64 = 1_900_000_000 * SECOND;

fn limiter() -> (Limiter, Pump) {
    let config = Config::default();
    let signals = config.signals.clone().expect("on by default");
    let keys = KeyDeriver::new(&Secret::from_bytes([9; SECRET_BYTES]));
    let (link, pump) = channel(&signals, &keys);
    let limiter =
        Limiter::new(&config, Arc::new(ClassTable::default()), keys, Journal::discard()).with_signals(Some(link));
    (limiter, pump)
}

/// An address in ISP block 2001:db8:100::/48: customer `site` (its /56),
/// subnet `net` (its /64).
fn isp(site: u8, net: u8) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x100, u16::from(site) << 8 | u16::from(net), 0, 0, 0, 1))
}

fn who<'a>(account: &'a str, device: Option<&'a str>, peer: IpAddr) -> Subject<'a> {
    Subject { peer: Some(peer), account: Some(account), device, ..Subject::default() }
}

/// The attacker, customer 0x01 of the ISP's /48: one failure from each of
/// 16 /64s of its own /56, against made-up accounts, from T0.
fn fail_from_16_64s_of_customer_01(l: &Limiter, pump: &Pump) {
    for net in 0..16u8 {
        let account = format!("nobody{net}@example.com");
        attempt(l, pump, &who(&account, None, isp(0x01, net)), Outcome::Failure, "guess", T0 + u64::from(net));
    }
}

/// A check, and if it proceeds, its report; the check's decision.
fn attempt(l: &Limiter, pump: &Pump, s: &Subject<'_>, outcome: Outcome, pw: &str, now: u64) -> Decision {
    attempt_solving(l, pump, s, outcome, pw, now, Decision::Allow)
}

/// As `attempt`, reporting also when the check's decision is `solved` (a
/// challenge the attacker solves).
fn attempt_solving(
    l: &Limiter,
    pump: &Pump,
    s: &Subject<'_>,
    outcome: Outcome,
    pw: &str,
    now: u64,
    solved: Decision,
) -> Decision {
    let v = l.check("login", s, now).expect("login").decision;
    if v == Decision::Allow || v == solved {
        let digest = tollgate_client::password_digest(&[1; 32], s.account.unwrap(), pw);
        l.report("login", s, outcome, Some(digest), now).expect("login");
    }
    pump.drain(now);
    v
}

/// One customer of an ISP holding a /56 (the usual residential
/// delegation) widens the ISP's whole /48 from its own /64s, then locks a
/// neighbour out of their own account on the device their account knows,
/// from a different /56: 16 + 5 failures, none from the neighbour's site.
/// docs/operations.md promises "A stranger cannot lock the owner out of a
/// device they have logged in from ... (a stranger on the owner's own NAT
/// or /64 can do this)"; widening stretches "own /64" to "own /48".
#[test]
fn a_customer_with_a_56_widens_the_isps_48_and_locks_a_neighbour_on_a_known_device() {
    let (l, pump) = limiter();
    let neighbour = isp(0x42, 0x07);
    // The neighbour's laptop is known to their account (a success a day ago).
    let laptop = who("neighbour@example.com", Some("laptop"), neighbour);
    assert_eq!(attempt(&l, &pump, &laptop, Outcome::Success, "right", T0 - 86_400 * SECOND), Decision::Allow);

    // The attacker, customer 0x01 of the same /48: 16 /64s of its own
    // /56, one failure each against made-up accounts (past its own /56's
    // challenge from the 11th).
    let t = T0;
    for net in 0..16u8 {
        let account = format!("nobody{net}@example.com");
        let s = who(&account, None, isp(0x01, net));
        let solved = Decision::Challenge;
        assert_ne!(
            attempt_solving(&l, &pump, &s, Outcome::Failure, "guess", t + u64::from(net), solved),
            Decision::Deny
        );
    }
    // Now the /48 is one source. Five failures on the neighbour's account
    // from the attacker's first /64 lock (neighbour, /48).
    for i in 0..5u64 {
        let s = who("neighbour@example.com", None, isp(0x01, 0x00));
        attempt(&l, &pump, &s, Outcome::Failure, &format!("guess{i}"), t + 100 + i);
    }
    // The owner, on their own /64 of their own /56, on their known laptop,
    // with the right password:
    let v = l.check("login", &laptop, t + 200).expect("login");
    assert_eq!(
        v.decision,
        Decision::Allow,
        "the owner on a known device, from a site the attacker never used, is refused by rule `{}` ({:?})",
        v.rule,
        v.reason
    );
}

/// The same widening merges every customer of the /48 into one
/// `source_rate` budget (600 a minute, burst 300): the attacker spends it
/// and everyone else in the /48 is refused, known devices included.
#[test]
fn a_widened_48_shares_one_source_rate_and_the_attacker_can_spend_it() {
    let (l, pump) = limiter();
    let neighbour = isp(0x42, 0x07);
    let laptop = who("neighbour@example.com", Some("laptop"), neighbour);
    assert_eq!(attempt(&l, &pump, &laptop, Outcome::Success, "right", T0 - 86_400 * SECOND), Decision::Allow);
    fail_from_16_64s_of_customer_01(&l, &pump);
    // Checks only (the attacker never needs a report), from its own /64s,
    // known-device-less: the budget of the /48 goes.
    let mut spent = 0;
    for i in 0..2_000u64 {
        let account = format!("filler{i}@example.com");
        let s = who(&account, None, isp(0x01, (i % 256) as u8));
        if l.check("login", &s, T0 + SECOND).expect("login").decision == Decision::Deny {
            break;
        }
        spent += 1;
    }
    let v = l.check("login", &laptop, T0 + SECOND).expect("login");
    assert_eq!(
        v.decision,
        Decision::Allow,
        "after {spent} checks from the attacker's /56, the neighbour on a known device is refused by `{}` ({:?})",
        v.rule,
        v.reason
    );
}

/// Red team: the failure-share gate is meant to keep a busy block from
/// widening (failing /56s must be at least half of failing plus succeeding
/// ones). A success was counted only once its block had an entry (only a
/// failure made one), so the /48's successes *before* the attacker's first
/// failure counted for nothing: 64 customers' /56s succeed in the ten
/// minutes before, then 16 failures in 16 seconds widened the /48 with a
/// measured share of 1.0. Successes now make entries too.
#[test]
fn successes_before_the_first_failure_do_not_count_in_the_failure_share() {
    let (l, pump) = limiter();
    for site in 0..64u8 {
        let account = format!("customer{site}@example.com");
        let device = format!("pc{site}");
        let s = who(&account, Some(&device), isp(0x80 + site, 0));
        attempt(&l, &pump, &s, Outcome::Success, "right", T0 - 600 * SECOND + u64::from(site) * SECOND);
    }
    // One failing /64 in each of 16 /56s (none widens its /56; the /48
    // has 16 failing /56s against 64 succeeding ones).
    for net in 0..16u8 {
        let account = format!("nobody{net}@example.com");
        attempt(&l, &pump, &who(&account, None, isp(net, 0x01)), Outcome::Failure, "guess", T0 + u64::from(net));
    }
    let widened = pump.engine().lock().unwrap().widenings_total();
    assert_eq!(widened, 0, "64 succeeding /56s against 16 failing ones (share 0.2), yet the /48 widened");
}

/// Shared mode: known devices are shared through the store ("a device an
/// account logged in from on any host is known to every host"), but the
/// signal rule is judged in `begin_check` with this host's own knowledge
/// (`rule_key(rule, known)`, `known` from this host's table), before the
/// store is asked. An attacker flags the owner's account from 8 prefixes;
/// the owner, on the laptop they logged in from on another host, lands on
/// this one and is challenged by `spray_signals`. The README promises the
/// owner on a known device is never touched.
#[test]
fn shared_mode_challenges_the_owner_on_a_device_known_to_another_host() {
    let config = Config::parse("[shared]\nurl = \"redis://127.0.0.1:1\"\n").expect("parses");
    let config = Config::build(config).expect("valid");
    let signals = config.signals.clone().expect("on by default");
    let keys = KeyDeriver::new(&Secret::from_bytes([9; SECRET_BYTES]));
    let (link, pump) = channel(&signals, &keys);
    let l = Limiter::new(&config, Arc::new(ClassTable::default()), keys, Journal::discard()).with_signals(Some(link));
    // 8 prefixes fail the owner's account once each: account_distributed.
    for p in 0..8u8 {
        let peer = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, p, 7));
        let s = who("owner@example.com", None, peer);
        l.report("login", &s, Outcome::Failure, None, T0 + u64::from(p)).expect("login");
    }
    pump.drain(T0 + 10);
    // The owner's laptop logged in on host A yesterday; this is host B.
    let home = IpAddr::V4(std::net::Ipv4Addr::new(203, 0, 113, 9));
    let laptop = who("owner@example.com", Some("laptop"), home);
    let plan = l.plan_check("login", &laptop, T0 + 20).expect("login");
    let checked = l.begin_check(plan, T0 + 20);
    if let super::global::Begun::Done(v, _) = &checked {
        panic!("decided before asking the store whether the device is known: {:?} by `{}`", v.decision, v.rule);
    }
}

/// Turning spray detection off by reload (`[signals] enabled = false`,
/// the operator's emergency switch when widening hurts a network) stops
/// the signal rules but not widening: the limiter keeps the link, the
/// daemon does not reconfigure the engine when `[signals]` is gone, and
/// `SubjectKeys::widened` reads the published flags on every route. The
/// /48 stays one source until its flag runs out (an hour and more).
#[test]
fn disabling_signals_by_reload_does_not_unwiden() {
    let (l, pump) = limiter();
    let neighbour = isp(0x42, 0x07);
    let laptop = who("neighbour@example.com", Some("laptop"), neighbour);
    assert_eq!(attempt(&l, &pump, &laptop, Outcome::Success, "right", T0 - 86_400 * SECOND), Decision::Allow);
    fail_from_16_64s_of_customer_01(&l, &pump);
    let off = Config::build(Config::parse("[signals]\nenabled = false\n").expect("parses")).expect("valid");
    assert!(off.signals.is_none());
    let l = l.reconfigured(&off, Arc::new(ClassTable::default()), T0 + 50);
    for i in 0..5u64 {
        let s = who("neighbour@example.com", None, isp(0x01, 0x00));
        attempt(&l, &pump, &s, Outcome::Failure, &format!("guess{i}"), T0 + 100 + i);
    }
    // The neighbour's new phone (a device the account does not know yet,
    // so it would be widened if anything were).
    let phone = who("neighbour@example.com", Some("new-phone"), neighbour);
    let v = l.check("login", &phone, T0 + 200).expect("login");
    assert_eq!(
        v.decision,
        Decision::Allow,
        "spray detection is off, yet `{}` refuses the /48 ({:?})",
        v.rule,
        v.reason
    );
}

/// The pump derives the wide prefixes' and IPv6 blocks' digests the
/// request path probes flags with: a pump holding other keys would raise
/// every wide and widening flag where no request looks. Refused at once.
#[test]
#[should_panic(expected = "other keys than the limiter's")]
fn a_pump_with_other_keys_than_the_limiters_is_refused() {
    let config = Config::default();
    let signals = config.signals.clone().expect("on by default");
    let (link, _pump) = channel(&signals, &KeyDeriver::new(&Secret::from_bytes([1; SECRET_BYTES])));
    let keys = KeyDeriver::new(&Secret::from_bytes([2; SECRET_BYTES]));
    let _ = Limiter::new(&config, Arc::new(ClassTable::default()), keys, Journal::discard()).with_signals(Some(link));
}
