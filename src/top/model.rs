//! What `tollgate top` shows, computed from the daemon's counters: rates
//! from the difference between two snapshots, latency percentiles of the
//! last interval from the difference of two histograms. Pure: the caller
//! passes the snapshots and the time between them.

use std::time::Duration;

use crate::client::FullStatus;
use crate::protocol::{latency_bucket_upper_ns, Activity, DecisionCounts, LatencyHistogram, LATENCY_BUCKETS};

/// One tick's answers: the status (with the shared store's and spray
/// detection's) and the activity, and when they were taken on this
/// process's monotonic clock (rates divide by this, not by the daemon's
/// clock, which a `--manual-clock` daemon does not move).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub full: FullStatus,
    pub activity: Activity,
    pub taken: Duration,
}

/// Per-second rates of one route's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouteRates {
    pub name: String,
    pub checks: DecisionRates,
    pub reports: DecisionRates,
    pub failures: f64,
    pub successes: f64,
    /// Every verdict, failure and success since the daemon started: 0 for
    /// a route nobody has used (the view folds those into one line).
    pub total: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecisionRates {
    pub allow: f64,
    pub delay: f64,
    pub challenge: f64,
    pub deny: f64,
    pub would_refuse: f64,
}

/// A monitor-mode rule's would-be refusals: since the daemon started, and
/// per second over the interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleRate {
    pub route: String,
    pub rule: String,
    pub total: u64,
    pub per_s: f64,
}

/// Latency percentiles in nanoseconds. `interval` is false when the last
/// interval had no samples and these are the daemon's since its start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    pub interval: bool,
    pub samples: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

/// Everything `top` derives from two snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    /// Seconds the rates are averaged over; `since_start` when there was no
    /// earlier snapshot and they are averages since the daemon started.
    pub interval_s: f64,
    pub since_start: bool,
    pub routes: Vec<RouteRates>,
    pub would_refuse: Vec<RuleRate>,
    pub latency: Percentiles,
}

/// A counter's increase from `before` to `now`. A counter that went down
/// started again from zero in between (the daemon restarted, or a reload
/// rebuilt the rule): its increase is what it counts now, never negative.
pub fn increase(before: u64, now: u64) -> u64 {
    if now >= before {
        now - before
    } else {
        now
    }
}

fn per_s(before: u64, now: u64, interval_s: f64) -> f64 {
    if interval_s <= 0.0 {
        return 0.0;
    }
    increase(before, now) as f64 / interval_s
}

fn decision_rates(before: &DecisionCounts, now: &DecisionCounts, s: f64) -> DecisionRates {
    DecisionRates {
        allow: per_s(before.allow, now.allow, s),
        delay: per_s(before.delay, now.delay, s),
        challenge: per_s(before.challenge, now.challenge, s),
        deny: per_s(before.deny, now.deny, s),
        would_refuse: per_s(before.would_refuse, now.would_refuse, s),
    }
}

/// Rates between `before` and `now`. Without `before` (the first tick, or
/// `--once`), averages since the daemon started, on the daemon's clock.
/// If the daemon started again in between (its activity's `since_ms`
/// moved), every counter counts from zero.
pub fn rates(before: Option<&Snapshot>, now: &Snapshot) -> Rates {
    let (interval_s, since_start) = match before {
        Some(b) => (now.taken.saturating_sub(b.taken).as_secs_f64(), false),
        None => (now.activity.now_ms.saturating_sub(now.activity.since_ms) as f64 / 1000.0, true),
    };
    // Restarted within the interval: everything it counts, it counted in it.
    let restarted = before.is_some_and(|b| b.activity.since_ms != now.activity.since_ms);
    let before = before.filter(|_| !restarted);
    let zero_route = crate::protocol::RouteActivity::default();
    let routes = now
        .activity
        .routes
        .iter()
        .map(|r| {
            let b = before.and_then(|b| b.activity.routes.iter().find(|x| x.name == r.name)).unwrap_or(&zero_route);
            RouteRates {
                name: r.name.clone(),
                checks: decision_rates(&b.checks, &r.checks, interval_s),
                reports: decision_rates(&b.reports, &r.reports, interval_s),
                failures: per_s(b.failures, r.failures, interval_s),
                successes: per_s(b.successes, r.successes, interval_s),
                total: [&r.checks, &r.reports].iter().map(|c| c.allow + c.delay + c.challenge + c.deny).sum::<u64>()
                    + r.failures
                    + r.successes,
            }
        })
        .collect();
    let mut would_refuse = Vec::new();
    for route in &now.full.status.routes {
        for rule in route.rules.iter().filter(|r| r.monitor) {
            let was = before
                .and_then(|b| b.full.status.routes.iter().find(|x| x.name == route.name))
                .and_then(|r| r.rules.iter().find(|x| x.name == rule.name))
                .map_or(0, |r| r.would_refuse);
            would_refuse.push(RuleRate {
                route: route.name.clone(),
                rule: rule.name.clone(),
                total: rule.would_refuse,
                per_s: per_s(was, rule.would_refuse, interval_s),
            });
        }
    }
    let latency = match before {
        Some(b) => interval_percentiles(&b.activity.latency, &now.activity.latency),
        None if restarted => interval_percentiles(&LatencyHistogram::default(), &now.activity.latency),
        None => cumulative_percentiles(&now.activity.latency),
    };
    Rates { interval_s, since_start, routes, would_refuse, latency }
}

/// The daemon's own percentiles, since it started.
pub fn cumulative_percentiles(h: &LatencyHistogram) -> Percentiles {
    Percentiles {
        interval: false,
        samples: h.samples,
        p50_ns: h.p50_ns,
        p90_ns: h.p90_ns,
        p99_ns: h.p99_ns,
        p999_ns: h.p999_ns,
        max_ns: h.max_ns,
    }
}

/// Percentiles of the samples taken between two histograms, each reported
/// as the upper bound of the bucket it falls in (within 25% above the
/// true value; the last, unbounded, bucket as the daemon's maximum). No
/// samples in between (or a histogram of another shape): the cumulative ones.
pub fn interval_percentiles(before: &LatencyHistogram, now: &LatencyHistogram) -> Percentiles {
    if now.buckets.len() != LATENCY_BUCKETS {
        return cumulative_percentiles(now);
    }
    let reset =
        before.buckets.len() != now.buckets.len() || before.buckets.iter().zip(&now.buckets).any(|(b, n)| n < b);
    let diff: Vec<u64> =
        if reset { now.buckets.clone() } else { before.buckets.iter().zip(&now.buckets).map(|(b, n)| n - b).collect() };
    let samples: u64 = diff.iter().sum();
    if samples == 0 {
        return cumulative_percentiles(now);
    }
    let bound = |i: usize| if i + 1 >= LATENCY_BUCKETS { now.max_ns } else { latency_bucket_upper_ns(i) };
    let at = |q: f64| bound(bucket_at_rank(&diff, rank(q, samples)));
    let highest = diff.iter().rposition(|&n| n > 0).expect("samples > 0");
    Percentiles {
        interval: true,
        samples,
        p50_ns: at(0.5),
        p90_ns: at(0.9),
        p99_ns: at(0.99),
        p999_ns: at(0.999),
        max_ns: bound(highest),
    }
}

/// The 1-based rank of quantile `q` among `n` sorted values (nearest rank).
pub fn rank(q: f64, n: u64) -> u64 {
    ((q * n as f64).ceil() as u64).clamp(1, n)
}

/// The bucket that holds the value of 1-based `rank`.
fn bucket_at_rank(counts: &[u64], rank: u64) -> usize {
    let mut seen = 0;
    for (i, &n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return i;
        }
    }
    counts.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{latency_bucket, RouteActivity, RuleStatus, Status};

    fn histogram(values: &[u64]) -> LatencyHistogram {
        let mut buckets = vec![0; LATENCY_BUCKETS];
        for &v in values {
            buckets[latency_bucket(v)] += 1;
        }
        LatencyHistogram {
            samples: values.len() as u64,
            sample_every: 1,
            max_ns: values.iter().copied().max().unwrap_or(0),
            p50_ns: 111,
            p90_ns: 222,
            p99_ns: 333,
            p999_ns: 444,
            buckets,
        }
    }

    /// xorshift64, seeded.
    fn values(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Log-uniform over 50 ns .. ~50 ms: every octave is used.
                let octave = x % 20;
                (50u64 << octave) + (x >> 20) % (50u64 << octave)
            })
            .collect()
    }

    #[test]
    fn interval_percentiles_are_the_buckets_of_the_brute_force_ones() {
        for seed in 1..20u64 {
            let earlier = values(seed, 500);
            let interval = values(seed * 7919, 1 + (seed as usize * 37) % 900);
            let before = histogram(&earlier);
            let now = histogram(&[earlier.clone(), interval.clone()].concat());
            let got = interval_percentiles(&before, &now);
            let mut sorted = interval.clone();
            sorted.sort_unstable();
            let brute = |q: f64| sorted[rank(q, sorted.len() as u64) as usize - 1];
            // The bucket's bound, as `top` shows it.
            let shown = |v: u64| {
                let i = latency_bucket(v);
                if i + 1 >= LATENCY_BUCKETS {
                    now.max_ns
                } else {
                    latency_bucket_upper_ns(i)
                }
            };
            assert!(got.interval);
            assert_eq!(got.samples, interval.len() as u64);
            for (q, p) in [(0.5, got.p50_ns), (0.9, got.p90_ns), (0.99, got.p99_ns), (0.999, got.p999_ns)] {
                let v = brute(q);
                assert_eq!(p, shown(v), "seed {seed} q {q}: brute force {v}");
                assert!(p > v && p as f64 <= v as f64 * 1.25 + 32.0, "seed {seed} q {q}: {p} bounds {v} within 25%");
            }
            assert_eq!(got.max_ns, shown(*sorted.last().unwrap()));
        }
    }

    #[test]
    fn an_interval_without_samples_or_after_a_reset_falls_back_or_starts_over() {
        let h = histogram(&values(3, 100));
        let same = interval_percentiles(&h, &h);
        assert!(!same.interval, "no samples in the interval: the daemon's cumulative figures");
        assert_eq!((same.p50_ns, same.p999_ns, same.samples), (111, 444, 100));
        // The daemon restarted: fewer samples now than before.
        let fresh = histogram(&[1000, 1000, 1000]);
        let got = interval_percentiles(&h, &fresh);
        assert!(got.interval);
        assert_eq!(got.samples, 3, "after a reset the current histogram is the interval's");
        assert_eq!(got.p50_ns, latency_bucket_upper_ns(latency_bucket(1000)));
    }

    fn status(would_refuse: u64) -> FullStatus {
        let rule = RuleStatus {
            name: "per_ip".into(),
            kind: "rate".into(),
            key: vec!["ip".into()],
            limit: 10,
            burst: 10,
            period_ms: 1000,
            cleared_by_success: false,
            entries: 1,
            entries_max: 100,
            refused_full: 0,
            monitor: true,
            responses: vec!["deny".into()],
            devices: "all".into(),
            refused: 0,
            would_refuse,
            class_limits: Vec::new(),
        };
        let route = crate::protocol::RouteStatus {
            name: "login".into(),
            fail_policy: "open".into(),
            rules: vec![rule],
            known_devices: 0,
            known_devices_max: 0,
            recent_passwords: 0,
        };
        FullStatus {
            status: Status {
                version: "0.1.0".into(),
                uptime_ms: 0,
                now_ms: 0,
                manual_clock: false,
                connections: 1,
                verdicts: Default::default(),
                routes: vec![route],
                limits: Vec::new(),
                persistence: crate::protocol::PersistenceStatus {
                    state_path: String::new(),
                    snapshot_interval_ms: 0,
                    ..Default::default()
                },
                ..Default::default()
            },
            shared: None,
            signals: None,
        }
    }

    fn snapshot(taken_ms: u64, allow: u64, deny: u64, failures: u64, would_refuse: u64) -> Snapshot {
        let route = RouteActivity {
            name: "login".into(),
            checks: DecisionCounts { allow, deny, ..Default::default() },
            reports: DecisionCounts::default(),
            failures,
            successes: 0,
        };
        Snapshot {
            full: status(would_refuse),
            activity: Activity { now_ms: 10_000, since_ms: 0, routes: vec![route], ..Default::default() },
            taken: Duration::from_millis(taken_ms),
        }
    }

    #[test]
    fn rates_are_differences_over_the_elapsed_time() {
        let a = snapshot(1000, 100, 10, 40, 5);
        let b = snapshot(3000, 160, 30, 40, 9);
        let r = rates(Some(&a), &b);
        assert_eq!(r.interval_s, 2.0);
        assert!(!r.since_start);
        assert_eq!(r.routes[0].checks.allow, 30.0);
        assert_eq!(r.routes[0].checks.deny, 10.0);
        assert_eq!(r.routes[0].failures, 0.0);
        assert_eq!(
            r.would_refuse,
            vec![RuleRate { route: "login".into(), rule: "per_ip".into(), total: 9, per_s: 2.0 }]
        );
        // The first tick: averages since the daemon started (10 s on its clock).
        let first = rates(None, &b);
        assert!(first.since_start);
        assert_eq!(first.routes[0].checks.allow, 16.0);
    }

    #[test]
    fn a_counter_that_went_down_restarts_the_rate_instead_of_going_negative() {
        let a = snapshot(1000, 100, 10, 40, 5);
        // A reload rebuilt the rule and its counter: 2 would-be refusals since.
        let b = snapshot(2000, 104, 12, 41, 2);
        let r = rates(Some(&a), &b);
        assert_eq!(r.would_refuse[0].per_s, 2.0, "counted from zero, not 2 - 5");
        assert_eq!(r.routes[0].checks.allow, 4.0);
        // The daemon restarted: every counter from zero.
        let mut c = snapshot(3000, 7, 1, 3, 0);
        c.activity.since_ms = 2500;
        let r = rates(Some(&b), &c);
        assert_eq!(r.routes[0].checks.allow, 7.0);
        assert_eq!(r.routes[0].failures, 3.0);
        assert!(r.routes.iter().all(|x| x.checks.allow >= 0.0 && x.failures >= 0.0));
        assert_eq!(increase(10, 3), 3);
        assert_eq!(increase(3, 10), 7);
    }
}
