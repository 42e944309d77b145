//! Where each tracked subject's entry sits in its family's dense array: an
//! open-addressed index of 8-byte words, linear probing.
//!
//! Our own rather than `IndexMap`'s swiss table because the thread must be
//! able to prefetch. A swiss-table lookup is three dependent cache misses
//! (control bytes, the slot, the entry), none of them exposed; with 100,000
//! sources tracked they were most of the thread's time. Here the drain loop
//! hints the cache at the word a coming event's key will probe, and a few
//! events later at the entry that word names (`Family::prefetch`), so the
//! misses of several events overlap instead of queueing.
//!
//! A word holds the key's 32-bit tag and its position + 1; 0 is empty. The
//! home slot derives from the tag alone, so the index grows and deletes
//! without reading the entries, and a word is found by (tag, position)
//! without them too. Load at most 1/2: a lookup reads one or two words,
//! almost always on one cache line.

use crate::tat_table::advise_huge_pages_under;

/// An empty word (positions are stored + 1, so no full word is 0).
const EMPTY: u64 = 0;
/// Smallest index: 128 bytes.
const SLOTS_MIN: usize = 16;

#[derive(Debug)]
pub struct PositionIndex {
    words: Vec<u64>,
    /// 64 − log2(words): the home slot is the top bits of the tag's product.
    shift: u32,
    len: usize,
}

/// The bits of a key a word keeps. Keys are keyed digests: an attacker
/// without the secret cannot choose tags, so cannot aim at a probe run.
fn tag(key: u64) -> u32 {
    (key ^ (key >> 32)) as u32
}

fn word(tag: u32, position: usize) -> u64 {
    let stored = u32::try_from(position + 1).expect("positions fit in 32 bits (entries_max ≤ 100,000,000)");
    u64::from(tag) << 32 | u64::from(stored)
}

fn word_tag(word: u64) -> u32 {
    (word >> 32) as u32
}

fn word_position(word: u64) -> usize {
    (word as u32 - 1) as usize
}

impl Default for PositionIndex {
    fn default() -> PositionIndex {
        PositionIndex::with_slots(SLOTS_MIN)
    }
}

impl PositionIndex {
    fn with_slots(slots: usize) -> PositionIndex {
        debug_assert!(slots.is_power_of_two());
        let words = vec![EMPTY; slots];
        advise_huge_pages_over(&words);
        PositionIndex { words, shift: 64 - slots.trailing_zeros(), len: 0 }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    pub fn heap_bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<u64>()
    }

    fn mask(&self) -> usize {
        self.words.len() - 1
    }

    /// Fibonacci hashing: the tag's bits spread over the product's top bits.
    fn home(&self, tag: u32) -> usize {
        (u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The slot and position of `key`, `is_key` telling a position holding
    /// it from one whose key only shares its tag.
    pub fn find(&self, key: u64, is_key: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
        let tag = tag(key);
        let mut slot = self.home(tag);
        loop {
            let word = self.words[slot];
            if word == EMPTY {
                return None;
            }
            if word_tag(word) == tag && is_key(word_position(word)) {
                return Some((slot, word_position(word)));
            }
            slot = (slot + 1) & self.mask();
        }
    }

    /// The slot whose word is exactly `key`'s tag at `position`.
    pub fn slot_of(&self, key: u64, position: usize) -> Option<usize> {
        let wanted = word(tag(key), position);
        let mut slot = self.home(tag(key));
        loop {
            match self.words[slot] {
                EMPTY => return None,
                word if word == wanted => return Some(slot),
                _ => slot = (slot + 1) & self.mask(),
            }
        }
    }

    /// The position of the first word with `key`'s tag, unverified: where
    /// the key's entry most likely is, to prefetch it.
    pub fn peek(&self, key: u64) -> Option<usize> {
        let tag = tag(key);
        let mut slot = self.home(tag);
        loop {
            match self.words[slot] {
                EMPTY => return None,
                word if word_tag(word) == tag => return Some(word_position(word)),
                _ => slot = (slot + 1) & self.mask(),
            }
        }
    }

    /// The address of `key`'s home word, to prefetch it.
    pub fn home_address(&self, key: u64) -> usize {
        self.words.as_ptr() as usize + self.home(tag(key)) * std::mem::size_of::<u64>()
    }

    /// Indexes `key` (not already indexed) at `position`.
    pub fn insert(&mut self, key: u64, position: usize) {
        if (self.len + 1) * 2 > self.words.len() {
            self.resize(self.words.len() * 2);
        }
        self.place(word(tag(key), position));
        self.len += 1;
    }

    fn place(&mut self, word: u64) {
        let mut slot = self.home(word_tag(word));
        while self.words[slot] != EMPTY {
            slot = (slot + 1) & self.mask();
        }
        self.words[slot] = word;
    }

    fn resize(&mut self, slots: usize) {
        let old = std::mem::replace(self, PositionIndex::with_slots(slots));
        for word in old.words.into_iter().filter(|w| *w != EMPTY) {
            self.place(word);
        }
        self.len = old.len;
    }

    /// Points the word at `slot` to `position`.
    pub fn set_position(&mut self, slot: usize, position: usize) {
        self.words[slot] = word(word_tag(self.words[slot]), position);
    }

    /// Empties `slot`, shifting the rest of its run back so that no probe
    /// meets a hole before its key (no tombstones).
    pub fn remove(&mut self, slot: usize) {
        let mask = self.mask();
        let mut hole = slot;
        let mut next = (slot + 1) & mask;
        loop {
            let word = self.words[next];
            if word == EMPTY {
                break;
            }
            // The word may fill the hole if its home is not after the hole
            // on the run (cyclically): it is at least as far from home.
            let from_home = next.wrapping_sub(self.home(word_tag(word))) & mask;
            if from_home >= next.wrapping_sub(hole) & mask {
                self.words[hole] = word;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.words[hole] = EMPTY;
        self.len -= 1;
    }

    /// Indexes `keys` afresh at positions 0, 1, ..., sized for them.
    pub fn rebuild(&mut self, keys: impl ExactSizeIterator<Item = u64>) {
        let slots = (keys.len() * 2).next_power_of_two().max(SLOTS_MIN);
        *self = PositionIndex::with_slots(slots);
        for (position, key) in keys.enumerate() {
            self.place(word(tag(key), position));
            self.len += 1;
        }
    }
}

/// Bytes from which a spray detection table's array (an index's words, a
/// family's entries) asks for huge pages.
pub(super) const HUGE_PAGES_FROM_BYTES: usize = 4 << 20;

/// Asks for huge pages under a large array (whole, with its spare
/// capacity): at 100,000 entries a table spans thousands of small pages,
/// and each event's probes missed the TLB as well as the cache.
pub(super) fn advise_huge_pages_over<T>(array: &Vec<T>) {
    let bytes = array.capacity() * std::mem::size_of::<T>();
    if bytes >= HUGE_PAGES_FROM_BYTES {
        advise_huge_pages_under(array.as_ptr() as usize, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Checks every key in `model` is found at its position, and the rest
    /// are not.
    fn agrees(index: &PositionIndex, model: &HashMap<u64, usize>, absent: &[u64]) -> Result<(), TestCaseError> {
        prop_assert_eq!(index.len(), model.len());
        let at: HashMap<usize, u64> = model.iter().map(|(k, p)| (*p, *k)).collect();
        for (key, position) in model {
            let found = index.find(*key, |p| at.get(&p) == Some(key));
            prop_assert_eq!(found.map(|(_, p)| p), Some(*position));
            prop_assert!(index.slot_of(*key, *position).is_some());
        }
        for key in absent.iter().filter(|k| !model.contains_key(k)) {
            prop_assert_eq!(index.find(*key, |p| at.get(&p) == Some(key)), None);
        }
        Ok(())
    }

    /// Removes the key at `position` as `Family` does: swap-remove from
    /// the array, re-pointing the moved key's word; the model follows.
    fn swap_remove(index: &mut PositionIndex, keys: &mut Vec<u64>, model: &mut HashMap<u64, usize>, position: usize) {
        let key = keys[position];
        index.remove(index.slot_of(key, position).expect("indexed"));
        model.remove(&key);
        let last = keys.len() - 1;
        keys.swap_remove(position);
        if position != last {
            let moved = keys[position];
            index.set_position(index.slot_of(moved, last).expect("indexed"), position);
            model.insert(moved, position);
        }
    }

    proptest! {
        /// Against a `HashMap`, through growth and backward-shift removals,
        /// with keys drawn from a small space so tags and homes collide
        /// (keys ≥ 2^32 share tags with keys below it).
        #[test]
        fn finds_what_a_map_holds(ops in prop::collection::vec((any::<bool>(), 0u64..64, 0u64..3), 1..400)) {
            let mut index = PositionIndex::default();
            let mut model: HashMap<u64, usize> = HashMap::new();
            let mut keys: Vec<u64> = Vec::new();
            let mut seen = Vec::new();
            for (add, low, high) in ops {
                let key = low | high << 32 | (low & 1) << 33;
                seen.push(key);
                if add && !model.contains_key(&key) {
                    index.insert(key, keys.len());
                    model.insert(key, keys.len());
                    keys.push(key);
                } else if let Some(&position) = model.get(&key) {
                    swap_remove(&mut index, &mut keys, &mut model, position);
                }
                agrees(&index, &model, &seen)?;
            }
            index.rebuild(keys.iter().copied());
            agrees(&index, &model, &seen)?;
        }
    }

    /// Keys that all share one tag whose home is the last slot: their run
    /// wraps around the end, every lookup must tell them apart by
    /// `is_key`, and removals from any point of the run shift the rest
    /// back across the wrap.
    #[test]
    fn one_tag_for_every_key_and_a_run_across_the_end() {
        let index = PositionIndex::default();
        let last = index.words.len() - 1;
        let tag = (1u32..).find(|t| index.home(*t) == last).expect("some tag's home is the last slot");
        // tag(key) = low ^ high = tag for each of these.
        let keys: Vec<u64> = (0..7u64).map(|x| u64::from(tag) ^ x | x << 32).collect();
        assert!(keys.iter().all(|k| super::tag(*k) == tag));
        for removed in 0..keys.len() {
            let mut index = PositionIndex::default();
            let mut model: HashMap<u64, usize> = HashMap::new();
            let mut live = keys.clone();
            for (p, k) in keys.iter().enumerate() {
                index.insert(*k, p);
                model.insert(*k, p);
            }
            assert_eq!(index.words.len(), 16, "7 keys at load at most 1/2");
            agrees(&index, &model, &[0, u64::from(tag), u64::from(tag) << 32]).unwrap();
            // Remove the key at `removed`, then the rest from the front.
            swap_remove(&mut index, &mut live, &mut model, removed);
            agrees(&index, &model, &keys).unwrap();
            while !live.is_empty() {
                swap_remove(&mut index, &mut live, &mut model, 0);
                agrees(&index, &model, &keys).unwrap();
            }
            assert!(index.words.iter().all(|w| *w == EMPTY), "nothing left behind");
        }
    }

    #[test]
    fn load_stays_at_most_half_and_a_rebuild_shrinks() {
        let mut index = PositionIndex::default();
        for i in 0..10_000u64 {
            index.insert(i.wrapping_mul(0x9E37_79B9_7F4A_7C15), i as usize);
            assert!(index.len() * 2 <= index.words.len());
        }
        assert_eq!(index.heap_bytes(), 32_768 * 8);
        index.rebuild((0..10u32).map(|i| u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        assert_eq!((index.len(), index.heap_bytes()), (10, 32 * 8), "twice the keys, rounded up to a power of two");
        assert_eq!(index.peek(3u64.wrapping_mul(0x9E37_79B9_7F4A_7C15)), Some(3));
    }
}
