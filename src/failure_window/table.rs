//! `FailureWindowTable`: failure counts per key in a slab of fixed-size
//! slots, a hash index over it, and one list per count class ordered by
//! last write, so that expiry and eviction pop list heads and never scan;
//! it lists the changes to persist since the last snapshot.
//!
//! Does not do the window arithmetic (`window.rs`) nor hold attempts in
//! flight (`places.rs`), and persists nothing itself.

use hashbrown::HashTable;

use super::overflow::OverflowSketch;
use super::places::{Places, Presumed};
use super::window::{Counts, WindowSpec, THRESHOLD_MAX, WINDOW_US_MIN};
use crate::expiring::ExpiringMap;
use crate::keys::Key;

const NIL: u32 = u32::MAX;
/// Entries of the top count class examined for an unlocked one when a full
/// table needs room: bounds the work of one insert.
pub const TOP_CLASS_EVICTION_SCAN: usize = 64;

/// One slot of the slab: the key, its counts, and its place in a list.
/// 48 bytes; `Key` is stored as two u64 so the slot is 8-aligned.
#[derive(Clone, Copy, Debug)]
struct Slot {
    key: Key,
    counts: Counts,
    /// Of the counts, the failures presumed for attempts admitted with no
    /// room for their place, which their reports settle. Memory only.
    pub(super) presumed: Presumed,
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
    pub(super) spec: WindowSpec,
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
    pub(super) changed: Vec<u32>,
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
    pub(super) in_flight: ExpiringMap<Places>,
    /// Checks admitted with no room for their place, counted as failures.
    pub(super) presumed: u64,
    /// Failures of keys the table could not hold (full of lockouts), made
    /// at the first such failure.
    pub(super) overflow: Option<Box<OverflowSketch>>,
    /// With `track_starts`, per slot: when its key's first failure was
    /// counted on an empty count (0: not known, e.g. restored, or begun
    /// from spilled failures). Shared mode's write-back ages a lockout
    /// from it. Beside the slots, not in them: only a global rule's
    /// table (its degraded share) pays the 8 bytes a slot.
    starts: Option<Vec<u64>>,
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
            starts: None,
        }
    }

    /// Keeps when each entry's counting began (see `started_us`).
    pub fn track_starts(&mut self) {
        if self.starts.is_none() {
            self.starts = Some(vec![0; self.slots.len()]);
        }
    }

    /// When the key's entry began counting from nothing, if tracked and
    /// known: none of its failures is older.
    pub fn started_us(&self, key: Key) -> Option<u64> {
        let (starts, i) = (self.starts.as_ref()?, self.find(key)?);
        Some(starts[i as usize]).filter(|&us| us > 0)
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

    /// Counts one failure for `key`, in one step.
    pub fn record_failure(&mut self, key: Key, now_us: u64) -> Result<Recorded, TableError> {
        let (i, before) = match self.find(key) {
            Some(i) => (i, self.slots[i as usize].counts),
            // A key that spilled starts from its spilled failures.
            None => {
                let i = self.insert(key, now_us)?;
                let spilled = self.spilled(key, now_us);
                if let (Some(starts), 0, 0) = (&mut self.starts, spilled.previous, spilled.current) {
                    starts[i as usize] = now_us;
                }
                (i, spilled)
            }
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

    /// The presumed failures of the key's entry, if it has one.
    pub(super) fn presumed_mut(&mut self, key: Key) -> Option<&mut Presumed> {
        let i = self.find(key)?;
        Some(&mut self.slots[i as usize].presumed)
    }

    /// Takes back one failure counted in the current window (or, with
    /// `in_previous`, the previous one): a presumed failure whose attempt
    /// did not fail after all.
    pub(super) fn take_back(&mut self, key: Key, now_us: u64, in_previous: bool) {
        let Some(i) = self.find(key) else { return };
        let mut counts = self.spec.rolled(self.slots[i as usize].counts, now_us);
        let count = if in_previous { &mut counts.previous } else { &mut counts.current };
        *count = count.saturating_sub(1);
        if counts.previous == 0 && counts.current == 0 {
            self.remove(i);
        } else {
            self.write(i, counts);
        }
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
        } else if spec.threshold != old.threshold {
            // Other cells are at the threshold now.
            self.forget_cell_rows();
        }
        self.lists = vec![EMPTY; spec.threshold as usize + 1];
        for i in live {
            let mut counts = self.slots[i as usize].counts;
            if spec.window_us != old.window_us {
                let whole = old.whole_failures(counts, now_us);
                counts = Counts { window: spec.window_index(now_us), previous: 0, current: whole };
                // Their windows mean nothing at the new length: they stay
                // counted, and their reports count them again.
                self.slots[i as usize].presumed = Presumed::default();
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
        let slot = Slot {
            key,
            counts: Counts::default(),
            presumed: Presumed::default(),
            prev: NIL,
            next: NIL,
            class: 0,
            dirty: false,
            persisted: false,
        };
        let i = if self.free_head != NIL {
            let i = self.free_head;
            self.free_head = self.slots[i as usize].next;
            self.slots[i as usize] = slot;
            i
        } else {
            self.slots.push(slot);
            (self.slots.len() - 1) as u32
        };
        if let Some(starts) = &mut self.starts {
            starts.resize(self.slots.len(), 0);
            starts[i as usize] = 0;
        }
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
impl FailureWindowTable {
    /// The index holds exactly one entry per live slot, and every live key
    /// is found through it at its slot.
    pub(super) fn assert_index_matches_slots(&self) {
        let mut live = 0;
        for list in &self.lists[1..] {
            let mut at = list.head;
            while at != NIL {
                let key = self.slots[at as usize].key;
                assert_eq!(self.find(key), Some(at), "{key:?} found at its slot");
                live += 1;
                at = self.slots[at as usize].next;
            }
        }
        assert_eq!(live, self.len);
        assert_eq!(self.index.len(), self.len, "one index entry per live slot, no more");
    }
}
