//! Sharded tables: each shard behind its own mutex on its own cache lines,
//! and the builders that keep a running table across a reload.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::expiring::ExpiringMap;
use crate::gcra::{GcraDecision, GcraSpec, GcraTable};
use crate::keys::Key;
use crate::tat_table::SlotHint;
use crate::unpoisoned::Unpoisoned;

/// Shards per table: a power of two a little above the core count times a
/// few, so that concurrent requests rarely meet on one lock.
pub const SHARDS: usize = 16;
const _: () = assert!(SHARDS.is_power_of_two());

pub(super) struct Shards<T>(Box<[Shard<T>]>);

/// A shard's lock on a cache line pair of its own: shards side by side
/// shared lines, and two cores locking neighbouring shards bounced them
/// (a tenth of a check's time in the lock's compare-and-swap).
///
/// A rate table's shard also publishes where its slots are, so a planned
/// check can prefetch its slot without the lock (a stale address after a
/// rebuild only wastes the hint).
#[repr(align(128))]
pub(super) struct Shard<T>(Mutex<T>, SlotHint);

impl<T> Shards<T> {
    pub(super) fn new(total_entries_max: usize, make: impl Fn(usize) -> T) -> Shards<T> {
        let per_shard = total_entries_max.div_ceil(SHARDS);
        Shards((0..SHARDS).map(|_| Shard(Mutex::new(make(per_shard)), SlotHint::default())).collect())
    }

    pub(super) fn shard(&self, bits: u64) -> &Shard<T> {
        &self.0[shard_index(bits)]
    }

    pub(super) fn of_bits(&self, bits: u64) -> MutexGuard<'_, T> {
        lock(self.shard(bits))
    }

    pub(super) fn of(&self, key: Key) -> MutexGuard<'_, T> {
        self.of_bits(key.tuple)
    }

    /// The shard at `index` (0..SHARDS), locked: for work done one shard
    /// at a time (sweeps, restores filed by shard).
    pub(super) fn at(&self, index: usize) -> MutexGuard<'_, T> {
        lock(&self.0[index])
    }

    pub(super) fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.0.iter().map(lock)
    }
}

impl Shards<GcraTable> {
    /// One GCRA step for `key`, spending when allowed.
    pub(super) fn check(&self, spec: GcraSpec, key: Key, now_us: u64) -> GcraDecision {
        let shard = self.shard(key.tuple);
        let mut table = lock(shard);
        let decision = table.check(spec, key, now_us, true);
        table.publish_slots(&shard.1);
        decision
    }

    pub(super) fn prefetch(&self, key: Key) {
        self.shard(key.tuple).1.prefetch(key.hash_bits());
    }
}

/// A poisoned shard means a panic mid-step, a bug; the table itself is still
/// consistent at every await-free step boundary, so keep serving.
pub(super) fn lock<T>(shard: &Shard<T>) -> MutexGuard<'_, T> {
    shard.0.locked()
}

/// Which shard holds `bits`: the middle bits, since the tables hash with
/// the low (bucket) and top (tag) bits.
pub(super) fn shard_index(bits: u64) -> usize {
    (bits >> 32) as usize & (SHARDS - 1)
}

pub(super) type SharedTable<T> = Arc<Shards<T>>;

/// A route's bounded map: the running one with the new cap, or a new one.
pub(super) fn expiring_table<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
) -> SharedTable<ExpiringMap<V>> {
    expiring_table_made(old, entries_max, ExpiringMap::new)
}

/// A persisted map: like `expiring_table`, with a change list.
pub(super) fn expiring_table_tracked<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
) -> SharedTable<ExpiringMap<V>> {
    expiring_table_made(old, entries_max, ExpiringMap::tracked)
}

pub(super) fn expiring_table_made<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
    make: fn(usize) -> ExpiringMap<V>,
) -> SharedTable<ExpiringMap<V>> {
    match old {
        Some(old) => reuse(old, entries_max, |t, cap| t.set_entries_max(cap)),
        None => Arc::new(Shards::new(entries_max, make)),
    }
}

/// Keeps an existing sharded table, applying a new total cap to each shard.
pub(super) fn reuse<T>(
    shards: &SharedTable<T>,
    total_entries_max: usize,
    apply: impl Fn(&mut T, usize),
) -> SharedTable<T> {
    let per_shard = total_entries_max.div_ceil(SHARDS);
    for mut t in shards.each() {
        apply(&mut t, per_shard);
    }
    shards.clone()
}
