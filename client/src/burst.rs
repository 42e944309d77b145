//! Which checks of this client are in a burst: a timeout from a busy
//! daemon stops a login only when another check on the same account (or,
//! without one, the same address) was waiting on this client at the same
//! time, or started less than `BURST_GAP_US` before it (a straggler of the
//! burst, scheduled late). A lone user's timeout during a flood on other
//! accounts is an outage for the fail policy, not a refusal: the daemon
//! makes the same distinction for its store.

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

/// Per subject key (a hash of the route and the account, or the address):
/// checks waiting on it, the newest of them, and when it started. An
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
    /// Counts a check on `subject` waiting until the guard drops.
    pub(crate) fn enter<'b>(&'b self, route: &str, subject: &Subject<'_>) -> BurstGuard<'b> {
        let mut h = self.hasher.build_hasher();
        h.write(route.as_bytes());
        match (subject.account, subject.peer) {
            (Some(account), _) => {
                h.write_u8(1);
                h.write(account.as_bytes());
            }
            (None, Some(peer)) => {
                h.write_u8(2);
                h.write(peer.to_string().as_bytes());
            }
            (None, None) => h.write_u8(0),
        }
        let key = h.finish();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut entries = self.entries.locked();
        let now = self.epoch.elapsed().as_micros() as u64 + BURST_GAP_US;
        if entries.len() >= SWEEP_AT && !entries.contains_key(&key) {
            entries.retain(|_, e| e.waiting > 0 || now - e.started_us < BURST_GAP_US);
        }
        let entry = entries.entry(key).or_default();
        let company = entry.waiting > 0 || (entry.started_us > 0 && now - entry.started_us < BURST_GAP_US);
        entry.waiting += 1;
        entry.newest = seq;
        entry.started_us = now;
        BurstGuard { bursts: self, key, seq, company }
    }
}

pub(crate) struct BurstGuard<'b> {
    bursts: &'b Bursts,
    key: u64,
    seq: u64,
    company: bool,
}

impl BurstGuard<'_> {
    /// Whether another check on its key waited while it did (before or
    /// after it came), or started within `BURST_GAP_US` before it.
    pub(crate) fn in_burst(&self) -> bool {
        let entries = self.bursts.entries.locked();
        self.company || entries.get(&self.key).is_some_and(|e| e.newest > self.seq)
    }
}

impl Drop for BurstGuard<'_> {
    fn drop(&mut self) {
        let mut entries = self.bursts.entries.locked();
        if let Some(entry) = entries.get_mut(&self.key) {
            entry.waiting -= 1;
        }
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
