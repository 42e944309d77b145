//! Body of the `tat_table` fuzz target, shared with `tests/fuzz_replay.rs`
//! (which replays `fuzz/corpus/tat_table/` on stable). Uses only `tollgate`
//! and std; the bytes are decoded by hand.
//!
//! `TatTable` (the GCRA table's open-addressed storage) against a plain
//! `HashMap<u64, u64>` of the last TAT written per key, the fuzzing
//! counterpart of `tests/model.rs`'s `tat_table_matches_a_map`. The first
//! byte picks the cap; then come bounded operations (two bytes each, most
//! read one more): updates (absolute, GCRA-like relative to the TAT the
//! closure sees, and rewriting what it sees), reads (now and a little
//! later), sweeps, cap changes and floods of fresh keys. Time only moves
//! forward.
//!
//! - With a cap no run can reach, every `get` and every TAT `update` passes
//!   to its closure must equal the model's live TAT (live: after now).
//! - With a small cap (or once one was set): whatever the table still holds
//!   must equal the model's value, `len()` never exceeds the cap (a lowered
//!   cap is only reached as keys arrive, so it never grows past it), and a
//!   key just written with a TAT after now is readable right after.
//! - Always: one empty slot at least and at most 7/8 of the array occupied,
//!   never more entries than keys written, and after a sweep none expired
//!   and the array no larger than its live entries need (3/8 to 3/4 full).
//!
//! Ids share low bits on purpose: `k * 64 + c` with `c` near the end of a
//! 64- or 128-slot array (so probe runs wrap past it) or at its start, plus
//! spread ids, so runs collide, wrap, and lose entries from their middle to
//! sweeps and evictions (which shift the rest of the run back). Ids 0 and 1
//! are both reachable: the table stores digest 0 as 1, so they are one key.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use tollgate::TatTable;

// The including crate declares `bytes` (tests/fuzz_bodies/bytes.rs) once.
use crate::bytes::Bytes;

/// Operations per input; at two or three bytes each, a 4 KiB input has at
/// most 2048.
const OPS_MAX: usize = 2048;
/// A cap no run can reach: 256 ordinary ids and `FLOOD_INSERTS_MAX`.
const UNREACHABLE_CAP: usize = 1 << 20;
/// Small caps are 0..=SMALL_CAP_MAX (0 means 1).
const SMALL_CAP_MAX: u8 = 63;
/// Fresh keys the flood operations of one run may write in all: enough to
/// grow the array a few times over.
const FLOOD_INSERTS_MAX: u64 = 4096;
/// Flood ids are `(FLOOD_K + n) * 64 + c`: the low bits of ordinary ids.
const FLOOD_K: u64 = 1 << 20;
/// The table's smallest array.
const CAPACITY_MIN: usize = 64;
const START_US: u64 = 1_000_000;
/// Time steps, indexed by an operation byte's top five bits: mostly small
/// against the lifetimes (0..64 µs in the common case), sometimes past all.
const STEPS: [u64; 32] =
    [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 25, 32, 50, 64, 200, 1 << 20];
/// How often every key of the model is checked, in operations.
const CHECK_ALL_EVERY: usize = 64;

/// A `HashMap` with fixed hash keys: with `RandomState` its (instrumented)
/// probing differs between runs of one input, and libFuzzer's coverage with
/// it, which makes the fuzzer chase noise and `cmin` keep arbitrary files.
type Model = HashMap<u64, u64, BuildHasherDefault<DefaultHasher>>;

pub fn run(data: &[u8]) {
    let mut input = Bytes(data);
    Run::new(&mut input).run(&mut input);
}

/// An id from a byte: the top two bits pick a family, the rest `k` in 0..64.
fn id(b: u8) -> u64 {
    let k = (b & 63) as u64;
    match b >> 6 {
        // Homes 60..=63 and 0 of a 64-slot array (60..=64 and 124..=128 of
        // a 128-slot one): runs that wrap past the end.
        0 => k * 64 + 60 + k % 5,
        // Homes 0..=3, where wrapped runs land; 63 is id 1, and k = 0 is
        // id 0, which the table stores as 1.
        1 if k == 63 => 1,
        1 => k * 64 + k % 4,
        // Homes 120..=127 of a 128-slot array (56..=63 of a 64-slot one).
        2 => k * 128 + 120 + k % 8,
        _ => (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    }
}

/// The key the table keeps `id` under (its digest 0 is stored as 1).
fn stored(id: u64) -> u64 {
    id.max(1)
}

/// The array size `live` entries need: the smallest power of two from
/// `CAPACITY_MIN` they fill at most 3/4 of (the module doc's sizing).
fn capacity_for(live: usize) -> usize {
    let mut capacity = CAPACITY_MIN;
    while live * 4 > capacity * 3 {
        capacity *= 2;
    }
    capacity
}

/// A TAT from a byte and `now`: mostly a short lifetime (0 means "nothing to
/// remember"), sometimes a long one, one already past, or the largest.
fn tat_for(b: u8, now: u64) -> u64 {
    match b {
        0..=0xBF => now + (b % 64) as u64,
        0xC0..=0xDF => now + (b & 31) as u64 * 64 + 64,
        0xE0..=0xEF => now - (b & 15) as u64 - 1,
        0xF0..=0xFE => now + (((b & 15) as u64 + 1) << 20),
        0xFF => u64::MAX,
    }
}

fn small_cap(b: u8) -> usize {
    (b % (SMALL_CAP_MAX + 1)) as usize
}

struct Run {
    table: TatTable,
    /// The cap set last.
    cap: usize,
    /// A small cap was set at some point: the table may have evicted, so
    /// it only has to agree on what it still holds.
    lossy: bool,
    now: u64,
    /// The last TAT written per stored key, live or not; expired ones are
    /// dropped at sweeps (the table drops them then too), so the table's
    /// keys are always a subset.
    model: Model,
    flood_next: u64,
}

impl Run {
    fn new(input: &mut Bytes<'_>) -> Run {
        let mode = input.byte();
        let lossy = mode & 1 == 1;
        let cap = if lossy { small_cap(mode >> 1) } else { UNREACHABLE_CAP };
        let table = TatTable::new(cap);
        assert_eq!(table.entries_max(), cap.max(1));
        assert!(table.is_empty());
        assert_eq!(table.len(), 0);
        assert_eq!(table.capacity(), CAPACITY_MIN);
        Run { table, cap, lossy, now: START_US, model: Model::default(), flood_next: 0 }
    }

    fn live(&self, id: u64) -> Option<u64> {
        self.model.get(&stored(id)).copied().filter(|&tat| tat > self.now)
    }

    fn live_count(&self) -> usize {
        self.model.values().filter(|&&tat| tat > self.now).count()
    }

    fn run(mut self, input: &mut Bytes<'_>) {
        let mut ops = 0;
        while !input.is_empty() && ops < OPS_MAX {
            ops += 1;
            let op = input.byte();
            let id = id(input.byte());
            self.now += STEPS[(op >> 3) as usize];
            let len_before = self.table.len();
            match op & 7 {
                0 | 1 => {
                    let tat = tat_for(input.byte(), self.now);
                    self.update(id, |_| tat);
                }
                2 => {
                    // As GCRA does: from the TAT seen, or now, onwards.
                    let b = input.byte();
                    let now = self.now;
                    self.update(id, |seen| match b {
                        0xFF => u64::MAX,
                        _ => seen.map_or(now, |tat| tat.max(now)).saturating_add((b % 64) as u64),
                    });
                }
                3 => {
                    // Writes back what it sees; nothing seen writes now.
                    let now = self.now;
                    self.update(id, |seen| seen.unwrap_or(now));
                }
                4 => {
                    let later = self.now + (input.byte() % 64) as u64;
                    self.check(id, self.now);
                    self.check(id, later);
                }
                5 => self.sweep(),
                6 => self.set_cap(input.byte()),
                _ => self.flood(input.byte()),
            }
            self.check_shape(len_before, op & 7 == 6);
            self.check(id, self.now);
            if ops % CHECK_ALL_EVERY == 0 {
                self.check_all();
            }
        }
        self.check_all();
        self.sweep();
        self.check_all();
    }

    /// One `update` through the table and the model; `next` maps the TAT
    /// the closure sees to the one it keeps.
    fn update(&mut self, id: u64, next: impl FnOnce(Option<u64>) -> u64) {
        let expected = self.live(id);
        let len_before = self.table.len();
        let now = self.now;
        let (seen, tat) = self.table.update(id, now, |seen| {
            let tat = next(seen);
            (tat, (seen, tat))
        });
        if let Some(t) = seen {
            assert!(t > now, "update({id}) passed an expired TAT {t} at {now}");
        }
        if self.lossy {
            assert!(seen.is_none() || seen == expected, "update({id}) saw {seen:?}, model {expected:?} at {now}");
        } else {
            assert_eq!(seen, expected, "update({id}) at {now}");
        }
        let len = self.table.len();
        assert!(len <= len_before + 1, "one update added {} entries", len - len_before);
        assert!(len <= self.cap.max(1) || len <= len_before, "{len} entries (were {len_before}), cap {}", self.cap);
        self.model.insert(stored(id), tat);
        if tat > now {
            assert_eq!(self.table.get(id, now), Some(tat), "update({id}) at {now}: the key just written is held");
        } else {
            assert_eq!(self.table.get(id, now), None, "update({id}) at {now} wrote an expired {tat}");
        }
    }

    /// `get` at `at` (now or later) against the model.
    fn check(&self, id: u64, at: u64) {
        let got = self.table.get(id, at);
        let expected = self.model.get(&stored(id)).copied().filter(|&tat| tat > at);
        if self.lossy {
            assert!(got.is_none() || got == expected, "get({id}, {at}) gave {got:?}, model {expected:?}");
        } else {
            assert_eq!(got, expected, "get({id}, {at}) (now {})", self.now);
        }
    }

    fn check_all(&self) {
        for &id in self.model.keys() {
            self.check(id, self.now);
        }
        if !self.lossy {
            let (len, live) = (self.table.len(), self.live_count());
            assert!(len >= live, "{len} entries, {live} live keys");
        }
    }

    /// What holds after every operation, whatever the cap.
    fn check_shape(&self, len_before: usize, cap_changed: bool) {
        let (len, capacity) = (self.table.len(), self.table.capacity());
        assert_eq!(self.table.is_empty(), len == 0);
        assert!(capacity.is_power_of_two() && capacity >= CAPACITY_MIN, "capacity {capacity}");
        assert!(len * 8 <= capacity * 7, "{len} entries in {capacity} slots");
        assert!(len <= self.model.len(), "{len} entries, {} keys ever written", self.model.len());
        if !cap_changed {
            assert!(len <= self.cap.max(1) || len <= len_before, "{len} entries (were {len_before}), cap {}", self.cap);
        }
    }

    fn sweep(&mut self) {
        let live_before = self.live_count();
        let len_before = self.table.len();
        let capacity_before = self.table.capacity();
        self.table.sweep(self.now);
        let now = self.now;
        self.model.retain(|_, tat| *tat > now);
        let (len, capacity) = (self.table.len(), self.table.capacity());
        if self.lossy {
            assert!(len <= live_before, "{len} entries after a sweep, {live_before} live keys");
        } else {
            assert_eq!(len, live_before, "entries after a sweep");
        }
        if len == len_before {
            // Nothing was expired: nothing moves.
            assert_eq!(capacity, capacity_before, "a sweep with nothing to drop resized the array");
        } else {
            assert!(capacity <= capacity_for(len), "{len} entries left in {capacity} slots after a sweep");
        }
        self.check_all();
    }

    fn set_cap(&mut self, b: u8) {
        self.cap = if b & 0x80 == 0 && !self.lossy {
            // Another unreachable cap, as a reload that raises it.
            UNREACHABLE_CAP + b as usize
        } else if b & 0xC0 == 0xC0 {
            UNREACHABLE_CAP
        } else {
            self.lossy = true;
            small_cap(b)
        };
        self.table.set_entries_max(self.cap);
        assert_eq!(self.table.entries_max(), self.cap.max(1));
    }

    /// Up to 64 fresh keys whose low bits are the ordinary ids' ones.
    fn flood(&mut self, b: u8) {
        let n = ((b & 63) as u64 + 1).min(FLOOD_INSERTS_MAX - self.flood_next);
        for _ in 0..n {
            let j = self.flood_next;
            self.flood_next += 1;
            let low = if b & 0x40 == 0 { (60 + j % 8) % 64 } else { j.wrapping_mul(0x9E37_79B9) % 64 };
            let id = (FLOOD_K + j) * 64 + low;
            let lifetime = if b & 0x80 == 0 { j % 7 } else { 64 + j % 61 };
            let tat = self.now + lifetime;
            self.update(id, |_| tat);
        }
    }
}
