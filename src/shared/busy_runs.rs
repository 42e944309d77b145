//! How long each requester has been refused as busy. A late check in a
//! burst on its keys is refused while the store is busy with the burst
//! (`SharedStore::late_is_busy`); were that all, anyone who kept one of a
//! user's keys in a burst (her account from anywhere, her address from
//! behind her NAT, in turns so each burst was young) kept her out. So one
//! requester, a check's whole set of store keys (account, address,
//! device), is refused as busy for at most `busy_max_ms` in a stretch of
//! late checks in bursts; then its late checks are the store's failures
//! and answered on the share, until it has gone `busy_max_ms` x
//! `BUSY_QUIET_FACTOR` without one. An attacker's burst on fresh accounts
//! is a fresh requester each time, held by the store; one kept up on one
//! requester for longer than `busy_max_ms` is answered as for a store away
//! (the degraded bound).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::unpoisoned::Unpoisoned;

const SHARDS: usize = 16;
/// Requesters one shard remembers: 16 x 4096 stretches of 16 bytes, about
/// 2 MB at most. Past it a new requester is not excused: a flood of
/// distinct keys cannot make room to refuse a user again, and what it buys
/// the attacker is the degraded bound.
const REQUESTERS_PER_SHARD_MAX: usize = 4096;
pub const REQUESTERS_MAX: usize = SHARDS * REQUESTERS_PER_SHARD_MAX;
/// A requester's stretch ends after `busy_max_ms` times this without a
/// late check in a burst (5 s by default): an attacker who pauses between
/// turns refuses a user for at most a tenth of the time.
pub const BUSY_QUIET_FACTOR: u64 = 10;
/// A full shard is swept of ended stretches at most this often.
const SWEEP_INTERVAL_US: u64 = 10_000;

#[derive(Clone, Copy)]
struct Stretch {
    first_us: u64,
    last_us: u64,
}

#[derive(Default)]
struct Shard {
    stretches: HashMap<u64, Stretch>,
    last_sweep_us: u64,
}

#[derive(Default)]
pub struct BusyRuns {
    shards: [Mutex<Shard>; SHARDS],
}

impl BusyRuns {
    /// A late check in a burst from `requester` (`HotGuard::requester`) at
    /// `now_us`, the store busy: whether it may still be refused as busy,
    /// its stretch younger than `busy_max_us`. Counts it in the stretch.
    pub fn excused(&self, requester: u64, now_us: u64, busy_max_us: u64) -> bool {
        let quiet_us = busy_max_us.saturating_mul(BUSY_QUIET_FACTOR);
        let mut shard = self.shards[(requester >> 60) as usize % SHARDS].locked();
        if let Some(s) = shard.stretches.get_mut(&requester) {
            if now_us.saturating_sub(s.last_us) < quiet_us {
                s.last_us = s.last_us.max(now_us);
                return now_us.saturating_sub(s.first_us) < busy_max_us;
            }
            *s = Stretch { first_us: now_us, last_us: now_us };
            return busy_max_us > 0;
        }
        if !shard.has_room(now_us, quiet_us) {
            return false;
        }
        shard.stretches.insert(requester, Stretch { first_us: now_us, last_us: now_us });
        busy_max_us > 0
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.locked().stretches.len()).sum()
    }
}

impl Shard {
    fn has_room(&mut self, now_us: u64, quiet_us: u64) -> bool {
        if self.stretches.len() < REQUESTERS_PER_SHARD_MAX {
            return true;
        }
        if now_us.saturating_sub(self.last_sweep_us) < SWEEP_INTERVAL_US {
            return false;
        }
        self.last_sweep_us = now_us;
        self.stretches.retain(|_, s| now_us.saturating_sub(s.last_us) < quiet_us);
        self.stretches.len() < REQUESTERS_PER_SHARD_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 500;

    #[test]
    fn a_requester_is_excused_for_busy_max_in_a_stretch_that_ends_only_when_quiet() {
        let runs = BusyRuns::default();
        assert!(runs.excused(7, 1_000, MAX), "the stretch begins");
        assert!(runs.excused(7, 1_499, MAX));
        assert!(!runs.excused(7, 1_500, MAX), "busy_max of refusals");
        assert!(runs.excused(8, 1_500, MAX), "another requester has its own");
        let quiet = MAX * BUSY_QUIET_FACTOR;
        assert!(!runs.excused(7, 1_500 + quiet - 1, MAX), "late checks keep the stretch going");
        let ended = 1_500 + quiet - 1 + quiet;
        assert!(runs.excused(7, ended, MAX), "quiet for busy_max x {BUSY_QUIET_FACTOR}: a new stretch");
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
        let later = 3 + MAX * BUSY_QUIET_FACTOR + SWEEP_INTERVAL_US;
        assert!(runs.excused(u64::MAX >> 4, later, MAX), "the ended stretches swept for it");
        assert_eq!(runs.len(), 1);
    }
}
