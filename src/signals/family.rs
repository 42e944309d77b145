//! One bounded table of tracked subjects (prefixes, accounts, passwords):
//! each with its failed and succeeded distinct counts over the window.
//!
//! Our own rather than an LRU crate's because eviction must keep the
//! entries that carry information: a flood of one-failure prefixes must
//! not push out the /24 a spray is coming from. So a full table samples a
//! few entries at random positions (an `IndexMap` gives O(1) access by
//! position) and evicts the one that counts least, the oldest of equals,
//! as Redis's sampled eviction does.

use indexmap::IndexMap;

use super::sketch::Windowed;
use crate::expiring::DigestBuildHasher;

/// Entries sampled per eviction.
const EVICTION_SAMPLES: usize = 5;

/// What a tracked entry is, for `status`: a prefix shown as CIDR, or a
/// digest shown truncated. Never a raw identifier.
#[derive(Clone, Copy, Debug)]
pub enum Label {
    Prefix(crate::source::Prefix),
    /// An account or password: shown by its flag's digest.
    Digest,
}

#[derive(Debug)]
pub struct Tracked {
    pub failed: Windowed,
    pub succeeded: Windowed,
    pub label: Label,
    pub touched_us: u64,
}

impl Tracked {
    fn heap_bytes(&self) -> usize {
        self.failed.heap_bytes() + self.succeeded.heap_bytes()
    }

    /// Failed distinct elements over failed plus succeeded ones (1 when
    /// nothing succeeded). Distinct successes, not raw ones: an attacker
    /// cannot dilute it by logging into one account of its own many times.
    /// Successes are counted from a sample, each weighing `success_weight`,
    /// and a source with any sampled success is taken to have one more
    /// sampled than seen: which accounts are sampled is fixed by the
    /// secret, so a small shared source (a lab, a café) that drew few would
    /// be flagged every hour, not by chance once. With it, 15 people and
    /// 10 typos from one lab are flagged 13% of the time instead of 42%.
    /// A source with no success, a spray's, keeps its share of 1.
    pub fn failure_share(&self, success_weight: u32) -> f64 {
        let failed = self.failed.count() as f64;
        let sampled = self.succeeded.count();
        let seen = if success_weight > 1 && sampled > 0 { sampled + 1 } else { sampled };
        let succeeded = f64::from(seen) * f64::from(success_weight);
        if failed + succeeded == 0.0 {
            0.0
        } else {
            failed / (failed + succeeded)
        }
    }
}

/// splitmix64: the sampling positions of a full table. Deterministic, so
/// the simulator's runs are exact; unpredictability is not needed, since
/// what is evicted depends on the entries' counts, which the attacker's
/// keyed inputs cannot aim.
pub(super) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    mix64(*state)
}

/// splitmix64's finalizer: every output bit depends on every input bit.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub struct Family {
    pub name: &'static str,
    /// Keyed by digests, whose bits pass through as the hash (an attacker
    /// without the secret cannot aim at a bucket).
    map: IndexMap<u64, Tracked, DigestBuildHasher>,
    pub entries_max: usize,
    pub evicted: u64,
    /// Heap bytes of every sketch in the table.
    pub heap_bytes: usize,
    /// Sampling state (splitmix64): deterministic for the simulator.
    rng: u64,
    /// Eviction ranks an entry by its successes too (`roaming`).
    successes_rank: bool,
}

impl Family {
    pub fn new(name: &'static str, entries_max: usize, seed: u64) -> Family {
        Family {
            name,
            map: IndexMap::default(),
            entries_max,
            evicted: 0,
            heap_bytes: 0,
            rng: seed,
            successes_rank: false,
        }
    }

    /// As `new`, for a table whose successes carry information too: the
    /// accounts' distinct succeeding sources, what caps where an account
    /// dilutes failure shares (`success_sources_max`). Ranked by failures
    /// alone, an attacker's own accounts (success only) were the first a
    /// full table evicted, and its stuffing run fills the table: each
    /// eviction forgot the addresses an owned account had diluted.
    pub fn roaming(name: &'static str, entries_max: usize, seed: u64) -> Family {
        Family { successes_rank: true, ..Family::new(name, entries_max, seed) }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, key: u64) -> Option<&Tracked> {
        self.map.get(&key)
    }

    /// The entry of `key`, created if absent (evicting another if that
    /// puts the table over its cap); its index. One hash probe either way.
    fn entry(&mut self, key: u64, label: Label, now_us: u64) -> usize {
        let (index, made) = match self.map.entry(key) {
            indexmap::map::Entry::Occupied(e) => (e.index(), false),
            indexmap::map::Entry::Vacant(e) => {
                let index = e.index();
                let empty =
                    Tracked { failed: Windowed::default(), succeeded: Windowed::default(), label, touched_us: now_us };
                e.insert(empty);
                (index, true)
            }
        };
        if made && self.map.len() > self.entries_max {
            // Never the entry just made: it is last, and sampling skips it;
            // removing another moves the last entry (ours) into its place.
            if let Some(hole) = self.evict_one_before(index) {
                return hole;
            }
        }
        index
    }

    /// Counts a failure's `element` under `key`. Returns the entry.
    pub fn fail(&mut self, key: u64, label: Label, epoch: u64, element: u64, now_us: u64) -> &Tracked {
        let index = self.entry(key, label, now_us);
        let (_, entry) = self.map.get_index_mut(index).expect("an index just found or made");
        entry.touched_us = now_us;
        let delta = entry.failed.insert(epoch, element) + entry.succeeded.roll(epoch);
        self.heap_bytes = (self.heap_bytes as isize + delta) as usize;
        entry
    }

    /// Counts a success's `element` under `key`, so that a source's
    /// successes before its first failure weigh in its failure share. An
    /// entry that only succeeded is the first a full table evicts (it
    /// counts no failure), so successes never push out a failing source;
    /// in a `roaming` table its distinct successes rank it as failures do.
    pub fn succeed(&mut self, key: u64, label: Label, epoch: u64, element: u64, now_us: u64) -> &Tracked {
        let index = self.entry(key, label, now_us);
        let (_, entry) = self.map.get_index_mut(index).expect("an index just found or made");
        entry.touched_us = now_us;
        let delta = entry.succeeded.insert(epoch, element) + entry.failed.roll(epoch);
        self.heap_bytes = (self.heap_bytes as isize + delta) as usize;
        entry
    }

    fn next_random(&mut self) -> u64 {
        splitmix64(&mut self.rng)
    }

    /// Evicts the least informative of a few sampled entries.
    pub fn evict_one(&mut self) {
        let len = self.map.len();
        self.evict_one_before(len);
    }

    /// As `evict_one`, among the entries before index `end`; the index
    /// emptied (which the last entry now holds), if any.
    fn evict_one_before(&mut self, end: usize) -> Option<usize> {
        let len = end.min(self.map.len());
        if len == 0 {
            return None;
        }
        let mut victim = (u32::MAX, u64::MAX, 0);
        for _ in 0..EVICTION_SAMPLES.min(len) {
            let i = (self.next_random() % len as u64) as usize;
            let (_, e) = self.map.get_index(i).expect("index below len");
            let counted = if self.successes_rank { e.failed.count() + e.succeeded.count() } else { e.failed.count() };
            let rank = (counted, e.touched_us, i);
            if (rank.0, rank.1) < (victim.0, victim.1) {
                victim = rank;
            }
        }
        let (_, gone) = self.map.swap_remove_index(victim.2).expect("index below len");
        self.heap_bytes -= gone.heap_bytes();
        self.evicted += 1;
        Some(victim.2)
    }

    /// Drops entries untouched for a whole window (they count nothing).
    pub fn sweep(&mut self, now_us: u64, window_us: u64) {
        let mut freed = 0;
        self.map.retain(|_, e| {
            let keep = e.touched_us + window_us > now_us;
            if !keep {
                freed += e.heap_bytes();
            }
            keep
        });
        self.heap_bytes -= freed;
    }

    /// Forgets every entry (not counted as evictions).
    pub fn clear(&mut self) {
        self.map.clear();
        self.heap_bytes = 0;
    }

    /// Applies a new cap, evicting down to it.
    pub fn set_entries_max(&mut self, entries_max: usize) {
        self.entries_max = entries_max;
        while self.map.len() > entries_max {
            self.evict_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_stays_under_the_cap_and_keeps_the_entry_that_counts() {
        let mut f = Family::new("t", 1_000, 1);
        // The spray's prefix: 30 distinct accounts.
        for a in 0..30 {
            f.fail(u64::MAX, Label::Digest, 0, a * 7919 + 1, 0);
        }
        // A flood of one-failure prefixes, 100 times the cap.
        for k in 0..100_000u64 {
            f.fail(k, Label::Digest, 0, k.wrapping_mul(0x9E37_79B9_7F4A_7C15), 1 + k);
            assert!(f.len() <= 1_000);
        }
        assert_eq!(f.get(u64::MAX).map(|e| e.failed.count()), Some(30), "sampled eviction keeps the informative entry");
        assert!(f.evicted >= 99_000);
    }

    #[test]
    fn a_success_makes_an_entry_the_first_to_go_and_sweeping_frees_the_heap() {
        let mut f = Family::new("t", 2, 1);
        f.fail(2, Label::Digest, 0, 7, 0);
        f.succeed(3, Label::Digest, 0, 1, 1);
        f.succeed(4, Label::Digest, 0, 1, 2);
        assert_eq!(f.len(), 2);
        assert!(f.get(2).is_some(), "the failing entry stays; a success-only one was evicted");
        f.sweep(10, 5);
        let mut f = Family::new("t", 10, 1);
        for a in 0..200u64 {
            f.fail(1, Label::Digest, 0, a.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1, 0);
        }
        assert!(f.heap_bytes > 0);
        f.sweep(10, 5);
        assert_eq!((f.len(), f.heap_bytes), (0, 0));
    }
}
