//! Property tests: the real tables against plain reference models over
//! random bounded operation sequences.

use std::collections::HashMap;

use proptest::prelude::*;

use tollgate::Key;
use tollgate::TatTable;
use tollgate::{Counts, FailureWindowTable, WindowSpec};
use tollgate::{GcraSpec, GcraTable};

fn key(n: u8) -> Key {
    let n = n as u64 + 1;
    Key { account_tag: n, tuple: n.wrapping_mul(0x9E37_79B9_7F4A_7C15) }
}

/// Token bucket, the textbook form GCRA rearranges: a level in
/// microseconds-of-credit that refills with time up to burst × interval and
/// pays one interval per request.
#[derive(Clone, Copy)]
struct Bucket {
    level_us: u64,
    at_us: u64,
}

fn bucket_step(spec: GcraSpec, bucket: Option<Bucket>, now: u64, spend: bool) -> (bool, u32, u64, Bucket) {
    let full = spec.interval_us * spec.burst as u64;
    let mut b = bucket.unwrap_or(Bucket { level_us: full, at_us: now });
    b.level_us = (b.level_us + now.saturating_sub(b.at_us)).min(full);
    b.at_us = b.at_us.max(now);
    if b.level_us >= spec.interval_us {
        if spend {
            b.level_us -= spec.interval_us;
        }
        let remaining = (b.level_us / spec.interval_us) as u32 - if spend { 0 } else { 1 };
        (true, remaining, 0, b)
    } else {
        (false, 0, spec.interval_us - b.level_us, b)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gcra_matches_a_token_bucket(
        limit in 1u32..50,
        period_s in 1u64..120,
        burst in 1u32..20,
        ops in prop::collection::vec((0u8..4, 0u64..5_000_000, any::<bool>()), 1..300),
    ) {
        let spec = GcraSpec::new(limit, period_s * 1_000_000, burst);
        let mut table = GcraTable::new(1000);
        let mut model: HashMap<u8, Bucket> = HashMap::new();
        let mut now = 1_000_000_000u64;
        for (k, dt, peek) in ops {
            now += dt;
            let spend = !peek;
            let real = if spend { table.check(spec, key(k), now, true) } else { table.peek(spec, key(k), now) };
            let (allowed, remaining, retry_after, bucket) = bucket_step(spec, model.get(&k).copied(), now, spend);
            model.insert(k, bucket);
            prop_assert_eq!(real.allowed, allowed);
            prop_assert_eq!(real.retry_after_us, retry_after);
            if allowed {
                prop_assert_eq!(real.remaining, remaining);
            }
        }
    }

    /// The GCRA table's storage against a `HashMap` of (TAT) per key: with
    /// room for every key it must agree exactly, through growth, slot reuse,
    /// sweeps and deletions; when full, whatever it still holds must agree
    /// and the key just written must be there. Keys share low bits often
    /// (`k * 64` and small tables), so probe runs collide and wrap.
    #[test]
    fn tat_table_matches_a_map(
        entries_max in prop_oneof![Just(1_000usize), 1usize..40],
        ops in prop::collection::vec((0u8..4, 0u64..200, 0u64..50, 0u64..20), 1..600),
    ) {
        let mut table = TatTable::new(entries_max);
        let mut model: HashMap<u64, u64> = HashMap::new();
        let mut now = 1_000u64;
        for (op, k, lifetime, dt) in ops {
            now += dt;
            // Few distinct low bits: long runs starting at a handful of
            // homes near the array's end (so they wrap past it), with keys
            // sitting at their own home inside them. Mutation-checked: the
            // deletion's back-shift rule, broken either way, fails this.
            let id = match k % 3 {
                0 => k * 64 + 60 + k % 5,
                1 => k * 64,
                _ => k.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            };
            let live = |model: &HashMap<u64, u64>, id: u64| model.get(&id).copied().filter(|tat| *tat > now);
            match op {
                0 | 1 => {
                    let tat = now + lifetime;
                    let seen = table.update(id, now, |old| (tat, old));
                    if entries_max >= 1_000 {
                        prop_assert_eq!(seen, live(&model, id));
                    }
                    model.insert(id, tat);
                    if tat > now {
                        prop_assert_eq!(table.get(id, now), Some(tat), "the key just written is held");
                    }
                }
                2 => table.sweep(now),
                _ => {
                    let got = table.get(id, now);
                    if entries_max >= 1_000 {
                        prop_assert_eq!(got, live(&model, id));
                    } else if let Some(tat) = got {
                        prop_assert_eq!(Some(tat), live(&model, id), "an evicted table never invents a TAT");
                    }
                }
            }
            prop_assert!(table.len() <= entries_max, "len {} over {}", table.len(), entries_max);
        }
        for (id, tat) in &model {
            let got = table.get(*id, now);
            if entries_max >= 1_000 {
                prop_assert_eq!(got, Some(*tat).filter(|t| *t > now));
            } else if let Some(t) = got {
                prop_assert_eq!(t, *tat);
            }
        }
    }

    #[test]
    fn failure_window_matches_a_log_of_failure_times(
        threshold in 1u32..12,
        window_s in 1u64..1000,
        ops in prop::collection::vec((0u8..6, 0u8..10, 0u64..400), 1..400),
    ) {
        let spec = WindowSpec { window_us: window_s * 1_000_000, threshold };
        let mut table = FailureWindowTable::new(spec, 1000);
        // The model keeps every failure's time and derives the estimate from
        // its definition: previous window's count × (1 − elapsed/W) + current.
        let mut log: HashMap<u8, Vec<u64>> = HashMap::new();
        let mut now = 5_000 * spec.window_us;
        for (k, op, dt_s) in ops {
            now += dt_s * 1_000_000 * window_s / 100;
            let times = log.entry(k).or_default();
            match op {
                0..=5 => {
                    let r = table.record_failure(key(k), now).unwrap();
                    times.push(now);
                    prop_assert_eq!(r.now_locked, model_locked(spec, times, now));
                }
                6 => {
                    table.clear(key(k));
                    times.clear();
                }
                7 => {
                    table.expire(now);
                }
                _ => {}
            }
            let real = table.get(key(k), now);
            let (previous, current) = model_counts(spec, times, now);
            prop_assert_eq!((real.previous, real.current), (previous, current));
            prop_assert_eq!(spec.is_locked(real, now), model_locked(spec, times, now));
            if spec.is_locked(real, now) {
                let at = spec.unlocks_at(real, now);
                prop_assert!(!model_locked(spec, times, at));
                prop_assert!(model_locked(spec, times, at - 1));
                prop_assert!(at <= now + 2 * spec.window_us);
            }
        }
    }

    #[test]
    fn a_capped_table_never_overflows_never_over_counts_and_keeps_lockouts(
        threshold in 1u32..6,
        cap in 1usize..12,
        ops in prop::collection::vec((0u8..40, 0u64..30), 1..600),
    ) {
        let spec = WindowSpec { window_us: 60_000_000, threshold };
        let mut table = FailureWindowTable::new(spec, cap);
        let mut log: HashMap<u8, Vec<u64>> = HashMap::new();
        let mut now = 10_000 * spec.window_us;
        for (k, dt_s) in ops {
            now += dt_s * 1_000_000;
            let locked_before: Vec<Key> = table.locked(now).map(|(key, _)| key).collect();
            let result = table.record_failure(key(k), now);
            if result.is_ok() {
                log.entry(k).or_default().push(now);
            }
            prop_assert!(table.len() <= cap);
            for locked in locked_before {
                prop_assert!(table.get(locked, now) != Counts { window: spec.window_index(now), previous: 0, current: 0 },
                    "a locked entry was evicted");
            }
            for (&k, times) in &log {
                let real = table.get(key(k), now);
                let (previous, current) = model_counts(spec, times, now);
                prop_assert!(real.previous <= previous && real.current <= current, "over-counted");
            }
        }
    }
}

fn model_counts(spec: WindowSpec, times: &[u64], now: u64) -> (u32, u32) {
    let w = spec.window_us;
    let current_start = now / w * w;
    let current = times.iter().filter(|&&t| t >= current_start && t <= now).count() as u32;
    let previous = times.iter().filter(|&&t| t + w >= current_start && t < current_start).count() as u32;
    (previous, current)
}

fn model_locked(spec: WindowSpec, times: &[u64], now: u64) -> bool {
    let w = spec.window_us as u128;
    let (previous, current) = model_counts(spec, times, now);
    let elapsed = (now % spec.window_us) as u128;
    // estimate ≥ threshold, multiplied through by W to stay in integers
    previous as u128 * (w - elapsed) + current as u128 * w >= spec.threshold as u128 * w
}
