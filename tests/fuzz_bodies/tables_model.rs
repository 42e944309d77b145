//! Body of the `tables_model` fuzz target, shared with `tests/fuzz_replay.rs`
//! (which replays `fuzz/corpus/tables_model/` on stable). Uses only
//! `tollgate` and std; the bytes are decoded by hand.
//!
//! The first byte picks a table; then come its parameters and a sequence of
//! bounded operations (two bytes each, some read one more), run against the
//! real table and a plain reference model side by side:
//!
//! - `FailureWindowTable` against a log of failure times per key (the module
//!   doc's rule: aligned windows, `previous × (1 − elapsed/W) + current`,
//!   locked while that is at least the threshold, integers ×W), plus a
//!   `BTreeMap` "disk" that receives `take_changes` (and the writes that
//!   `mark_persisted`/`restore` stand for) and must equal the live entries.
//! - `GcraTable` against a token bucket per key, kept as the credit missing
//!   from a full bucket so that two specs (a rule's and a class's) can share
//!   a key.
//! - `ExpiringMap` against a `HashMap`.
//!
//! With a cap the operations can never reach, the answers must match the
//! model exactly; with a small cap: never more entries than the cap, never
//! more counted than happened (never refused where the model admits), and a
//! locked entry is never evicted. A step back of the clock turns the model
//! comparisons off for the rest of the run (wall time may jump back) and
//! keeps the structural checks. Failures are recorded both plainly and as
//! `Limiter::report` does (a new lockout is written durably, then
//! `mark_persisted`), since that is what the persistence invariant must
//! survive (`fuzz/regressions/tables_model/` holds what this found).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tollgate::Key;
use tollgate::{
    Change, Counts, FailureWindowTable, Recorded, TableError, WindowSpec, THRESHOLD_MAX, TOP_CLASS_EVICTION_SCAN,
};
use tollgate::{ExpiringMap, Slot};
use tollgate::{GcraDecision, GcraSpec, GcraTable};

// The including crate declares `bytes` (tests/fuzz_bodies/bytes.rs) once.
use crate::bytes::Bytes;

const SECOND_US: u64 = 1_000_000;
/// 2030-01-01T00:00:00Z: aligned to every window length that divides a day.
const START_US: u64 = 1_893_456_000 * SECOND_US;
/// Operations per input; at two bytes each a 4 KiB input has at most 2048.
const OPS_MAX: usize = 2048;
/// A cap no run can reach: at most 256 distinct keys exist.
const UNREACHABLE_CAP: usize = 4096;
/// Small caps are 0..=SMALL_CAP_MAX (0 means 1).
const SMALL_CAP_MAX: u8 = 12;
// A full table looks this far into its top class for an unlocked entry; with
// caps within it, "full of lockouts" must mean every entry is locked.
const _: () = assert!(SMALL_CAP_MAX as usize <= TOP_CLASS_EVICTION_SCAN);
/// Keys the ordinary operations name, without and with a small cap; floods
/// use keys from `FLOOD_KEYS_FROM` up.
const KEYS_UNCAPPED: u8 = 8;
const KEYS_CAPPED: u8 = 24;
const FLOOD_KEYS_FROM: u8 = 64;
const WINDOWS_S: [u64; 8] = [1, 2, 7, 60, 90, 900, 3600, 86_400];
const PERIODS_S: [u64; 8] = [1, 2, 10, 60, 90, 900, 3600, 86_400];
/// Inserts the flood operations of one `ExpiringMap` run may make in all:
/// past `expiring::SWEEP_INSERTS_MIN` a few times, and still fast.
const FLOOD_INSERTS_MAX: usize = 4096;

pub fn run(data: &[u8]) {
    let mut input = Bytes(data);
    match input.byte() % 3 {
        0 => FailureRun::new(&mut input).run(&mut input),
        1 => GcraRun::new(&mut input).run(&mut input),
        _ => ExpiringRun::new(&mut input).run(&mut input),
    }
}

/// Key `n`; with `collide`, keys share hash bits four ways (the tables hash
/// by `Key::hash_bits`, the low half).
fn key(n: u8, collide: bool) -> Key {
    let bits = if collide { n % 4 } else { n } as u64 + 1;
    Key { account_tag: n as u64 + 1, tuple: bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) }
}

/// A time step from a nibble, relative to a period `w`: fractions of it,
/// and the instants just before and at boundaries.
fn step(nibble: u8, w: u64) -> u64 {
    match nibble & 15 {
        0 => 0,
        n @ 1..=11 => n as u64 * w / 48,
        12 => w - 1,
        13 => w,
        14 => 2 * w - 1,
        _ => 2 * w + w / 3,
    }
}

fn small_cap(b: u8) -> usize {
    (b % (SMALL_CAP_MAX + 1)) as usize
}

// ---- FailureWindowTable ----

fn window_spec(a: u8, b: u8) -> WindowSpec {
    let threshold = if a & 0x80 == 0 { 1 + (a % 12) as u32 } else { ((a & 0x7f) as u32 * 8 + 1).min(THRESHOLD_MAX) };
    WindowSpec { window_us: WINDOWS_S[(b % 8) as usize] * SECOND_US, threshold }
}

/// (previous, current) by the definition: failures in the window before the
/// one `now` is in, and in that one up to `now`.
fn model_counts(w: u64, times: &[u64], now: u64) -> (u32, u32) {
    let start = now / w * w;
    let current = times.iter().filter(|&&t| t >= start && t <= now).count() as u32;
    let previous = times.iter().filter(|&&t| t < start && t + w >= start).count() as u32;
    (previous, current)
}

/// The estimate × W.
fn model_weighted(w: u64, times: &[u64], now: u64) -> u128 {
    let (previous, current) = model_counts(w, times, now);
    let elapsed = (now % w) as u128;
    previous as u128 * (w as u128 - elapsed) + current as u128 * w as u128
}

fn model_locked(spec: WindowSpec, times: &[u64], now: u64) -> bool {
    model_weighted(spec.window_us, times, now) >= spec.threshold as u128 * spec.window_us as u128
}

fn model_estimate(spec: WindowSpec, times: &[u64], now: u64) -> u32 {
    model_weighted(spec.window_us, times, now).div_ceil(spec.window_us as u128) as u32
}

/// The estimate rounded down: the count a re-dated entry carries.
fn model_whole_failures(spec: WindowSpec, times: &[u64], now: u64) -> u32 {
    (model_weighted(spec.window_us, times, now) / spec.window_us as u128) as u32
}

struct FailureRun {
    table: FailureWindowTable,
    spec: WindowSpec,
    cap: usize,
    /// The cap may be reached: counts are only bounded by the model's.
    capped: bool,
    /// The clock never stepped back: the model's counts are meaningful.
    time_ok: bool,
    /// Writes happened in window order, so every list is in window order
    /// and `expire` must drop every expired entry.
    ordered: bool,
    latest_window: u32,
    collide: bool,
    /// Every failure is recorded as `Limiter::report` does: a new lockout is
    /// written durably and marked persisted.
    durable: bool,
    keys: u8,
    now: u64,
    /// Failure times per key (synthetic ones for restored and re-dated
    /// entries). Kept while `time_ok`.
    logs: BTreeMap<u8, Vec<u64>>,
    /// Uncapped and `time_ok`: the keys with an entry, and the window of the
    /// entry's last write.
    live: BTreeMap<u8, u32>,
    /// What the persistence layer holds.
    disk: BTreeMap<Key, Counts>,
}

impl FailureRun {
    fn new(input: &mut Bytes<'_>) -> FailureRun {
        let spec = window_spec(input.byte(), input.byte());
        let mode = input.byte();
        let capped = mode & 1 == 1;
        let cap = if capped { small_cap(mode >> 1) } else { UNREACHABLE_CAP };
        let now = START_US + input.byte() as u64 * spec.window_us / 256;
        let table = FailureWindowTable::new(spec, cap);
        assert_eq!(table.entries_max(), cap.max(1));
        assert_eq!(table.spec(), spec);
        assert!(table.is_empty());
        FailureRun {
            table,
            spec,
            cap,
            capped,
            time_ok: true,
            ordered: true,
            latest_window: spec.window_index(now),
            collide: mode & 0x80 != 0,
            durable: mode & 0x40 != 0,
            keys: if capped { KEYS_CAPPED } else { KEYS_UNCAPPED },
            now,
            logs: BTreeMap::new(),
            live: BTreeMap::new(),
            disk: BTreeMap::new(),
        }
    }

    fn key(&self, n: u8) -> Key {
        key(n, self.collide)
    }

    fn run(mut self, input: &mut Bytes<'_>) {
        let mut ops = 0;
        while !input.is_empty() && ops < OPS_MAX {
            ops += 1;
            let op = input.byte();
            let arg = input.byte();
            let k = arg % self.keys;
            let len_before = self.table.len();
            if op & 15 != 14 {
                self.now += step(op >> 4, self.spec.window_us);
            }
            match op & 15 {
                0..=2 | 15 if self.durable => self.record_as_daemon(k),
                0..=2 | 15 => {
                    self.record(k);
                }
                3 => self.record_as_daemon(k),
                4 => {
                    for _ in 0..=(input.byte() % 16) {
                        self.record_as_daemon(k);
                    }
                }
                5 => self.clear(k),
                6 => self.expire(),
                7 => self.check_all(),
                8 => self.take_changes(),
                9 => self.check_locked(),
                10 => self.reconfigure(arg, input.byte()),
                11 => self.restore(k, arg, input.byte()),
                12 => self.mark_persisted(k),
                13 => {
                    for j in 0..=(arg % 32) {
                        self.record_as_daemon(FLOOD_KEYS_FROM + (arg.wrapping_mul(7).wrapping_add(j) % 192));
                    }
                }
                _ => self.step_back(op >> 4),
            }
            if op & 15 != 10 {
                assert!(
                    self.table.len() <= self.cap.max(1) || self.table.len() <= len_before,
                    "{} entries, cap {}",
                    self.table.len(),
                    self.cap
                );
            }
            if self.time_ok {
                self.check_key(k);
            }
        }
        self.check_all();
        self.take_changes();
    }

    fn present(&self, key: Key) -> Option<Counts> {
        self.table.entries().find(|&(k, _)| k == key).map(|(_, c)| c)
    }

    /// A failure as `Limiter::report` records it: a new lockout is written
    /// durably and marked persisted.
    fn record_as_daemon(&mut self, k: u8) {
        if let Some(recorded) = self.record(k) {
            if recorded.now_locked && !recorded.was_locked {
                self.mark_persisted(k);
            }
        }
    }

    fn record(&mut self, k: u8) -> Option<Recorded> {
        let key = self.key(k);
        let now = self.now;
        let spec = self.spec;
        let locked_before: Vec<Key> = self.table.locked(now).map(|(key, _)| key).collect();
        let refused_before = self.table.refused_full();
        let model_was_locked = self.time_ok && model_locked(spec, self.logs.get(&k).map_or(&[][..], |t| t), now);
        let result = self.table.record_failure(key, now);
        match result {
            Ok(recorded) => {
                assert!(recorded.counts.current >= 1);
                assert_eq!(recorded.now_locked, spec.is_locked(recorded.counts, now));
                if self.time_ok {
                    let times = self.logs.entry(k).or_default();
                    times.push(now);
                    let (previous, current) = model_counts(spec.window_us, times, now);
                    let locked = model_locked(spec, times, now);
                    let window = spec.window_index(now);
                    self.latest_window = self.latest_window.max(window);
                    if self.capped {
                        assert!(
                            recorded.counts.previous <= previous && recorded.counts.current <= current,
                            "over-counted: {recorded:?} vs ({previous}, {current})"
                        );
                    } else {
                        assert_eq!(recorded.counts, Counts { window, previous, current }, "key {k}");
                        assert_eq!(recorded.was_locked, model_was_locked, "key {k}");
                        assert_eq!(recorded.now_locked, locked, "key {k}");
                        self.live.insert(k, window);
                    }
                }
            }
            Err(TableError::FullOfLockouts(n)) => {
                assert!(self.capped, "a table that cannot fill refused key {k}");
                assert_eq!(n, self.cap.max(1));
                assert_eq!(self.table.refused_full(), refused_before + 1);
                assert!(self.table.len() >= self.cap.max(1), "refused with room");
                let unlocked: Vec<(Key, Counts)> =
                    self.table.entries().filter(|&(_, c)| !spec.is_locked(c, now)).collect();
                assert!(
                    unlocked.is_empty(),
                    "FullOfLockouts ('every entry is locked') while {unlocked:?} are not locked at {now}"
                );
            }
        }
        for locked in locked_before {
            assert!(self.present(locked).is_some(), "locked entry {locked:?} was evicted by key {k}");
        }
        result.ok()
    }

    fn clear(&mut self, k: u8) {
        let key = self.key(k);
        let before = self.present(key);
        let cleared = self.table.clear(key);
        assert_eq!(cleared, before, "clear returns the entry's counts");
        assert!(self.present(key).is_none());
        if self.time_ok {
            self.logs.remove(&k);
            if !self.capped {
                assert_eq!(cleared.map(|c| c.window), self.live.remove(&k), "key {k}");
            }
        }
    }

    fn expire(&mut self) {
        let index = self.spec.window_index(self.now) as u64;
        let before: BTreeMap<Key, Counts> = self.table.entries().collect();
        let dropped = self.table.expire(self.now);
        let after: BTreeMap<Key, Counts> = self.table.entries().collect();
        assert_eq!(before.len() - after.len(), dropped, "expire's count");
        for (key, counts) in &before {
            let expired = counts.window as u64 + 2 <= index;
            if !after.contains_key(key) {
                assert!(expired, "expire dropped live {key:?} {counts:?} at window {index}");
            } else if self.ordered {
                assert!(!expired, "expire left expired {key:?} {counts:?} at window {index}");
            }
        }
        if self.time_ok && !self.capped {
            let keys: Vec<u8> = self.live.keys().copied().collect();
            for k in keys {
                if !after.contains_key(&self.key(k)) {
                    self.live.remove(&k);
                }
            }
        }
    }

    fn check_key(&mut self, k: u8) {
        let key = self.key(k);
        let (spec, now, w) = (self.spec, self.now, self.spec.window_us);
        let times = self.logs.entry(k).or_default();
        let keep_from = (now / w).saturating_sub(1) * w;
        times.retain(|&t| t >= keep_from);
        let real = self.table.get(key, now);
        assert_eq!(real.window, spec.window_index(now), "get rolls to now's window");
        let (previous, current) = model_counts(w, times, now);
        if self.capped {
            assert!(real.previous <= previous && real.current <= current, "over-counted key {k}: {real:?}");
            return;
        }
        assert_eq!((real.previous, real.current), (previous, current), "key {k} at {now}");
        let locked = spec.is_locked(real, now);
        assert_eq!(locked, model_locked(spec, times, now), "key {k} at {now}");
        let estimate = model_estimate(spec, times, now);
        assert_eq!(spec.estimate(real, now), estimate, "key {k} at {now}");
        assert_eq!(spec.remaining(real, now), spec.threshold.saturating_sub(estimate));
        let at = spec.unlocks_at(real, now);
        if locked {
            assert!(at > now && at <= now + 2 * w, "unlocks_at {at} from {now}");
            assert!(!model_locked(spec, times, at), "still locked at unlocks_at {at}");
            assert!(model_locked(spec, times, at - 1), "already unlocked before unlocks_at {at}");
        } else {
            assert_eq!(at, now);
        }
    }

    fn check_locked(&self) {
        let entries: BTreeMap<Key, Counts> = self.table.entries().collect();
        let locked: BTreeMap<Key, Counts> = self.table.locked(self.now).collect();
        let expected: BTreeMap<Key, Counts> =
            entries.into_iter().filter(|&(_, c)| self.spec.is_locked(c, self.now)).collect();
        assert_eq!(locked, expected, "locked() is not every locked entry");
    }

    fn check_all(&mut self) {
        let entries: BTreeMap<Key, Counts> = self.table.entries().collect();
        assert_eq!(entries.len(), self.table.len(), "entries() and len() disagree");
        assert_eq!(self.table.is_empty(), entries.is_empty());
        self.check_locked();
        if !self.time_ok {
            return;
        }
        let named: BTreeSet<u8> = self.logs.keys().chain(self.live.keys()).copied().collect();
        for &k in &named {
            self.check_key(k);
        }
        if !self.capped {
            let expected: BTreeMap<Key, u32> = self.live.iter().map(|(&k, &w)| (self.key(k), w)).collect();
            let real: BTreeMap<Key, u32> = entries.iter().map(|(&k, c)| (k, c.window)).collect();
            assert_eq!(real, expected, "live entries and their last windows");
        }
    }

    fn take_changes(&mut self) {
        let changes: Vec<Change> = self.table.take_changes();
        let writes_from = changes.iter().position(|(_, c)| c.is_some()).unwrap_or(changes.len());
        assert!(changes[writes_from..].iter().all(|(_, c)| c.is_some()), "a removal after a write: {changes:?}");
        for (key, counts) in changes {
            match counts {
                Some(counts) => self.disk.insert(key, counts),
                None => self.disk.remove(&key),
            };
        }
        let live: BTreeMap<Key, Counts> = self.table.entries().collect();
        assert_eq!(self.disk, live, "applying take_changes does not reproduce the live entries");
    }

    fn mark_persisted(&mut self, k: u8) {
        let key = self.key(k);
        self.table.mark_persisted(key);
        // the daemon wrote the entry's counts itself (a lockout, durably)
        if let Some(counts) = self.present(key) {
            self.disk.insert(key, counts);
        }
    }

    fn restore(&mut self, k: u8, arg: u8, counts_byte: u8) {
        let key = self.key(k);
        let index = self.spec.window_index(self.now);
        let window = index.saturating_sub((arg >> 6) as u32 % 3);
        let counts = Counts { window, previous: (counts_byte % 16) as u32, current: (counts_byte >> 4) as u32 };
        let skipped = window as u64 + 2 <= index as u64 || counts.previous + counts.current == 0;
        let before = self.present(key);
        let refused_before = self.table.refused_full();
        match self.table.restore(key, counts, self.now) {
            Ok(false) if skipped => {
                assert_eq!(self.present(key), before, "a skipped restore changed {key:?}");
                // The row was on disk; the next take_changes must delete it
                // (checked there: disk == live).
                if before.is_none() {
                    self.disk.insert(key, counts);
                }
            }
            Ok(true) if !skipped => {
                assert_eq!(self.present(key), Some(counts));
                self.disk.insert(key, counts);
                if window < self.latest_window {
                    self.ordered = false;
                }
                self.latest_window = self.latest_window.max(window);
                if self.time_ok {
                    let w = self.spec.window_us;
                    let start = window as u64 * w;
                    let mut times = vec![start - w; counts.previous as usize];
                    times.extend(std::iter::repeat_n(start, counts.current as usize));
                    self.logs.insert(k, times);
                    if !self.capped {
                        self.live.insert(k, window);
                    }
                }
            }
            Ok(live) => panic!("restore of {counts:?} at window {index} said live = {live}"),
            Err(TableError::FullOfLockouts(_)) => {
                assert!(self.capped && !skipped, "restore of {counts:?} refused");
                assert_eq!(self.table.refused_full(), refused_before + 1);
            }
        }
    }

    fn reconfigure(&mut self, a: u8, b: u8) {
        let old = self.spec;
        let spec = window_spec(a, b);
        let cap = if self.capped { small_cap(b >> 3) } else { UNREACHABLE_CAP };
        let now = self.now;
        let new_window = spec.window_us != old.window_us;
        let redated = |c: Counts| {
            if new_window {
                Counts { window: spec.window_index(now), previous: 0, current: old.whole_failures(c, now) }
            } else {
                c
            }
        };
        // the new spec's lockouts, which no eviction may take
        let must_keep: Vec<Key> =
            self.table.entries().filter(|&(_, c)| spec.is_locked(redated(c), now)).map(|(k, _)| k).collect();
        self.table.reconfigure(spec, cap, now);
        assert_eq!(self.table.spec(), spec);
        assert_eq!(self.table.entries_max(), cap.max(1));
        for key in must_keep {
            assert!(self.present(key).is_some(), "reconfigure evicted lockout {key:?}");
        }
        if self.table.len() > cap.max(1) {
            let unlocked: Vec<(Key, Counts)> = self.table.entries().filter(|&(_, c)| !spec.is_locked(c, now)).collect();
            assert!(unlocked.is_empty(), "over the cap after reconfigure while {unlocked:?} are not locked");
        }
        if self.time_ok {
            if new_window {
                let index = spec.window_index(now);
                for (&k, times) in self.logs.iter_mut() {
                    // A new window length neither invents nor lifts a
                    // lockout: locked under the new threshold afterwards
                    // exactly when the old weighted count reached it.
                    let locked_before =
                        model_weighted(old.window_us, times, now) >= spec.threshold as u128 * old.window_us as u128;
                    let estimate = model_whole_failures(old, times, now);
                    *times = vec![now; estimate as usize];
                    assert_eq!(model_locked(spec, times, now), locked_before, "re-dating key {k} changed its lockout");
                    if !self.capped {
                        if estimate == 0 {
                            self.live.remove(&k);
                        } else {
                            self.live.insert(k, index);
                        }
                    }
                }
                self.latest_window = index;
            }
            self.ordered = true;
        }
        self.spec = spec;
        self.cap = cap;
    }

    /// Wall time may step back; the model's counts mean nothing after it.
    fn step_back(&mut self, nibble: u8) {
        self.now -= step(nibble, self.spec.window_us) + 1;
        self.time_ok = false;
        self.ordered = false;
        self.logs.clear();
        self.live.clear();
    }
}

// ---- GcraTable ----

fn gcra_spec(a: u8, b: u8) -> GcraSpec {
    let limit = 1 + (a % 50) as u32;
    let period_us = PERIODS_S[(b % 8) as usize] * SECOND_US;
    let burst = 1 + ((b >> 3) % 20) as u32;
    GcraSpec::new(limit, period_us, burst)
}

/// A token bucket, kept as the credit missing from a full one (`debt_us`)
/// as of `at_us`: it refills at one microsecond per microsecond, and one
/// request costs an interval. Spec-independent, so specs can change.
#[derive(Clone, Copy, Default)]
struct Bucket {
    debt_us: u64,
    at_us: u64,
}

/// What the bucket answers, and the bucket after it.
fn bucket_answer(spec: GcraSpec, bucket: Bucket, now: u64, spend: bool) -> (GcraDecision, Bucket) {
    let debt = bucket.debt_us.saturating_sub(now.saturating_sub(bucket.at_us));
    let interval = spec.interval_us as i128;
    let level = (spec.interval_us * spec.burst as u64) as i128 - debt as i128;
    if level >= interval {
        let after = if spend { debt + spec.interval_us } else { debt };
        let remaining = ((level - interval) / interval) as u32;
        let decision = GcraDecision { allowed: true, remaining, retry_after_us: 0, reset_us: after };
        (decision, Bucket { debt_us: after, at_us: now })
    } else {
        let decision =
            GcraDecision { allowed: false, remaining: 0, retry_after_us: (interval - level) as u64, reset_us: debt };
        (decision, Bucket { debt_us: debt, at_us: now })
    }
}

struct GcraRun {
    table: GcraTable,
    specs: [GcraSpec; 2],
    cap: usize,
    capped: bool,
    time_ok: bool,
    collide: bool,
    keys: u8,
    now: u64,
    /// Per hash bits: the bucket as the real table's decisions left it.
    buckets: HashMap<u64, Bucket>,
}

impl GcraRun {
    fn new(input: &mut Bytes<'_>) -> GcraRun {
        let specs = [gcra_spec(input.byte(), input.byte()), gcra_spec(input.byte(), input.byte())];
        let mode = input.byte();
        let capped = mode & 1 == 1;
        let cap = if capped { small_cap(mode >> 1) } else { UNREACHABLE_CAP };
        let table = GcraTable::new(cap);
        assert_eq!(table.entries_max(), cap.max(1));
        GcraRun {
            table,
            specs,
            cap,
            capped,
            time_ok: true,
            collide: mode & 0x80 != 0,
            keys: if capped { KEYS_CAPPED } else { KEYS_UNCAPPED },
            now: START_US,
            buckets: HashMap::new(),
        }
    }

    fn run(mut self, input: &mut Bytes<'_>) {
        let mut ops = 0;
        while !input.is_empty() && ops < OPS_MAX {
            ops += 1;
            let op = input.byte();
            let arg = input.byte();
            let key = key(arg % self.keys, self.collide);
            let spec = self.specs[(op >> 3 & 1) as usize];
            let len_before = self.table.len();
            self.now += step(op >> 4, self.specs[0].interval_us);
            match op & 7 {
                0..=2 => self.decide(spec, key, true, false),
                3 => self.decide(spec, key, false, false),
                4 => self.decide(spec, key, false, true),
                5 => self.sweep(),
                6 => {
                    if self.capped {
                        self.cap = small_cap(arg);
                        self.table.set_entries_max(self.cap);
                        assert_eq!(self.table.entries_max(), self.cap.max(1));
                    }
                }
                _ => {
                    if arg & 1 == 0 {
                        self.now += (arg as u64 + 1) * self.specs[1].interval_us;
                    } else {
                        self.now -= step(arg >> 1, self.specs[0].interval_us) + 1;
                        self.time_ok = false;
                    }
                }
            }
            assert!(self.table.len() <= self.cap.max(1) || self.table.len() <= len_before, "over the cap");
        }
        self.sweep();
    }

    fn decide(&mut self, spec: GcraSpec, key: Key, spend: bool, peek: bool) {
        let real =
            if peek { self.table.peek(spec, key, self.now) } else { self.table.check(spec, key, self.now, spend) };
        if real.allowed {
            assert_eq!(real.retry_after_us, 0);
        } else {
            assert!(real.retry_after_us > 0 && real.remaining == 0, "{real:?}");
        }
        if !self.time_ok {
            return;
        }
        let bucket = self.buckets.get(&key.hash_bits()).copied().unwrap_or(Bucket { debt_us: 0, at_us: self.now });
        let (model, _) = bucket_answer(spec, bucket, self.now, spend && !peek);
        // The model follows the real decisions, so a capped run stays
        // comparable: an evicted key restarts with a full bucket, so the real
        // table never owes more than the model and never refuses where the
        // model admits.
        let debt = bucket.debt_us.saturating_sub(self.now - bucket.at_us);
        let spent = real.allowed && spend && !peek;
        let after = Bucket { debt_us: debt + if spent { spec.interval_us } else { 0 }, at_us: self.now };
        if self.capped {
            assert!(real.allowed || !model.allowed, "refused where an unevicted bucket admits: {real:?} {model:?}");
            assert!(real.reset_us <= after.debt_us, "{real:?} owes more than the model's {}", after.debt_us);
        } else {
            assert_eq!(real, model, "spec {spec:?}, key {key:?}, at {}", self.now);
        }
        self.buckets.insert(key.hash_bits(), after);
    }

    fn sweep(&mut self) {
        self.table.sweep(self.now);
        if !self.time_ok {
            return;
        }
        let now = self.now;
        let owing = self.buckets.values().filter(|b| b.debt_us.saturating_sub(now - b.at_us) > 0).count();
        if self.capped {
            assert!(self.table.len() <= owing, "{} entries after a sweep, {owing} keys owe", self.table.len());
        } else {
            assert_eq!(self.table.len(), owing, "entries after a sweep");
        }
    }
}

// ---- ExpiringMap ----

struct ExpiringRun {
    map: ExpiringMap<u16>,
    cap: usize,
    capped: bool,
    time_ok: bool,
    now: u64,
    /// Every entry set and not removed, expired or not.
    model: HashMap<u64, Slot<u16>>,
    next_flood_id: u64,
    /// Inserts floods may still make (enough to pass the sweep threshold).
    flood_budget: usize,
}

impl ExpiringRun {
    fn new(input: &mut Bytes<'_>) -> ExpiringRun {
        let mode = input.byte();
        let capped = mode & 1 == 1;
        let cap = if capped { small_cap(mode >> 1) } else { 1_000_000 };
        let map = ExpiringMap::new(cap);
        assert_eq!(map.entries_max(), cap.max(1));
        ExpiringRun {
            map,
            cap,
            capped,
            time_ok: true,
            now: START_US,
            model: HashMap::new(),
            next_flood_id: 1 << 32,
            flood_budget: FLOOD_INSERTS_MAX,
        }
    }

    fn id(n: u8) -> u64 {
        (n as u64 % 48 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn live(&self) -> usize {
        self.model.values().filter(|s| s.expires_us > self.now).count()
    }

    fn run(mut self, input: &mut Bytes<'_>) {
        let mut ops = 0;
        while !input.is_empty() && ops < OPS_MAX {
            ops += 1;
            let op = input.byte();
            let arg = input.byte();
            let id = Self::id(arg);
            let len_before = self.map.len();
            match op & 15 {
                0..=5 | 13..=15 => {
                    let ttl = match op >> 4 {
                        0 => 0,
                        15 => u64::MAX - self.now,
                        n => n as u64 * n as u64 * SECOND_US,
                    };
                    let value = u16::from_le_bytes([arg, input.byte()]);
                    self.set(id, Slot { expires_us: self.now + ttl, value });
                }
                6 => self.check(id),
                7 => {
                    let removed = self.map.remove(id);
                    let expected = self.model.remove(&id);
                    assert!(
                        removed.is_none() || removed == expected,
                        "remove({id}) gave {removed:?}, model {expected:?}"
                    );
                    if !self.capped && self.time_ok && expected.is_some_and(|s| s.expires_us > self.now) {
                        assert_eq!(removed, expected, "remove({id}) lost a live entry");
                    }
                }
                8 => {
                    self.map.sweep(self.now);
                    let now = self.now;
                    self.model.retain(|_, s| s.expires_us > now);
                    if self.capped || !self.time_ok {
                        assert!(self.map.len() <= self.model.len());
                    } else {
                        assert_eq!(self.map.len(), self.model.len(), "entries after a sweep");
                    }
                }
                9 => {
                    if self.capped {
                        self.cap = small_cap(arg);
                        self.map.set_entries_max(self.cap);
                        assert_eq!(self.map.entries_max(), self.cap.max(1));
                    }
                }
                10 => {
                    let n = (arg as usize * 4).min(self.flood_budget);
                    self.flood_budget -= n;
                    for _ in 0..n {
                        self.next_flood_id += 1;
                        let ttl = (self.next_flood_id % 7) * SECOND_US;
                        self.set(self.next_flood_id, Slot { expires_us: self.now + ttl, value: 0 });
                    }
                }
                11 => self.now += (arg as u64).pow(2) * SECOND_US,
                _ => {
                    self.now -= arg as u64 * SECOND_US + 1;
                    self.time_ok = false;
                }
            }
            assert!(self.map.len() <= self.cap.max(1) || self.map.len() <= len_before, "over the cap");
            if self.time_ok && !self.capped && ops % 16 == 0 {
                assert!(self.map.len() >= self.live() && self.map.len() <= self.model.len(), "entries count");
            }
            self.check(id);
        }
    }

    fn set(&mut self, id: u64, slot: Slot<u16>) {
        let stored_before = self.map.get(id, 0).is_some();
        let len_before = self.map.len();
        self.map.set(id, slot, self.now);
        if slot.expires_us <= self.now {
            self.model.remove(&id);
            assert_eq!(self.map.get(id, 0), None, "an expired set was stored");
            return;
        }
        self.model.insert(id, slot);
        assert_eq!(self.map.get(id, self.now), Some(slot), "a set entry is not there");
        if stored_before {
            assert_eq!(self.map.len(), len_before, "overwriting changed the count");
        } else {
            let cap = self.cap.max(1);
            assert!(self.map.len() <= cap, "{} entries, cap {cap}", self.map.len());
        }
    }

    fn check(&self, id: u64) {
        let real = self.map.get(id, self.now);
        let expected = self.model.get(&id).copied().filter(|s| s.expires_us > self.now);
        if self.capped || !self.time_ok {
            assert!(real.is_none() || real == expected, "get({id}) gave {real:?}, model {expected:?}");
        } else {
            assert_eq!(real, expected, "get({id}) at {}", self.now);
        }
    }
}
