//! Unit tests of the failure window: its arithmetic, the table, and the
//! places in flight against a plain model.

use super::*;
use crate::keys::Key;

const MINUTE: u64 = 60_000_000;
const WINDOW: u64 = 15 * MINUTE;

fn spec(threshold: u32) -> WindowSpec {
    WindowSpec { window_us: WINDOW, threshold }
}

fn key(n: u64) -> Key {
    Key { account_tag: n, tuple: n.wrapping_mul(0x9E37_79B9_7F4A_7C15) }
}

#[test]
fn locks_at_exactly_the_threshold() {
    let mut table = FailureWindowTable::new(spec(5), 100);
    let t0 = 100 * WINDOW;
    for n in 1..=4 {
        let r = table.record_failure(key(1), t0).unwrap();
        assert!(!r.now_locked, "after {n}");
    }
    let fifth = table.record_failure(key(1), t0).unwrap();
    assert!(fifth.now_locked && !fifth.was_locked);
    assert_eq!(table.locked(t0).count(), 1);
}

#[test]
fn boundary_burst_admits_at_most_one_more_in_three_minutes() {
    let s = spec(5);
    let mut table = FailureWindowTable::new(s, 100);
    let boundary = 101 * WINDOW;
    for _ in 0..5 {
        table.record_failure(key(1), boundary - 1_000_000).unwrap();
    }
    let mut admitted = 0;
    let mut t = boundary;
    while t <= boundary + 3 * MINUTE {
        if !s.is_locked(table.get(key(1), t), t) {
            admitted += 1;
            table.record_failure(key(1), t).unwrap();
        }
        t += 10_000_000;
    }
    assert_eq!(admitted, 1);
}

#[test]
fn unlocks_at_is_the_first_unlocked_instant() {
    let s = spec(5);
    for (previous, current) in [(5, 0), (3, 4), (5, 5), (0, 5), (9, 2), (2, 40)] {
        for elapsed in [0, 1, WINDOW / 3, WINDOW - 1] {
            let counts = Counts { window: 200, previous, current };
            let now = 200 * WINDOW + elapsed;
            let at = s.unlocks_at(counts, now);
            assert!(!s.is_locked(counts, at), "{previous},{current}@{elapsed}");
            if at > now {
                assert!(s.is_locked(counts, at - 1), "{previous},{current}@{elapsed}");
            }
            assert!(at <= now + 2 * WINDOW);
        }
    }
}

#[test]
fn a_full_table_evicts_the_fewest_failures_and_keeps_lockouts() {
    let mut table = FailureWindowTable::new(spec(5), 10);
    let now = 300 * WINDOW;
    for _ in 0..5 {
        table.record_failure(key(0), now).unwrap();
    }
    for _ in 0..3 {
        table.record_failure(key(1), now).unwrap();
    }
    for n in 2..100_000 {
        table.record_failure(key(n), now).unwrap();
        assert!(table.len() <= 10);
    }
    assert!(table.get(key(0), now).current == 5, "the lockout survives");
    assert_eq!(table.get(key(1), now).current, 3, "the 3-count outlives 1-counts");
}

#[test]
fn a_table_full_of_lockouts_refuses_new_keys() {
    let mut table = FailureWindowTable::new(spec(1), 3);
    let now = 300 * WINDOW;
    for n in 0..3 {
        table.record_failure(key(n), now).unwrap();
    }
    assert_eq!(table.record_failure(key(9), now), Err(TableError::FullOfLockouts(3)));
    assert_eq!(table.len(), 3);
}

#[test]
fn a_lockout_written_durably_after_a_removal_is_not_deleted_by_the_next_snapshot() {
    // Found by the tables_model fuzzer: persist, clear, lock again and
    // write durably; the next snapshot must not emit the old removal.
    let mut table = FailureWindowTable::new(spec(1), 100);
    let now = 600 * WINDOW;
    table.record_failure(key(1), now).unwrap();
    assert_eq!(table.take_changes().len(), 1);
    table.clear(key(1));
    table.record_failure(key(1), now).unwrap();
    table.mark_persisted(key(1));
    assert_eq!(table.take_changes(), vec![], "nothing to write: the durable write is the latest");
}

#[test]
fn a_flood_between_snapshots_lists_each_live_slot_once_and_stays_bounded() {
    // Distinct one-failure keys through a 4-entry table: every insert
    // evicts and reuses a slot. The change list must stay within twice
    // the cap, and the snapshot write exactly the survivors, once each.
    let mut table = FailureWindowTable::new(spec(5), 4);
    let now = 700 * WINDOW;
    for k in 0..1000 {
        table.record_failure(key(k), now).unwrap();
        assert!(table.changed.len() <= 2 * 4 + 1, "{} listed after key {k}", table.changed.len());
    }
    let mut written: Vec<Key> = table
        .take_changes()
        .into_iter()
        .map(|(k, counts)| {
            assert!(counts.is_some());
            k
        })
        .collect();
    written.sort_by_key(|k| k.to_u128());
    let mut live: Vec<Key> = (0..1000).map(key).filter(|k| table.get(*k, now).current > 0).collect();
    live.sort_by_key(|k| k.to_u128());
    assert_eq!(written.len(), 4);
    assert_eq!(written, live);
    assert_eq!(table.take_changes(), vec![]);
}

#[test]
fn a_full_table_evicts_an_unlocked_top_class_entry_behind_a_locked_one() {
    let s = WindowSpec { window_us: 60_000_000, threshold: 5 };
    let mut table = FailureWindowTable::new(s, 2);
    let t0 = 1000 * s.window_us;
    for _ in 0..10 {
        table.record_failure(key(0), t0).unwrap();
    }
    for _ in 0..5 {
        table.record_failure(key(1), t0).unwrap();
    }
    let later = t0 + s.window_us + s.window_us / 2;
    assert!(s.is_locked(table.get(key(0), later), later));
    assert!(!s.is_locked(table.get(key(1), later), later));
    assert!(table.record_failure(key(2), later).is_ok(), "key 1 is evictable");
    assert!(s.is_locked(table.get(key(0), later), later), "the lockout stays");
}

#[test]
fn reconfiguring_keeps_counts_and_applies_the_new_threshold() {
    let mut table = FailureWindowTable::new(spec(5), 100);
    let now = 500 * WINDOW;
    for _ in 0..3 {
        table.record_failure(key(1), now).unwrap();
    }
    table.record_failure(key(2), now).unwrap();
    table.reconfigure(spec(3), 100, now);
    assert_eq!(table.locked(now).map(|(k, _)| k).collect::<Vec<_>>(), vec![key(1)]);
    assert_eq!(table.get(key(2), now).current, 1);
    table.reconfigure(WindowSpec { window_us: 2 * WINDOW, threshold: 3 }, 1, now);
    assert_eq!(table.len(), 1, "shrunk to the new cap, the lockout kept");
    assert!(table.spec().is_locked(table.get(key(1), now), now));
}

#[test]
fn expiry_drops_entries_after_two_windows_and_reports_changes() {
    let mut table = FailureWindowTable::new(spec(5), 100);
    let now = 400 * WINDOW;
    table.record_failure(key(1), now).unwrap();
    assert_eq!(table.take_changes(), vec![(key(1), Some(Counts { window: 400, previous: 0, current: 1 }))]);
    assert_eq!(table.expire(now + WINDOW), 0);
    assert_eq!(table.expire(now + 2 * WINDOW), 1);
    assert!(table.is_empty());
    assert_eq!(table.take_changes(), vec![(key(1), None)]);
}

#[test]
fn a_key_with_failures_in_the_table_and_the_sketch_reads_their_sum() {
    // Found by review: the two were combined by max, so a key whose
    // failures were split between them read fewer than it had.
    let mut table = FailureWindowTable::new(spec(5), 1);
    let now = 800 * WINDOW;
    for _ in 0..5 {
        table.record_failure(key(1), now).unwrap();
    }
    for _ in 0..3 {
        assert!(table.record_failure(key(2), now).is_err(), "full of a lockout");
        table.count_overflow(key(2), now);
    }
    table.clear(key(1));
    table.record_failure(key(2), now).unwrap();
    table.record_failure(key(2), now).unwrap();
    let standing = table.standing(key(2), now);
    assert_eq!(table.spec().estimate(standing.counts, now), 5, "3 spilled + 2 in the table");
    assert!(table.spec().is_locked(standing.counts, now));
}

#[test]
fn a_tracked_entry_knows_when_it_began_counting_from_nothing() {
    let now = 900 * WINDOW;
    let mut untracked = FailureWindowTable::new(spec(5), 4);
    untracked.record_failure(key(1), now).unwrap();
    assert_eq!(untracked.started_us(key(1)), None, "only a global rule's share tracks");
    let mut table = FailureWindowTable::new(spec(5), 1);
    table.track_starts();
    table.record_failure(key(1), now).unwrap();
    table.record_failure(key(1), now + MINUTE).unwrap();
    assert_eq!(table.started_us(key(1)), Some(now), "the first failure's instant stays");
    table.clear(key(1));
    assert_eq!(table.started_us(key(1)), None);
    table.record_failure(key(1), now + 2 * MINUTE).unwrap();
    assert_eq!(table.started_us(key(1)), Some(now + 2 * MINUTE), "a cleared entry begins again");
    // Failures that spilled while the table was full of a lockout are of
    // an unknown age: the entry that takes them in does not say it began
    // now, however long after them it is made.
    for _ in 0..4 {
        table.record_failure(key(1), now + 2 * MINUTE).unwrap();
    }
    assert!(table.record_failure(key(2), now + 3 * MINUTE).is_err(), "full of a lockout");
    table.count_overflow(key(2), now + 3 * MINUTE);
    table.clear(key(1));
    table.record_failure(key(2), now + 4 * MINUTE).unwrap();
    assert_eq!(table.started_us(key(2)), None, "begun from spilled failures");
    // Nor does an entry put back from the state file.
    table.clear(key(2));
    let counts = Counts { window: spec(5).window_index(now), previous: 0, current: 2 };
    assert!(table.restore(key(3), counts, now + 5 * MINUTE).unwrap());
    assert_eq!(table.started_us(key(3)), None, "restored");
}

#[derive(Clone, Debug)]
enum AttemptOp {
    Check(u8),
    Report(u8, bool),
    Advance(u16),
}

fn attempt_op() -> impl proptest::strategy::Strategy<Value = AttemptOp> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0u8..4).prop_map(AttemptOp::Check),
        3 => ((0u8..4), any::<bool>()).prop_map(|(k, f)| AttemptOp::Report(k, f)),
        1 => (0u16..3000).prop_map(AttemptOp::Advance),
    ]
}

proptest::proptest! {
    /// Places in flight against a plain model: per key, the lapse
    /// instant of each place. A check is admitted exactly when the
    /// table's own counts plus the live places stay under the
    /// threshold; a report releases the newest live place, whatever its
    /// outcome; each place lapses on its own.
    #[test]
    fn places_in_flight_follow_a_plain_model(ops in proptest::collection::vec(attempt_op(), 1..200)) {
        const TIMEOUT_US: u64 = 1_000_000;
        let s = spec(3);
        let mut table = FailureWindowTable::new(s, 100);
        let mut model: std::collections::HashMap<u8, Vec<u64>> = Default::default();
        let mut now = 900 * WINDOW;
        for op in ops {
            match op {
                AttemptOp::Check(k) => {
                    let places = model.entry(k).or_default();
                    places.retain(|until| *until > now);
                    let held = places.len() as u32;
                    let expect = !s.refuses(table.get(key(k as u64), now), held, now);
                    let (admitted, standing) = table.admit(key(k as u64), now, TIMEOUT_US);
                    proptest::prop_assert_eq!(admitted, expect);
                    if admitted {
                        places.push(now + TIMEOUT_US);
                    }
                    proptest::prop_assert_eq!(standing.in_flight, held + admitted as u32);
                }
                AttemptOp::Report(k, failed) => {
                    table.settle(key(k as u64), now, failed);
                    let places = model.entry(k).or_default();
                    places.retain(|until| *until > now);
                    if let Some(newest) = places.iter().enumerate().max_by_key(|(_, u)| **u).map(|(i, _)| i) {
                        places.remove(newest);
                    }
                    if failed {
                        table.record_failure(key(k as u64), now).unwrap();
                    }
                }
                AttemptOp::Advance(ms) => now += ms as u64 * 1000,
            }
            for k in 0..4u8 {
                let held = model.get(&k).map_or(0, |p| p.iter().filter(|u| **u > now).count()) as u32;
                proptest::prop_assert_eq!(table.standing(key(k as u64), now).in_flight, held, "key {}", k);
            }
        }
    }
}

proptest::proptest! {
    /// A map of places too small for the keys in flight (room for 2 of 6
    /// keys): however checks, reports and abandons interleave, once every
    /// admitted attempt is settled each key counts exactly its failed
    /// reports. An attempt with no room is counted at its check and its
    /// report settles that, never counting it twice nor losing it; an
    /// abandon or a success takes it back.
    #[test]
    fn a_full_map_of_places_counts_each_attempt_once(ops in proptest::collection::vec(
        ((0u8..6), proptest::prelude::any::<bool>(), (0u8..3)), 1..300)) {
        const TIMEOUT_US: u64 = 60_000_000;
        // The entries have room (an evicted entry loses counts by design).
        let mut table = FailureWindowTable::new(spec(127), 100);
        table.in_flight.set_entries_max(2);
        let now = 900 * WINDOW;
        let mut outstanding = [0u32; 6];
        let mut failed = [0u32; 6];
        for (k, check, outcome) in ops {
            let i = k as usize;
            if check || outstanding[i] == 0 {
                let (admitted, _) = table.admit(key(k as u64), now, TIMEOUT_US);
                outstanding[i] += admitted as u32;
                continue;
            }
            // 0: failed, 1: succeeded (counts nothing here), 2: abandoned.
            let fails = outcome == 0;
            let settled = table.settle(key(k as u64), now, fails);
            if fails && settled != Settled::Presumed {
                table.record_failure(key(k as u64), now).unwrap();
            }
            failed[i] += fails as u32;
            outstanding[i] -= 1;
        }
        for k in 0..6u8 {
            let i = k as usize;
            while outstanding[i] > 0 {
                table.settle(key(k as u64), now, false);
                outstanding[i] -= 1;
            }
            let counts = table.get(key(k as u64), now);
            proptest::prop_assert_eq!(counts.previous + counts.current, failed[i], "key {}", k);
            proptest::prop_assert_eq!(table.standing(key(k as u64), now).in_flight, 0);
        }
    }
}

/// Keys of group `t` share the tuple's low bits except those `x` flips,
/// and a high half of `x`: neighbours in the index.
fn neighbouring_key(t: u64, x: u64) -> Key {
    Key { account_tag: x, tuple: (t ^ x) | x << 32 }
}

proptest::proptest! {
    /// However failures, clears, expiry, evictions past a small cap and
    /// reconfiguration interleave over neighbouring keys, the index names
    /// exactly the live slots.
    #[test]
    fn the_index_names_exactly_the_live_slots(ops in proptest::collection::vec(
        ((0u64..3), (0u64..8), (0u8..8), (0u64..3)), 1..300)) {
        let mut table = FailureWindowTable::new(spec(3), 6);
        let mut now = 900 * WINDOW;
        for (t, x, op, step) in ops {
            let key = neighbouring_key(t, x);
            now += step * WINDOW / 2;
            match op {
                0..=3 => { let _ = table.record_failure(key, now); }
                4 => { table.clear(key); }
                5 => { table.expire(now); }
                6 => { let _ = table.restore(key, Counts { window: spec(3).window_index(now), previous: 0, current: 2 }, now); }
                _ => table.reconfigure(spec(3), 2 + (x as usize % 6), now),
            }
            table.assert_index_matches_slots();
        }
    }
}

/// A failure presumed in one window and abandoned in the next comes out of
/// the window it went into.
#[test]
fn a_presumed_failure_is_taken_back_from_its_own_window() {
    let mut table = FailureWindowTable::new(spec(5), 1);
    let t = 901 * WINDOW - 1_000_000;
    assert!(table.admit(key(1), t, 30_000_000).0, "a place");
    assert!(table.admit(key(2), t, 30_000_000).0, "presumed: no room");
    table.record_failure(key(2), t + 2_000_000).unwrap();
    let counts = table.get(key(2), t + 2_000_000);
    assert_eq!((counts.previous, counts.current), (1, 1));
    assert_eq!(table.settle(key(2), t + 2_000_000, false), Settled::Presumed);
    let counts = table.get(key(2), t + 2_000_000);
    assert_eq!((counts.previous, counts.current), (0, 1), "the presumed one, not the new window's");
    assert_eq!(table.settle(key(2), t + 3_000_000, false), Settled::Nothing, "settled once");
    assert_eq!(table.presumed_failures(), 1);
}

/// However many places a key holds, each lapses on its own: 49 checks at
/// t0 and one 20 s later hold 50 places, and once the 49 lapse (30 s after
/// their checks) 49 more are admitted beside the one still live. Later
/// checks never renew earlier places.
#[test]
fn each_of_many_places_lapses_after_its_own_check() {
    const TIMEOUT_US: u64 = 30_000_000;
    let mut table = FailureWindowTable::new(spec(50), 100);
    let t0 = 100 * WINDOW;
    for n in 0..49 {
        assert!(table.admit(key(1), t0, TIMEOUT_US).0, "check {n} at t0");
    }
    assert!(table.admit(key(1), t0 + 20_000_000, TIMEOUT_US).0, "the check at t0 + 20 s");
    assert!(!table.admit(key(1), t0 + 20_000_000, TIMEOUT_US).0, "50 places: the threshold");
    let later = t0 + 35_000_000;
    assert_eq!(table.standing(key(1), later).in_flight, 1, "only the t0 + 20 s place is live");
    let admitted = (0..60).filter(|_| table.admit(key(1), later, TIMEOUT_US).0).count();
    assert_eq!(admitted, 49);
}

/// An operator's unlock drops the places of the key it clears, and of
/// every key of the account when it clears them all.
#[test]
fn clearing_places_frees_the_key_and_the_account() {
    const TIMEOUT_US: u64 = 30_000_000;
    let mut table = FailureWindowTable::new(spec(5), 100);
    let t0 = 100 * WINDOW;
    let other_key_of_1 = Key { account_tag: 1, tuple: 77 };
    for _ in 0..5 {
        table.admit(key(1), t0, TIMEOUT_US);
        table.admit(other_key_of_1, t0, TIMEOUT_US);
        table.admit(key(2), t0, TIMEOUT_US);
    }
    assert!(!table.admit(key(1), t0, TIMEOUT_US).0, "5 places refuse");
    assert!(table.clear_places(key(1), t0));
    assert!(!table.clear_places(key(1), t0), "nothing left to clear");
    assert_eq!(table.standing(key(1), t0).in_flight, 0);
    assert_eq!(table.clear_account_places(1, t0), 1, "the account's other key");
    assert_eq!(table.standing(other_key_of_1, t0).in_flight, 0);
    assert_eq!(table.standing(key(2), t0).in_flight, 5, "another account keeps its places");
}

proptest::proptest! {
    /// Past the cells' count of exact places, grouped places still lapse
    /// on their own: against a plain model of each place's lapse instant,
    /// the table holds at least every place the model still holds and at
    /// most those that lapsed less than one step (timeout / 7) ago. (Reports
    /// are left out: which of several places a report frees is arbitrary,
    /// and `places_in_flight_follow_a_plain_model` covers them.)
    #[test]
    fn many_places_lapse_within_a_step_of_their_own_instant(
        ops in proptest::collection::vec((0u8..12, 0u16..4000), 1..400),
    ) {
        const TIMEOUT_US: u64 = 1_000_000;
        const STEP_US: u64 = TIMEOUT_US.div_ceil(super::places::PLACE_CELLS as u64 - 1);
        const THRESHOLD: u32 = 1000;
        let mut table = FailureWindowTable::new(spec(THRESHOLD), 10);
        let mut model: Vec<u64> = Vec::new();
        let mut now = 900 * WINDOW;
        for (checks, ms) in ops {
            for _ in 0..checks {
                let (admitted, _) = table.admit(key(1), now, TIMEOUT_US);
                proptest::prop_assert!(admitted);
                model.push(now + TIMEOUT_US);
            }
            now += u64::from(ms) * 100;
            model.retain(|u| *u + STEP_US > now);
            let held = table.standing(key(1), now).in_flight as usize;
            let at_least = model.iter().filter(|u| **u > now).count();
            proptest::prop_assert!(held >= at_least, "{} held, {} live in the model", held, at_least);
            proptest::prop_assert!(held <= model.len(), "{} held, at most {} within a step", held, model.len());
        }
    }
}
