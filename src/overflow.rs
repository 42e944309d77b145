//! OverflowSketch: where a failure table full of lockouts still counts.
//!
//! A table never evicts a lockout for a new key, so an attacker who fills
//! one with lockouts would otherwise make every further key uncounted and
//! brute-force any other account at the rate limit. Keys the table cannot
//! hold are counted here instead: a count-min sketch of sliding-window
//! counts, `OVERFLOW_ROWS` rows of cells, each key adding to one cell per
//! row. A key reads the row whose cell holds the least, so collisions can
//! only over-count: protection degrades towards refusing, never off.
//!
//! Our own code because the cells are the failure table's own sliding-window
//! counts (`Counts`, rolled lazily per cell); a generic count-min crate
//! counts plain integers with no window.
//!
//! What the over-count costs is the price of the guarantee. A cell that
//! any spilled key at its threshold shares reads locked, so once `k` such
//! keys have spilled in one window, a fresh key reads locked in all four
//! rows with probability about (1 − e^(−k / cells a row))^4. With
//! `OVERFLOW_CELLS_PER_ENTRY` = 4 that is 0.24% after a further table's
//! worth of lockouts (a unit test measures it), 8% after three, and most
//! fresh keys after ten, until the window drains. `refused_full` counts
//! every spilled failure: it is the signal to raise the table's cap.

use crate::failure_window::{Counts, WindowSpec};
use crate::keys::Key;

/// Rows of the sketch: each is an independent chance for a key to find a
/// cell no one else has filled.
pub const OVERFLOW_ROWS: usize = 4;
/// Cells in each row per entry of the table's cap (rounded up to a power of
/// two): 4 keeps a table's worth of spilled lockouts from refusing more
/// than a quarter of a percent of fresh keys, at 4 × 4 × 12 = 192 bytes per
/// entry, paid only once a table overflows.
pub const OVERFLOW_CELLS_PER_ENTRY: usize = 4;
/// The narrowest row, so a small table's sketch is not all collisions (a
/// shard of a 16-entry table spills into 1,024 cells a row, 48 KiB).
pub const OVERFLOW_ROW_CELLS_MIN: usize = 1024;

/// Odd multipliers, one per row, to spread a key's digest over each row.
const ROW_MIX: [u64; OVERFLOW_ROWS] =
    [0x9E37_79B9_7F4A_7C15, 0xD6E8_FEB8_6659_FD93, 0xBF58_476D_1CE4_E5B9, 0x94D0_49BB_1331_11EB];

/// Sliding-window failure counts of keys a full table could not hold.
/// Allocated when a table first overflows; its size never changes.
#[derive(Debug)]
pub struct OverflowSketch {
    /// `OVERFLOW_ROWS` rows of `1 << row_bits` cells, row after row.
    cells: Box<[Counts]>,
    row_bits: u32,
}

impl OverflowSketch {
    pub fn new(entries_max: usize) -> OverflowSketch {
        let row_cells =
            (entries_max.saturating_mul(OVERFLOW_CELLS_PER_ENTRY)).max(OVERFLOW_ROW_CELLS_MIN).next_power_of_two();
        OverflowSketch {
            cells: vec![Counts::default(); OVERFLOW_ROWS * row_cells].into_boxed_slice(),
            row_bits: row_cells.trailing_zeros(),
        }
    }

    /// The key's cell in `row`. Digests are keyed with the install's secret,
    /// so which keys share a cell is not up to a client.
    fn cell(&self, key: Key, row: usize) -> usize {
        let bits = (key.tuple ^ key.account_tag.rotate_left(17 * row as u32 + 5)).wrapping_mul(ROW_MIX[row]);
        (row << self.row_bits) | (bits >> (64 - self.row_bits)) as usize
    }

    /// The key's counts: those of its least-filled cell, which hold at
    /// least every failure spilled for the key in their windows.
    pub fn counts(&self, spec: WindowSpec, key: Key, now_us: u64) -> Counts {
        (0..OVERFLOW_ROWS)
            .map(|row| spec.rolled(self.cells[self.cell(key, row)], now_us))
            .min_by_key(|c| spec.weighted(*c, now_us))
            .expect("OVERFLOW_ROWS > 0")
    }

    /// Re-dates every cell to a new window length the way a table re-dates
    /// its entries at a reload: its sliding count, rounded down, becomes
    /// the current window's count, so a reload neither lifts nor invents a
    /// spilled lockout.
    pub fn redate(&mut self, old: WindowSpec, new: WindowSpec, now_us: u64) {
        let window = new.window_index(now_us);
        for cell in self.cells.iter_mut() {
            *cell = Counts { window, previous: 0, current: old.whole_failures(*cell, now_us) };
        }
    }

    /// Counts one failure of `key`. Conservative update: only cells below
    /// the key's estimate plus one failure are raised, which keeps the
    /// over-count of other keys down and the key's own estimate at least its
    /// true count.
    pub fn record(&mut self, spec: WindowSpec, key: Key, now_us: u64) {
        let target = spec.weighted(self.counts(spec, key, now_us), now_us) + spec.window_us as u128;
        for row in 0..OVERFLOW_ROWS {
            let i = self.cell(key, row);
            let mut cell = spec.rolled(self.cells[i], now_us);
            if spec.weighted(cell, now_us) < target {
                cell.current = cell.current.saturating_add(1);
            }
            self.cells[i] = cell;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = 900_000_000;

    fn key(n: u64) -> Key {
        let mixed = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Key { account_tag: mixed.rotate_left(32) ^ 0x5555, tuple: mixed }
    }

    #[test]
    fn a_key_never_reads_fewer_failures_than_it_had() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let mut sketch = OverflowSketch::new(64);
        let now = 1000 * WINDOW;
        let mut truth = std::collections::HashMap::new();
        for n in 0..5000u64 {
            let k = n * 7 % 611;
            sketch.record(spec, key(k), now + n);
            *truth.entry(k).or_insert(0u32) += 1;
        }
        for (k, failures) in truth {
            let read = spec.estimate(sketch.counts(spec, key(k), now + 5000), now + 5000);
            assert!(read >= failures, "key {k}: {read} < {failures}");
        }
    }

    #[test]
    fn spilled_failures_slide_out_with_the_window() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let mut sketch = OverflowSketch::new(64);
        let now = 1000 * WINDOW;
        for _ in 0..5 {
            sketch.record(spec, key(1), now);
        }
        assert!(spec.is_locked(sketch.counts(spec, key(1), now), now));
        assert!(!spec.is_locked(sketch.counts(spec, key(2), now), now), "an untouched key reads clean");
        let later = now + 2 * WINDOW;
        assert_eq!(spec.estimate(sketch.counts(spec, key(1), later), later), 0);
    }

    #[test]
    fn a_table_worth_of_spilled_lockouts_rarely_locks_a_fresh_key() {
        // 1,000 keys locked in the sketch of a 1,000-entry table: the
        // figure the module doc states, measured.
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let mut sketch = OverflowSketch::new(1000);
        let now = 1000 * WINDOW;
        for k in 0..1000 {
            for _ in 0..5 {
                sketch.record(spec, key(k), now);
            }
        }
        let falsely_locked =
            (1_000_000..1_010_000).filter(|k| spec.is_locked(sketch.counts(spec, key(*k), now), now)).count();
        // (1 − e^(−1000/4096))^4 = 0.24% expected
        assert!(falsely_locked < 50, "{falsely_locked} of 10,000 fresh keys locked");
    }
}
