//! How long each requester has been refused as busy. A late check in a
//! burst on its keys is refused while the store is busy with the burst
//! (`SharedStore::lateness`). A burst of the requester's own (parallel
//! checks on one account and address: a guesser) is refused for as long
//! as it lasts. Were every burst so, anyone who kept one of a user's keys
//! hot (her account from anywhere, in turns or kept up) kept her out. So
//! a requester in a burst not its own is refused as busy for at most
//! `busy_max_ms` in a window of `busy_max_ms` x `BUSY_WINDOW_FACTOR` (a
//! minute by default) from its first such refusal; past that its late
//! checks are judged as lone ones (answered on the share while the run of
//! late calls is young). What it costs: a burst from many addresses, one
//! check each, whose requesters were refused within the window, gets the
//! degraded bound, not 5.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::unpoisoned::Unpoisoned;

const SHARDS: usize = 16;
/// Requesters one shard remembers: 16 x 4096 of 16 bytes, about 2 MB.
/// Past it a new requester is not excused: a flood of distinct keys cannot
/// make room to refuse a user again, and what it buys is the degraded
/// bound.
const REQUESTERS_PER_SHARD_MAX: usize = 4096;
pub const REQUESTERS_MAX: usize = SHARDS * REQUESTERS_PER_SHARD_MAX;
/// A requester's window, in multiples of `busy_max_ms`: refused as busy
/// for at most 1/120 of the time however its keys are kept hot.
pub const BUSY_WINDOW_FACTOR: u64 = 120;
/// A full shard is swept of ended windows at most this often.
const SWEEP_INTERVAL_US: u64 = 10_000;

#[derive(Default)]
struct Shard {
    /// Per requester, its window's first busy refusal (µs).
    first_us: HashMap<u64, u64>,
    last_sweep_us: u64,
}

#[derive(Default)]
pub struct BusyRuns {
    shards: [Mutex<Shard>; SHARDS],
}

impl BusyRuns {
    /// A late check from `requester` (`HotGuard::requester`) in a burst
    /// not its own, at `now_us`, the store busy: whether it may be refused
    /// as busy, within `busy_max_us` of its window's first refusal.
    pub fn excused(&self, requester: u64, now_us: u64, busy_max_us: u64) -> bool {
        let window_us = busy_max_us.saturating_mul(BUSY_WINDOW_FACTOR);
        let mut shard = self.shards[(requester >> 60) as usize % SHARDS].locked();
        if let Some(first) = shard.first_us.get_mut(&requester) {
            if now_us.saturating_sub(*first) < window_us {
                return now_us.saturating_sub(*first) < busy_max_us;
            }
            *first = now_us;
            return busy_max_us > 0;
        }
        if !shard.has_room(now_us, window_us) {
            return false;
        }
        shard.first_us.insert(requester, now_us);
        busy_max_us > 0
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.locked().first_us.len()).sum()
    }
}

impl Shard {
    fn has_room(&mut self, now_us: u64, window_us: u64) -> bool {
        if self.first_us.len() < REQUESTERS_PER_SHARD_MAX {
            return true;
        }
        if now_us.saturating_sub(self.last_sweep_us) < SWEEP_INTERVAL_US {
            return false;
        }
        self.last_sweep_us = now_us;
        self.first_us.retain(|_, first| now_us.saturating_sub(*first) < window_us);
        self.first_us.len() < REQUESTERS_PER_SHARD_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 500;

    #[test]
    fn a_requester_is_excused_for_busy_max_in_each_window() {
        let runs = BusyRuns::default();
        assert!(runs.excused(7, 1_000, MAX), "the window begins");
        assert!(runs.excused(7, 1_499, MAX));
        assert!(!runs.excused(7, 1_500, MAX), "busy_max of refusals");
        assert!(runs.excused(8, 1_500, MAX), "another requester has its own");
        let window = MAX * BUSY_WINDOW_FACTOR;
        assert!(!runs.excused(7, 1_000 + window - 1, MAX), "not again within the window, after any quiet");
        assert!(runs.excused(7, 1_000 + window, MAX), "a new window");
        assert!(!runs.excused(7, 1_000 + window + MAX, MAX));
        assert!(!BusyRuns::default().excused(9, 1, 0), "busy_max 0: never busy");
    }

    #[test]
    fn past_the_bound_a_new_requester_is_not_excused_until_ended_ones_are_swept() {
        let runs = BusyRuns::default();
        // All in shard 0.
        for r in 0..REQUESTERS_PER_SHARD_MAX as u64 {
            assert!(runs.excused(r, 1, MAX));
        }
        assert!(!runs.excused(u64::MAX >> 4, 2, MAX), "full: not excused");
        assert!(runs.excused(0, 3, MAX), "a remembered one goes on");
        assert_eq!(runs.len(), REQUESTERS_PER_SHARD_MAX, "bounded");
        let later = 1 + MAX * BUSY_WINDOW_FACTOR + SWEEP_INTERVAL_US;
        assert!(runs.excused(u64::MAX >> 4, later, MAX), "the ended windows swept for it");
        assert_eq!(runs.len(), 1);
    }
}
