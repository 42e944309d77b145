//! GCRA (generic cell rate algorithm): a rate limit whose whole state per key
//! is one theoretical arrival time (TAT). Checked and updated in one step
//! under the caller's lock, so parallel requests can never both see room that
//! only one of them may use.
//!
//! Our own code because it is the product's core and tiny; the table is a
//! plain hashbrown map keyed by the digest's bits (see `keys::Key::hash_bits`).

use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

use crate::keys::Key;

/// A table sweeps out expired entries after this many inserts, or after as
/// many inserts as half its size if larger, so sweeping is amortised O(1).
pub const SWEEP_ENTRIES_MIN: usize = 1024;
/// When a table is full of live keys, this many are sampled and the one
/// closest to expiry (least information) is evicted.
pub const EVICTION_SAMPLE: usize = 8;

/// Limits of one rate rule: `burst` requests at once, refilled at one request
/// per `interval_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraSpec {
    pub interval_us: u64,
    pub burst: u32,
}

impl GcraSpec {
    /// `limit` requests per `period_us` sustained, `burst` at once.
    pub fn new(limit: u32, period_us: u64, burst: u32) -> GcraSpec {
        assert!(limit > 0 && burst > 0 && period_us > 0, "validated by config");
        GcraSpec { interval_us: period_us.div_ceil(limit as u64).max(1), burst }
    }

    fn tolerance_us(self) -> u64 {
        self.interval_us * self.burst as u64
    }
}

/// The answer of one GCRA step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraDecision {
    pub allowed: bool,
    /// Requests that could still be made right now.
    pub remaining: u32,
    /// When refused: how long until this request would be allowed.
    pub retry_after_us: u64,
    /// How long until the key is back to a full burst.
    pub reset_us: u64,
}

/// Decides one request against a TAT. Returns the decision and the new TAT
/// (unchanged when refused, or when `spend` is false).
pub fn decide(spec: GcraSpec, tat_us: Option<u64>, now_us: u64, spend: bool) -> (GcraDecision, u64) {
    // Signed and wide: `tat − tolerance` may lie before the epoch when the
    // burst spans more time than has passed, and must not saturate.
    let now = now_us as i128;
    let interval = spec.interval_us as i128;
    let tolerance = spec.tolerance_us() as i128;
    let tat = (tat_us.unwrap_or(now_us).max(now_us)) as i128;
    let new_tat = tat + interval;
    let allow_at = new_tat - tolerance;
    let clamp = |v: i128| v.clamp(0, u32::MAX as i128) as u32;
    if allow_at > now {
        let decision = GcraDecision {
            allowed: false,
            remaining: clamp((now - (tat - tolerance)) / interval),
            retry_after_us: (allow_at - now) as u64,
            reset_us: (tat - now) as u64,
        };
        return (decision, tat as u64);
    }
    let after = if spend { new_tat } else { tat };
    let decision = GcraDecision {
        allowed: true,
        remaining: clamp((now - allow_at) / interval),
        retry_after_us: 0,
        reset_us: (after - now) as u64,
    };
    (decision, after.min(u64::MAX as i128) as u64)
}

/// Passes the key's (already uniformly random) bits through as the hash.
#[derive(Default)]
pub struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub type DigestBuildHasher = BuildHasherDefault<DigestHasher>;

/// One rule's GCRA state: TAT per key, bounded by `entries_max`.
/// Keyed by the 64-bit tuple digest: 16 bytes per entry plus the map's
/// control byte, and a collision merely shares a bucket between two clients
/// with probability 2^-64.
#[derive(Debug)]
pub struct GcraTable {
    spec: GcraSpec,
    entries_max: usize,
    inserts_since_sweep: usize,
    tats: HashMap<u64, u64, DigestBuildHasher>,
}

impl GcraTable {
    pub fn new(spec: GcraSpec, entries_max: usize) -> GcraTable {
        GcraTable { spec, entries_max: entries_max.max(1), inserts_since_sweep: 0, tats: HashMap::default() }
    }

    pub fn spec(&self) -> GcraSpec {
        self.spec
    }

    pub fn len(&self) -> usize {
        self.tats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tats.is_empty()
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// One decision for `key` at `now_us`; spends from the budget when
    /// `spend` and allowed.
    pub fn check(&mut self, key: Key, now_us: u64, spend: bool) -> GcraDecision {
        let id = key.hash_bits();
        if let Some(tat) = self.tats.get_mut(&id) {
            let (decision, after) = decide(self.spec, Some(*tat), now_us, spend);
            *tat = after;
            return decision;
        }
        let (decision, after) = decide(self.spec, None, now_us, spend);
        // A TAT at or before now carries no information: store only a debt.
        if after > now_us {
            self.make_room(now_us);
            self.tats.insert(id, after);
        }
        decision
    }

    /// Reads without spending.
    pub fn peek(&self, key: Key, now_us: u64) -> GcraDecision {
        decide(self.spec, self.tats.get(&key.hash_bits()).copied(), now_us, false).0
    }

    fn make_room(&mut self, now_us: u64) {
        self.inserts_since_sweep += 1;
        if self.inserts_since_sweep >= SWEEP_ENTRIES_MIN.max(self.tats.len() / 2) {
            self.sweep(now_us);
        }
        if self.tats.len() >= self.entries_max {
            // Full of live keys: drop the one that would free up soonest
            // among a few (hash order is random, so this is a random sample).
            let victim = self.tats.iter().take(EVICTION_SAMPLE).min_by_key(|(_, tat)| **tat).map(|(id, _)| *id);
            if let Some(id) = victim {
                self.tats.remove(&id);
            }
        }
    }

    /// Drops every entry whose TAT has passed (maintenance; not per request).
    pub fn sweep(&mut self, now_us: u64) {
        self.inserts_since_sweep = 0;
        self.tats.retain(|_, tat| *tat > now_us);
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
        let mut table = GcraTable::new(GcraSpec::new(60, 60 * SECOND, 10), 100);
        let now = 1_000 * SECOND;
        for expected_remaining in (0..10).rev() {
            let d = table.check(key(1), now, true);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let refused = table.check(key(1), now, true);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_us, SECOND);
        assert!(!table.check(key(1), now + SECOND - 1, true).allowed);
        assert!(table.check(key(1), now + SECOND, true).allowed);
        // other keys are untouched
        assert!(table.check(key(2), now, true).allowed);
    }

    #[test]
    fn peek_never_spends() {
        let mut table = GcraTable::new(GcraSpec::new(1, SECOND, 1), 100);
        for _ in 0..5 {
            assert!(table.peek(key(1), 0).allowed);
        }
        assert!(table.check(key(1), 0, true).allowed);
        assert!(!table.peek(key(1), 0).allowed);
    }

    #[test]
    fn table_stays_within_its_cap() {
        let mut table = GcraTable::new(GcraSpec::new(1, 3600 * SECOND, 5), 2_000);
        for n in 0..50_000 {
            table.check(key(n), 0, true);
            assert!(table.len() <= 2_000);
        }
    }

    #[test]
    fn expired_entries_are_swept_when_the_table_grows() {
        let mut table = GcraTable::new(GcraSpec::new(1, SECOND, 1), 1_000_000);
        for n in 0..(SWEEP_ENTRIES_MIN as u64 * 4) {
            table.check(key(n), n * 10 * SECOND, true);
        }
        assert!(table.len() < SWEEP_ENTRIES_MIN, "len {}", table.len());
    }
}
