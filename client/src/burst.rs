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
const KNOWN_PER_ACCOUNT_MAX: usize = 16;

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
    /// A check's burst key (route and account, or address), requester key
    /// (route, tenant, account, address and forwarded-for: behind a proxy
    /// the address is the proxy's, and the header tells its users apart;
    /// the burst key without an account or either address) and account
    /// key (route, tenant, account), for `KnownRequesters`. Each field is
    /// written with its length, so no two subjects' fields run together
    /// into one key ("bob" at 192.0.2.5 is not "bob1" at 92.0.2.5).
    pub(crate) fn keys(&self, route: &str, subject: &Subject<'_>) -> Keys {
        let field = |h: &mut std::collections::hash_map::DefaultHasher, bytes: Option<&[u8]>| {
            h.write_u8(bytes.is_some() as u8);
            let bytes = bytes.unwrap_or_default();
            h.write_usize(bytes.len());
            h.write(bytes);
        };
        let peer = subject.peer.map(|peer| peer.to_string());
        let (mut h, mut a) = (self.hasher.build_hasher(), self.hasher.build_hasher());
        field(&mut h, Some(route.as_bytes()));
        match (subject.account, &peer) {
            (Some(account), _) => {
                h.write_u8(1);
                field(&mut h, Some(account.as_bytes()));
            }
            (None, Some(peer)) => {
                h.write_u8(2);
                field(&mut h, Some(peer.as_bytes()));
            }
            (None, None) => h.write_u8(0),
        }
        let burst = h.finish();
        a.write_u8(4);
        for f in [Some(route), subject.tenant, subject.account] {
            field(&mut a, f.map(str::as_bytes));
        }
        let account = a.finish();
        let mut r = self.hasher.build_hasher();
        r.write_u8(3);
        for f in [Some(route), subject.tenant, subject.account, peer.as_deref(), subject.forwarded_for] {
            field(&mut r, f.map(str::as_bytes));
        }
        let addressed = subject.account.is_some() && (peer.is_some() || subject.forwarded_for.is_some());
        let requester = Some(r.finish()).filter(|&r| addressed && r != burst).unwrap_or(burst);
        Keys { burst, requester, account }
    }

    /// Counts a check on `subject` waiting until the guard drops.
    pub(crate) fn enter<'b>(&'b self, route: &str, subject: &Subject<'_>) -> BurstGuard<'b> {
        let Keys { burst: key, requester, .. } = self.keys(route, subject);
        let mut entries = self.entries.locked();
        // Numbered under the lock, so a check that entered later has the
        // higher number and is seen by `in_burst`.
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.epoch.elapsed().as_micros() as u64 + BURST_GAP_US;
        if entries.len() >= SWEEP_AT && !(entries.contains_key(&key) && entries.contains_key(&requester)) {
            entries.retain(|_, e| e.waiting > 0 || now - e.started_us < BURST_GAP_US);
        }
        let company = enter(&mut entries, key, seq, now);
        let own_company = if requester == key { company } else { enter(&mut entries, requester, seq, now) };
        BurstGuard { bursts: self, key, requester, seq, company, own_company }
    }
}

/// A subject's keys (`Bursts::keys`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keys {
    pub burst: u64,
    pub requester: u64,
    pub account: u64,
}

/// One check more waiting on `key`: whether another was waiting, or
/// started within `BURST_GAP_US` before it.
fn enter(entries: &mut HashMap<u64, Entry>, key: u64, seq: u64, now: u64) -> bool {
    let entry = entries.entry(key).or_default();
    let company = entry.waiting > 0 || (entry.started_us > 0 && now - entry.started_us < BURST_GAP_US);
    entry.waiting += 1;
    entry.newest = seq;
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
/// (µs since the client started), at most `KNOWN_PER_ACCOUNT_MAX` per
/// account. Evicted least recent first, in constant time: oldest-first
/// by a scan let anyone with one account of his own, logging in from
/// 65,536 fresh addresses, push every user out, each push a scan of the
/// whole map under the lock; capped per account he needs 4,096 accounts.
#[derive(Default)]
pub(crate) struct KnownRequesters {
    inner: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    /// Requester: (last success, its recency tick, its account key).
    entries: HashMap<u64, (u64, u64, u64)>,
    /// Recency tick: requester, oldest first.
    by_recency: std::collections::BTreeMap<u64, u64>,
    /// Account key: its requesters, least recent first.
    by_account: HashMap<u64, std::collections::VecDeque<u64>>,
    tick: u64,
}

impl Known {
    fn forget(&mut self, requester: u64) {
        if let Some((_, tick, account)) = self.entries.remove(&requester) {
            self.by_recency.remove(&tick);
            if let Some(list) = self.by_account.get_mut(&account) {
                list.retain(|&r| r != requester);
                if list.is_empty() {
                    self.by_account.remove(&account);
                }
            }
        }
    }
}

impl KnownRequesters {
    pub(crate) fn succeeded(&self, keys: Keys, now_us: u64) {
        let mut known = self.inner.locked();
        let Keys { requester, account, .. } = keys;
        if known.entries.contains_key(&requester) {
            known.forget(requester);
        } else {
            let full_account =
                known.by_account.get(&account).and_then(|l| (l.len() >= KNOWN_PER_ACCOUNT_MAX).then(|| l[0]));
            if let Some(least) = full_account {
                known.forget(least);
            }
            if known.entries.len() >= KNOWN_REQUESTERS_MAX {
                let least = known.by_recency.first_key_value().map(|(_, &r)| r);
                known.forget(least.expect("full, so not empty"));
            }
        }
        known.tick += 1;
        let tick = known.tick;
        known.entries.insert(requester, (now_us, tick, account));
        known.by_recency.insert(tick, requester);
        known.by_account.entry(account).or_default().push_back(requester);
    }

    pub(crate) fn known(&self, requester: u64, now_us: u64) -> bool {
        let known = self.inner.locked();
        known.entries.get(&requester).is_some_and(|(last, ..)| now_us.saturating_sub(*last) < KNOWN_FOR_US)
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
        let s = |tenant, account, peer: &str, xff| Subject {
            tenant,
            account: Some(account),
            peer: Some(peer.parse().unwrap()),
            forwarded_for: xff,
            ..Subject::default()
        };
        let requester = |subject: Subject<'_>| bursts.keys("login", &subject).requester;
        assert_ne!(requester(s(None, "bob", "192.0.2.5", None)), requester(s(None, "bob1", "92.0.2.5", None)));
        assert_ne!(requester(s(None, "bob", "2001:db8::1", None)), requester(s(None, "bob200", "1:db8::1", None)));
        assert_ne!(requester(s(Some("a"), "bc", "192.0.2.5", None)), requester(s(Some("ab"), "c", "192.0.2.5", None)));
        assert_ne!(
            requester(s(Some("a"), "bob", "192.0.2.5", None)),
            requester(s(Some("b"), "bob", "192.0.2.5", None))
        );
        assert_ne!(
            requester(s(None, "bob", "10.0.0.1", Some("1.2.3.4"))),
            requester(s(None, "bob", "10.0.0.1", Some("5.6.7.8")))
        );
        assert_ne!(requester(s(None, "bob", "10.0.0.1", None)), requester(s(None, "bob", "10.0.0.1", Some(""))));
        assert_eq!(requester(s(None, "bob", "192.0.2.5", None)), requester(s(None, "bob", "192.0.2.5", None)));
        let tenants = [s(Some("a"), "bob", "192.0.2.5", None), s(Some("b"), "bob", "192.0.2.5", None)];
        let [a, b] = tenants.map(|t| bursts.keys("login", &t));
        assert_eq!(a.burst, b.burst, "one account name, one burst, whatever the tenant");
        assert_ne!(a.account, b.account);
    }

    #[test]
    fn a_success_makes_its_requester_known_for_a_while_and_the_table_is_bounded() {
        let known = KnownRequesters::default();
        let keys = |requester, account| Keys { burst: 0, requester, account };
        assert!(!known.known(1, 0));
        known.succeeded(keys(1, 1), 10);
        assert!(known.known(1, 10 + KNOWN_FOR_US - 1) && !known.known(1, 10 + KNOWN_FOR_US));
        for r in 2..=KNOWN_REQUESTERS_MAX as u64 {
            known.succeeded(keys(r, r), 100 + r);
        }
        known.succeeded(keys(2, 2), 200_000);
        assert!(known.known(2, 300_000), "an update makes no room");
        known.succeeded(keys(u64::MAX, u64::MAX), 300_000);
        assert!(!known.known(1, 300_000), "full: the least recent forgotten");
        assert!(known.known(2, 300_000) && known.known(3, 300_000) && known.known(u64::MAX, 300_000));
        assert_eq!(known.inner.lock().unwrap().entries.len(), KNOWN_REQUESTERS_MAX);
    }

    #[test]
    fn an_account_keeps_its_sixteen_most_recent_requesters() {
        let known = KnownRequesters::default();
        let keys = |requester, account| Keys { burst: 0, requester, account };
        known.succeeded(keys(1000, 9), 0);
        for r in 0..=KNOWN_PER_ACCOUNT_MAX as u64 {
            known.succeeded(keys(r, 7), r);
        }
        assert!(!known.known(0, 100), "the account's least recent forgotten");
        assert!((1..=KNOWN_PER_ACCOUNT_MAX as u64).all(|r| known.known(r, 100)));
        assert!(known.known(1000, 100), "another account's kept");
        known.succeeded(keys(1, 7), 200);
        known.succeeded(keys(99, 7), 300);
        assert!(known.known(1, 400) && !known.known(2, 400), "a success makes its requester recent again");
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
