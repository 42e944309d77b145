//! FailureWindowTable: failure counts per key in a sliding window, with a
//! fixed-size entry per key, a hard cap on entries, and expiry and eviction
//! from lists ordered by window start, so no operation scans the table.
//!
//! Counting: windows are aligned to multiples of the window length. An entry
//! keeps the count of the current window and of the previous one; the count
//! at time t is `previous × (1 − elapsed/window) + current`. A key is *locked*
//! while that estimate is at least the threshold, so a burst that straddles a
//! boundary cannot reach twice the threshold: after the boundary, failures
//! are admitted only as fast as the previous window's weight drains.
//!
//! Our own code because this table *is* the product: no crate offers a
//! bounded sliding-window counter with information-ordered eviction.

use hashbrown::HashTable;

use crate::expiring::{ExpiringMap, Slot as ExpiringSlot};
use crate::keys::Key;
use crate::overflow::OverflowSketch;

/// Highest threshold a rule may have. Eviction looks for the lowest non-empty
/// count class, so this bounds the work of one insert into a full table.
pub const THRESHOLD_MAX: u32 = 1000;
/// Shortest window a rule may have: windows are indexed in u32 seconds-ish
/// units, and shorter windows make no sense for failures anyway.
pub const WINDOW_US_MIN: u64 = 1_000_000;

const NIL: u32 = u32::MAX;
/// Entries of the top count class examined for an unlocked one when a full
/// table needs room: bounds the work of one insert.
pub const TOP_CLASS_EVICTION_SCAN: usize = 64;

/// Window length and threshold of one failure rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub window_us: u64,
    pub threshold: u32,
}

/// What one entry knows: the window it was last written in and two counts.
/// Twelve bytes; the whole persisted state of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counts {
    /// Index of the window `current` counts (`start_us / window_us`).
    pub window: u32,
    pub previous: u32,
    pub current: u32,
}

impl WindowSpec {
    pub fn window_index(self, now_us: u64) -> u32 {
        (now_us / self.window_us).min(u32::MAX as u64) as u32
    }

    /// The counts as seen from `now_us`'s window.
    pub fn rolled(self, counts: Counts, now_us: u64) -> Counts {
        let now = self.window_index(now_us);
        if now <= counts.window {
            counts
        } else if now == counts.window + 1 {
            Counts { window: now, previous: counts.current, current: 0 }
        } else {
            Counts { window: now, previous: 0, current: 0 }
        }
    }

    /// Estimate × window_us, in integers so that comparisons are exact.
    pub fn weighted(self, counts: Counts, now_us: u64) -> u128 {
        let c = self.rolled(counts, now_us);
        let elapsed = now_us.saturating_sub(c.window as u64 * self.window_us).min(self.window_us);
        c.previous as u128 * (self.window_us - elapsed) as u128 + c.current as u128 * self.window_us as u128
    }

    /// The sliding-window count, rounded up.
    pub fn estimate(self, counts: Counts, now_us: u64) -> u32 {
        self.weighted(counts, now_us).div_ceil(self.window_us as u128).min(u32::MAX as u128) as u32
    }

    /// The sliding-window count rounded down: what an entry re-dated to a
    /// new window length carries as its count. Rounding down keeps a key
    /// locked exactly when it was (locked means weighted ≥ threshold × W,
    /// so floor(weighted / W) ≥ threshold); rounding up would lock a key
    /// that sat at 4.5 of 5.
    pub fn whole_failures(self, counts: Counts, now_us: u64) -> u32 {
        (self.weighted(counts, now_us) / self.window_us as u128).min(u32::MAX as u128) as u32
    }

    pub fn is_locked(self, counts: Counts, now_us: u64) -> bool {
        self.weighted(counts, now_us) >= self.threshold as u128 * self.window_us as u128
    }

    /// Failures that may still be reported before the key locks.
    pub fn remaining(self, counts: Counts, now_us: u64) -> u32 {
        self.threshold.saturating_sub(self.estimate(counts, now_us))
    }

    /// Whether a check is refused: the failures counted plus the attempts
    /// in flight (each presumed to fail) reach the threshold. With nothing
    /// in flight this is `is_locked`.
    pub fn refuses(self, counts: Counts, in_flight: u32, now_us: u64) -> bool {
        let presumed = self.weighted(counts, now_us) + in_flight as u128 * self.window_us as u128;
        presumed >= self.threshold as u128 * self.window_us as u128
    }

    /// Attempts this rule would still admit: the threshold less the
    /// sliding-window failures (rounded up) and the attempts in flight.
    pub fn admits_remaining(self, counts: Counts, in_flight: u32, now_us: u64) -> u32 {
        self.remaining(counts, now_us).saturating_sub(in_flight)
    }

    /// The first instant at which the key is not locked, if no further
    /// failure arrives (`now_us` itself when it is not locked now).
    pub fn unlocks_at(self, counts: Counts, now_us: u64) -> u64 {
        if !self.is_locked(counts, now_us) {
            return now_us;
        }
        let c = self.rolled(counts, now_us);
        let w = self.window_us as u128;
        let t = self.threshold as u128;
        let start = c.window as u64 * self.window_us;
        // In this window: locked while previous·(W−e) ≥ (T−current)·W,
        // i.e. until e = W − ceil((T−current)·W / previous) + 1.
        if (c.current as u128) < t {
            let need = (t - c.current as u128) * w;
            let e = w - need.div_ceil(c.previous as u128) + 1;
            return start + e as u64;
        }
        // Otherwise through this window, then current becomes previous.
        let need = t * w;
        let e = w - need.div_ceil(c.current as u128) + 1;
        start + self.window_us + e as u64
    }

    /// When the entry stops carrying any count (both windows over).
    pub fn expires_at(self, counts: Counts) -> u64 {
        (counts.window as u64 + 2) * self.window_us
    }

    fn is_expired(self, counts: Counts, now_index: u32) -> bool {
        counts.window as u64 + 2 <= now_index as u64
    }
}

/// One slot of the slab: the key, its counts, and its place in a list.
/// 40 bytes; `Key` is stored as two u64 so the slot is 8-aligned.
#[derive(Clone, Copy, Debug)]
struct Slot {
    key: Key,
    counts: Counts,
    prev: u32,
    next: u32,
    /// Which list the slot is on: `min(previous + current, threshold)` at its
    /// last write. The free list is class 0.
    class: u16,
    /// Changed since the last `take_changes`.
    dirty: bool,
    /// A copy is on disk (or queued for it), so removing the entry is a
    /// change to persist. Entries born and gone between two snapshots (a
    /// flood of one-off keys) never cost the writer anything.
    persisted: bool,
}

#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List { head: NIL, tail: NIL };

/// What `record_failure` saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub counts: Counts,
    pub was_locked: bool,
    pub now_locked: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    #[error("table full: every one of its {0} entries is locked")]
    FullOfLockouts(usize),
}

/// Places a key's attempts in flight hold, each timed on its own: up to
/// `PLACES_TIMED` by their own lapse instant, and any beyond that (more
/// attempts at once than any default threshold but the account ceiling
/// admits) together, lapsing with the newest of them.
pub const PLACES_TIMED: usize = 8;

/// The places of one key (see `PLACES_TIMED`). A report releases the newest
/// live place, so a place whose report never comes (a crashed handler)
/// keeps its own lapse instant however busy the key stays: an older place
/// is never renewed by newer attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Places {
    /// Lapse instants; 0 or past means the cell is free.
    until_us: [u64; PLACES_TIMED],
    /// Places beyond the timed ones, lapsing together at `more_until_us`.
    more: u32,
    more_until_us: u64,
}

impl Places {
    pub fn live(&self, now_us: u64) -> u32 {
        let timed = self.until_us.iter().filter(|u| **u > now_us).count() as u32;
        timed + if self.more_until_us > now_us { self.more } else { 0 }
    }

    /// When the first live place lapses (`now_us` if none is live).
    pub fn first_lapse(&self, now_us: u64) -> u64 {
        let more = (self.more > 0 && self.more_until_us > now_us).then_some(self.more_until_us);
        self.until_us.iter().copied().filter(|u| *u > now_us).chain(more).min().unwrap_or(now_us)
    }

    /// When the last live place lapses: the map entry's own expiry.
    fn last_lapse(&self, now_us: u64) -> u64 {
        let more = if self.more > 0 { self.more_until_us } else { 0 };
        self.until_us.iter().copied().chain([more]).max().unwrap_or(0).max(now_us)
    }

    fn take(&mut self, until_us: u64, now_us: u64) {
        if let Some(free) = self.until_us.iter_mut().find(|u| **u <= now_us) {
            *free = until_us;
            return;
        }
        if self.more_until_us <= now_us {
            self.more = 0;
        }
        self.more = self.more.saturating_add(1);
        self.more_until_us = until_us;
    }

    /// Releases the newest live place, if any.
    fn release(&mut self, now_us: u64) {
        if self.more > 0 && self.more_until_us > now_us {
            self.more -= 1;
            return;
        }
        if let Some(newest) = self.until_us.iter_mut().filter(|u| **u > now_us).max_by_key(|u| **u) {
            *newest = 0;
        }
    }
}

/// What a key looks like to a check: its counts and the attempts admitted
/// on it that have not been reported yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    pub counts: Counts,
    pub in_flight: u32,
    /// When the first of the places in flight lapses if no report settles
    /// it (`now` when none is held).
    pub in_flight_until_us: u64,
}

/// A change to persist: the key's counts now, or `None` when it is gone.
pub type Change = (Key, Option<Counts>);

/// Failure counts per key. See the module doc for the counting rule.
///
/// Every live entry sits on exactly one list, chosen by its count class;
/// entries join the tail when written, so each list is ordered by the window
/// they were last written in. Expiry pops heads; eviction takes the head of
/// the lowest class (fewest failures, oldest), and never an entry that is
/// locked.
#[derive(Debug)]
pub struct FailureWindowTable {
    spec: WindowSpec,
    entries_max: usize,
    slots: Vec<Slot>,
    free_head: u32,
    index: HashTable<u32>,
    lists: Vec<List>,
    len: usize,
    /// Slots written since the last `take_changes`: an index, not a key, so
    /// a snapshot interval's worth of changes costs 4 bytes each, not 16. A
    /// slot freed and reused in one interval may be listed twice; the
    /// second sighting finds it clean.
    changed: Vec<u32>,
    /// Persisted keys removed since the last `take_changes`.
    removed: Vec<Key>,
    refused_full: u64,
    /// Attempts admitted by `check` and not yet settled by a report, per
    /// key (by its tuple digest): each holds a place against the threshold,
    /// so parallel attempts cannot all read "4 of 5" and all proceed. Each
    /// place lapses `attempt_timeout_us` after its own check (see
    /// `Places`). Bounded like the table, and a live place is never evicted
    /// for another key's: when the map is full of them, an attempt that
    /// finds no room is counted as a failure at once (`presumed`), which
    /// errs towards refusing. Never persisted (a restart forgets attempts,
    /// not their reported failures).
    in_flight: ExpiringMap<Places>,
    /// Checks admitted with no room for their place, counted as failures.
    presumed: u64,
    /// Failures of keys the table could not hold (full of lockouts), made
    /// at the first such failure.
    overflow: Option<Box<OverflowSketch>>,
}

impl FailureWindowTable {
    pub fn new(spec: WindowSpec, entries_max: usize) -> FailureWindowTable {
        assert!(spec.threshold >= 1 && spec.threshold <= THRESHOLD_MAX, "validated by config");
        assert!(spec.window_us >= WINDOW_US_MIN, "validated by config");
        FailureWindowTable {
            spec,
            entries_max: entries_max.max(1),
            slots: Vec::new(),
            free_head: NIL,
            index: HashTable::new(),
            lists: vec![EMPTY; spec.threshold as usize + 1],
            len: 0,
            changed: Vec::new(),
            removed: Vec::new(),
            refused_full: 0,
            in_flight: ExpiringMap::new(entries_max),
            presumed: 0,
            overflow: None,
        }
    }

    pub fn spec(&self) -> WindowSpec {
        self.spec
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// Failures the table could not hold because it was full of lockouts
    /// (each counted in the overflow sketch instead).
    pub fn refused_full(&self) -> u64 {
        self.refused_full
    }

    fn find(&self, key: Key) -> Option<u32> {
        let slots = &self.slots;
        self.index.find(key.hash_bits(), |&i| slots[i as usize].key == key).copied()
    }

    /// The key's counts as of `now_us` (zero when absent or expired).
    pub fn get(&self, key: Key, now_us: u64) -> Counts {
        match self.find(key) {
            Some(i) => self.spec.rolled(self.slots[i as usize].counts, now_us),
            None => Counts { window: self.spec.window_index(now_us), ..Counts::default() },
        }
    }

    /// The key's counts and attempts in flight as of `now_us`. Once the
    /// table has overflowed, a key's failures are those of its entry plus
    /// those spilled to the overflow sketch (each failure is in one of
    /// them; the sketch only adds).
    pub fn standing(&self, key: Key, now_us: u64) -> Standing {
        self.standing_and_places(key, now_us).0
    }

    /// `standing`, and the places it read (one probe of each map).
    fn standing_and_places(&self, key: Key, now_us: u64) -> (Standing, Places) {
        let places = self.in_flight.get(key.tuple, now_us).map(|s| s.value).unwrap_or_default();
        let mut counts = self.get(key, now_us);
        if let Some(sketch) = &self.overflow {
            let spilled = sketch.counts(self.spec, key, now_us);
            counts.previous = counts.previous.saturating_add(spilled.previous);
            counts.current = counts.current.saturating_add(spilled.current);
        }
        (Standing { counts, in_flight: places.live(now_us), in_flight_until_us: places.first_lapse(now_us) }, places)
    }

    /// `check` on this rule, in one step: admits the attempt unless the
    /// failures plus the attempts already in flight reach the threshold,
    /// and an admitted attempt takes a place until `settle` or
    /// `timeout_us` from now. Returns whether it was admitted and the
    /// standing after it.
    pub fn admit(&mut self, key: Key, now_us: u64, timeout_us: u64) -> (bool, Standing) {
        let (before, mut places) = self.standing_and_places(key, now_us);
        if self.spec.refuses(before.counts, before.in_flight, now_us) {
            return (false, before);
        }
        places.take(now_us.saturating_add(timeout_us.max(1)), now_us);
        let slot = ExpiringSlot { expires_us: places.last_lapse(now_us), value: places };
        if !self.in_flight.set_if_room(key.tuple, slot, now_us) {
            // Full of live places: the attempt is counted as a failure now,
            // and its report, finding no place, counts again (a success
            // clears what it clears). Over-counting, only under a flood.
            self.presumed += 1;
            if self.record_failure(key, now_us).is_err() {
                self.count_overflow(key, now_us);
            }
            return (true, self.standing(key, now_us));
        }
        let after =
            Standing { in_flight: places.live(now_us), in_flight_until_us: places.first_lapse(now_us), ..before };
        (true, after)
    }

    /// Releases the newest of the key's places in flight (its report
    /// arrived, or the check was refused by another rule); none held is
    /// fine (a report after its place lapsed, or without a check).
    pub fn settle(&mut self, key: Key, now_us: u64) {
        self.in_flight.update(key.tuple, now_us, |held| match held {
            Some(mut slot) => {
                slot.value.release(now_us);
                let live = slot.value.live(now_us) > 0;
                slot.expires_us = slot.value.last_lapse(now_us);
                (live.then_some(slot), ())
            }
            None => (None, ()),
        });
    }

    /// Checks admitted when the map of places was full of live ones, each
    /// counted as a failure at once (in `status`, with `refused_full`).
    pub fn presumed_failures(&self) -> u64 {
        self.presumed
    }

    /// Counts a failure that `record_failure` could not (the table full of
    /// lockouts) in the overflow sketch.
    /// Spilled failures are in memory only, and neither a success nor an
    /// unlock clears them: they drain with their window.
    pub fn count_overflow(&mut self, key: Key, now_us: u64) {
        let spec = self.spec;
        let entries_max = self.entries_max;
        self.overflow.get_or_insert_with(|| Box::new(OverflowSketch::new(entries_max))).record(spec, key, now_us);
    }

    /// Counts one failure for `key`, in one step.
    pub fn record_failure(&mut self, key: Key, now_us: u64) -> Result<Recorded, TableError> {
        let (i, before) = match self.find(key) {
            Some(i) => (i, self.slots[i as usize].counts),
            None => (self.insert(key, now_us)?, Counts::default()),
        };
        let was_locked = self.spec.is_locked(before, now_us);
        let mut counts = self.spec.rolled(before, now_us);
        counts.current = counts.current.saturating_add(1);
        self.write(i, counts);
        Ok(Recorded { counts, was_locked, now_locked: self.spec.is_locked(counts, now_us) })
    }

    /// Removes the key's entry (a success, or an operator's unlock).
    pub fn clear(&mut self, key: Key) -> Option<Counts> {
        let i = self.find(key)?;
        let counts = self.slots[i as usize].counts;
        self.remove(i);
        Some(counts)
    }

    /// Puts back a persisted entry at start; true if it is live. An entry
    /// already expired is not restored but listed as removed, so the next
    /// snapshot deletes its row (otherwise rows that expire while the daemon
    /// is down would stay in the file for good). Callers restore in window
    /// order so lists stay ordered.
    pub fn restore(&mut self, key: Key, counts: Counts, now_us: u64) -> Result<bool, TableError> {
        if self.spec.is_expired(counts, self.spec.window_index(now_us)) || counts.previous + counts.current == 0 {
            self.removed.push(key);
            return Ok(false);
        }
        let i = match self.find(key) {
            Some(i) => i,
            None => self.insert(key, now_us)?,
        };
        self.write(i, counts);
        self.mark_persisted(key);
        Ok(true)
    }

    /// Drops places that lapsed: a scan, for maintenance only (the map
    /// also sweeps itself, amortised, as it fills).
    pub fn sweep_places(&mut self, now_us: u64) {
        self.in_flight.sweep(now_us);
    }

    /// Drops entries whose windows are both over. Pops list heads only.
    pub fn expire(&mut self, now_us: u64) -> usize {
        let now_index = self.spec.window_index(now_us);
        let mut dropped = 0;
        for class in 1..self.lists.len() {
            loop {
                let head = self.lists[class].head;
                if head == NIL || !self.spec.is_expired(self.slots[head as usize].counts, now_index) {
                    break;
                }
                self.remove(head);
                dropped += 1;
            }
        }
        dropped
    }

    /// Entries that are locked at `now_us`. Only the top class can be locked
    /// (a locked estimate implies previous + current ≥ threshold), so this
    /// walks that list alone.
    pub fn locked(&self, now_us: u64) -> impl Iterator<Item = (Key, Counts)> + '_ {
        let top = self.lists.len() - 1;
        let mut at = self.lists[top].head;
        std::iter::from_fn(move || {
            while at != NIL {
                let slot = &self.slots[at as usize];
                at = slot.next;
                if self.spec.is_locked(slot.counts, now_us) {
                    return Some((slot.key, slot.counts));
                }
            }
            None
        })
    }

    /// Every live entry (for operators' bulk operations, never per request).
    pub fn entries(&self) -> impl Iterator<Item = (Key, Counts)> + '_ {
        self.lists[1..].iter().flat_map(move |list| {
            let mut at = list.head;
            std::iter::from_fn(move || {
                if at == NIL {
                    return None;
                }
                let slot = &self.slots[at as usize];
                at = slot.next;
                Some((slot.key, slot.counts))
            })
        })
    }

    /// What changed since the last call, to be applied in order: removals
    /// of persisted keys first, then each written key still present with its
    /// counts now. The persistence layer writes these.
    pub fn take_changes(&mut self) -> Vec<Change> {
        // A removed key that is back (re-inserted, perhaps already written
        // durably as a new lockout) must not be deleted after that write:
        // its current counts, if unwritten, follow as an upsert.
        let removed = std::mem::take(&mut self.removed);
        let mut out: Vec<Change> =
            removed.into_iter().filter(|key| self.find(*key).is_none()).map(|key| (key, None)).collect();
        for i in std::mem::take(&mut self.changed) {
            // A freed slot is never dirty (see `remove`).
            let slot = &mut self.slots[i as usize];
            if slot.dirty {
                slot.dirty = false;
                slot.persisted = true;
                out.push((slot.key, Some(slot.counts)));
            }
        }
        out
    }

    /// Every live entry, for rewriting the state file from memory; pending
    /// changes are dropped (the entries supersede them) and every entry
    /// counts as persisted from now on.
    pub fn full_snapshot(&mut self) -> Vec<Change> {
        self.changed.clear();
        self.removed.clear();
        let mut out = Vec::with_capacity(self.len);
        for list in 1..self.lists.len() {
            let mut at = self.lists[list].head;
            while at != NIL {
                let slot = &mut self.slots[at as usize];
                slot.dirty = false;
                slot.persisted = true;
                out.push((slot.key, Some(slot.counts)));
                at = slot.next;
            }
        }
        out
    }

    /// Records that the key's current counts were written elsewhere (a
    /// lockout written synchronously): the next snapshot skips it, and its
    /// removal will be persisted.
    pub fn mark_persisted(&mut self, key: Key) {
        if let Some(i) = self.find(key) {
            let slot = &mut self.slots[i as usize];
            slot.dirty = false;
            slot.persisted = true;
        }
    }

    /// Marks an entry as changed since it was last written, so the next
    /// snapshot writes it (a restored row that was re-dated at start).
    pub fn mark_unwritten(&mut self, key: Key) {
        if let Some(i) = self.find(key) {
            let slot = &mut self.slots[i as usize];
            if !slot.dirty {
                slot.dirty = true;
                self.changed.push(i);
            }
        }
    }

    /// Applies new limits at a reload; entries keep their counts. With a new
    /// window length each entry is re-dated to the current window with its
    /// estimate (rounded down, see `whole_failures`) as its count, so a reload neither invents nor lifts
    /// lockouts beyond what the new threshold itself implies. O(entries):
    /// reloads only, never per request.
    pub fn reconfigure(&mut self, spec: WindowSpec, entries_max: usize, now_us: u64) {
        assert!(spec.threshold >= 1 && spec.threshold <= THRESHOLD_MAX, "validated by config");
        assert!(spec.window_us >= WINDOW_US_MIN, "validated by config");
        let old = self.spec;
        let mut live: Vec<u32> = Vec::with_capacity(self.len);
        for list in &self.lists[1..] {
            let mut at = list.head;
            while at != NIL {
                live.push(at);
                at = self.slots[at as usize].next;
            }
        }
        live.sort_by_key(|&i| self.slots[i as usize].counts.window);
        for &i in &live {
            self.unlink(i);
        }
        self.spec = spec;
        self.entries_max = entries_max.max(1);
        self.in_flight.set_entries_max(entries_max);
        if spec.window_us != old.window_us {
            if let Some(sketch) = &mut self.overflow {
                sketch.redate(old, spec, now_us);
            }
        }
        self.lists = vec![EMPTY; spec.threshold as usize + 1];
        for i in live {
            let mut counts = self.slots[i as usize].counts;
            if spec.window_us != old.window_us {
                let whole = old.whole_failures(counts, now_us);
                counts = Counts { window: spec.window_index(now_us), previous: 0, current: whole };
            }
            if counts.previous == 0 && counts.current == 0 {
                self.remove(i);
            } else {
                self.write(i, counts);
            }
        }
        while self.len > self.entries_max && self.evict_least_informative(now_us).is_ok() {}
    }

    fn insert(&mut self, key: Key, now_us: u64) -> Result<u32, TableError> {
        if self.len >= self.entries_max {
            self.expire(now_us);
        }
        if self.len >= self.entries_max {
            self.evict_least_informative(now_us)?;
        }
        let slot =
            Slot { key, counts: Counts::default(), prev: NIL, next: NIL, class: 0, dirty: false, persisted: false };
        let i = if self.free_head != NIL {
            let i = self.free_head;
            self.free_head = self.slots[i as usize].next;
            self.slots[i as usize] = slot;
            i
        } else {
            self.slots.push(slot);
            (self.slots.len() - 1) as u32
        };
        let slots = &self.slots;
        self.index.insert_unique(key.hash_bits(), i, |&j| slots[j as usize].key.hash_bits());
        self.len += 1;
        Ok(i)
    }

    fn evict_least_informative(&mut self, now_us: u64) -> Result<(), TableError> {
        let top = self.lists.len() - 1;
        for class in 1..top {
            let head = self.lists[class].head;
            if head != NIL {
                self.remove(head);
                return Ok(());
            }
        }
        // The top class is ordered by last write, not by how long each entry
        // stays locked, so look past locked entries, a bounded number.
        let mut at = self.lists[top].head;
        for _ in 0..TOP_CLASS_EVICTION_SCAN {
            if at == NIL {
                break;
            }
            if !self.spec.is_locked(self.slots[at as usize].counts, now_us) {
                self.remove(at);
                return Ok(());
            }
            at = self.slots[at as usize].next;
        }
        self.refused_full += 1;
        Err(TableError::FullOfLockouts(self.entries_max))
    }

    /// Stores new counts and moves the slot to the tail of its class list.
    fn write(&mut self, i: u32, counts: Counts) {
        let class = (counts.previous.saturating_add(counts.current)).clamp(1, self.spec.threshold) as u16;
        let slot = &mut self.slots[i as usize];
        slot.counts = counts;
        let newly_dirty = !slot.dirty;
        slot.dirty = true;
        if newly_dirty {
            self.changed.push(i);
            if self.changed.len() > 2 * self.entries_max {
                // Slots written then freed and reused before a snapshot pile
                // up here under a flood; keep each still-dirty slot once, so
                // the list stays within twice the cap (amortised O(log n)
                // per write, and only under a flood).
                let slots = &self.slots;
                self.changed.retain(|&j| slots[j as usize].dirty);
                self.changed.sort_unstable();
                self.changed.dedup();
            }
        }
        self.unlink(i);
        self.link_tail(i, class);
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let slot = self.slots[i as usize];
        let hash = slot.key.hash_bits();
        if let Ok(entry) = self.index.find_entry(hash, |&j| j == i) {
            entry.remove();
        }
        if slot.persisted {
            self.removed.push(slot.key);
        }
        let slot = &mut self.slots[i as usize];
        slot.class = 0;
        slot.dirty = false;
        slot.persisted = false;
        slot.next = self.free_head;
        self.free_head = i;
        self.len -= 1;
    }

    fn unlink(&mut self, i: u32) {
        let Slot { prev, next, class, .. } = self.slots[i as usize];
        if class == 0 {
            return;
        }
        let list = &mut self.lists[class as usize];
        if prev == NIL {
            list.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.lists[class as usize].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let slot = &mut self.slots[i as usize];
        slot.prev = NIL;
        slot.next = NIL;
        slot.class = 0;
    }

    fn link_tail(&mut self, i: u32, class: u16) {
        let tail = self.lists[class as usize].tail;
        {
            let slot = &mut self.slots[i as usize];
            slot.class = class;
            slot.prev = tail;
            slot.next = NIL;
        }
        if tail == NIL {
            self.lists[class as usize].head = i;
        } else {
            self.slots[tail as usize].next = i;
        }
        self.lists[class as usize].tail = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000_000;
    const WINDOW: u64 = 15 * MINUTE;

    fn spec(threshold: u32) -> WindowSpec {
        WindowSpec { window_us: WINDOW, threshold }
    }

    fn key(n: u64) -> Key {
        Key { account_tag: n, tuple: n.wrapping_mul(0x9E37_79B9_7F4A_7C15) }
    }

    #[test]
    fn locks_at_exactly_the_threshold() {
        let mut table = FailureWindowTable::new(spec(5), 100);
        let t0 = 100 * WINDOW;
        for n in 1..=4 {
            let r = table.record_failure(key(1), t0).unwrap();
            assert!(!r.now_locked, "after {n}");
        }
        let fifth = table.record_failure(key(1), t0).unwrap();
        assert!(fifth.now_locked && !fifth.was_locked);
        assert_eq!(table.locked(t0).count(), 1);
    }

    #[test]
    fn boundary_burst_admits_at_most_one_more_in_three_minutes() {
        let s = spec(5);
        let mut table = FailureWindowTable::new(s, 100);
        let boundary = 101 * WINDOW;
        for _ in 0..5 {
            table.record_failure(key(1), boundary - 1_000_000).unwrap();
        }
        let mut admitted = 0;
        let mut t = boundary;
        while t <= boundary + 3 * MINUTE {
            if !s.is_locked(table.get(key(1), t), t) {
                admitted += 1;
                table.record_failure(key(1), t).unwrap();
            }
            t += 10_000_000;
        }
        assert_eq!(admitted, 1);
    }

    #[test]
    fn unlocks_at_is_the_first_unlocked_instant() {
        let s = spec(5);
        for (previous, current) in [(5, 0), (3, 4), (5, 5), (0, 5), (9, 2), (2, 40)] {
            for elapsed in [0, 1, WINDOW / 3, WINDOW - 1] {
                let counts = Counts { window: 200, previous, current };
                let now = 200 * WINDOW + elapsed;
                let at = s.unlocks_at(counts, now);
                assert!(!s.is_locked(counts, at), "{previous},{current}@{elapsed}");
                if at > now {
                    assert!(s.is_locked(counts, at - 1), "{previous},{current}@{elapsed}");
                }
                assert!(at <= now + 2 * WINDOW);
            }
        }
    }

    #[test]
    fn a_full_table_evicts_the_fewest_failures_and_keeps_lockouts() {
        let mut table = FailureWindowTable::new(spec(5), 10);
        let now = 300 * WINDOW;
        for _ in 0..5 {
            table.record_failure(key(0), now).unwrap();
        }
        for _ in 0..3 {
            table.record_failure(key(1), now).unwrap();
        }
        for n in 2..100_000 {
            table.record_failure(key(n), now).unwrap();
            assert!(table.len() <= 10);
        }
        assert!(table.get(key(0), now).current == 5, "the lockout survives");
        assert_eq!(table.get(key(1), now).current, 3, "the 3-count outlives 1-counts");
    }

    #[test]
    fn a_table_full_of_lockouts_refuses_new_keys() {
        let mut table = FailureWindowTable::new(spec(1), 3);
        let now = 300 * WINDOW;
        for n in 0..3 {
            table.record_failure(key(n), now).unwrap();
        }
        assert_eq!(table.record_failure(key(9), now), Err(TableError::FullOfLockouts(3)));
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn a_lockout_written_durably_after_a_removal_is_not_deleted_by_the_next_snapshot() {
        // Found by the tables_model fuzzer: persist, clear, lock again and
        // write durably; the next snapshot must not emit the old removal.
        let mut table = FailureWindowTable::new(spec(1), 100);
        let now = 600 * WINDOW;
        table.record_failure(key(1), now).unwrap();
        assert_eq!(table.take_changes().len(), 1);
        table.clear(key(1));
        table.record_failure(key(1), now).unwrap();
        table.mark_persisted(key(1));
        assert_eq!(table.take_changes(), vec![], "nothing to write: the durable write is the latest");
    }

    #[test]
    fn a_flood_between_snapshots_lists_each_live_slot_once_and_stays_bounded() {
        // Distinct one-failure keys through a 4-entry table: every insert
        // evicts and reuses a slot. The change list must stay within twice
        // the cap, and the snapshot write exactly the survivors, once each.
        let mut table = FailureWindowTable::new(spec(5), 4);
        let now = 700 * WINDOW;
        for k in 0..1000 {
            table.record_failure(key(k), now).unwrap();
            assert!(table.changed.len() <= 2 * 4 + 1, "{} listed after key {k}", table.changed.len());
        }
        let mut written: Vec<Key> = table
            .take_changes()
            .into_iter()
            .map(|(k, counts)| {
                assert!(counts.is_some());
                k
            })
            .collect();
        written.sort_by_key(|k| k.to_u128());
        let mut live: Vec<Key> = (0..1000).map(key).filter(|k| table.get(*k, now).current > 0).collect();
        live.sort_by_key(|k| k.to_u128());
        assert_eq!(written.len(), 4);
        assert_eq!(written, live);
        assert_eq!(table.take_changes(), vec![]);
    }

    #[test]
    fn a_full_table_evicts_an_unlocked_top_class_entry_behind_a_locked_one() {
        let s = WindowSpec { window_us: 60_000_000, threshold: 5 };
        let mut table = FailureWindowTable::new(s, 2);
        let t0 = 1000 * s.window_us;
        for _ in 0..10 {
            table.record_failure(key(0), t0).unwrap();
        }
        for _ in 0..5 {
            table.record_failure(key(1), t0).unwrap();
        }
        let later = t0 + s.window_us + s.window_us / 2;
        assert!(s.is_locked(table.get(key(0), later), later));
        assert!(!s.is_locked(table.get(key(1), later), later));
        assert!(table.record_failure(key(2), later).is_ok(), "key 1 is evictable");
        assert!(s.is_locked(table.get(key(0), later), later), "the lockout stays");
    }

    #[test]
    fn reconfiguring_keeps_counts_and_applies_the_new_threshold() {
        let mut table = FailureWindowTable::new(spec(5), 100);
        let now = 500 * WINDOW;
        for _ in 0..3 {
            table.record_failure(key(1), now).unwrap();
        }
        table.record_failure(key(2), now).unwrap();
        table.reconfigure(spec(3), 100, now);
        assert_eq!(table.locked(now).map(|(k, _)| k).collect::<Vec<_>>(), vec![key(1)]);
        assert_eq!(table.get(key(2), now).current, 1);
        table.reconfigure(WindowSpec { window_us: 2 * WINDOW, threshold: 3 }, 1, now);
        assert_eq!(table.len(), 1, "shrunk to the new cap, the lockout kept");
        assert!(table.spec().is_locked(table.get(key(1), now), now));
    }

    #[test]
    fn expiry_drops_entries_after_two_windows_and_reports_changes() {
        let mut table = FailureWindowTable::new(spec(5), 100);
        let now = 400 * WINDOW;
        table.record_failure(key(1), now).unwrap();
        assert_eq!(table.take_changes(), vec![(key(1), Some(Counts { window: 400, previous: 0, current: 1 }))]);
        assert_eq!(table.expire(now + WINDOW), 0);
        assert_eq!(table.expire(now + 2 * WINDOW), 1);
        assert!(table.is_empty());
        assert_eq!(table.take_changes(), vec![(key(1), None)]);
    }

    #[test]
    fn a_key_with_failures_in_the_table_and_the_sketch_reads_their_sum() {
        // Found by review: the two were combined by max, so a key whose
        // failures were split between them read fewer than it had.
        let mut table = FailureWindowTable::new(spec(5), 1);
        let now = 800 * WINDOW;
        for _ in 0..5 {
            table.record_failure(key(1), now).unwrap();
        }
        for _ in 0..3 {
            assert!(table.record_failure(key(2), now).is_err(), "full of a lockout");
            table.count_overflow(key(2), now);
        }
        table.clear(key(1));
        table.record_failure(key(2), now).unwrap();
        table.record_failure(key(2), now).unwrap();
        let standing = table.standing(key(2), now);
        assert_eq!(table.spec().estimate(standing.counts, now), 5, "3 spilled + 2 in the table");
        assert!(table.spec().is_locked(standing.counts, now));
    }

    #[derive(Clone, Debug)]
    enum AttemptOp {
        Check(u8),
        Report(u8, bool),
        Advance(u16),
    }

    fn attempt_op() -> impl proptest::strategy::Strategy<Value = AttemptOp> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..4).prop_map(AttemptOp::Check),
            3 => ((0u8..4), any::<bool>()).prop_map(|(k, f)| AttemptOp::Report(k, f)),
            1 => (0u16..3000).prop_map(AttemptOp::Advance),
        ]
    }

    proptest::proptest! {
        /// Places in flight against a plain model: per key, the lapse
        /// instant of each place. A check is admitted exactly when the
        /// table's own counts plus the live places stay under the
        /// threshold; a report releases the newest live place, whatever its
        /// outcome; each place lapses on its own.
        #[test]
        fn places_in_flight_follow_a_plain_model(ops in proptest::collection::vec(attempt_op(), 1..200)) {
            const TIMEOUT_US: u64 = 1_000_000;
            let s = spec(3);
            let mut table = FailureWindowTable::new(s, 100);
            let mut model: std::collections::HashMap<u8, Vec<u64>> = Default::default();
            let mut now = 900 * WINDOW;
            for op in ops {
                match op {
                    AttemptOp::Check(k) => {
                        let places = model.entry(k).or_default();
                        places.retain(|until| *until > now);
                        let held = places.len() as u32;
                        let expect = !s.refuses(table.get(key(k as u64), now), held, now);
                        let (admitted, standing) = table.admit(key(k as u64), now, TIMEOUT_US);
                        proptest::prop_assert_eq!(admitted, expect);
                        if admitted {
                            places.push(now + TIMEOUT_US);
                        }
                        proptest::prop_assert_eq!(standing.in_flight, held + admitted as u32);
                    }
                    AttemptOp::Report(k, failed) => {
                        table.settle(key(k as u64), now);
                        let places = model.entry(k).or_default();
                        places.retain(|until| *until > now);
                        if let Some(newest) = places.iter().enumerate().max_by_key(|(_, u)| **u).map(|(i, _)| i) {
                            places.remove(newest);
                        }
                        if failed {
                            table.record_failure(key(k as u64), now).unwrap();
                        }
                    }
                    AttemptOp::Advance(ms) => now += ms as u64 * 1000,
                }
                for k in 0..4u8 {
                    let held = model.get(&k).map_or(0, |p| p.iter().filter(|u| **u > now).count()) as u32;
                    proptest::prop_assert_eq!(table.standing(key(k as u64), now).in_flight, held, "key {}", k);
                }
            }
        }
    }
}
