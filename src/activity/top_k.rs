//! The heaviest items of a stream in bounded memory: a space-saving
//! summary (Metwally, Agrawal and El Abbadi, 2005). Our own rather than a
//! crate's: it is thirty lines, and the crates that have it carry a
//! floating-point sketch zoo we do not need.
//!
//! With K entries, every item whose true count is above total/K is in the
//! summary, and each entry's count overstates its item's by at most its
//! `error` (what the evicted entry it replaced had counted). The least
//! entry is kept findable in O(log K) (an ordered map from counts to
//! items), since a flood of distinct items evicts at every one.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash};

/// `S` hashes the items: the default, randomly keyed, for items a client
/// chooses (addresses); `DigestBuildHasher` for keyed digests, whose bits
/// already are a hash.
pub struct TopK<T, S = RandomState> {
    capacity: usize,
    /// Item → (count, error, its place in `by_count`'s tiebreak).
    entries: HashMap<T, (u64, u64, u64), S>,
    /// (count, tiebreak) of every entry, to its item, so the least is
    /// found and evicted in O(log K): a flood of distinct items replaces
    /// the least at each one.
    by_count: BTreeMap<(u64, u64), T>,
    next: u64,
}

impl<T: Hash + Eq + Clone, S: BuildHasher + Default> TopK<T, S> {
    pub fn new(capacity: usize) -> TopK<T, S> {
        assert!(capacity > 0, "a summary holds at least one entry");
        TopK { capacity, entries: HashMap::default(), by_count: BTreeMap::new(), next: 0 }
    }

    pub fn add(&mut self, item: T, by: u64) {
        if let Some(entry) = self.entries.get_mut(&item) {
            let kept = self.by_count.remove(&(entry.0, entry.2)).unwrap_or(item);
            entry.0 += by;
            self.by_count.insert((entry.0, entry.2), kept);
            return;
        }
        let (count, error) = if self.entries.len() < self.capacity {
            (by, 0)
        } else {
            // Full: the new item replaces the least entry and inherits its
            // count as its error.
            let ((least, _), evicted) = self.by_count.pop_first().expect("full means non-empty");
            self.entries.remove(&evicted);
            (least + by, least)
        };
        let tiebreak = self.next;
        self.next += 1;
        self.entries.insert(item.clone(), (count, error, tiebreak));
        self.by_count.insert((count, tiebreak), item);
    }

    /// (item, count, error), heaviest first, at most `limit`.
    pub fn top(&self, limit: usize) -> Vec<(T, u64, u64)> {
        self.by_count
            .iter()
            .rev()
            .take(limit)
            .map(|(&(count, _), item)| (item.clone(), count, self.entries[item].1))
            .collect()
    }

    /// Every entry summed with `other`'s (a window and the one before).
    /// An item one summary lacks may still have counted there, up to that
    /// summary's least entry if it is full (an item outside a full
    /// space-saving summary counted no more than its least): that much is
    /// added to its count and to its error, so each merged count stays
    /// within [true, true + error].
    pub fn merged(&self, other: &TopK<T, S>, limit: usize) -> Vec<(T, u64, u64)> {
        let least = |t: &TopK<T, S>| {
            if t.entries.len() < t.capacity {
                0
            } else {
                t.by_count.first_key_value().map_or(0, |(&(count, _), _)| count)
            }
        };
        let (least_here, least_there) = (least(self), least(other));
        // On the default, randomly keyed hasher whatever `S` is: a map
        // filled in another's iteration order under the same fixed hasher
        // clusters (rust-lang/rust#36481).
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
            let mut top: TopK<u16> = TopK::new(capacity);
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
            // On the digest hasher only to run its instance of the type:
            // these items are no digests, which costs only speed here.
            let (mut a, mut b): (TopK<u16, crate::expiring::DigestBuildHasher>, _) = (TopK::new(capacity), TopK::new(capacity));
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
