//! A bounded map from a 64-bit key digest to a small value that stops
//! meaning anything at a known instant. GCRA timestamps, escalation levels,
//! known devices and recent password digests all have that shape.
//!
//! Expired entries are swept out after as many inserts as half the map's
//! size (amortised O(1) per insert); when the map is full of live entries, a
//! few are sampled and the one expiring soonest is evicted.

use std::hash::{BuildHasherDefault, Hasher};

use hashbrown::hash_map::Entry;
use hashbrown::{HashMap, HashSet};

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
    /// Ids changed since the last `take_changes`, for a map that is
    /// persisted (`tracked`); `None` for one that lives in memory only.
    changes: Option<ChangeLog>,
}

/// What changed since the last snapshot. Bounded by the map's cap: past it,
/// writing the whole map costs no more than the list would, so the list is
/// dropped and the next snapshot replaces the whole map.
#[derive(Debug, Default)]
struct ChangeLog {
    ids: HashSet<u64, DigestBuildHasher>,
    whole: bool,
}

impl ChangeLog {
    fn record(&mut self, id: u64, entries_max: usize) {
        if self.whole {
            return;
        }
        self.ids.insert(id);
        if self.ids.len() > entries_max {
            self.whole = true;
            self.ids = HashSet::default();
        }
    }
}

fn record(changes: &mut Option<ChangeLog>, id: u64, entries_max: usize) {
    if let Some(log) = changes {
        log.record(id, entries_max);
    }
}

/// A tracked map's changes since the last call (see `take_changes`).
#[derive(Debug, PartialEq, Eq)]
pub enum Changes<V> {
    /// Each changed id with its live entry, or `None` if it is gone.
    Some(Vec<(u64, Option<Slot<V>>)>),
    /// Too many to list: every live entry, to replace all that was written.
    Whole(Vec<(u64, Slot<V>)>),
}

impl<V: Copy> ExpiringMap<V> {
    pub fn new(entries_max: usize) -> ExpiringMap<V> {
        ExpiringMap { entries_max: entries_max.max(1), inserts_since_sweep: 0, map: HashMap::default(), changes: None }
    }

    /// A map whose changes are kept for `take_changes` (a persisted map).
    pub fn tracked(entries_max: usize) -> ExpiringMap<V> {
        ExpiringMap { changes: Some(ChangeLog::default()), ..ExpiringMap::new(entries_max) }
    }

    /// Every change since the last call, `None` if nothing changed. An
    /// entry expired by now reads as gone.
    pub fn take_changes(&mut self, now_us: u64) -> Option<Changes<V>> {
        let log = self.changes.as_mut()?;
        if log.whole {
            *log = ChangeLog::default();
            return Some(Changes::Whole(self.live(now_us)));
        }
        if log.ids.is_empty() {
            return None;
        }
        let ids = std::mem::take(&mut log.ids);
        Some(Changes::Some(ids.into_iter().map(|id| (id, self.get(id, now_us))).collect()))
    }

    /// Every live entry (a full save).
    pub fn live(&self, now_us: u64) -> Vec<(u64, Slot<V>)> {
        self.iter_live(now_us).collect()
    }

    /// The live entries, in no order.
    pub fn iter_live(&self, now_us: u64) -> impl Iterator<Item = (u64, Slot<V>)> + '_ {
        self.map.iter().filter(move |(_, s)| s.expires_us > now_us).map(|(id, s)| (*id, *s))
    }

    /// Puts back an entry read from the state file: not a change (it is
    /// written already), unless making room evicts another.
    pub fn restore(&mut self, id: u64, slot: Slot<V>, now_us: u64) {
        if slot.expires_us <= now_us {
            return;
        }
        if !self.map.contains_key(&id) {
            self.make_room(now_us);
        }
        self.map.insert(id, slot);
    }

    /// Marks `id` changed, so the next snapshot writes it (or its absence).
    pub fn mark_changed(&mut self, id: u64) {
        record(&mut self.changes, id, self.entries_max);
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
        record(&mut self.changes, id, self.entries_max);
        if slot.expires_us <= now_us {
            self.map.remove(&id);
            return;
        }
        let room = self.room_as_it_is();
        match self.map.entry(id) {
            Entry::Occupied(mut existing) => *existing.get_mut() = slot,
            Entry::Vacant(vacant) if room => {
                self.inserts_since_sweep += 1;
                vacant.insert(slot);
            }
            Entry::Vacant(_) => {
                self.make_room(now_us);
                self.map.insert(id, slot);
            }
        }
    }

    /// Whether one more insert finds room without `make_room` doing more
    /// than count it (no sweep due, no eviction): then the insert takes the
    /// slot its lookup found, one hash probe in all.
    fn room_as_it_is(&self) -> bool {
        self.map.len() < self.entries_max && self.inserts_since_sweep + 1 < SWEEP_INSERTS_MIN.max(self.map.len() / 2)
    }

    /// Sets `id`'s entry like `set`, but never evicts a live entry to make
    /// room: returns false, storing nothing, when the map is full of live
    /// entries (an expired one sampled, or found by a sweep amortised as in
    /// `set`, gives way).
    pub fn set_if_room(&mut self, id: u64, slot: Slot<V>, now_us: u64) -> bool {
        if self.map.len() >= self.entries_max && !self.map.contains_key(&id) {
            self.inserts_since_sweep += 1;
            let expired =
                self.map.iter().take(EVICTION_SAMPLE).find(|(_, s)| s.expires_us <= now_us).map(|(id, _)| *id);
            if let Some(expired) = expired {
                record(&mut self.changes, expired, self.entries_max);
                self.map.remove(&expired);
            } else if self.inserts_since_sweep >= SWEEP_INSERTS_MIN.max(self.map.len() / 2) {
                self.sweep(now_us);
            }
            if self.map.len() >= self.entries_max {
                return false;
            }
        }
        self.set(id, slot, now_us);
        true
    }

    /// Reads and rewrites `id`'s entry in one step: `f` sees the live entry
    /// (if any) and returns what to store (`None` to drop it). One hash
    /// probe, whether the entry is there or not, unless the insert has to
    /// make room first: this is the hot path of every table, and each
    /// check's place goes in and each report's comes out through it.
    pub fn update<R>(&mut self, id: u64, now_us: u64, f: impl FnOnce(Option<Slot<V>>) -> (Option<Slot<V>>, R)) -> R {
        record(&mut self.changes, id, self.entries_max);
        let room = self.room_as_it_is();
        match self.map.entry(id) {
            Entry::Occupied(mut existing) => {
                let live = (existing.get().expires_us > now_us).then_some(*existing.get());
                let (next, result) = f(live);
                match next {
                    Some(slot) if slot.expires_us > now_us => *existing.get_mut() = slot,
                    _ => {
                        existing.remove();
                    }
                }
                result
            }
            Entry::Vacant(vacant) if room => {
                let (next, result) = f(None);
                if let Some(slot) = next.filter(|s| s.expires_us > now_us) {
                    self.inserts_since_sweep += 1;
                    vacant.insert(slot);
                }
                result
            }
            Entry::Vacant(_) => {
                let (next, result) = f(None);
                if let Some(slot) = next.filter(|s| s.expires_us > now_us) {
                    self.make_room(now_us);
                    self.map.insert(id, slot);
                }
                result
            }
        }
    }

    pub fn remove(&mut self, id: u64) -> Option<Slot<V>> {
        record(&mut self.changes, id, self.entries_max);
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
                Some(id) => {
                    record(&mut self.changes, id, self.entries_max);
                    self.map.remove(&id)
                }
                None => break,
            };
        }
    }

    /// Ends every entry's life by `latest_us` at the latest (a reload that
    /// shortened a TTL). A scan: reloads only.
    pub fn cap_expiry(&mut self, latest_us: u64) {
        let (changes, entries_max) = (&mut self.changes, self.entries_max);
        for (id, slot) in self.map.iter_mut() {
            if slot.expires_us > latest_us {
                slot.expires_us = latest_us;
                record(changes, *id, entries_max);
            }
        }
    }

    /// Drops every expired entry (a scan: maintenance and amortised inserts
    /// only, never per request).
    pub fn sweep(&mut self, now_us: u64) {
        self.inserts_since_sweep = 0;
        let (changes, entries_max) = (&mut self.changes, self.entries_max);
        self.map.retain(|id, slot| {
            let live = slot.expires_us > now_us;
            if !live {
                record(changes, *id, entries_max);
            }
            live
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `update` as it was before its one-probe paths: a lookup, then an
    /// insert or a remove that probes again.
    fn update_probing_twice(
        m: &mut ExpiringMap<u32>,
        id: u64,
        now_us: u64,
        f: impl FnOnce(Option<Slot<u32>>) -> (Option<Slot<u32>>, Option<u32>),
    ) -> Option<u32> {
        record(&mut m.changes, id, m.entries_max);
        if let Some(existing) = m.map.get_mut(&id) {
            let live = (existing.expires_us > now_us).then_some(*existing);
            let (next, result) = f(live);
            match next {
                Some(slot) if slot.expires_us > now_us => *existing = slot,
                _ => {
                    m.map.remove(&id);
                }
            }
            return result;
        }
        let (next, result) = f(None);
        if let Some(slot) = next.filter(|s| s.expires_us > now_us) {
            m.make_room(now_us);
            m.map.insert(id, slot);
        }
        result
    }

    /// `set` as it was: a lookup, then an insert that probes again.
    fn set_probing_twice(m: &mut ExpiringMap<u32>, id: u64, slot: Slot<u32>, now_us: u64) {
        record(&mut m.changes, id, m.entries_max);
        if slot.expires_us <= now_us {
            m.map.remove(&id);
            return;
        }
        if let Some(existing) = m.map.get_mut(&id) {
            *existing = slot;
            return;
        }
        m.make_room(now_us);
        m.map.insert(id, slot);
    }

    proptest! {
        /// At and past the cap, through every way in: the map never holds
        /// more than its cap, and every id whose live entry changed is in
        /// the change log.
        #[test]
        fn at_the_cap_every_change_is_recorded(
            cap in 2usize..12,
            ops in proptest::collection::vec((0u64..40, 0u64..3, 0u64..50, 0u8..4), 1..3000),
        ) {
            let mut m: ExpiringMap<u32> = ExpiringMap::tracked(cap);
            let mut now = 0;
            for (id, step, ttl, op) in ops {
                now += step;
                let before: Vec<_> = (0..40).map(|i| m.get(i, now)).collect();
                match op {
                    0 => m.update(id, now, |live| (live.map(|s| Slot { value: s.value + 1, ..s }), ())),
                    1 => m.update(id, now, |live| {
                        (Some(Slot { expires_us: now + ttl, value: live.map_or(0, |s| s.value) + 1 }), ())
                    }),
                    2 => m.set(id, Slot { expires_us: now + ttl, value: id as u32 }, now),
                    _ => {
                        m.set_if_room(id, Slot { expires_us: now + ttl, value: 9 }, now);
                    }
                }
                prop_assert!(m.len() <= m.entries_max());
                let after: Vec<_> = (0..40).map(|i| m.get(i, now)).collect();
                match m.take_changes(now) {
                    Some(Changes::Whole(_)) => {}
                    Some(Changes::Some(list)) => {
                        for i in 0..40u64 {
                            if before[i as usize] != after[i as usize] {
                                prop_assert!(list.iter().any(|(k, _)| *k == i), "id {} changed unrecorded", i);
                            }
                        }
                    }
                    None => prop_assert_eq!(before, after),
                }
            }
        }

        /// Through its sweeps, `update` and `set` leave the map as their
        /// two-probe versions did, and `update` returns what it did. Below its cap: which entry
        /// an eviction picks depends on the table's layout, which the two
        /// grow into differently (`a_full_map_stays_within_its_cap` holds
        /// the cap).
        #[test]
        fn one_probe_does_what_two_probes_did(
            cap in 48usize..64,
            ops in proptest::collection::vec((0u64..48, 0u64..3, 0u64..50, 0u8..3), 1..2500),
        ) {
            let (mut fast, mut slow) = (ExpiringMap::new(cap), ExpiringMap::new(cap));
            let mut now = 0;
            for (id, step, ttl, op) in ops {
                now += step;
                let f = |live: Option<Slot<u32>>| {
                    let seen = live.map(|s| s.value);
                    let next = (op == 1).then(|| Slot { expires_us: now + ttl, value: seen.unwrap_or(0) + 1 });
                    (next, seen)
                };
                if op == 2 {
                    let slot = Slot { expires_us: now + ttl, value: id as u32 };
                    fast.set(id, slot, now);
                    set_probing_twice(&mut slow, id, slot, now);
                } else {
                    prop_assert_eq!(fast.update(id, now, f), update_probing_twice(&mut slow, id, now, f));
                }
                prop_assert_eq!(fast.inserts_since_sweep, slow.inserts_since_sweep);
                let (mut a, mut b): (Vec<_>, Vec<_>) = (
                    fast.map.iter().map(|(k, s)| (*k, s.expires_us, s.value)).collect(),
                    slow.map.iter().map(|(k, s)| (*k, s.expires_us, s.value)).collect(),
                );
                a.sort_unstable();
                b.sort_unstable();
                prop_assert_eq!(a, b);
            }
        }
    }

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
    fn set_if_room_never_evicts_a_live_entry() {
        let mut map = ExpiringMap::new(4);
        for id in 0..4u64 {
            assert!(map.set_if_room(id, Slot { expires_us: 100, value: id }, 0));
        }
        assert!(!map.set_if_room(9, Slot { expires_us: 100, value: 9 }, 50), "full of live entries");
        assert!(map.set_if_room(2, Slot { expires_us: 200, value: 2 }, 50), "an existing id is updated");
        assert_eq!((0..4).filter(|id| map.get(*id, 50).is_some()).count(), 4);
        assert!(map.set_if_room(9, Slot { expires_us: 300, value: 9 }, 150), "expired entries give way");
        assert_eq!(map.get(9, 150).map(|s| s.value), Some(9));
        assert_eq!(map.get(2, 150).map(|s| s.value), Some(2));
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

    #[test]
    fn a_tracked_map_lists_its_changes_then_replaces_itself_whole_past_its_cap() {
        let mut map = ExpiringMap::tracked(4);
        assert_eq!(map.take_changes(0), None);
        map.set(1, Slot { expires_us: 100, value: 1u16 }, 0);
        map.set(2, Slot { expires_us: 100, value: 2 }, 0);
        map.remove(2);
        let Some(Changes::Some(mut changes)) = map.take_changes(0) else { panic!("changes") };
        changes.sort_by_key(|(id, _)| *id);
        assert_eq!(changes, vec![(1, Some(Slot { expires_us: 100, value: 1 })), (2, None)]);
        assert_eq!(map.take_changes(0), None, "taken once");
        map.restore(3, Slot { expires_us: 100, value: 3 }, 0);
        assert_eq!(map.take_changes(0), None, "a restored entry is on disk already");
        for id in 10..20 {
            map.set(id, Slot { expires_us: 100, value: 0 }, 0);
        }
        let Some(Changes::Whole(all)) = map.take_changes(0) else { panic!("whole") };
        assert!(all.len() <= 4, "{all:?}");
        assert!(ExpiringMap::<u16>::new(4).take_changes(0).is_none(), "untracked");
    }
}
