//! The BLAKE2b digests derived last, remembered: a report derives the
//! same account and tuple digests its check derived moments before, and
//! those two compressions were the largest share of a login's cost.
//!
//! Written here rather than taken from a crate: the caches on crates.io
//! (moka, quick_cache, ...) lock, allocate and keep LRU order per entry,
//! which costs about what a compression does. This is a fixed array of
//! slots written and read without locks (a seqlock per slot, in atomics:
//! no `unsafe`), lossy on purpose: a slot being written, or taken by
//! another input, is a miss, and a miss only costs the derivation.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Slots in the table (a power of two). A report finds its check's
/// digests if fewer than about this many other digests were derived in
/// between: 4,096 covers the two per attempt of a few thousand attempts
/// in flight, for 160 KiB a daemon.
pub const RECENT_DIGESTS_SLOTS: usize = 4096;

const _: () = assert!(RECENT_DIGESTS_SLOTS.is_power_of_two());

/// One remembered digest under the tag of its input.
struct Slot {
    /// Even: settled; odd: being written (readers then miss).
    version: AtomicU64,
    /// The input's tag (two words), then its digest (two words).
    words: [AtomicU64; 4],
}

/// A fixed table of digests by their input's tag. The tag is a keyed
/// 128-bit hash of the whole input (see `KeyDeriver`): unpredictable
/// without the secret, so no one can aim inputs at one slot or make two
/// inputs share a tag, and no input (an account name) is kept, only its
/// tag and its digest.
pub struct RecentDigests {
    slots: Box<[Slot]>,
}

impl RecentDigests {
    pub fn new() -> RecentDigests {
        let slot = || Slot { version: AtomicU64::new(0), words: Default::default() };
        RecentDigests { slots: (0..RECENT_DIGESTS_SLOTS).map(|_| slot()).collect() }
    }

    fn slot(&self, tag: u128) -> &Slot {
        &self.slots[tag as usize & (RECENT_DIGESTS_SLOTS - 1)]
    }

    /// The digest remembered under `tag`, if its slot still holds it.
    pub fn recall(&self, tag: u128) -> Option<[u8; 16]> {
        let slot = self.slot(tag);
        let before = slot.version.load(Ordering::Acquire);
        // Odd: being written. Zero: never written (its all-zero words
        // must not answer for a tag of zero).
        if before & 1 == 1 || before == 0 {
            return None;
        }
        let words = [0, 1, 2, 3].map(|i| slot.words[i].load(Ordering::Relaxed));
        // Pairs with the writer's release fence: a word read from a write
        // begun after `before` makes the version read below differ.
        fence(Ordering::Acquire);
        if slot.version.load(Ordering::Relaxed) != before || words[..2] != split(tag) {
            return None;
        }
        let mut digest = [0u8; 16];
        digest[..8].copy_from_slice(&words[2].to_le_bytes());
        digest[8..].copy_from_slice(&words[3].to_le_bytes());
        Some(digest)
    }

    /// Remembers `digest` under `tag`, in place of whatever the slot held;
    /// skipped if another thread is writing the slot.
    pub fn remember(&self, tag: u128, digest: &[u8; 16]) {
        let slot = self.slot(tag);
        let before = slot.version.load(Ordering::Relaxed);
        if before & 1 == 1
            || slot.version.compare_exchange(before, before + 1, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            return;
        }
        // Orders the odd version before the words: a reader that sees any
        // of them sees the version moved.
        fence(Ordering::Release);
        let [hi, lo] = split(tag);
        let word = |half: &[u8]| u64::from_le_bytes(half.try_into().expect("8 bytes"));
        for (i, value) in [hi, lo, word(&digest[..8]), word(&digest[8..])].into_iter().enumerate() {
            slot.words[i].store(value, Ordering::Relaxed);
        }
        slot.version.store(before + 2, Ordering::Release);
    }
}

fn split(tag: u128) -> [u64; 2] {
    [(tag >> 64) as u64, tag as u64]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_digest_is_recalled_until_its_slot_is_taken() {
        let recent = RecentDigests::new();
        assert_eq!(recent.recall(0), None, "an unwritten slot answers for tag 0");
        assert_eq!(recent.recall(7), None);
        recent.remember(7, &[1; 16]);
        assert_eq!(recent.recall(7), Some([1; 16]));
        // Same slot, another tag: the slot now answers only for it.
        let rival = 7 + RECENT_DIGESTS_SLOTS as u128;
        recent.remember(rival, &[2; 16]);
        assert_eq!(recent.recall(7), None);
        assert_eq!(recent.recall(rival), Some([2; 16]));
        // Tags that differ only in their high word are told apart.
        assert_eq!(recent.recall(rival | 1 << 100), None);
    }

    #[test]
    fn readers_racing_writers_never_see_a_torn_digest() {
        // Each tag's digest is a function of the tag; writers keep
        // replacing the slots' contents, readers check every hit.
        let recent = std::sync::Arc::new(RecentDigests::new());
        // Tags sharing a slot differ in their high word, and so do both
        // halves of their digests: a mix of two writes cannot pass.
        let digest_of = |tag: u128| {
            let high = (tag >> 64) as u64;
            let mut digest = [0u8; 16];
            digest[..8].copy_from_slice(&high.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
            digest[8..].copy_from_slice(&(!high).to_le_bytes());
            digest
        };
        let tags: Vec<u128> = (0..64u128).map(|i| i << 64 | (i % 4)).collect();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (recent, tags) = (recent.clone(), tags.clone());
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    for round in 0..50_000usize {
                        // Each tag written is read back next round,
                        // while the other threads write its slot too.
                        let tag = tags[(round / 2 * 5 + t) % tags.len()];
                        if round % 2 == 0 {
                            recent.remember(tag, &digest_of(tag));
                        } else if let Some(digest) = recent.recall(tag) {
                            assert_eq!(digest, digest_of(tag), "tag {tag:x}");
                            hits += 1;
                        }
                    }
                    hits
                })
            })
            .collect();
        let hits: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(hits > 0, "the readers never hit: the test proved nothing");
    }
}
