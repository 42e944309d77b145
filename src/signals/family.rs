//! One bounded table of tracked subjects (prefixes, accounts, passwords):
//! each with its failed and succeeded distinct counts over the window.
//!
//! Our own rather than an LRU crate's because eviction must keep the
//! entries that carry information: a flood of one-failure prefixes must
//! not push out the /24 a spray is coming from. So a full table samples a
//! few entries at random positions (the entries are a dense array) and
//! evicts the one that counts least, the oldest of equals, as Redis's
//! sampled eviction does. The array is found by key through our own index
//! (`index`), which the thread can prefetch.

use super::index::advise_huge_pages_over;
use super::index::PositionIndex;
use super::sketch::Windowed;
use crate::tat_table::prefetch_read;

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
        self.failure_share_of(self.failed.count(), success_weight)
    }

    /// As `failure_share`, with `failed` standing for the failed count (a
    /// block's capped one).
    pub fn failure_share_of(&self, failed: u32, success_weight: u32) -> f64 {
        let failed = f64::from(failed);
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
    *state = state.wrapping_add(SPLITMIX_STEP);
    mix64(*state)
}

/// splitmix64's increment: the state `n` draws ahead is `n` steps on.
const SPLITMIX_STEP: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's finalizer: every output bit depends on every input bit.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A tracked subject and its key (a keyed digest): two cache lines, all
/// of which counting reads, so a prefetch brings exactly them. Its label,
/// which only `status` reads, is kept apart (`Family::labels`).
#[derive(Debug)]
#[repr(align(64))]
struct Entry {
    key: u64,
    tracked: Tracked,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 128, "an entry is two cache lines");

pub struct Family {
    pub name: &'static str,
    /// Dense, in the order made (a removal moves the last entry into the
    /// hole, as `IndexMap::swap_remove` did: the simulator's runs, which
    /// sample positions, are the same as with it).
    entries: Vec<Entry>,
    /// Each entry's label, at the same position.
    labels: Vec<Label>,
    /// Keyed by digests, whose bits pass through as the tag (an attacker
    /// without the secret cannot aim at a probe run).
    index: PositionIndex,
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
            entries: Vec::new(),
            labels: Vec::new(),
            index: PositionIndex::default(),
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
        self.entries.len()
    }

    /// Bytes of the entries' array and index, as allocated (the sketches'
    /// heap is `heap_bytes`).
    pub fn table_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.labels.capacity() * std::mem::size_of::<Label>()
            + self.index.heap_bytes()
    }

    fn position(&self, key: u64) -> Option<usize> {
        self.index.find(key, |p| self.entries[p].key == key).map(|(_, p)| p)
    }

    pub fn get(&self, key: u64) -> Option<&Tracked> {
        self.position(key).map(|p| &self.entries[p].tracked)
    }

    pub fn label(&self, key: u64) -> Option<Label> {
        self.position(key).map(|p| self.labels[p])
    }

    /// Hints the cache at the index word `key` will probe first.
    pub fn prefetch_index(&self, key: u64) {
        prefetch_read(self.index.home_address(key));
    }

    /// Hints the cache at `key`'s entry, found through its index word (the
    /// word itself prefetched earlier, `prefetch_index`): both its lines.
    /// A key not there, in a full table, will evict: then the entries its
    /// eviction will sample, taking it to be `evictions_ahead` evictions
    /// away (exact under a flood, where every event evicts; a wasted hint
    /// otherwise).
    pub fn prefetch_entry(&self, key: u64, evictions_ahead: u64) {
        match self.index.peek(key) {
            Some(position) => self.prefetch_position(position),
            None if !self.entries.is_empty() && self.entries.len() >= self.entries_max => {
                for position in self.sampled_at(evictions_ahead) {
                    self.prefetch_position(position);
                }
            }
            None => {}
        }
    }

    /// The positions the eviction `evictions_ahead` evictions from now
    /// will sample, the table staying full until then (`victim`'s draws).
    fn sampled_at(&self, evictions_ahead: u64) -> impl Iterator<Item = usize> + '_ {
        let len = self.entries.len() as u64;
        let first = evictions_ahead * EVICTION_SAMPLES as u64;
        (first + 1..=first + EVICTION_SAMPLES as u64).map(move |draw| {
            // `next_random`'s draw that many calls from now.
            (mix64(self.rng.wrapping_add(draw.wrapping_mul(SPLITMIX_STEP))) % len) as usize
        })
    }

    fn prefetch_position(&self, position: usize) {
        if let Some(entry) = self.entries.get(position) {
            let start = entry as *const Entry as usize;
            prefetch_read(start);
            prefetch_read(start + 64);
        }
    }

    /// The entry of `key`, created if absent (in the place of another,
    /// evicted, when the table is full); its position.
    fn entry(&mut self, key: u64, label: Label, now_us: u64) -> usize {
        if let Some(position) = self.position(key) {
            return position;
        }
        let made = Entry {
            key,
            tracked: Tracked { failed: Windowed::default(), succeeded: Windowed::default(), touched_us: now_us },
        };
        // A cap of 0 holds one entry, as `IndexMap` did (it sampled among
        // the entries before the new one, and with none it kept it).
        let entries_max = self.entries_max.max(1);
        if self.entries.len() >= entries_max {
            // The new entry takes the victim's place: where `IndexMap`
            // left it, appended and then swapped into the hole.
            let victim = self.victim(self.entries.len());
            let slot = self.index.slot_of(self.entries[victim].key, victim).expect("every entry is indexed");
            self.index.remove(slot);
            let gone = std::mem::replace(&mut self.entries[victim], made);
            self.labels[victim] = label;
            self.heap_bytes -= gone.tracked.heap_bytes();
            self.evicted += 1;
            self.index.insert(key, victim);
            return victim;
        }
        if self.entries.len() == self.entries.capacity() {
            // Doubling, but never past the cap: a full table's array is
            // its cap, not the next power of two.
            let capacity = (self.entries.capacity() * 2).max(4).min(entries_max);
            // A fresh array, advised before the move writes it: growing in
            // place would keep the pages already touched small.
            let mut grown = Vec::with_capacity(capacity);
            advise_huge_pages_over(&grown);
            grown.append(&mut self.entries);
            self.entries = grown;
            self.labels.reserve_exact(capacity - self.labels.len());
        }
        let position = self.entries.len();
        self.entries.push(made);
        self.labels.push(label);
        self.index.insert(key, position);
        position
    }

    /// Counts a failure's `element` under `key`. Returns the entry.
    pub fn fail(&mut self, key: u64, label: Label, epoch: u64, element: u64, now_us: u64) -> &Tracked {
        let position = self.entry(key, label, now_us);
        let entry = &mut self.entries[position].tracked;
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
        let position = self.entry(key, label, now_us);
        let entry = &mut self.entries[position].tracked;
        entry.touched_us = now_us;
        let delta = entry.succeeded.insert(epoch, element) + entry.failed.roll(epoch);
        self.heap_bytes = (self.heap_bytes as isize + delta) as usize;
        entry
    }

    /// Removes the entry at `position`, moving the last entry into its place.
    fn swap_remove(&mut self, position: usize) -> Tracked {
        let last = self.entries.len() - 1;
        let slot = self.index.slot_of(self.entries[position].key, position).expect("every entry is indexed");
        self.index.remove(slot);
        if position != last {
            let moved = self.entries[last].key;
            let slot = self.index.slot_of(moved, last).expect("every entry is indexed");
            self.index.set_position(slot, position);
        }
        self.labels.swap_remove(position);
        self.entries.swap_remove(position).tracked
    }

    fn next_random(&mut self) -> u64 {
        splitmix64(&mut self.rng)
    }

    /// Evicts the least informative of a few sampled entries.
    pub fn evict_one(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let victim = self.victim(self.entries.len());
        let gone = self.swap_remove(victim);
        self.heap_bytes -= gone.heap_bytes();
        self.evicted += 1;
    }

    /// The least informative of a few entries sampled among the first
    /// `len` (at least one): fewest counted, the oldest of equals.
    fn victim(&mut self, len: usize) -> usize {
        let mut victim = (u32::MAX, u64::MAX, 0);
        for _ in 0..EVICTION_SAMPLES.min(len) {
            let i = (self.next_random() % len as u64) as usize;
            let e = &self.entries[i].tracked;
            let counted = if self.successes_rank { e.failed.count() + e.succeeded.count() } else { e.failed.count() };
            let rank = (counted, e.touched_us, i);
            if (rank.0, rank.1) < (victim.0, victim.1) {
                victim = rank;
            }
        }
        victim.2
    }

    /// Drops entries untouched for a whole window (they count nothing).
    pub fn sweep(&mut self, now_us: u64, window_us: u64) {
        // `retain` over both arrays at once: the kept keep their order.
        let (mut kept, before) = (0, self.entries.len());
        for i in 0..before {
            let tracked = &self.entries[i].tracked;
            if tracked.touched_us + window_us > now_us {
                self.entries.swap(kept, i);
                self.labels.swap(kept, i);
                kept += 1;
            } else {
                self.heap_bytes -= tracked.heap_bytes();
            }
        }
        self.entries.truncate(kept);
        self.labels.truncate(kept);
        if kept < before {
            // A flood that has passed gives most of its memory back.
            if self.entries.capacity() > 4 * kept {
                self.entries.shrink_to(2 * kept);
                self.labels.shrink_to(2 * kept);
            }
            self.index.rebuild(self.entries.iter().map(|e| e.key));
        }
    }

    /// Forgets every entry (not counted as evictions).
    pub fn clear(&mut self) {
        self.entries = Vec::new();
        self.labels = Vec::new();
        self.index = PositionIndex::default();
        self.heap_bytes = 0;
    }

    /// Applies a new cap, evicting down to it. A lowered cap gives back
    /// the array and index sized for the old one (positions unchanged).
    pub fn set_entries_max(&mut self, entries_max: usize) {
        self.entries_max = entries_max;
        while self.entries.len() > entries_max {
            self.evict_one();
        }
        let entries_max = entries_max.max(1);
        if self.entries.capacity() > entries_max || self.labels.capacity() > entries_max {
            self.entries.shrink_to(entries_max);
            self.labels.shrink_to(entries_max);
            self.index.rebuild(self.entries.iter().map(|e| e.key));
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
    fn a_full_table_holds_its_cap_and_no_more_memory() {
        let mut f = Family::new("t", 1_000, 1);
        for k in 0..50_000u64 {
            f.fail(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), Label::Digest, 0, 1, k);
            assert!(f.len() <= 1_000);
            assert!(f.entries.capacity() <= 1_000, "the array never doubles past the cap");
        }
        // 1,000 entries at load at most 1/2: 2,048 words.
        assert_eq!(f.table_bytes(), 1_000 * (128 + std::mem::size_of::<Label>()) + 2_048 * 8);
        assert!(f.get(49_999u64.wrapping_mul(0x9E37_79B9_7F4A_7C15)).is_some(), "the newest is found");
        assert_eq!(f.evicted, 49_000);
    }

    #[test]
    fn a_lowered_cap_gives_its_memory_back_and_keeps_what_it_holds() {
        let mut f = Family::new("t", 10_000, 1);
        let key = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..20_000u64 {
            f.fail(key(k), Label::Digest, 0, 1, k);
        }
        let full = f.table_bytes();
        f.set_entries_max(100);
        assert_eq!(f.len(), 100);
        assert!(f.entries.capacity() <= 100, "the array holds the new cap, not the old: {}", f.entries.capacity());
        assert!(f.table_bytes() * 50 < full, "{} of {full} bytes kept", f.table_bytes());
        // Every entry kept is still found, at its position.
        let kept: Vec<u64> = f.entries.iter().map(|e| e.key).collect();
        for (p, k) in kept.iter().enumerate() {
            assert_eq!(f.position(*k), Some(p));
        }
        for k in 20_000..21_000u64 {
            f.fail(key(k), Label::Digest, 0, 1, k);
            assert!(f.len() <= 100 && f.entries.capacity() <= 100);
        }
        assert!(f.get(key(20_999)).is_some());
    }

    #[test]
    fn a_cap_of_zero_holds_one_entry_as_indexmap_did() {
        // Configuration refuses 0, but the table must not panic on it
        // (sampling among no entries indexed an empty array).
        let mut f = Family::new("t", 0, 1);
        for k in 1..50u64 {
            f.fail(k, Label::Digest, 0, 1, k);
            assert_eq!(f.len(), 1);
            assert!(f.get(k).is_some());
        }
        assert_eq!(f.evicted, 48);
        f.set_entries_max(0);
        assert_eq!(f.len(), 0);
        f.prefetch_entry(7, 1); // empty and "full": nothing to sample
        f.succeed(7, Label::Digest, 0, 1, 60);
        assert_eq!(f.len(), 1);
    }

    #[test]
    fn the_prefetch_foresees_the_positions_evictions_will_sample() {
        let mut f = Family::new("t", 100, 9);
        for k in 0..100u64 {
            f.fail(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), Label::Digest, 0, 1, k);
        }
        let foreseen: Vec<usize> = (0..3).flat_map(|ahead| f.sampled_at(ahead).collect::<Vec<_>>()).collect();
        let drawn: Vec<usize> = (0..15).map(|_| (f.next_random() % 100) as usize).collect();
        assert_eq!(foreseen, drawn);
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
