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
//!
//! The files:
//! - `window.rs`: the window arithmetic (`WindowSpec`, `Counts`), pure
//!   functions of a key's counts and the time.
//! - `table.rs`: `FailureWindowTable`, its slab, index and count-class
//!   lists; expiry, eviction, the changes to persist, reconfiguration.
//! - `places.rs`: the places attempts in flight hold (`Places`), and the
//!   table's `admit`, `settle` and `standing`, which take and read them.
//! - `overflow.rs`: the sketch that counts keys a table full of lockouts
//!   cannot hold, and the cells of it the state file keeps.
//!
//! No locks, no clock, no I/O: callers pass `now_us` in and persist the
//! changes the table lists.

mod overflow;
mod places;
mod table;
#[cfg(test)]
mod tests;
mod window;

pub use overflow::CellChunk;
pub use overflow::{CellChanges, OVERFLOW_ROWS, ROW_BITS_MAX, ROW_BITS_MIN};
pub use places::{Settled, Standing};
pub use table::{Change, FailureWindowTable, Recorded, TableError, TOP_CLASS_EVICTION_SCAN};
pub use window::{Counts, WindowSpec, THRESHOLD_MAX, WINDOW_US_MIN};
