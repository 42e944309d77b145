//! The places attempts in flight hold: an allowed check takes a place on
//! the rule (`FailureWindowTable::admit`), its report gives it back
//! (`settle`), and a place whose report never comes lapses on its own.
//! `standing` is what a check reads: a key's failures and its places.
//!
//! Places are memory only, never persisted; they count as failures only
//! when the map of places is full (`presumed_failures`).

use super::table::FailureWindowTable;
use super::window::Counts;
use crate::expiring::Slot as ExpiringSlot;
use crate::keys::Key;

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

impl FailureWindowTable {
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
    /// fine (a report after its place lapsed, or without a check). True
    /// if a live place was released.
    pub fn settle(&mut self, key: Key, now_us: u64) -> bool {
        self.in_flight.update(key.tuple, now_us, |held| match held {
            Some(mut slot) => {
                let released = slot.value.live(now_us) > 0;
                slot.value.release(now_us);
                let live = slot.value.live(now_us) > 0;
                slot.expires_us = slot.value.last_lapse(now_us);
                (live.then_some(slot), released)
            }
            None => (None, false),
        })
    }

    /// Checks admitted when the map of places was full of live ones, each
    /// counted as a failure at once (in `status`, with `refused_full`).
    pub fn presumed_failures(&self) -> u64 {
        self.presumed
    }

    /// Drops places that lapsed: a scan, for maintenance only (the map
    /// also sweeps itself, amortised, as it fills).
    pub fn sweep_places(&mut self, now_us: u64) {
        self.in_flight.sweep(now_us);
    }
}
