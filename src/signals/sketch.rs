//! A distinct count over a sliding window: `SUB_WINDOWS` sketches, one per
//! sub-window, and their running union. The window therefore slides in
//! steps of one sub-window: what it counts is between (SUB_WINDOWS − 1) and
//! SUB_WINDOWS sub-windows old.
//!
//! The sketch is `cardinality-estimator` (Cloudflare's HyperLogLog++), the
//! only module that names the crate. It suits a million mostly tiny sets:
//! 8 bytes inline and no heap up to 2 elements, an exact array of 32-bit
//! codes up to 128, a dense 780-byte HLL (3.25% error at P = 10) above.
//! Every threshold a detector uses is under 128, so every flag is decided
//! in the exact range. Elements go in through `insert_hash`, unhashed: they
//! are already keyed digests, so an attacker choosing the inputs cannot
//! choose where they land (see docs/design/spray-detection.md §1.3).

use cardinality_estimator::CardinalityEstimator;

/// Sub-windows per window.
pub const SUB_WINDOWS: usize = 4;

/// P = 10 registers' worth (1,024) and W = 6 bits each: W = 5 would let a
/// rare rank ≥ 32 spill into the index bits of the sparse code.
type Sketch = CardinalityEstimator<u64, std::collections::hash_map::DefaultHasher, 10, 6>;

/// Bytes a sketch holds inline (its tagged pointer); the rest is heap.
const INLINE_BYTES: usize = std::mem::size_of::<usize>();

#[derive(Clone, Debug, Default)]
pub struct Windowed {
    subs: [Sketch; SUB_WINDOWS],
    union: Sketch,
    /// The sub-window `subs[epoch % SUB_WINDOWS]` counts.
    epoch: u64,
}

impl Windowed {
    /// Forgets the sub-windows that have left the window by `epoch`; the
    /// change in heap bytes.
    pub fn roll(&mut self, epoch: u64) -> isize {
        if epoch <= self.epoch {
            return 0;
        }
        let before = self.heap_bytes() as isize;
        let gone = (epoch - self.epoch).min(SUB_WINDOWS as u64);
        for step in 1..=gone {
            self.subs[((self.epoch + step) % SUB_WINDOWS as u64) as usize] = Sketch::new();
        }
        self.epoch = epoch;
        let mut union = Sketch::new();
        for sub in &self.subs {
            union.merge(sub);
        }
        self.union = union;
        self.heap_bytes() as isize - before
    }

    /// Counts `element` in sub-window `epoch` (after rolling to it); the
    /// change in heap bytes.
    pub fn insert(&mut self, epoch: u64, element: u64) -> isize {
        let mut delta = self.roll(epoch);
        let slot = (self.epoch % SUB_WINDOWS as u64) as usize;
        let before = self.subs[slot].size_of() + self.union.size_of();
        self.subs[slot].insert_hash(element);
        self.union.insert_hash(element);
        delta += (self.subs[slot].size_of() + self.union.size_of()) as isize - before as isize;
        delta
    }

    /// Distinct elements in the window (exact below 128).
    pub fn count(&self) -> u32 {
        self.union.estimate().min(u32::MAX as usize) as u32
    }

    /// Distinct elements in the sub-window last counted (exact below 128).
    pub fn current_count(&self) -> u32 {
        self.subs[(self.epoch % SUB_WINDOWS as u64) as usize].estimate().min(u32::MAX as usize) as u32
    }

    /// Distinct elements an insert at `epoch` would find in its sub-window.
    pub fn count_in(&self, epoch: u64) -> u32 {
        if epoch > self.epoch {
            0
        } else {
            self.current_count()
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.subs.iter().chain([&self.union]).map(|s| s.size_of() - INLINE_BYTES).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};

    /// An element that looks like a keyed digest (what the engine feeds).
    fn digest(i: u64) -> u64 {
        let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    proptest! {
        /// Against an exact model: the distinct elements of the last
        /// SUB_WINDOWS sub-windows, exactly, while under 128.
        #[test]
        fn counts_exactly_what_the_window_holds(steps in prop::collection::vec((0u64..3, 0u64..40), 1..200)) {
            let mut w = Windowed::default();
            let mut model: BTreeMap<u64, HashSet<u64>> = BTreeMap::new();
            let mut epoch = 0;
            let mut heap = 0isize;
            for (advance, element) in steps {
                epoch += advance;
                heap += w.insert(epoch, digest(element));
                model.entry(epoch).or_default().insert(element);
                let live: HashSet<u64> = model
                    .range(epoch.saturating_sub(SUB_WINDOWS as u64 - 1)..=epoch)
                    .flat_map(|(_, s)| s.iter().copied())
                    .collect();
                prop_assert_eq!(w.count() as usize, live.len());
                prop_assert_eq!(heap, w.heap_bytes() as isize);
            }
            heap += w.roll(epoch + SUB_WINDOWS as u64);
            prop_assert_eq!(w.count(), 0);
            prop_assert_eq!(heap, 0);
        }
    }

    #[test]
    fn a_set_larger_than_the_exact_range_is_estimated_within_a_few_percent() {
        let mut w = Windowed::default();
        for i in 0..10_000 {
            w.insert(0, digest(i));
        }
        let count = w.count() as f64;
        assert!((count - 10_000.0).abs() / 10_000.0 < 0.1, "estimate {count}");
        // Dense: five sketches of 1,024 six-bit registers, whatever the count.
        assert!(w.heap_bytes() < 5 * 800, "{} heap bytes", w.heap_bytes());
    }

    #[test]
    fn repeats_count_once() {
        let mut w = Windowed::default();
        for _ in 0..1000 {
            w.insert(7, digest(1));
        }
        assert_eq!(w.count(), 1);
        assert_eq!(w.heap_bytes(), 0, "one element stays inline");
    }
}
