//! The GCRA table's storage: one theoretical arrival time (TAT) per 64-bit
//! key digest, in a flat open-addressed array of 16-byte slots.
//!
//! Our own rather than a general map because the hot path of every `check`
//! is one lookup here, and at millions of keys that lookup is a cache miss.
//! A general swiss table touches two places per lookup (its control bytes,
//! then the slot); here the key and its TAT sit side by side, so a lookup is
//! one cache line in the common case (profiling a million-key daemon put
//! the map at 28% of its time, almost all of it waiting on those misses).
//!
//! Linear probing. An expired slot (TAT at or before now) means "absent",
//! and a new key takes the first expired slot on its probe path, so steady
//! churn needs no deletions. Deletions (sweep, eviction) shift the rest of
//! the run back, so a probe never meets a tombstone. The array is rebuilt,
//! dropping expired entries, when occupied slots pass 7/8 of it, sized so
//! the live entries fill between 3/8 and 3/4 of the new one: 21 to 43 bytes
//! per live key, and every rebuild is paid for by an eighth of the array in
//! inserts.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Smallest array; a rule with few keys costs 1 KiB.
const CAPACITY_MIN: usize = 64;
/// When full of live entries, up to this many are sampled (the run at the
/// new key's home) and the one expiring soonest is evicted.
pub const EVICTION_SAMPLE: usize = 8;
/// Slots looked at, from the new key's home, to find the eviction sample.
const EVICTION_SCAN_MAX: usize = 64;
/// Marks an empty slot; a digest that happens to be 0 is stored as 1 (two
/// keys then share a TAT with probability 2^-64).
const EMPTY: u64 = 0;

/// `[key digest, TAT in µs]`; an all-zero slot is empty. A plain array of
/// integers so a fresh table is zero pages the kernel maps on first touch.
type Slot = [u64; 2];

/// Where a table's slots are, readable without the table's lock, so a
/// caller can prefetch a key's slot before locking. On a cache line of its
/// own and written only when the slots move: next to the lock, every
/// prefetch first waited for the line the other core had just locked.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct SlotHint {
    base: AtomicUsize,
    mask: AtomicUsize,
}

impl SlotHint {
    /// Hints the CPU to fetch the cache line where `id`'s probe starts.
    pub fn prefetch(&self, id: u64) {
        let base = self.base.load(Ordering::Relaxed);
        if base != 0 {
            let home = stored(id) as usize & self.mask.load(Ordering::Relaxed);
            prefetch_read(base.wrapping_add(home * std::mem::size_of::<Slot>()));
        }
    }
}

/// One of the crate's two exceptions to its no-unsafe rule (see lib.rs).
#[allow(unsafe_code)]
pub(crate) fn prefetch_read(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint to the cache: it never faults, whatever
    // the address (a stale one merely fetches nothing useful), and it
    // neither reads into the program nor writes. The intrinsic is `unsafe`
    // only because it is declared with the `sse` target feature, which
    // every x86_64 target has.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Bytes of a transparent huge page (x86_64; elsewhere the advice may be
/// refused, which only costs the speed-up).
const HUGE_PAGE_BYTES: usize = 2 << 20;
const PAGE_BYTES: usize = 4096;

/// A zeroed slot array; a large one is advised onto transparent huge pages.
fn slot_array(capacity: usize) -> Vec<Slot> {
    let slots = vec![[EMPTY; 2]; capacity];
    if std::mem::size_of_val(slots.as_slice()) >= 2 * HUGE_PAGE_BYTES {
        advise_huge_pages(&slots);
    }
    slots
}

/// Asks the kernel to back `slots` with transparent huge pages. At millions
/// of keys every lookup otherwise misses the TLB as well as the cache, and
/// in a VM the page walk costs more than the miss: with 10 million keys a
/// check's prefetch spent most of its time waiting on it, and huge pages
/// took pipelined throughput from 0.67 to over 0.9 of the 1k-key figure.
pub(crate) fn advise_huge_pages<T>(slots: &[T]) {
    advise_huge_pages_under(slots.as_ptr() as usize, std::mem::size_of_val(slots));
}

/// As `advise_huge_pages`, for the `bytes` from `address` (an array with
/// its spare capacity, which a `Vec` fills later).
/// The other exception to the crate's no-unsafe rule (see lib.rs).
#[allow(unsafe_code)]
pub(crate) fn advise_huge_pages_under(address: usize, bytes: usize) {
    let start = address.next_multiple_of(PAGE_BYTES);
    let end = (address + bytes) / PAGE_BYTES * PAGE_BYTES;
    let Some(address) = std::ptr::NonNull::new(start as *mut std::ffi::c_void) else { return };
    if end > start {
        // SAFETY: MADV_HUGEPAGE changes only how the kernel backs these
        // pages, never their contents or whether they are mapped, and the
        // page-aligned range lies inside the caller's live allocation.
        // With THP off or unsupported the call fails, and the table works
        // the same on small pages.
        let _ = unsafe { nix::sys::mman::madvise(address, end - start, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
    }
}

#[derive(Debug)]
pub struct TatTable {
    slots: Vec<Slot>,
    /// Slots holding a key, live or expired.
    occupied: usize,
    entries_max: usize,
}

impl TatTable {
    pub fn new(entries_max: usize) -> TatTable {
        TatTable { slots: slot_array(CAPACITY_MIN), occupied: 0, entries_max: entries_max.max(1) }
    }

    /// Keys held, including expired ones not yet reclaimed.
    pub fn len(&self) -> usize {
        self.occupied
    }

    pub fn is_empty(&self) -> bool {
        self.occupied == 0
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }

    /// A new cap (at reload); an over-full table shrinks as keys arrive.
    pub fn set_entries_max(&mut self, entries_max: usize) {
        self.entries_max = entries_max.max(1);
    }

    /// The slots, for memory accounting in benchmarks.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Tells `hint` where the slots are now (they move on a rebuild).
    pub fn publish_slots(&self, hint: &SlotHint) {
        let (base, mask) = (self.slots.as_ptr() as usize, self.mask());
        // A reader may see one store and not the other: a wasted hint.
        if hint.base.load(Ordering::Relaxed) != base || hint.mask.load(Ordering::Relaxed) != mask {
            hint.base.store(base, Ordering::Relaxed);
            hint.mask.store(mask, Ordering::Relaxed);
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home(&self, id: u64) -> usize {
        id as usize & self.mask()
    }

    /// The live TAT of `id`, if any.
    pub fn get(&self, id: u64, now_us: u64) -> Option<u64> {
        let id = stored(id);
        let mut i = self.home(id);
        loop {
            let [key, tat] = self.slots[i];
            if key == id {
                return (tat > now_us).then_some(tat);
            }
            if key == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask();
        }
    }

    /// Reads and rewrites `id`'s TAT in one probe: `f` sees the live TAT (if
    /// any) and returns the TAT to keep; one at or before `now_us` means
    /// "nothing to remember" and is not inserted.
    pub fn update<R>(&mut self, id: u64, now_us: u64, f: impl FnOnce(Option<u64>) -> (u64, R)) -> R {
        let id = stored(id);
        let mut i = self.home(id);
        let mut reusable = None;
        loop {
            let [key, tat] = self.slots[i];
            if key == id {
                let (next, result) = f((tat > now_us).then_some(tat));
                self.slots[i][1] = next;
                return result;
            }
            if key == EMPTY {
                break;
            }
            if reusable.is_none() && tat <= now_us {
                reusable = Some(i);
            }
            i = (i + 1) & self.mask();
        }
        let (next, result) = f(None);
        if next <= now_us {
            return result;
        }
        match reusable {
            // On the key's probe path, so it is found there; the expired
            // key it held meant nothing.
            Some(at) => self.slots[at] = [id, next],
            None => self.insert_new(id, next, now_us),
        }
        result
    }

    /// Inserts a key known to be absent, making room first.
    fn insert_new(&mut self, id: u64, tat: u64, now_us: u64) {
        while self.occupied >= self.entries_max {
            // The run at the new key's home is a random sample; a table
            // left sparse by a lowered cap may need a longer look.
            if !self.evict_near(self.home(id), EVICTION_SCAN_MAX) && !self.evict_near(0, self.slots.len()) {
                break;
            }
        }
        if (self.occupied + 1) * 8 > self.slots.len() * 7 {
            self.rebuild(now_us, 1);
        }
        let mut i = self.home(id);
        while self.slots[i][0] != EMPTY {
            i = (i + 1) & self.mask();
        }
        self.slots[i] = [id, tat];
        self.occupied += 1;
    }

    /// Evicts the soonest-expiring of the first few entries within `scan`
    /// slots from `from` (slot order is random). False if there were none.
    fn evict_near(&mut self, from: usize, scan: usize) -> bool {
        let mut victim: Option<(usize, u64)> = None;
        let mut seen = 0;
        let mut i = from;
        for _ in 0..scan.min(self.slots.len()) {
            let [key, tat] = self.slots[i];
            if key != EMPTY {
                if victim.is_none_or(|(_, soonest)| tat < soonest) {
                    victim = Some((i, tat));
                }
                seen += 1;
                if seen == EVICTION_SAMPLE {
                    break;
                }
            }
            i = (i + 1) & self.mask();
        }
        match victim {
            Some((at, _)) => {
                self.remove_at(at);
                true
            }
            None => false,
        }
    }

    /// Empties slot `at` and shifts back the rest of its run, so every key
    /// after it stays reachable from its home.
    fn remove_at(&mut self, mut at: usize) {
        let mask = self.mask();
        let mut next = at;
        loop {
            next = (next + 1) & mask;
            let key = self.slots[next][0];
            if key == EMPTY {
                break;
            }
            let home = self.home(key);
            // The key at `next` may move back to `at` only if its home is
            // not cyclically within (at, next].
            let stays = if at <= next { at < home && home <= next } else { at < home || home <= next };
            if !stays {
                self.slots[at] = self.slots[next];
                at = next;
            }
        }
        self.slots[at] = [EMPTY; 2];
        self.occupied -= 1;
    }

    fn live(&self, now_us: u64) -> usize {
        self.slots.iter().filter(|[key, tat]| *key != EMPTY && *tat > now_us).count()
    }

    /// The array size for `keys` live keys: they fill between 3/8 and 3/4.
    fn capacity_for(keys: usize) -> usize {
        let mut capacity = CAPACITY_MIN;
        while keys * 4 > capacity * 3 {
            capacity *= 2;
        }
        capacity
    }

    /// A new array holding only the live entries, with room for `extra`.
    fn rebuild(&mut self, now_us: u64, extra: usize) {
        let capacity = Self::capacity_for(self.live(now_us) + extra);
        let old = std::mem::replace(&mut self.slots, slot_array(capacity));
        self.occupied = 0;
        for [key, tat] in old {
            if key != EMPTY && tat > now_us {
                let mut i = self.home(key);
                while self.slots[i][0] != EMPTY {
                    i = (i + 1) & self.mask();
                }
                self.slots[i] = [key, tat];
                self.occupied += 1;
            }
        }
    }

    /// Drops every expired entry (maintenance, one shard at a time; never
    /// per request), and gives memory back when few keys are left.
    pub fn sweep(&mut self, now_us: u64) {
        let live = self.live(now_us);
        if live == self.occupied {
            return;
        }
        if Self::capacity_for(live) < self.slots.len() {
            return self.rebuild(now_us, 0);
        }
        // In place: start just after an empty slot, so no run wraps past
        // the start, and look again at a slot a removal refilled.
        let Some(start) = self.slots.iter().position(|[key, _]| *key == EMPTY) else { return };
        let mut step = 1;
        while step <= self.slots.len() {
            let i = (start + step) & self.mask();
            let [key, tat] = self.slots[i];
            if key != EMPTY && tat <= now_us {
                self.remove_at(i);
                continue;
            }
            step += 1;
        }
    }
}

fn stored(id: u64) -> u64 {
    if id == EMPTY {
        1
    } else {
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> u64 {
        n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn set(table: &mut TatTable, key: u64, tat: u64, now: u64) {
        table.update(key, now, |_| (tat, ()));
    }

    #[test]
    fn keys_read_back_until_they_expire() {
        let mut table = TatTable::new(1_000);
        for n in 0..500 {
            set(&mut table, id(n), 1_000 + n, 0);
        }
        for n in 0..500 {
            assert_eq!(table.get(id(n), 0), Some(1_000 + n));
            assert_eq!(table.get(id(n), 1_000 + n), None, "expired at its TAT");
        }
        assert_eq!(table.get(id(10_000), 0), None);
        assert_eq!(table.len(), 500);
    }

    #[test]
    fn digest_zero_is_a_key_like_any_other() {
        let mut table = TatTable::new(10);
        set(&mut table, 0, 50, 0);
        assert_eq!(table.get(0, 0), Some(50));
    }

    #[test]
    fn expired_slots_are_reused_and_rebuilds_drop_them() {
        let mut table = TatTable::new(1_000_000);
        // Each key lives 5 µs; a million inserts never hold more than a few.
        for n in 0..1_000_000u64 {
            set(&mut table, id(n), n * 10 + 5, n * 10);
        }
        assert!(table.capacity() <= 2 * CAPACITY_MIN, "capacity {}", table.capacity());
        table.sweep(u64::MAX - 1);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn a_full_table_evicts_the_soonest_expiring_and_stays_within_its_cap() {
        let mut table = TatTable::new(100);
        for n in 0..10_000u64 {
            set(&mut table, id(n), 1_000_000 + n, 0);
            assert!(table.len() <= 100);
        }
        // The newest key always made it in.
        assert_eq!(table.get(id(9_999), 0), Some(1_009_999));
        table.set_entries_max(10);
        set(&mut table, id(20_000), 5_000_000, 0);
        assert!(table.len() <= 10, "len {}", table.len());
        assert_eq!(table.get(id(20_000), 0), Some(5_000_000));
    }

    #[test]
    fn sweep_in_place_keeps_every_live_key_reachable() {
        let mut table = TatTable::new(1_000_000);
        for n in 0..10_000u64 {
            set(&mut table, id(n), if n % 3 == 0 { 10 } else { 1_000 }, 0);
        }
        let capacity = table.capacity();
        table.sweep(10);
        assert_eq!(table.capacity(), capacity, "two thirds live: swept in place");
        assert_eq!(table.len(), 6_666);
        for n in 0..10_000u64 {
            assert_eq!(table.get(id(n), 10), (n % 3 != 0).then_some(1_000), "key {n}");
        }
    }

    #[test]
    fn sweep_shrinks_a_table_whose_keys_expired() {
        let mut table = TatTable::new(1_000_000);
        for n in 0..100_000 {
            set(&mut table, id(n), 100, 0);
        }
        let big = table.capacity();
        set(&mut table, id(1 << 40), 1_000, 0);
        table.sweep(100);
        assert_eq!(table.len(), 1);
        assert!(table.capacity() < big / 100);
        assert_eq!(table.get(id(1 << 40), 100), Some(1_000));
    }
}
