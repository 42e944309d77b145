//! The heaviest items of a stream in bounded memory: a space-saving
//! summary (Metwally, Agrawal and El Abbadi, 2005). Our own rather than a
//! crate's: it is thirty lines, and the crates that have it carry a
//! floating-point sketch zoo we do not need.
//!
//! With K entries, every item whose true count is above total/K is in the
//! summary, and each entry's count overstates its item's by at most its
//! `error` (what the evicted entry it replaced had counted). The least
//! entry is kept findable in O(log K) (an ordered set of counts), since a
//! flood of distinct items evicts at every one.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

pub struct TopK<T> {
    capacity: usize,
    /// Item → (count, error, its place in `by_count`'s tiebreak).
    entries: HashMap<T, (u64, u64, u64)>,
    /// (count, tiebreak) of every entry, so the least is found in
    /// O(log K): a flood of distinct items replaces the least at each one.
    by_count: BTreeSet<(u64, u64)>,
    /// Tiebreak → item, for the least entry's eviction.
    items: HashMap<u64, T>,
    next: u64,
}

impl<T: Hash + Eq + Clone> TopK<T> {
    pub fn new(capacity: usize) -> TopK<T> {
        assert!(capacity > 0, "a summary holds at least one entry");
        TopK { capacity, entries: HashMap::new(), by_count: BTreeSet::new(), items: HashMap::new(), next: 0 }
    }

    pub fn add(&mut self, item: T, by: u64) {
        if let Some(entry) = self.entries.get_mut(&item) {
            self.by_count.remove(&(entry.0, entry.2));
            entry.0 += by;
            self.by_count.insert((entry.0, entry.2));
            return;
        }
        let (count, error) = if self.entries.len() < self.capacity {
            (by, 0)
        } else {
            // Full: the new item replaces the least entry and inherits its
            // count as its error.
            let (least, tiebreak) = self.by_count.pop_first().expect("full means non-empty");
            let evicted = self.items.remove(&tiebreak).expect("every entry has its item");
            self.entries.remove(&evicted);
            (least + by, least)
        };
        let tiebreak = self.next;
        self.next += 1;
        self.entries.insert(item.clone(), (count, error, tiebreak));
        self.by_count.insert((count, tiebreak));
        self.items.insert(tiebreak, item);
    }

    /// (item, count, error), heaviest first, at most `limit`.
    pub fn top(&self, limit: usize) -> Vec<(T, u64, u64)> {
        self.by_count
            .iter()
            .rev()
            .take(limit)
            .map(|(count, tiebreak)| {
                let item = &self.items[tiebreak];
                (item.clone(), *count, self.entries[item].1)
            })
            .collect()
    }

    /// Every entry summed with `other`'s (a window and the one before).
    /// An item one summary lacks may still have counted there, up to that
    /// summary's least entry if it is full (an item outside a full
    /// space-saving summary counted no more than its least): that much is
    /// added to its count and to its error, so each merged count stays
    /// within [true, true + error].
    pub fn merged(&self, other: &TopK<T>, limit: usize) -> Vec<(T, u64, u64)> {
        let least = |t: &TopK<T>| {
            if t.entries.len() < t.capacity {
                0
            } else {
                t.by_count.first().map_or(0, |&(count, _)| count)
            }
        };
        let (least_here, least_there) = (least(self), least(other));
        let mut sum: HashMap<&T, (u64, u64)> =
            self.entries.iter().map(|(k, &(c, e, _))| (k, (c + least_there, e + least_there))).collect();
        for (k, &(c, e, _)) in &other.entries {
            match sum.get_mut(k) {
                // Counted in both: its own counts, not the least's.
                Some(entry) => *entry = (entry.0 - least_there + c, entry.1 - least_there + e),
                None => {
                    sum.insert(k, (c + least_here, e + least_here));
                }
            }
        }
        let mut all: Vec<(T, u64, u64)> = sum.into_iter().map(|(k, (c, e))| (k.clone(), c, e)).collect();
        all.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        all.truncate(limit);
        all
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_count.clear();
        self.items.clear();
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

        /// The same over two windows merged (`merged`), the way the
        /// operator's view shows them: an item evicted from one window and
        /// kept in the other is not undercounted.
        #[test]
        fn two_windows_merged_keep_every_count_within_its_error(
            before in proptest::collection::vec(0u16..64, 0..1_000),
            now in proptest::collection::vec(0u16..64, 0..1_000),
            capacity in 1usize..32,
        ) {
            let (mut a, mut b) = (TopK::new(capacity), TopK::new(capacity));
            let mut exact: HashMap<u16, u64> = HashMap::new();
            for &item in &before {
                b.add(item, 1);
                *exact.entry(item).or_default() += 1;
            }
            for &item in &now {
                a.add(item, 1);
                *exact.entry(item).or_default() += 1;
            }
            for (item, c, e) in a.merged(&b, usize::MAX) {
                let count = exact[&item];
                prop_assert!(c >= count && c - e <= count, "item {item}: true {count}, merged {c} ± {e}");
            }
        }
    }
}
