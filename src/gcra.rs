//! GCRA (generic cell rate algorithm): a rate limit whose whole state per key
//! is one theoretical arrival time (TAT). Checked and updated in one step
//! under the caller's lock, so parallel requests can never both see room that
//! only one of them may use.
//!
//! Our own code because it is the product's core and tiny. The decision
//! lives in the client crate (`tollgate_client::gcra`), which runs it for its
//! static budgets; the table here is a bounded `TatTable` whose expiry *is*
//! the TAT.

use crate::keys::Key;
use crate::tat_table::{SlotHint, TatTable};

// The decision is the client crate's too: its static budgets run it.
pub use tollgate_client::gcra::{decide, GcraDecision, GcraSpec};

/// One rule's GCRA state: TAT per key, bounded. Keyed by the 64-bit tuple
/// digest: 16 bytes per slot; a collision
/// merely shares a bucket between two clients with probability 2^-64. The
/// limits are passed to each call, so a rule's per-class limits and a
/// reload's new limits apply to the same table.
#[derive(Debug)]
pub struct GcraTable {
    tats: TatTable,
}

impl GcraTable {
    pub fn new(entries_max: usize) -> GcraTable {
        GcraTable { tats: TatTable::new(entries_max) }
    }

    pub fn len(&self) -> usize {
        self.tats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tats.is_empty()
    }

    pub fn entries_max(&self) -> usize {
        self.tats.entries_max()
    }

    pub fn set_entries_max(&mut self, entries_max: usize) {
        self.tats.set_entries_max(entries_max);
    }

    /// Slots in the table's array (memory accounting).
    pub fn capacity(&self) -> usize {
        self.tats.capacity()
    }

    /// One decision for `key` at `now_us`; spends from the budget when
    /// `spend` and allowed. A TAT at or before now is not stored at all.
    pub fn check(&mut self, spec: GcraSpec, key: Key, now_us: u64, spend: bool) -> GcraDecision {
        self.tats.update(key.hash_bits(), now_us, |tat| {
            let (decision, after) = decide(spec, tat, now_us, spend);
            (after, decision)
        })
    }

    /// Tells `hint` where this table's slots are now.
    pub fn publish_slots(&self, hint: &SlotHint) {
        self.tats.publish_slots(hint);
    }

    /// Reads without spending.
    pub fn peek(&self, spec: GcraSpec, key: Key, now_us: u64) -> GcraDecision {
        decide(spec, self.tats.get(key.hash_bits(), now_us), now_us, false).0
    }

    /// Drops every entry whose TAT has passed (maintenance; not per request).
    pub fn sweep(&mut self, now_us: u64) {
        self.tats.sweep(now_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    fn key(n: u64) -> Key {
        Key { account_tag: 0, tuple: n.wrapping_mul(0x9E37_79B9_7F4A_7C15) }
    }

    #[test]
    fn burst_is_allowed_at_once_then_refill_at_the_rate() {
        // 60 a minute, burst 10
        let spec = GcraSpec::new(60, 60 * SECOND, 10);
        let mut table = GcraTable::new(100);
        let now = 1_000 * SECOND;
        for expected_remaining in (0..10).rev() {
            let d = table.check(spec, key(1), now, true);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let refused = table.check(spec, key(1), now, true);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_us, SECOND);
        assert!(!table.check(spec, key(1), now + SECOND - 1, true).allowed);
        assert!(table.check(spec, key(1), now + SECOND, true).allowed);
        // other keys are untouched
        assert!(table.check(spec, key(2), now, true).allowed);
    }

    #[test]
    fn peek_never_spends() {
        let spec = GcraSpec::new(1, SECOND, 1);
        let mut table = GcraTable::new(100);
        for _ in 0..5 {
            assert!(table.peek(spec, key(1), 0).allowed);
        }
        assert!(table.check(spec, key(1), 0, true).allowed);
        assert!(!table.peek(spec, key(1), 0).allowed);
    }

    #[test]
    fn table_stays_within_its_cap() {
        let spec = GcraSpec::new(1, 3600 * SECOND, 5);
        let mut table = GcraTable::new(2_000);
        for n in 0..50_000 {
            table.check(spec, key(n), 0, true);
            assert!(table.len() <= 2_000);
        }
    }

    #[test]
    fn expired_entries_make_room_for_new_ones() {
        let spec = GcraSpec::new(1, SECOND, 1);
        let mut table = GcraTable::new(1_000_000);
        for n in 0..100_000 {
            table.check(spec, key(n), n * 10 * SECOND, true);
        }
        assert!(table.len() < 100, "len {}", table.len());
    }
}
