//! The places attempts in flight hold: an allowed check takes a place on
//! the rule (`FailureWindowTable::admit`), its report gives it back
//! (`settle`), and a place whose report never comes lapses on its own.
//! `standing` is what a check reads: a key's failures and its places.
//!
//! Places are memory only, never persisted. When the map of places is full
//! of live ones, an attempt that finds no room is counted as a failure at
//! once and remembered as presumed (`Presumed`), so that its report settles
//! it as a place would be: a failure is not counted twice, and a success,
//! a repeat or an abandon takes the presumed failure back.

use super::table::FailureWindowTable;
use super::window::{Counts, WindowSpec};
use crate::expiring::Slot as ExpiringSlot;
use crate::keys::Key;

/// Cells of one key's places (see `Places`).
pub const PLACE_CELLS: usize = 8;

/// How finely places that share a cell are timed: a cell that holds more
/// than one place lapses at the end of its step of `timeout / PLACE_STEPS`.
/// With that step, the places of one timeout fall in at most
/// `PLACE_STEPS + 1` steps, one cell each, so the cells always suffice.
const PLACE_STEPS: u64 = PLACE_CELLS as u64 - 1;

/// The places of one key, each lapsing on its own: up to `PLACE_CELLS` at
/// their exact instant, and beyond that grouped by the step of the timeout
/// their instant falls in, so a place lapses at most one step
/// (`attempt_timeout / 7`) after its own instant and is never renewed by
/// later attempts. A report or an abandon releases the newest live place,
/// so a place whose report never comes (a crashed handler) keeps its own
/// lapse instant however busy the key stays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Places {
    /// Lapse instants; 0 or past means the cell is free.
    until_us: [u64; PLACE_CELLS],
    /// Places each cell holds (1 unless grouped).
    count: [u32; PLACE_CELLS],
    /// The key's account tag, so an account-wide unlock finds its places.
    account_tag: u64,
}

impl Places {
    /// The live places and when the first of them lapses (`now_us` if none
    /// is live), in one pass over the cells: every check and report reads
    /// both.
    fn held(&self, now_us: u64) -> (u32, u64) {
        let (mut live, mut first) = (0u32, None::<u64>);
        for (&until, &count) in self.until_us.iter().zip(self.count.iter()) {
            if until > now_us {
                live = live.saturating_add(count);
                first = Some(first.map_or(until, |f| f.min(until)));
            }
        }
        (live, first.unwrap_or(now_us))
    }

    pub fn live(&self, now_us: u64) -> u32 {
        self.held(now_us).0
    }

    /// `Standing` with these places in flight.
    fn standing(&self, counts: Counts, now_us: u64) -> Standing {
        let (in_flight, in_flight_until_us) = self.held(now_us);
        Standing { counts, in_flight, in_flight_until_us }
    }

    /// When the last live place lapses: the map entry's own expiry.
    fn last_lapse(&self, now_us: u64) -> u64 {
        self.until_us.iter().copied().max().unwrap_or(0).max(now_us)
    }

    /// A place lapsing at `until_us`, taken at `now_us` for `timeout_us`.
    fn take(&mut self, until_us: u64, now_us: u64, timeout_us: u64) {
        let step_us = timeout_us.div_ceil(PLACE_STEPS).max(1);
        let step_end = |u: u64| u.div_ceil(step_us).saturating_mul(step_us);
        let live = |i: usize| self.until_us[i] > now_us;
        if let Some(free) = (0..PLACE_CELLS).find(|&i| !live(i)) {
            (self.until_us[free], self.count[free]) = (until_us, 1);
            return;
        }
        // Every cell is live: join the cell of the same step, or merge two
        // cells that share a step to free one. Each then lapses at the end
        // of its step, never earlier than any of its places.
        let end = step_end(until_us);
        if let Some(same) = (0..PLACE_CELLS).find(|&i| step_end(self.until_us[i]) == end) {
            self.count[same] = self.count[same].saturating_add(1);
            self.until_us[same] = end;
            return;
        }
        let pair = (0..PLACE_CELLS)
            .flat_map(|i| (i + 1..PLACE_CELLS).map(move |j| (i, j)))
            .find(|&(i, j)| step_end(self.until_us[i]) == step_end(self.until_us[j]));
        if let Some((i, j)) = pair {
            self.count[i] = self.count[i].saturating_add(self.count[j]);
            self.until_us[i] = step_end(self.until_us[i]);
            (self.until_us[j], self.count[j]) = (until_us, 1);
            return;
        }
        // Only when places of a longer timeout (a reload) span more steps
        // than there are cells: join the newest cell, which then lapses
        // with the newest place. Errs towards holding, never freeing.
        let newest = (0..PLACE_CELLS).max_by_key(|&i| self.until_us[i]).expect("cells");
        self.count[newest] = self.count[newest].saturating_add(1);
        self.until_us[newest] = self.until_us[newest].max(until_us);
    }

    /// Releases the newest live place, if any; true if there was one.
    fn release(&mut self, now_us: u64) -> bool {
        let newest = (0..PLACE_CELLS).filter(|&i| self.until_us[i] > now_us).max_by_key(|&i| self.until_us[i]);
        if let Some(i) = newest {
            self.count[i] -= 1;
            if self.count[i] == 0 {
                self.until_us[i] = 0;
            }
        }
        newest.is_some()
    }
}

/// A key's attempts admitted with no room for their place: each counted as
/// a failure in the window it was admitted in, and kept in the key's entry
/// beside its counts until a report or an abandon settles it (so it lasts
/// as long as the failure it stands for). Per window, as `Counts`, so that
/// a failure taken back comes out of the window it went into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Presumed {
    window: u32,
    previous: u16,
    current: u16,
}

/// How a report (or an abandon, or a refused check giving back) found its
/// attempt on a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// A live place was released.
    Place,
    /// A presumed failure was settled: the attempt was counted already.
    Presumed,
    /// Neither: a report after its place lapsed, or without a check.
    Nothing,
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
    /// table has overflowed, a key's failures are the more of its entry's
    /// and the sketch's: a key spills only while it has no entry, and an
    /// entry starts from what the key spilled (`record_failure`), so the
    /// entry holds every failure; the sketch only adds.
    pub fn standing(&self, key: Key, now_us: u64) -> Standing {
        self.standing_and_places(key, now_us).0
    }

    /// `standing`, and the places it read (one probe of each map).
    fn standing_and_places(&self, key: Key, now_us: u64) -> (Standing, Places) {
        let places = self.in_flight.get(key.tuple, now_us).map(|s| s.value).unwrap_or_default();
        let mut counts = self.get(key, now_us);
        if self.overflow.is_some() {
            let spilled = self.spilled(key, now_us);
            if self.spec.weighted(spilled, now_us) > self.spec.weighted(counts, now_us) {
                counts = self.spec.rolled(spilled, now_us);
            }
        }
        (places.standing(counts, now_us), places)
    }

    /// `check` on this rule, in one step: admits the attempt unless the
    /// failures plus the attempts already in flight reach the threshold,
    /// and an admitted attempt takes a place until `settle` or
    /// `timeout_us` from now. Returns whether it was admitted and the
    /// standing after it.
    pub fn admit(&mut self, key: Key, now_us: u64, timeout_us: u64) -> (bool, Standing) {
        self.admit_within(key, now_us, timeout_us, self.spec.threshold)
    }

    /// `admit` against a lower `threshold` than the table's (a share
    /// some of which was used elsewhere), judged under the same lock as
    /// the place is taken.
    pub fn admit_within(&mut self, key: Key, now_us: u64, timeout_us: u64, threshold: u32) -> (bool, Standing) {
        let (before, mut places) = self.standing_and_places(key, now_us);
        let spec = WindowSpec { threshold: threshold.min(self.spec.threshold), ..self.spec };
        if spec.refuses(before.counts, before.in_flight, now_us) {
            return (false, before);
        }
        places.account_tag = key.account_tag;
        places.take(now_us.saturating_add(timeout_us.max(1)), now_us, timeout_us.max(1));
        let slot = ExpiringSlot { expires_us: places.last_lapse(now_us), value: places };
        if !self.in_flight.set_if_room(key.tuple, slot, now_us) {
            // Full of live places: the attempt is counted as a failure now,
            // which errs towards refusing, and marked presumed in its entry
            // for its report to settle. In a table full of lockouts (the
            // failure spilled to the sketch) its report counts it again.
            self.presumed += 1;
            if self.record_failure(key, now_us).is_ok() {
                self.presume(key, now_us);
            } else {
                self.count_overflow(key, now_us);
            }
            return (true, self.standing(key, now_us));
        }
        (true, places.standing(before.counts, now_us))
    }

    /// Marks one of the key's failures, counted in `now_us`'s window, as
    /// presumed.
    fn presume(&mut self, key: Key, now_us: u64) {
        let window = self.spec.window_index(now_us);
        if let Some(presumed) = self.presumed_mut(key) {
            let mut p = rolled(*presumed, window);
            p.current = p.current.saturating_add(1);
            *presumed = p;
        }
    }

    /// Settles the attempt a report (or an abandon, or a refused check)
    /// speaks for: releases the newest of the key's live places, or else
    /// settles one of its presumed failures, which is taken back unless
    /// `failed` (the attempt failed, and was counted when presumed). None
    /// held is fine (a report after its place lapsed, or without a check).
    pub fn settle(&mut self, key: Key, now_us: u64, failed: bool) -> Settled {
        if self.release_place(key, now_us) {
            return Settled::Place;
        }
        let window = self.spec.window_index(now_us);
        let Some(presumed) = self.presumed_mut(key) else { return Settled::Nothing };
        let mut p = rolled(*presumed, window);
        let in_previous = if p.current > 0 {
            p.current -= 1;
            false
        } else if p.previous > 0 {
            p.previous -= 1;
            true
        } else {
            return Settled::Nothing;
        };
        *presumed = p;
        if !failed {
            self.take_back(key, now_us, in_previous);
        }
        Settled::Presumed
    }

    /// Releases the newest of the key's live places; true if there was one.
    fn release_place(&mut self, key: Key, now_us: u64) -> bool {
        self.in_flight.update(key.tuple, now_us, |held| match held {
            Some(mut slot) => {
                let released = slot.value.release(now_us);
                let live = slot.value.live(now_us) > 0;
                slot.expires_us = slot.value.last_lapse(now_us);
                (live.then_some(slot), released)
            }
            None => (None, false),
        })
    }

    /// Drops every place the key holds (an operator's unlock); true if
    /// any was live.
    pub fn clear_places(&mut self, key: Key, now_us: u64) -> bool {
        self.in_flight.remove(key.tuple).is_some_and(|slot| slot.value.live(now_us) > 0)
    }

    /// Drops every place held on a key of the account; how many keys held
    /// live ones.
    pub fn clear_account_places(&mut self, account_tag: u64, now_us: u64) -> u32 {
        let doomed: Vec<u64> = self
            .in_flight
            .live(now_us)
            .into_iter()
            .filter(|(_, slot)| slot.value.account_tag == account_tag && slot.value.live(now_us) > 0)
            .map(|(id, _)| id)
            .collect();
        for id in &doomed {
            self.in_flight.remove(*id);
        }
        doomed.len() as u32
    }

    /// Up to `max` keys refused by their places in flight and not locked
    /// by failures alone: each with its counts (and the overflow's) and the
    /// instant its first place lapses, when it admits again. A scan of the
    /// live places, for the operator's `lockouts` only; it stops at `max`.
    pub fn refused_by_places(&self, max: usize, now_us: u64) -> Vec<(Key, Counts, u64)> {
        let mut out = Vec::new();
        for (tuple, slot) in self.in_flight.iter_live(now_us) {
            if out.len() >= max {
                break;
            }
            let key = Key { account_tag: slot.value.account_tag, tuple };
            let (standing, _) = self.standing_and_places(key, now_us);
            if !self.spec.is_locked(standing.counts, now_us)
                && self.spec.refuses(standing.counts, standing.in_flight, now_us)
            {
                out.push((key, standing.counts, standing.in_flight_until_us));
            }
        }
        out
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

/// The presumed failures as seen from `window`.
fn rolled(p: Presumed, window: u32) -> Presumed {
    if window <= p.window {
        p
    } else if window == p.window + 1 {
        Presumed { window, previous: p.current, current: 0 }
    } else {
        Presumed { window, previous: 0, current: 0 }
    }
}
