//! Which checks of this client are in a burst: a timeout from a busy
//! daemon stops a login only when another check on the same account (or,
//! without one, the same address) was waiting on this client at the same
//! time, or started less than `BURST_GAP_US` before it (a straggler of the
//! burst, scheduled late). A lone user's timeout during a flood on other
//! accounts is an outage for the fail policy, not a refusal: the daemon
//! makes the same distinction for its store.
//!
//! Parallel checks on one account and address are a guesser's, refused
//! for as long as they last (`BurstGuard::own_burst`). A user who has
//! logged in from her address through this client (`KnownRequesters`)
//! is refused in a burst on her account that is not her own (others'
//! checks, from other addresses) for at most `busy_max` in a window of
//! `BUSY_WINDOW_FACTOR` x `busy_max` (`BusyWindow`), then her timeout
//! follows the fail policy: else anyone who kept checking her account
//! kept her out. Anyone else in a burst on the account (a guesser's
//! other addresses, a botnet) stays busy: a late guess that failed open
//! would be admitted with no check at all.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::protocol::Subject;
use crate::unpoisoned::Unpoisoned;

/// Checks on one key that start this close together are one burst, even if
/// they do not overlap: far shorter than a person's next try (a password
/// hash and a page apart), longer than a loaded host's scheduling delay.
const BURST_GAP_US: u64 = 50_000;
/// Entries kept before the ended ones are swept (those with no check
/// waiting and none started within `BURST_GAP_US`).
const SWEEP_AT: usize = 1024;
/// A requester's window, in multiples of `busy_max`: refused as busy in
/// others' bursts for at most 1/120 of the time, as the daemon does.
const BUSY_WINDOW_FACTOR: u64 = 120;
/// Requesters whose windows one client remembers. Past it a new requester
/// is not excused: a flood of distinct keys cannot make room to refuse a
/// user again.
const BUSY_REQUESTERS_MAX: usize = 4096;

/// How long a success makes its requester known, and how many one
/// client remembers (the oldest forgotten first when full).
const KNOWN_FOR_US: u64 = 30 * 24 * 3600 * 1_000_000;
const KNOWN_REQUESTERS_MAX: usize = 65_536;

/// Per key (a hash of the route and the account, or the address; or of
/// the route, account and address, a requester): checks waiting on it,
/// the newest of them, and when it started. An
/// entry lives while a check on it waits and `BURST_GAP_US` after the last
/// one started (swept past `SWEEP_AT` entries), so the map is bounded by
/// the calls of that span.
pub(crate) struct Bursts {
    entries: Mutex<HashMap<u64, Entry>>,
    hasher: std::collections::hash_map::RandomState,
    seq: AtomicU64,
    epoch: std::time::Instant,
}

#[derive(Default)]
struct Entry {
    waiting: u32,
    newest: u64,
    /// µs since `epoch`, plus `BURST_GAP_US` (so 0 is never a start).
    started_us: u64,
}

impl Default for Bursts {
    fn default() -> Bursts {
        Bursts {
            entries: Mutex::default(),
            hasher: Default::default(),
            seq: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }
}

impl Bursts {
    /// A check's burst key (route and account, or address) and requester
    /// key (route, account and address; the burst key without both).
    /// Each field is written with its length, so no two subjects' fields
    /// run together into one key ("bob" at 192.0.2.5 is not "bob1" at
    /// 92.0.2.5).
    pub(crate) fn keys(&self, route: &str, subject: &Subject<'_>) -> (u64, u64) {
        let field = |h: &mut std::collections::hash_map::DefaultHasher, bytes: &[u8]| {
            h.write_usize(bytes.len());
            h.write(bytes);
        };
        let (mut h, mut r) = (self.hasher.build_hasher(), self.hasher.build_hasher());
        field(&mut h, route.as_bytes());
        field(&mut r, route.as_bytes());
        let requester = match (subject.account, subject.peer) {
            (Some(account), peer) => {
                h.write_u8(1);
                field(&mut h, account.as_bytes());
                r.write_u8(3);
                field(&mut r, account.as_bytes());
                peer.map(|peer| {
                    field(&mut r, peer.to_string().as_bytes());
                    r.finish()
                })
            }
            (None, Some(peer)) => {
                h.write_u8(2);
                field(&mut h, peer.to_string().as_bytes());
                None
            }
            (None, None) => {
                h.write_u8(0);
                None
            }
        };
        let key = h.finish();
        (key, requester.filter(|&r| r != key).unwrap_or(key))
    }

    /// Counts a check on `subject` waiting until the guard drops.
    pub(crate) fn enter<'b>(&'b self, route: &str, subject: &Subject<'_>) -> BurstGuard<'b> {
        let (key, requester) = self.keys(route, subject);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut entries = self.entries.locked();
        let now = self.epoch.elapsed().as_micros() as u64 + BURST_GAP_US;
        if entries.len() >= SWEEP_AT && !(entries.contains_key(&key) && entries.contains_key(&requester)) {
            entries.retain(|_, e| e.waiting > 0 || now - e.started_us < BURST_GAP_US);
        }
        let company = enter(&mut entries, key, seq, now);
        let own_company = if requester == key { company } else { enter(&mut entries, requester, seq, now) };
        BurstGuard { bursts: self, key, requester, seq, company, own_company }
    }
}

/// One check more waiting on `key`: whether another was waiting, or
/// started within `BURST_GAP_US` before it.
fn enter(entries: &mut HashMap<u64, Entry>, key: u64, seq: u64, now: u64) -> bool {
    let entry = entries.entry(key).or_default();
    let company = entry.waiting > 0 || (entry.started_us > 0 && now - entry.started_us < BURST_GAP_US);
    entry.waiting += 1;
    // Sequence numbers are taken before the lock: a later-numbered check
    // may have entered first.
    entry.newest = entry.newest.max(seq);
    entry.started_us = now;
    company
}

pub(crate) struct BurstGuard<'b> {
    bursts: &'b Bursts,
    key: u64,
    requester: u64,
    seq: u64,
    company: bool,
    own_company: bool,
}

impl BurstGuard<'_> {
    /// Whether another check on its key waited while it did (before or
    /// after it came), or started within `BURST_GAP_US` before it.
    pub(crate) fn in_burst(&self) -> bool {
        let entries = self.bursts.entries.locked();
        self.company || entries.get(&self.key).is_some_and(|e| e.newest > self.seq)
    }

    /// `in_burst` on its requester: another check on the same account
    /// from the same address (a guesser's parallel guesses).
    pub(crate) fn own_burst(&self) -> bool {
        let entries = self.bursts.entries.locked();
        self.own_company || entries.get(&self.requester).is_some_and(|e| e.newest > self.seq)
    }

    /// The check's requester, for `BusyWindow::excused`.
    pub(crate) fn requester(&self) -> u64 {
        self.requester
    }
}

impl Drop for BurstGuard<'_> {
    fn drop(&mut self) {
        let mut entries = self.bursts.entries.locked();
        let keys = [self.key, self.requester];
        let keys = if self.requester == self.key { &keys[..1] } else { &keys[..] };
        for key in keys {
            if let Some(entry) = entries.get_mut(key) {
                entry.waiting -= 1;
            }
        }
    }
}

/// Per requester, when its window's first busy refusal in a burst not its
/// own was (µs since the client started).
#[derive(Default)]
pub(crate) struct BusyWindow {
    first_us: Mutex<HashMap<u64, u64>>,
}

impl BusyWindow {
    /// A timeout of `requester`'s, in a burst not its own, from a busy
    /// daemon at `now_us`: whether it may be refused as busy, within
    /// `busy_max_us` of its window's first refusal.
    pub(crate) fn excused(&self, requester: u64, now_us: u64, busy_max_us: u64) -> bool {
        let window_us = busy_max_us.saturating_mul(BUSY_WINDOW_FACTOR);
        let mut first_us = self.first_us.locked();
        if let Some(first) = first_us.get_mut(&requester) {
            if now_us.saturating_sub(*first) < window_us {
                return now_us.saturating_sub(*first) < busy_max_us;
            }
            *first = now_us;
            return busy_max_us > 0;
        }
        if first_us.len() >= BUSY_REQUESTERS_MAX {
            first_us.retain(|_, first| now_us.saturating_sub(*first) < window_us);
            if first_us.len() >= BUSY_REQUESTERS_MAX {
                return false;
            }
        }
        first_us.insert(requester, now_us);
        busy_max_us > 0
    }
}
/// Per requester, when a success was last reported through this client
/// (µs since the client started).
#[derive(Default)]
pub(crate) struct KnownRequesters {
    last_us: Mutex<HashMap<u64, u64>>,
}

impl KnownRequesters {
    pub(crate) fn succeeded(&self, requester: u64, now_us: u64) {
        let mut last_us = self.last_us.locked();
        if last_us.len() >= KNOWN_REQUESTERS_MAX && !last_us.contains_key(&requester) {
            last_us.retain(|_, last| now_us.saturating_sub(*last) < KNOWN_FOR_US);
            if last_us.len() >= KNOWN_REQUESTERS_MAX {
                let oldest = last_us.iter().min_by_key(|(_, last)| **last).map(|(r, _)| *r);
                last_us.remove(&oldest.expect("full, so not empty"));
            }
        }
        last_us.insert(requester, now_us);
    }

    pub(crate) fn known(&self, requester: u64, now_us: u64) -> bool {
        self.last_us.locked().get(&requester).is_some_and(|last| now_us.saturating_sub(*last) < KNOWN_FOR_US)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_on_one_account_close_together_are_a_burst_and_others_are_not() {
        let bursts = Bursts::default();
        let alice = Subject { account: Some("alice"), ..Subject::default() };
        let erin = Subject { account: Some("erin"), ..Subject::default() };
        let first = bursts.enter("login", &alice);
        assert!(!first.in_burst());
        let lone = bursts.enter("login", &erin);
        let second = bursts.enter("login", &alice);
        assert!(first.in_burst() && second.in_burst(), "overlapping on alice");
        assert!(!lone.in_burst(), "erin is alone on hers");
        drop((first, second, lone));
        let straggler = bursts.enter("login", &alice);
        assert!(straggler.in_burst(), "started just after the burst");
        drop(straggler);
        std::thread::sleep(std::time::Duration::from_micros(BURST_GAP_US + 10_000));
        let later = bursts.enter("login", &erin);
        assert!(!later.in_burst(), "erin's next try, a moment later, is alone");
    }

    #[test]
    fn a_burst_is_a_requesters_own_only_from_its_account_and_address() {
        let bursts = Bursts::default();
        let at =
            |peer: &str| Subject { account: Some("alice"), peer: Some(peer.parse().unwrap()), ..Subject::default() };
        let (guesser, again, other) = (
            bursts.enter("login", &at("10.0.0.1")),
            bursts.enter("login", &at("10.0.0.1")),
            bursts.enter("login", &at("10.0.0.2")),
        );
        assert!(guesser.own_burst() && again.own_burst(), "one address's parallel checks");
        assert!(other.in_burst() && !other.own_burst(), "another address in the account's burst");
        assert_eq!(guesser.requester(), again.requester());
        drop((guesser, again, other));
        std::thread::sleep(std::time::Duration::from_micros(BURST_GAP_US + 10_000));
        let peer = |p: &str| Subject { peer: Some(p.parse().unwrap()), ..Subject::default() };
        let (a, b) = (bursts.enter("login", &peer("10.0.0.3")), bursts.enter("login", &peer("10.0.0.3")));
        assert!(a.own_burst() && b.own_burst(), "without an account, the address is the requester");
        drop((a, b));
        assert!(bursts.entries.lock().unwrap().values().all(|e| e.waiting == 0), "every entry left");
    }

    #[test]
    fn a_requester_is_excused_for_busy_max_a_window() {
        let window = BusyWindow::default();
        let busy_max = 1_000;
        assert!(window.excused(7, 10_000, busy_max), "its first refusal");
        assert!(window.excused(7, 10_999, busy_max), "within busy_max of it");
        assert!(!window.excused(7, 11_000, busy_max), "past busy_max");
        assert!(!window.excused(7, 10_000 + 119 * busy_max, busy_max), "the window lasts 120 x busy_max");
        assert!(window.excused(7, 10_000 + 120 * busy_max, busy_max), "a new window");
        assert!(!window.excused(8, 0, 0), "busy_max 0 excuses nothing");
    }

    #[test]
    fn a_full_busy_window_excuses_no_newcomer_until_windows_end() {
        let window = BusyWindow::default();
        for r in 0..BUSY_REQUESTERS_MAX as u64 {
            assert!(window.excused(r, 0, 1_000));
        }
        assert!(!window.excused(u64::MAX, 1_000, 1_000), "full of live windows");
        assert!(window.excused(u64::MAX, 120_000, 1_000), "the ended ones swept");
        assert_eq!(window.first_us.lock().unwrap().len(), 1);
    }

    #[test]
    fn fields_do_not_run_together_into_one_key() {
        let bursts = Bursts::default();
        let at = |account, peer: &str| Subject {
            account: Some(account),
            peer: Some(peer.parse().unwrap()),
            ..Subject::default()
        };
        assert_ne!(bursts.keys("login", &at("bob", "192.0.2.5")), bursts.keys("login", &at("bob1", "92.0.2.5")));
        assert_ne!(bursts.keys("login", &at("bob", "2001:db8::1")), bursts.keys("login", &at("bob200", "1:db8::1")));
        assert_eq!(bursts.keys("login", &at("bob", "192.0.2.5")), bursts.keys("login", &at("bob", "192.0.2.5")));
    }

    #[test]
    fn a_success_makes_its_requester_known_for_a_while_and_the_table_is_bounded() {
        let known = KnownRequesters::default();
        assert!(!known.known(1, 0));
        known.succeeded(1, 10);
        assert!(known.known(1, 10 + KNOWN_FOR_US - 1) && !known.known(1, 10 + KNOWN_FOR_US));
        for r in 2..=KNOWN_REQUESTERS_MAX as u64 {
            known.succeeded(r, 100 + r);
        }
        known.succeeded(1, 200_000);
        assert!(known.known(2, 300_000), "an update makes no room");
        known.succeeded(u64::MAX, 300_000);
        assert!(!known.known(2, 300_000), "full: the oldest forgotten");
        assert!(known.known(1, 300_000) && known.known(u64::MAX, 300_000));
        assert_eq!(known.last_us.lock().unwrap().len(), KNOWN_REQUESTERS_MAX);
    }

    #[test]
    fn ended_entries_are_swept_past_the_bound() {
        let bursts = Bursts::default();
        for n in 0..SWEEP_AT {
            drop(bursts.enter("login", &Subject { account: Some(&n.to_string()), ..Subject::default() }));
        }
        std::thread::sleep(std::time::Duration::from_micros(BURST_GAP_US + 10_000));
        drop(bursts.enter("login", &Subject { account: Some("new"), ..Subject::default() }));
        assert_eq!(bursts.entries.lock().unwrap().len(), 1, "the ended ones swept");
    }
}
