//! Which checks of this client are in a burst: a timeout from a busy
//! daemon stops a login only when another check on the same account (or,
//! without one, the same address) was waiting on this client at the same
//! time. A lone user's timeout during a flood on other accounts is an
//! outage for the fail policy, not a refusal: the daemon makes the same
//! distinction for its store.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::protocol::Subject;

/// Per subject key (a hash of the route and the account, or the address):
/// checks waiting on it and the newest of them. An entry lives only while
/// a check on it waits, so the map is bounded by the calls in flight.
#[derive(Default)]
pub(crate) struct Bursts {
    waiting: Mutex<HashMap<u64, (u32, u64)>>,
    hasher: std::collections::hash_map::RandomState,
    seq: AtomicU64,
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
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let entry = waiting.entry(key).or_insert((0, 0));
        let company = entry.0 > 0;
        entry.0 += 1;
        entry.1 = seq;
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
    /// after it came).
    pub(crate) fn in_burst(&self) -> bool {
        self.company
            || self
                .bursts
                .waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&self.key)
                .is_some_and(|e| e.1 > self.seq)
    }
}

impl Drop for BurstGuard<'_> {
    fn drop(&mut self) {
        let mut waiting = self.bursts.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = waiting.get_mut(&self.key) {
            entry.0 -= 1;
            if entry.0 == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_on_one_account_overlapping_are_a_burst_and_others_are_not() {
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
        assert!(bursts.waiting.lock().unwrap().is_empty(), "nothing left behind");
    }
}
