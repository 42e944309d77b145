//! A uniform sample of a stream of unknown length in fixed memory
//! (Vitter's algorithm R): after n items, each is in the sample with
//! probability k/n. What `tollgate sample` prints of monitor mode's
//! would-be refusals.

pub struct Reservoir<T> {
    capacity: usize,
    items: Vec<T>,
    seen: u64,
    /// splitmix64's state: the choice must be random, not the client's.
    rng: u64,
}

impl<T> Reservoir<T> {
    pub fn new(capacity: usize, seed: u64) -> Reservoir<T> {
        assert!(capacity > 0, "a sample holds at least one item");
        Reservoir { capacity, items: Vec::new(), seen: 0, rng: seed }
    }

    pub fn offer(&mut self, item: T) {
        self.seen += 1;
        if self.items.len() < self.capacity {
            self.items.push(item);
            return;
        }
        let slot = self.next() % self.seen;
        if (slot as usize) < self.capacity {
            self.items[slot as usize] = item;
        }
    }

    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The generator's state (its seed until the sample is full).
    #[cfg(test)]
    pub fn seed(&self) -> u64 {
        self.rng
    }

    pub fn items(&self) -> &[T] {
        &self.items
    }

    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_equally_likely_to_stay() {
        // 1,000 runs of 100 items into 10 slots: each item stays ~100 times.
        let mut kept = [0u32; 100];
        for run in 0..1_000u64 {
            let mut r = Reservoir::new(10, run);
            for i in 0..100usize {
                r.offer(i);
            }
            assert_eq!((r.items().len(), r.seen()), (10, 100));
            for &i in r.items() {
                kept[i] += 1;
            }
        }
        let (early, late) = (kept[..50].iter().sum::<u32>(), kept[50..].iter().sum::<u32>());
        assert!(early.abs_diff(late) < 600, "first half kept {early}, second half {late}");
        assert!(kept.iter().all(|&k| (40..=170).contains(&k)), "{kept:?}");
    }
}
