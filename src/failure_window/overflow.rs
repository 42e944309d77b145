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
//!
//! Durable like a table's lockouts: a key reads locked only when all its
//! cells are at the threshold, so the cells at the threshold are all a
//! spilled lockout needs to survive a restart. The state file keeps
//! those, 64 neighbouring cells to a row (a key's four rows are written,
//! and waited for, when it locks; the rest at each snapshot), so it holds
//! at most the sketch's size, and a cell falling below the threshold
//! leaves its row. A restart puts them back, folding them into a sketch
//! of another size (a changed cap) by the prefix of their index, which
//! can only over-count.

use super::table::FailureWindowTable;
use super::{Counts, WindowSpec};
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
/// The sizes a sketch can have, as bits of its row's cell count: from
/// `OVERFLOW_ROW_CELLS_MIN` to what a shard of the largest cap needs. A
/// state-file row of another size is damage.
pub const ROW_BITS_MIN: u8 = 10;
pub const ROW_BITS_MAX: u8 = 25;
const _: () = assert!(1 << ROW_BITS_MIN == OVERFLOW_ROW_CELLS_MIN);
const _: () = assert!(
    (crate::config::ENTRIES_MAX_LIMIT.div_ceil(16) * OVERFLOW_CELLS_PER_ENTRY).next_power_of_two() == 1 << ROW_BITS_MAX
);
/// A sketch made at start for rows of a larger sketch (a cap lowered
/// while the daemon was down) is at most this many times the configured
/// one's size (4x, 2 bits): a lower cap's lockouts folded into a quarter
/// of the cells would refuse 16% of fresh keys, and a file cannot make
/// the daemon allocate much more than its cap implies.
const RESTORED_ROW_BITS_EXTRA_MAX: u32 = 2;

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
    /// Cells with a row in the state file (one bit each).
    persisted: Box<[u64]>,
    /// Cells to write (or delete) at the next snapshot.
    dirty: Box<[u64]>,
    /// Every row is to be replaced at the next snapshot: the rows in the
    /// file were of another size or window length.
    rewrite_whole: bool,
}

/// Changes to the rows of one shard's sketch: `whole` replaces every row
/// of the shard (of any size) with `chunks`; otherwise each chunk's row is
/// replaced (deleted when it holds no cell). `row_bits` is the sketch's
/// size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellChanges {
    pub row_bits: u8,
    pub whole: bool,
    pub chunks: Vec<CellChunk>,
}

/// One row of the state file: the cells at the threshold among the 64
/// from `chunk × 64` (one word of the bitmaps), by offset. A row per cell
/// cost 140 bytes of file a cell; a chunk's, about 15.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellChunk {
    pub chunk: u32,
    pub cells: Vec<(u8, Counts)>,
}

impl OverflowSketch {
    pub fn new(entries_max: usize) -> OverflowSketch {
        let row_cells =
            (entries_max.saturating_mul(OVERFLOW_CELLS_PER_ENTRY)).max(OVERFLOW_ROW_CELLS_MIN).next_power_of_two();
        Self::with_row_cells(row_cells)
    }

    fn with_row_cells(row_cells: usize) -> OverflowSketch {
        let cells = OVERFLOW_ROWS * row_cells;
        OverflowSketch {
            cells: vec![Counts::default(); cells].into_boxed_slice(),
            row_bits: row_cells.trailing_zeros(),
            persisted: vec![0; cells.div_ceil(64)].into_boxed_slice(),
            dirty: vec![0; cells.div_ceil(64)].into_boxed_slice(),
            rewrite_whole: false,
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
        self.forget_rows();
    }

    /// Every row is to be written again, and until then none counts as
    /// written: the rows in the file hold counts under an old window length
    /// or threshold.
    fn forget_rows(&mut self) {
        self.rewrite_whole = true;
        self.persisted.fill(0);
    }

    /// Counts one failure of `key`. Conservative update: only cells below
    /// the key's estimate plus one failure are raised, which keeps the
    /// over-count of other keys down and the key's own estimate at least its
    /// true count.
    /// A cell reaching the threshold is marked, so the next snapshot
    /// writes it: whichever keys it then refuses, their lockouts survive a
    /// restart.
    pub fn record(&mut self, spec: WindowSpec, key: Key, now_us: u64) {
        let target = spec.weighted(self.counts(spec, key, now_us), now_us) + spec.window_us as u128;
        for row in 0..OVERFLOW_ROWS {
            let i = self.cell(key, row);
            let mut cell = spec.rolled(self.cells[i], now_us);
            if spec.weighted(cell, now_us) < target {
                let was_locked = spec.is_locked(cell, now_us);
                cell.current = cell.current.saturating_add(1);
                if !was_locked && spec.is_locked(cell, now_us) {
                    // A row written for an earlier lockout of this cell
                    // holds counts that lift sooner than these.
                    self.dirty[i / 64] |= 1 << (i % 64);
                    self.persisted[i / 64] &= !(1 << (i % 64));
                }
            }
            self.cells[i] = cell;
        }
    }

    /// Whether each of the key's cells has its row in the state file.
    fn key_persisted(&self, key: Key) -> bool {
        (0..OVERFLOW_ROWS).all(|row| {
            let i = self.cell(key, row);
            self.persisted[i / 64] & (1 << (i % 64)) != 0
        })
    }

    /// The chunks holding the key's cells, once it reads locked: the rows
    /// its lockout needs. They count as written from here on.
    fn take_key_chunks(&mut self, spec: WindowSpec, key: Key, now_us: u64) -> Vec<CellChunk> {
        (0..OVERFLOW_ROWS).map(|row| self.take_chunk(spec, self.cell(key, row) / 64, now_us)).collect()
    }

    /// Chunk `chunk` as it is now (its cells at the threshold), counted as
    /// written.
    fn take_chunk(&mut self, spec: WindowSpec, chunk: usize, now_us: u64) -> CellChunk {
        let mut cells = Vec::new();
        let mut locked = 0u64;
        for (offset, counts) in self.cells[chunk * 64..(chunk + 1) * 64].iter().enumerate() {
            if spec.is_locked(*counts, now_us) {
                locked |= 1 << offset;
                cells.push((offset as u8, *counts));
            }
        }
        self.persisted[chunk] = locked;
        self.dirty[chunk] = 0;
        CellChunk { chunk: chunk as u32, cells }
    }

    fn mark_key_dirty(&mut self, key: Key) {
        for row in 0..OVERFLOW_ROWS {
            let i = self.cell(key, row);
            self.dirty[i / 64] |= 1 << (i % 64);
        }
    }

    /// The chunks to write since the last call: those with a marked cell
    /// at the threshold that their row lacks, and those with a cell in
    /// their row fallen below it (written without it, or deleted). Reads
    /// only the cells the bitmaps name.
    fn take_changes(&mut self, spec: WindowSpec, now_us: u64) -> Option<CellChanges> {
        if self.rewrite_whole {
            return Some(self.full_snapshot(spec, now_us));
        }
        let mut chunks = Vec::new();
        for chunk in 0..self.dirty.len() {
            let (dirty, persisted) = (self.dirty[chunk], self.persisted[chunk]);
            if dirty | persisted == 0 {
                continue;
            }
            let base = chunk * 64;
            let locked = |offset: u32| spec.is_locked(self.cells[base + offset as usize], now_us);
            let stale = bits(persisted).any(|offset| !locked(offset));
            let fresh = bits(dirty & !persisted).any(locked);
            if stale || fresh {
                chunks.push(self.take_chunk(spec, chunk, now_us));
            } else {
                self.dirty[chunk] = 0;
            }
        }
        (!chunks.is_empty()).then_some(CellChanges { row_bits: self.row_bits as u8, whole: false, chunks })
    }

    /// Every chunk with a cell at the threshold, replacing whatever rows
    /// the shard had (a rewrite of the file, or rows of another size or
    /// window length).
    fn full_snapshot(&mut self, spec: WindowSpec, now_us: u64) -> CellChanges {
        self.rewrite_whole = false;
        let chunks = (0..self.dirty.len())
            .map(|chunk| self.take_chunk(spec, chunk, now_us))
            .filter(|chunk| !chunk.cells.is_empty())
            .collect();
        CellChanges { row_bits: self.row_bits as u8, whole: true, chunks }
    }

    /// Puts back a cell's row, written by a sketch of `1 << row_bits` cells
    /// a row in `spec`'s window length (re-dated to this one's already): a
    /// sketch of another size takes it into every cell sharing its
    /// index's prefix, keeping the larger count, so no key that read
    /// locked reads less.
    fn restore_cell(&mut self, spec: WindowSpec, row_bits: u8, cell: u32, counts: Counts, now_us: u64) {
        let row_bits = u32::from(row_bits);
        let (row, index) = ((cell >> row_bits) as usize, cell & ((1u32 << row_bits) - 1));
        if row >= OVERFLOW_ROWS {
            return;
        }
        let first = if row_bits >= self.row_bits {
            (index >> (row_bits - self.row_bits)) as usize
        } else {
            (index as usize) << (self.row_bits - row_bits)
        };
        let span = 1usize << self.row_bits.saturating_sub(row_bits);
        for at in first..first + span {
            let i = (row << self.row_bits) | at;
            if spec.weighted(counts, now_us) > spec.weighted(self.cells[i], now_us) {
                self.cells[i] = counts;
            }
            if row_bits == self.row_bits {
                self.persisted[i / 64] |= 1 << (i % 64);
            }
        }
        if row_bits != self.row_bits {
            self.rewrite_whole = true;
        }
    }

    /// Raises each of the key's cells to at least `counts` (a persisted
    /// entry its table had no room for at start).
    fn raise(&mut self, spec: WindowSpec, key: Key, counts: Counts, now_us: u64) {
        for row in 0..OVERFLOW_ROWS {
            let i = self.cell(key, row);
            if spec.weighted(counts, now_us) > spec.weighted(self.cells[i], now_us) {
                self.cells[i] = counts;
            }
        }
        self.mark_key_dirty(key);
    }
}

/// The offsets of the set bits of `word`.
fn bits(mut word: u64) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        let bit = (word != 0).then(|| word.trailing_zeros())?;
        word &= word - 1;
        Some(bit)
    })
}

impl FailureWindowTable {
    fn sketch(&mut self) -> &mut OverflowSketch {
        let entries_max = self.entries_max();
        self.overflow.get_or_insert_with(|| Box::new(OverflowSketch::new(entries_max)))
    }

    /// Counts a failure that `record_failure` could not (the table full of
    /// lockouts) in the overflow sketch. Neither a success nor an unlock
    /// clears spilled failures: they drain with their window.
    pub fn count_overflow(&mut self, key: Key, now_us: u64) {
        self.spill(key, now_us);
    }

    /// `count_overflow`, and true when the key reads locked with a cell
    /// whose row is not in the state file yet (its lockout is new, or it
    /// was refused on cells other keys filled): the cells are then written
    /// at the next snapshot, or at once with `take_spilled_lockout`.
    pub fn spill(&mut self, key: Key, now_us: u64) -> bool {
        let spec = self.spec;
        let sketch = self.sketch();
        let was_locked = spec.is_locked(sketch.counts(spec, key, now_us), now_us);
        sketch.record(spec, key, now_us);
        let locked = spec.is_locked(sketch.counts(spec, key, now_us), now_us);
        // A new lockout is written whatever the bitmaps say: a row a
        // snapshot queued may not be committed yet.
        let unwritten = locked && (!was_locked || !sketch.key_persisted(key));
        if unwritten {
            sketch.mark_key_dirty(key);
        }
        unwritten
    }

    /// The rows a spilled lockout needs, to be written before the refusal
    /// is given (as a table's lockout is); they count as written.
    pub fn take_spilled_lockout(&mut self, key: Key, now_us: u64) -> Option<CellChanges> {
        let spec = self.spec;
        let sketch = self.overflow.as_mut()?;
        let chunks = sketch.take_key_chunks(spec, key, now_us);
        Some(CellChanges { row_bits: sketch.row_bits as u8, whole: false, chunks })
    }

    /// The sketch's rows to write since the last call, if it has any.
    pub fn take_cell_changes(&mut self, now_us: u64) -> Option<CellChanges> {
        let spec = self.spec;
        self.overflow.as_mut()?.take_changes(spec, now_us)
    }

    /// Every sketch cell at the threshold, for a rewrite of the file.
    pub fn full_cell_snapshot(&mut self, now_us: u64) -> Option<CellChanges> {
        let spec = self.spec;
        Some(self.overflow.as_mut()?.full_snapshot(spec, now_us))
    }

    /// Puts back a sketch cell's row at start (`counts` already in this
    /// table's window length). A sketch made for it is up to 4 times its
    /// configured size, to hold the size that wrote it: folded into fewer
    /// cells, a lower cap's lockouts refuse many fresh keys until they
    /// drain.
    pub fn restore_cell(&mut self, row_bits: u8, cell: u32, counts: Counts, now_us: u64) {
        let spec = self.spec;
        if self.overflow.is_none() {
            let configured = OverflowSketch::new(self.entries_max()).row_bits;
            let bits = u32::from(row_bits).clamp(configured, configured + RESTORED_ROW_BITS_EXTRA_MAX);
            self.overflow = Some(Box::new(OverflowSketch::with_row_cells(1 << bits)));
        }
        self.sketch().restore_cell(spec, row_bits, cell, counts, now_us);
    }

    /// Replaces every row of the sketch at the next snapshot: the rows
    /// hold counts under another window length or threshold (a reload, or
    /// rows read at start).
    pub fn forget_cell_rows(&mut self) {
        if let Some(sketch) = &mut self.overflow {
            sketch.forget_rows();
        }
    }

    /// Counts a persisted entry that found no room at start in the sketch,
    /// so its lockout holds.
    pub fn restore_spilled(&mut self, key: Key, counts: Counts, now_us: u64) {
        let spec = self.spec;
        self.sketch().raise(spec, key, counts, now_us);
    }

    /// The failures the sketch holds for the key, for a key the table
    /// takes in: its entry starts from them, so that an entry's count is
    /// every failure of the key (see `standing`).
    pub(super) fn spilled(&self, key: Key, now_us: u64) -> Counts {
        match &self.overflow {
            Some(sketch) => sketch.counts(self.spec, key, now_us),
            None => Counts { window: self.spec.window_index(now_us), ..Counts::default() },
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

    /// A table of one entry, full of a lockout, so every other key spills.
    fn full_table(spec: WindowSpec, now: u64) -> FailureWindowTable {
        let mut table = FailureWindowTable::new(spec, 1);
        for _ in 0..spec.threshold {
            table.record_failure(key(0), now).unwrap();
        }
        table
    }

    /// The cells a set of chunks holds at the threshold.
    fn cells_in(changes: &CellChanges) -> usize {
        changes.chunks.iter().map(|c| c.cells.len()).sum()
    }

    #[test]
    fn a_spilled_lockout_hands_over_its_four_cells_and_their_rows_go_when_it_drains() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        let locked: Vec<bool> = (0..5).map(|_| table.spill(key(1), now)).collect();
        assert_eq!(locked, [false, false, false, false, true], "the fifth failure locks it");
        let lockout = table.take_spilled_lockout(key(1), now).unwrap();
        assert_eq!((lockout.chunks.len(), cells_in(&lockout)), (OVERFLOW_ROWS, OVERFLOW_ROWS));
        assert!(lockout.chunks.iter().flat_map(|c| &c.cells).all(|(_, c)| spec.is_locked(*c, now)));
        assert_eq!(table.take_cell_changes(now), None, "written already");
        assert!(!table.spill(key(1), now), "a locked key's further failures lock nothing new");
        // A lockout that spilled where no one took its cells (a check's
        // presumed failure) is written by the next snapshot.
        for _ in 0..5 {
            table.spill(key(2), now);
        }
        // (A chunk holds 64 cells of a row of 1,024, so the two keys may
        // share one: it then carries both keys' cells.)
        let snapshot = table.take_cell_changes(now).unwrap();
        assert_eq!(snapshot.chunks.len(), OVERFLOW_ROWS);
        assert!(cells_in(&snapshot) >= OVERFLOW_ROWS);
        // Drained: every row is emptied, once.
        let later = now + 2 * WINDOW;
        let drained = table.take_cell_changes(later).unwrap();
        assert!((OVERFLOW_ROWS..=2 * OVERFLOW_ROWS).contains(&drained.chunks.len()));
        assert_eq!(cells_in(&drained), 0, "deleted");
        assert_eq!(table.take_cell_changes(later), None);
    }

    #[test]
    fn cells_put_back_in_a_sketch_of_any_size_keep_every_spilled_lockout() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW + WINDOW / 3;
        let mut table = full_table(spec, now);
        table.reconfigure(spec, 5000, now); // a sketch of 32,768 cells a row
        for k in 1..=300 {
            for _ in 0..5 {
                table.spill(key(k), now);
            }
        }
        let rows = table.full_cell_snapshot(now).unwrap();
        assert!(rows.whole);
        for entries_max in [1, 5000, 20_000] {
            let mut restarted = full_table(spec, now);
            restarted.reconfigure(spec, entries_max, now);
            for chunk in &rows.chunks {
                for (offset, counts) in &chunk.cells {
                    restarted.restore_cell(rows.row_bits, chunk.chunk * 64 + u32::from(*offset), *counts, now);
                }
            }
            for k in 1..=300 {
                let standing = restarted.standing(key(k), now + WINDOW / 2);
                assert!(spec.is_locked(standing.counts, now + WINDOW / 2), "key {k} at entries_max {entries_max}");
            }
            let same_size = restarted.overflow.as_ref().unwrap().row_bits == u32::from(rows.row_bits);
            let whole = restarted.take_cell_changes(now).is_some_and(|c| c.whole);
            // Rows of another size are replaced; rows of the same size stand.
            assert_eq!(whole, !same_size, "entries_max {entries_max}");
        }
    }

    #[test]
    fn after_a_snapshot_every_key_the_sketch_refuses_has_its_cells_written() {
        // Found by measuring: a key refused from its first failure, on
        // cells other keys had filled, never "locked" itself, and its
        // cells were not all written.
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        for k in 1..=3000 {
            for _ in 0..5 {
                if table.spill(key(k), now) {
                    table.take_spilled_lockout(key(k), now);
                }
            }
        }
        table.take_cell_changes(now);
        let sketch = table.overflow.as_ref().unwrap();
        let refused: Vec<u64> =
            (1..=100_000).filter(|k| spec.is_locked(sketch.counts(spec, key(*k), now), now)).collect();
        assert!(refused.len() > 3000, "saturated: {} refused", refused.len());
        assert!(refused.iter().all(|k| sketch.key_persisted(key(*k))));
    }

    #[test]
    fn a_key_taken_in_after_spilling_starts_from_its_spilled_failures() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        for _ in 0..3 {
            table.spill(key(1), now);
        }
        table.clear(key(0));
        table.record_failure(key(1), now).unwrap();
        let recorded = table.record_failure(key(1), now).unwrap();
        // Its entry holds all five, so its lockout is written as the
        // table's, and a restart without the sketch still refuses it.
        assert!(recorded.now_locked && !recorded.was_locked, "{recorded:?}");
        assert_eq!(spec.estimate(table.standing(key(1), now).counts, now), 5);
    }

    #[test]
    fn an_entry_with_no_room_at_start_is_counted_in_the_sketch() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        let lockout = Counts { window: 1000, previous: 0, current: 5 };
        assert!(table.restore(key(1), lockout, now).is_err(), "no room");
        table.restore_spilled(key(1), lockout, now);
        assert!(spec.is_locked(table.standing(key(1), now).counts, now));
        let rows = table.take_cell_changes(now).unwrap();
        assert_eq!(cells_in(&rows), OVERFLOW_ROWS, "written");
    }

    /// The state file's overflow_cells_v1 rows of one shard, as
    /// `commit_cells` leaves them, and `Limiter::restore_cells` for them
    /// (same window length).
    #[derive(Default)]
    struct Disk(std::collections::BTreeMap<(u8, u32), Vec<(u8, Counts)>>);

    impl Disk {
        fn apply(&mut self, changes: Option<CellChanges>) {
            let Some(changes) = changes else { return };
            if changes.whole {
                self.0.clear();
            }
            for chunk in changes.chunks {
                if chunk.cells.is_empty() {
                    self.0.remove(&(changes.row_bits, chunk.chunk));
                } else {
                    self.0.insert((changes.row_bits, chunk.chunk), chunk.cells);
                }
            }
        }

        fn restore_into(&self, table: &mut FailureWindowTable, now: u64) {
            for ((row_bits, chunk), cells) in &self.0 {
                for (offset, counts) in cells {
                    table.restore_cell(*row_bits, chunk * 64 + u32::from(*offset), *counts, now);
                }
            }
        }
    }

    /// One reported failure of a spilled key, as `report_rules` does it:
    /// its rows written before the reply when `spill` says so. True when
    /// the reply would be deny.
    fn report_failure(table: &mut FailureWindowTable, disk: &mut Disk, k: Key, now: u64) -> bool {
        match table.record_failure(k, now) {
            Ok(_) => panic!("the table had room: this test needs it full of lockouts"),
            Err(_) => {
                if table.spill(k, now) {
                    disk.apply(table.take_spilled_lockout(k, now));
                }
            }
        }
        table.spec.is_locked(table.standing(k, now).counts, now)
    }

    /// The attacker keeps the table full: a fresh key's five failures
    /// evict the entry whose lockout lifted with the window.
    fn refill(table: &mut FailureWindowTable, n: u64, now: u64) {
        for _ in 0..table.spec.threshold {
            table.record_failure(key(1_000_000 + n), now).unwrap();
        }
    }

    #[test]
    fn a_relock_just_after_the_window_turns_survives_a_clean_restart() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let w0 = 1000 * WINDOW;
        let mut disk = Disk::default();
        let mut table = full_table(spec, w0);
        let replies: Vec<bool> = (0..5).map(|_| report_failure(&mut table, &mut disk, key(1), w0)).collect();
        assert_eq!(replies, [false, false, false, false, true]);
        disk.apply(table.take_cell_changes(w0)); // a snapshot
                                                 // The window turns: the key unlocks a microsecond later (5 x
                                                 // (1 - 1us/W) < 5); the attacker's next guess locks it again.
        let t1 = w0 + WINDOW + 1;
        refill(&mut table, 1, t1);
        assert!(!spec.is_locked(table.standing(key(1), t1).counts, t1));
        assert!(report_failure(&mut table, &mut disk, key(1), t1), "answered deny");
        // A clean stop: the final snapshot.
        let stop = t1 + 1_000_000;
        disk.apply(table.take_cell_changes(stop));
        // Without a restart it is refused until 20% into the window
        // (5 x 0.9 + 1 = 5.5 at 10%).
        let later = w0 + WINDOW + WINDOW / 10;
        assert!(spec.is_locked(table.standing(key(1), later).counts, later));
        let mut restarted = full_table(spec, stop);
        disk.restore_into(&mut restarted, stop);
        assert!(
            spec.is_locked(restarted.standing(key(1), later).counts, later),
            "the deny of {t1} is gone after a clean restart: the file holds {:?}",
            disk.0
        );
    }

    #[test]
    fn a_key_kept_at_its_lockout_through_a_window_gets_no_extra_guesses_after_a_kill_9() {
        // The attacker guesses at the instant each lockout lifts: 5 a window,
        // the rule's rate. Every one of those guesses is answered deny.
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let w0 = 1000 * WINDOW;
        let mut disk = Disk::default();
        let mut table = full_table(spec, w0);
        for _ in 0..5 {
            report_failure(&mut table, &mut disk, key(1), w0);
        }
        disk.apply(table.take_cell_changes(w0));
        let w1 = w0 + WINDOW;
        refill(&mut table, 1, w1 + 1);
        for n in 0..5u64 {
            let t = w1 + n * WINDOW / 5 + 1;
            assert!(!spec.is_locked(table.standing(key(1), t).counts, t), "guess {n} admitted");
            assert!(report_failure(&mut table, &mut disk, key(1), t), "guess {n} answered deny");
            // a snapshot a second later (the default interval)
            disk.apply(table.take_cell_changes(t + 1_000_000));
        }
        // kill -9 at 85% of the window, then a restart at once.
        let crash = w1 + WINDOW * 85 / 100;
        assert!(spec.is_locked(table.standing(key(1), crash).counts, crash), "refused till the window ends");
        let mut restarted = full_table(spec, crash);
        disk.restore_into(&mut restarted, crash);
        let mut extra = 0;
        while !spec.is_locked(restarted.standing(key(1), crash).counts, crash) && extra < 100 {
            restarted.spill(key(1), crash);
            extra += 1;
        }
        assert_eq!(extra, 0, "guesses after the restart that the deny of each guess had refused; file {:?}", disk.0);
    }

    #[test]
    fn cells_a_reload_to_a_lower_threshold_locks_are_written_by_the_next_snapshot() {
        // 3 spilled failures, threshold 5: nothing to write. A reload to
        // threshold 3 locks the key (a check is refused), but its cells are
        // not marked, so no snapshot writes them: a kill -9 lets it in.
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        for _ in 0..3 {
            table.spill(key(1), now);
        }
        assert_eq!(table.take_cell_changes(now), None);
        let lower = WindowSpec { window_us: WINDOW, threshold: 3 };
        table.reconfigure(lower, 1, now);
        assert!(lower.is_locked(table.standing(key(1), now).counts, now), "refused after the reload");
        let snapshot = table.take_cell_changes(now + 1_000_000);
        assert!(snapshot.is_some_and(|c| cells_in(&c) >= OVERFLOW_ROWS), "the lockout's cells are not written");
    }

    #[test]
    fn a_restart_with_a_quarter_of_the_cap_refuses_few_more_fresh_keys() {
        let spec = WindowSpec { window_us: WINDOW, threshold: 5 };
        let now = 1000 * WINDOW;
        let mut table = full_table(spec, now);
        table.reconfigure(spec, 1000, now); // 4,096 cells a row
        for k in 1..=1000 {
            for _ in 0..5 {
                table.spill(key(k), now);
            }
        }
        let rows = table.full_cell_snapshot(now).unwrap();
        let fresh = |t: &FailureWindowTable| {
            (1_000_000..1_010_000u64).filter(|k| spec.is_locked(t.standing(key(*k), now).counts, now)).count()
        };
        let before = fresh(&table);
        let mut restarted = full_table(spec, now);
        restarted.reconfigure(spec, 250, now); // 1,024 cells a row
        for chunk in &rows.chunks {
            for (offset, counts) in &chunk.cells {
                restarted.restore_cell(rows.row_bits, chunk.chunk * 64 + u32::from(*offset), *counts, now);
            }
        }
        let after = fresh(&restarted);
        assert!(
            after <= 4 * before.max(25),
            "fresh keys refused of 10,000: {before} before, {after} after the restart"
        );
    }
}
