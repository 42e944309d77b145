//! A bounded map from a 64-bit key digest to a small value that stops
//! meaning anything at a known instant. GCRA timestamps, escalation levels,
//! known devices and recent password digests all have that shape.
//!
//! Expired entries are swept out after as many inserts as half the map's
//! size (amortised O(1) per insert); when the map is full of live entries, a
//! few are sampled and the one expiring soonest is evicted.

use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::HashMap;

/// A map sweeps out expired entries after this many inserts, or after as
/// many inserts as half its size if larger.
pub const SWEEP_INSERTS_MIN: usize = 1024;
/// When full of live entries, this many are sampled and the one expiring
/// soonest (least information) is evicted.
pub const EVICTION_SAMPLE: usize = 8;

/// Passes a key digest's (already uniformly random) bits through as the
/// hash: an attacker without the secret cannot aim at a bucket.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot<V> {
    pub expires_us: u64,
    pub value: V,
}

#[derive(Debug)]
pub struct ExpiringMap<V: Copy> {
    entries_max: usize,
    inserts_since_sweep: usize,
    map: HashMap<u64, Slot<V>, DigestBuildHasher>,
}

impl<V: Copy> ExpiringMap<V> {
    pub fn new(entries_max: usize) -> ExpiringMap<V> {
        ExpiringMap { entries_max: entries_max.max(1), inserts_since_sweep: 0, map: HashMap::default() }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// A new cap (at reload); an over-full map shrinks as it is used.
    pub fn set_entries_max(&mut self, entries_max: usize) {
        self.entries_max = entries_max.max(1);
    }

    /// The live entry for `id`, if any.
    pub fn get(&self, id: u64, now_us: u64) -> Option<Slot<V>> {
        self.map.get(&id).copied().filter(|s| s.expires_us > now_us)
    }

    /// Sets `id`'s entry; an entry that expires at or before now is removed
    /// instead, since it carries no information.
    pub fn set(&mut self, id: u64, slot: Slot<V>, now_us: u64) {
        if slot.expires_us <= now_us {
            self.map.remove(&id);
            return;
        }
        if let Some(existing) = self.map.get_mut(&id) {
            *existing = slot;
            return;
        }
        self.make_room(now_us);
        self.map.insert(id, slot);
    }

    /// Reads and rewrites `id`'s entry in one step: `f` sees the live entry
    /// (if any) and returns what to store (`None` to drop it). One hash
    /// probe when the key is present, which is the hot path of every table.
    pub fn update<R>(&mut self, id: u64, now_us: u64, f: impl FnOnce(Option<Slot<V>>) -> (Option<Slot<V>>, R)) -> R {
        if let Some(existing) = self.map.get_mut(&id) {
            let live = (existing.expires_us > now_us).then_some(*existing);
            let (next, result) = f(live);
            match next {
                Some(slot) if slot.expires_us > now_us => *existing = slot,
                _ => {
                    self.map.remove(&id);
                }
            }
            return result;
        }
        let (next, result) = f(None);
        if let Some(slot) = next.filter(|s| s.expires_us > now_us) {
            self.make_room(now_us);
            self.map.insert(id, slot);
        }
        result
    }

    pub fn remove(&mut self, id: u64) -> Option<Slot<V>> {
        self.map.remove(&id)
    }

    fn make_room(&mut self, now_us: u64) {
        self.inserts_since_sweep += 1;
        if self.inserts_since_sweep >= SWEEP_INSERTS_MIN.max(self.map.len() / 2) {
            self.sweep(now_us);
        }
        while self.map.len() >= self.entries_max {
            // The first few in iteration order: the same buckets each time,
            // but the keys in them are keyed digests, so which entries those
            // are is not up to a client.
            let victim =
                self.map.iter().take(EVICTION_SAMPLE).min_by_key(|(_, slot)| slot.expires_us).map(|(id, _)| *id);
            match victim {
                Some(id) => self.map.remove(&id),
                None => break,
            };
        }
    }

    /// Drops every expired entry (a scan: maintenance and amortised inserts
    /// only, never per request).
    pub fn sweep(&mut self, now_us: u64) {
        self.inserts_since_sweep = 0;
        self.map.retain(|_, slot| slot.expires_us > now_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_entries_read_as_absent_and_are_swept() {
        let mut map = ExpiringMap::new(1_000_000);
        map.set(1, Slot { expires_us: 100, value: 7u16 }, 0);
        assert_eq!(map.get(1, 99).map(|s| s.value), Some(7));
        assert_eq!(map.get(1, 100), None);
        for id in 2..(SWEEP_INSERTS_MIN as u64 * 3) {
            map.set(id, Slot { expires_us: id * 10 + 5, value: 0 }, id * 10);
        }
        assert!(map.len() <= SWEEP_INSERTS_MIN, "len {}", map.len());
    }

    #[test]
    fn a_full_map_stays_within_its_cap() {
        let mut map = ExpiringMap::new(100);
        for id in 0..10_000u64 {
            map.set(id.wrapping_mul(0x9E37_79B9_7F4A_7C15), Slot { expires_us: u64::MAX, value: () }, 0);
            assert!(map.len() <= 100);
        }
        map.set_entries_max(10);
        map.set(1, Slot { expires_us: u64::MAX, value: () }, 0);
        assert!(map.len() <= 10);
    }
}
