//! The heaviest items of a stream in bounded memory: a space-saving
//! summary (Metwally, Agrawal and El Abbadi, 2005). Our own rather than a
//! crate's: it is thirty lines, and the crates that have it carry a
//! floating-point sketch zoo we do not need.
//!
//! With K entries, every item whose true count is above total/K is in the
//! summary, and each entry's count overstates its item's by at most its
//! `error` (what the evicted entry it replaced had counted).

use std::collections::HashMap;
use std::hash::Hash;

pub struct TopK<T> {
    capacity: usize,
    /// Item → (count, error).
    entries: HashMap<T, (u64, u64)>,
}

impl<T: Hash + Eq + Clone> TopK<T> {
    pub fn new(capacity: usize) -> TopK<T> {
        assert!(capacity > 0, "a summary holds at least one entry");
        TopK { capacity, entries: HashMap::with_capacity(capacity) }
    }

    pub fn add(&mut self, item: T, by: u64) {
        if let Some(entry) = self.entries.get_mut(&item) {
            entry.0 += by;
            return;
        }
        if self.entries.len() < self.capacity {
            self.entries.insert(item, (by, 0));
            return;
        }
        // Full: the new item replaces the least entry and inherits its
        // count as its error. O(K), on the activity thread only.
        let (least, &(count, _)) = self.entries.iter().min_by_key(|(_, (c, _))| *c).expect("full means non-empty");
        let least = least.clone();
        self.entries.remove(&least);
        self.entries.insert(item, (count + by, count));
    }

    /// (item, count, error), heaviest first, at most `limit`.
    pub fn top(&self, limit: usize) -> Vec<(T, u64, u64)> {
        let mut all: Vec<(T, u64, u64)> = self.entries.iter().map(|(k, &(c, e))| (k.clone(), c, e)).collect();
        all.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        all.truncate(limit);
        all
    }

    /// Every entry summed with `other`'s (a window and the one before).
    pub fn merged(&self, other: &TopK<T>, limit: usize) -> Vec<(T, u64, u64)> {
        let mut sum: HashMap<T, (u64, u64)> = self.entries.clone();
        for (k, &(c, e)) in &other.entries {
            let entry = sum.entry(k.clone()).or_insert((0, 0));
            entry.0 += c;
            entry.1 += e;
        }
        let mut all: Vec<(T, u64, u64)> = sum.into_iter().map(|(k, (c, e))| (k, c, e)).collect();
        all.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        all.truncate(limit);
        all
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against an exact count: every item above total/K is kept, and
        /// each kept count is within [true, true + error].
        #[test]
        fn keeps_every_heavy_item_within_its_error(
            stream in proptest::collection::vec(0u16..64, 0..2_000),
            capacity in 1usize..32,
        ) {
            let mut top = TopK::new(capacity);
            let mut exact: HashMap<u16, u64> = HashMap::new();
            for &item in &stream {
                top.add(item, 1);
                *exact.entry(item).or_default() += 1;
            }
            let kept: HashMap<u16, (u64, u64)> =
                top.top(usize::MAX).into_iter().map(|(k, c, e)| (k, (c, e))).collect();
            prop_assert!(kept.len() <= capacity);
            let total = stream.len() as u64;
            for (item, &count) in &exact {
                if count * capacity as u64 > total {
                    prop_assert!(kept.contains_key(item), "heavy item {item} ({count} of {total}) lost");
                }
                if let Some(&(c, e)) = kept.get(item) {
                    prop_assert!(c >= count && c - e <= count, "item {item}: true {count}, kept {c} ± {e}");
                }
            }
        }
    }
}
