//! A realistic pair of snapshots for the view's tests: the built-in
//! routes, a minute of login traffic with one source prefix guessing
//! passwords, spray detection on.

use std::time::Duration;

use crate::client::FullStatus;
use crate::protocol::{
    latency_bucket, AccountCount, Activity, DecisionCounts, Distribution, FlaggedSubject, HistogramBucket,
    LatencyHistogram, PersistenceStatus, PrefixCount, Reason, RecentLockout, RecentRefusal, RouteActivity, RouteStatus,
    RuleStatus, SignalFamilyStatus, SignalsStatus, Status, LATENCY_BUCKETS,
};

/// 2030-01-01T00:00:00Z, where a `--manual-clock` daemon starts.
pub const EPOCH_2030_MS: u64 = 1_893_456_000_000;

pub fn rule(name: &str, kind: &str, entries: u64, entries_max: u64, monitor: bool, refused: u64) -> RuleStatus {
    RuleStatus {
        name: name.into(),
        kind: kind.into(),
        key: vec!["prefix".into()],
        limit: 5,
        burst: 0,
        period_ms: 900_000,
        cleared_by_success: true,
        entries,
        entries_max,
        refused_full: 0,
        monitor,
        responses: vec!["deny".into()],
        devices: "all".into(),
        refused: if monitor { 0 } else { refused },
        would_refuse: if monitor { refused } else { 0 },
        class_limits: Vec::new(),
    }
}

fn route(name: &str, rules: Vec<RuleStatus>, known_devices: (u64, u64)) -> RouteStatus {
    RouteStatus {
        name: name.into(),
        fail_policy: "open".into(),
        rules,
        known_devices: known_devices.0,
        known_devices_max: known_devices.1,
        recent_passwords: 0,
    }
}

pub fn full_status(uptime_ms: u64, would_refuse: u64) -> FullStatus {
    let routes = vec![
        route(
            "login",
            vec![
                rule("account_failures", "failures", 212, 100_000, false, 0),
                rule("source_failures", "failures", 1_841, 100_000, false, 96),
                rule("source_rate", "rate", 23_517, 1_000_000, false, 40),
                rule("spray_signals", "signal", 3, 65_536, true, would_refuse),
            ],
            (40_211, 1_000_000),
        ),
        route("mfa_verify", vec![rule("account_failures", "failures", 0, 100_000, false, 0)], (0, 0)),
        route("reauth", vec![rule("device_failures", "failures", 12, 100_000, false, 0)], (0, 0)),
        route("request", vec![rule("source_rate", "rate", 88, 1_000_000, false, 0)], (0, 0)),
    ];
    FullStatus {
        status: Status {
            version: "0.1.0".into(),
            uptime_ms,
            now_ms: EPOCH_2030_MS + uptime_ms,
            manual_clock: false,
            connections: 3,
            verdicts: Default::default(),
            routes,
            limits: Vec::new(),
            persistence: PersistenceStatus {
                state_path: "/var/lib/tollgate/state.redb".into(),
                snapshot_interval_ms: 1000,
                ..Default::default()
            },
            ..Default::default()
        },
        shared: None,
        signals: Some(SignalsStatus {
            window_ms: 3_600_000,
            sub_windows: 4,
            queue_max: 65_536,
            events_total: 4_100,
            events_dropped: 0,
            sketch_bytes: 81_920,
            sketch_bytes_max: 33_554_432,
            flags: 1,
            flags_max: 65_536,
            flags_dropped: 0,
            families: vec![
                SignalFamilyStatus {
                    name: "narrow_prefixes".into(),
                    entries: 310,
                    entries_max: 131_072,
                    heap_bytes: 0,
                    evicted: 0,
                },
                SignalFamilyStatus {
                    name: "accounts".into(),
                    entries: 2_950,
                    entries_max: 131_072,
                    heap_bytes: 0,
                    evicted: 0,
                },
            ],
            detectors: Vec::new(),
            flagged: vec![FlaggedSubject {
                detector: "narrow_spray".into(),
                subject: "203.0.113.0/24".into(),
                estimate: 14,
                threshold: 10,
                since_ms: EPOCH_2030_MS + uptime_ms - 40_000,
                until_ms: EPOCH_2030_MS + uptime_ms + 3_560_000,
            }],
        }),
    }
}

fn latency(values: &[(u64, u64)]) -> LatencyHistogram {
    let mut buckets = vec![0; LATENCY_BUCKETS];
    for &(ns, n) in values {
        buckets[latency_bucket(ns)] += n;
    }
    LatencyHistogram {
        samples: buckets.iter().sum(),
        sample_every: 1,
        p50_ns: 9_000,
        p90_ns: 14_000,
        p99_ns: 40_000,
        p999_ns: 95_000,
        max_ns: 310_000,
        buckets,
    }
}

pub fn activity(uptime_ms: u64, scale: u64) -> Activity {
    let now_ms = EPOCH_2030_MS + uptime_ms;
    let counts = |allow, deny| DecisionCounts { allow, delay: 0, challenge: 0, deny, would_refuse: 0 };
    Activity {
        now_ms,
        since_ms: EPOCH_2030_MS,
        routes: vec![
            RouteActivity {
                name: "login".into(),
                checks: counts(180 * scale, 12 * scale),
                reports: counts(170 * scale, 20 * scale),
                failures: 40 * scale,
                successes: 150 * scale,
            },
            RouteActivity { name: "mfa_verify".into(), ..Default::default() },
            RouteActivity {
                name: "reauth".into(),
                checks: counts(3 * scale, 0),
                reports: counts(3 * scale, 0),
                failures: 0,
                successes: 3 * scale,
            },
            RouteActivity { name: "request".into(), checks: counts(50 * scale, 0), ..Default::default() },
        ],
        latency: latency(&[(8_000, 100 * scale), (12_000, 60 * scale), (30_000, 3 * scale), (90_000, scale)]),
        top_window_ms: 120_000,
        top_refused_prefixes: vec![
            PrefixCount { prefix: "203.0.113.0/24".into(), class: "hosting".into(), refusals: 96, error: 0 },
            PrefixCount { prefix: "2001:db8:77:1::/64".into(), class: String::new(), refusals: 12, error: 1 },
        ],
        top_failing_accounts: vec![
            AccountCount { account: "acct:3f9a1c07d2e4b815".into(), failures: 31, error: 0 },
            AccountCount { account: "acct:a05e6612f0cd9b47".into(), failures: 7, error: 0 },
        ],
        recent_refusals: vec![RecentRefusal {
            at_ms: now_ms - 2_000,
            route: "login".into(),
            rule: "source_failures".into(),
            decision: crate::protocol::Decision::Deny,
            reason: Reason::TooManyFailures,
            prefix: "203.0.113.0/24".into(),
            class: "hosting".into(),
        }],
        recent_lockouts: vec![RecentLockout {
            at_ms: now_ms - 5_000,
            route: "login".into(),
            rule: "source_failures".into(),
            prefix: "203.0.113.0/24".into(),
            account: "acct:3f9a1c07d2e4b815".into(),
            retry_after_ms: 895_000,
        }],
        distributions: vec![Distribution {
            name: "attempts".into(),
            day: "today".into(),
            day_start_ms: EPOCH_2030_MS,
            accounts: 2_968,
            accounts_sampled: 742,
            sample_shift: 2,
            p50: 1,
            p90: 3,
            p99: 9,
            p999: 31,
            max: 212,
            histogram: vec![
                HistogramBucket { upto: 1, accounts: 1_960 },
                HistogramBucket { upto: 2, accounts: 588 },
                HistogramBucket { upto: 4, accounts: 300 },
                HistogramBucket { upto: 8, accounts: 88 },
                HistogramBucket { upto: 16, accounts: 24 },
                HistogramBucket { upto: 32, accounts: 4 },
                HistogramBucket { upto: 256, accounts: 4 },
            ],
        }],
        events: 4_100,
        events_dropped: 0,
        decision_log: None,
    }
}

/// Two snapshots a second apart, the second after `uptime_ms`.
pub fn pair(uptime_ms: u64) -> (super::Snapshot, super::Snapshot) {
    let before = super::Snapshot {
        full: full_status(uptime_ms - 1000, 2),
        activity: activity(uptime_ms - 1000, 10),
        taken: Duration::from_secs(10),
    };
    let now = super::Snapshot {
        full: full_status(uptime_ms, 5),
        activity: activity(uptime_ms, 11),
        taken: Duration::from_secs(11),
    };
    (before, now)
}
