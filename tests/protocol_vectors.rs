//! The hex vectors in `tests/vectors/protocol.json`, checked against the
//! codec both ways.
//!
//! Every vector in the file must have an entry in `cases()` and every entry
//! must be in the file, so the two cannot drift apart. For each vector the
//! test checks that:
//! - its `frame` is exactly its `fields`' bytes joined, and its `kind` and
//!   `id` are the case's;
//! - encoding the case's message with the case's id gives exactly `frame`;
//! - decoding `frame` gives back the case's id and message;
//! - each field's bytes match the type and value its `meaning` names (so the
//!   human breakdown cannot be wrong about which bytes are which).
//!
//! It also checks that every request and response variant has a vector, that
//! PROTOCOL.md links the file and that the worked example it shows inline is
//! the file's vector, and that the document's tables of `Outcome`,
//! `Decision`, `Reason` and `ErrorCode` values list exactly the values the
//! code decodes.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tollgate::codec::{
    decode_request_versioned, decode_response_versioned, encode_request_with_extras, encode_response_versioned,
    frame_len, request_version, ReplyExtras, RequestExtras, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX,
    RESPONSE_PAYLOAD_BYTES_MAX, WIRE,
};
use tollgate::protocol::{
    AccountCount, Activity, ClassLimit, Decision, DecisionCounts, DetectorStatus, Distribution, ErrorCode, ErrorReply,
    FlaggedSubject, HistogramBucket, InspectedRule, Inspection, LatencyHistogram, Lockout, NamedLimit, Outcome,
    PersistenceStatus, PrefixCount, Reason, RecentLockout, RecentRefusal, Request, Response, RouteActivity,
    RouteStatus, RuleStatus, SharedStatus, SignalFamilyStatus, SignalsStatus, Status, Subject, Verdict, VerdictCounts,
    WouldBeRefusal, ABANDON_VERSION, ACTIVITY_VERSION, INSPECT_VERSION, PROTOCOL_VERSION,
};

const DOC: &str = "PROTOCOL.md";
/// The vectors, in the format PROTOCOL.md section 10 describes.
const VECTORS: &str = "tests/vectors/protocol.json";

enum Message {
    Request(Request<'static>),
    Response(Response<'static>),
}

struct Case {
    name: &'static str,
    id: u64,
    /// The envelope's version byte: 1 unless the file's vector says otherwise.
    version: u8,
    message: Message,
    /// A version-3 check's or report's password tag.
    password_tag: Option<[u8; 16]>,
    /// A version-2 reply's extras.
    degraded: bool,
    shared: Option<SharedStatus>,
    /// A version-3 status's extra.
    signals: Option<SignalsStatus>,
}

fn request(name: &'static str, id: u64, request: Request<'static>) -> Case {
    Case {
        name,
        id,
        version: 1,
        message: Message::Request(request),
        password_tag: None,
        degraded: false,
        shared: None,
        signals: None,
    }
}

fn response(name: &'static str, id: u64, response: Response<'static>) -> Case {
    Case {
        name,
        id,
        version: 1,
        message: Message::Response(response),
        password_tag: None,
        degraded: false,
        shared: None,
        signals: None,
    }
}

/// A version-1 case's message in version 2.
fn v2(name: &'static str, case: Case) -> Case {
    Case { name, version: 2, ..case }
}

/// A case's message in version 3.
fn v3(name: &'static str, case: Case) -> Case {
    Case { name, version: 3, ..case }
}

/// A case's message in version 4.
fn v4(name: &'static str, case: Case) -> Case {
    Case { name, version: 4, ..case }
}

/// A case's message in version 5.
fn v5(name: &'static str, case: Case) -> Case {
    Case { name, version: 5, ..case }
}

/// A case's message in version 6.
fn v6(name: &'static str, case: Case) -> Case {
    Case { name, version: 6, ..case }
}

/// A case's message in version 7.
fn v7(name: &'static str, case: Case) -> Case {
    Case { name, version: 7, ..case }
}

/// The message as a reply of the case's version carries it: versions 1 and
/// 2 get the reasons added in 3 as the nearest reason they know.
fn as_sent(case: &Case, response: &Response<'static>) -> Response<'static> {
    match response {
        Response::Verdict(v) => Response::Verdict(Verdict { reason: v.reason.for_version(case.version), ..v.clone() }),
        other => other.clone(),
    }
}

/// The first case named `name`, again (the version-2 cases reuse the
/// version-1 messages, so the two cannot drift apart).
fn again(cases: &[Case], name: &str) -> Case {
    let case = cases.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case `{name}`"));
    let message = match &case.message {
        Message::Request(r) => Message::Request(r.clone()),
        Message::Response(r) => Message::Response(r.clone()),
    };
    Case { message, shared: case.shared.clone(), signals: case.signals.clone(), ..*case }
}

/// Spray detection's status in `status-small-v3-signals`: one password
/// flagged in monitor mode.
fn signals_monitoring() -> SignalsStatus {
    SignalsStatus {
        window_ms: 3_600_000,
        sub_windows: 12,
        queue_max: 65_536,
        events_total: 1_200,
        events_dropped: 0,
        sketch_bytes: 65_536,
        sketch_bytes_max: 33_554_432,
        flags: 1,
        flags_max: 1_024,
        flags_dropped: 0,
        families: vec![SignalFamilyStatus {
            name: "passwords".into(),
            entries: 40,
            entries_max: 65_536,
            heap_bytes: 8_192,
            evicted: 0,
        }],
        detectors: vec![DetectorStatus {
            name: "password_spray".into(),
            mode: "monitor".into(),
            threshold: 20,
            raised_total: 1,
            active: 1,
        }],
        flagged: vec![FlaggedSubject {
            detector: "password_spray".into(),
            subject: "pw:0123456789abcdef".into(),
            estimate: 31,
            threshold: 20,
            since_ms: 1_699_999_990_000,
            until_ms: 1_700_003_590_000,
        }],
    }
}

/// The password tag in the version-3 request vectors: the bytes a0 to af.
fn tag_a0() -> Option<[u8; 16]> {
    Some(std::array::from_fn(|i| 0xa0 + i as u8))
}

/// A verdict of the built-in signal rule, `spray_signals`, with `reason`
/// (added in version 3): a challenge (its ladder), or allow in monitor
/// mode. A signal rule has no count of its own to show.
fn spray_verdict(name: &'static str, reason: Reason) -> Case {
    let monitored = reason.is_monitored();
    response(
        name,
        1,
        Response::Verdict(Verdict {
            decision: if monitored { Decision::Allow } else { Decision::Challenge },
            retry_after_ms: if monitored { 0 } else { 60_000 },
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: 0,
            reason,
            rule: Cow::Borrowed("spray_signals"),
        }),
    )
}

/// The store's status in `status-small-v2-shared`: unreachable for 12 s.
fn shared_unreachable() -> SharedStatus {
    SharedStatus {
        url: "redis://10.0.0.5:6379/0".into(),
        state: "open".into(),
        degraded: true,
        degraded_for_ms: 12_000,
        degraded_total_ms: 45_000,
        transitions: 3,
        hosts_in_force: 3,
        hosts_live: 2,
        hosts_source: "configured".into(),
        calls: 1_000,
        timeouts: 4,
        errors: 1,
        bad_values: 0,
        not_asked: 2,
        degraded_answers: 7,
        noscript_reloads: 1,
        late_replies: 2,
        releases_sent: 2,
        batches: 400,
        batched_ops: 1_000,
        rtt_mean_us: 350,
        rtt_max_us: 2_100,
        known_lockouts: 1,
        known_lockout_refusals: 5,
        written_back: 1,
        clock_offset_us: -1_500,
        last_error: Some("timed out after 2 ms".into()),
        global_rules: vec!["login/source_failures".into(), "login/account_failures".into()],
    }
}

/// Every vector in the file, by name: version 1's, then those of versions
/// 2 to 6.
fn cases() -> Vec<Case> {
    let mut cases = v1_cases();
    let v2_cases = vec![
        v2("check-login-v4-v2", again(&cases, "check-login-v4")),
        v2("verdict-allow-v2", again(&cases, "verdict-allow")),
        Case { degraded: true, ..v2("verdict-deny-degraded-v2", again(&cases, "verdict-deny")) },
        v2("status-small-v2-no-store", again(&cases, "status-small")),
        Case { shared: Some(shared_unreachable()), ..v2("status-small-v2-shared", again(&cases, "status-small")) },
        v2("unlocked-2-v2", again(&cases, "unlocked-2")),
    ];
    cases.extend(v2_cases);
    let tagged = |case: Case| Case { password_tag: tag_a0(), ..case };
    let mut v3_cases = vec![
        v3("check-login-v4-v3", again(&cases, "check-login-v4")),
        tagged(v3("check-login-v4-v3-password-tag", again(&cases, "check-login-v4"))),
        tagged(v3("report-login-failure-v3-password-tag", again(&cases, "report-login-failure-with-password-digest"))),
        Case { degraded: true, ..v3("verdict-deny-degraded-v3", again(&cases, "verdict-deny")) },
        v3("status-small-v3-no-signals", again(&cases, "status-small")),
        Case { signals: Some(signals_monitoring()), ..v3("status-small-v3-signals", again(&cases, "status-small")) },
        v3("unlocked-2-v3", again(&cases, "unlocked-2")),
    ];
    // Each reason added in version 3, in 3, and as versions 1 and 2 get it.
    let spray: [(Reason, [&'static str; 3]); 4] = [
        (
            Reason::SpraySuspected,
            ["verdict-spray-suspected-v3", "verdict-spray-suspected-v1", "verdict-spray-suspected-v2"],
        ),
        (
            Reason::DistributedAttack,
            ["verdict-distributed-attack-v3", "verdict-distributed-attack-v1", "verdict-distributed-attack-v2"],
        ),
        (
            Reason::TenantAnomaly,
            ["verdict-tenant-anomaly-v3", "verdict-tenant-anomaly-v1", "verdict-tenant-anomaly-v2"],
        ),
        (
            Reason::MonitorSignal,
            ["verdict-monitor-signal-v3", "verdict-monitor-signal-v1", "verdict-monitor-signal-v2"],
        ),
    ];
    for (reason, [in_v3, in_v1, in_v2]) in spray {
        v3_cases.push(v3(in_v3, spray_verdict(in_v3, reason)));
        v3_cases.push(spray_verdict(in_v1, reason));
        v3_cases.push(v2(in_v2, spray_verdict(in_v2, reason)));
    }
    cases.extend(v3_cases);
    let v4_cases = vec![
        v4("check-login-v4-v4", again(&cases, "check-login-v4")),
        Case { degraded: true, ..v4("verdict-deny-degraded-v4", again(&cases, "verdict-deny")) },
        v4("unlocked-2-v4", again(&cases, "unlocked-2")),
        v4("activity-request-v4", request("activity-request-v4", 11, Request::Activity { limit: 10 })),
        v4("samples-request-v4", request("samples-request-v4", 12, Request::Samples { limit: 10 })),
        v4("activity-v4", response("activity-v4", 11, Response::Activity(Box::new(activity_small())))),
        v4("samples-v4", response("samples-v4", 12, samples_one())),
        v3("error-activity-needs-v4-v3", response("error-activity-needs-v4-v3", 11, activity_refused_in_v3())),
    ];
    cases.extend(v4_cases);
    let v5_cases = vec![
        v5("check-login-v4-v5", again(&cases, "check-login-v4")),
        v5("abandon-login-v5", request("abandon-login-v5", 13, abandon_login())),
        Case { degraded: true, ..v5("verdict-deny-degraded-v5", again(&cases, "verdict-deny")) },
        v4("error-abandon-needs-v5-v4", response("error-abandon-needs-v5-v4", 13, abandon_refused_in_v4())),
        v5("verdict-attempts-in-flight-v5", places_verdict("verdict-attempts-in-flight-v5")),
        v4("verdict-attempts-in-flight-v4", places_verdict("verdict-attempts-in-flight-v4")),
    ];
    cases.extend(v5_cases);
    // No version-6 check: version 6 adds `Inspect` alone, and the other
    // clients' vector tests send every check vector in versions they speak.
    let v6_cases = vec![
        v6("inspect-login-v6", request("inspect-login-v6", 14, inspect_login())),
        v6("inspection-v6", response("inspection-v6", 14, Response::Inspection(Box::new(inspection_locked())))),
        v5("error-inspect-needs-v6-v5", response("error-inspect-needs-v6-v5", 14, inspect_refused_in_v5())),
    ];
    cases.extend(v6_cases);
    // Version 7 adds `Ban`, `Unban`, `Banned` and the reason `banned`.
    let v7_cases = vec![
        v7("ban-v7", request("ban-v7", 15, ban_request())),
        v7("banned-v7", response("banned-v7", 15, Response::Banned { until_ms: 1_700_007_200_000, replaced: false })),
        v7("unban-v7", request("unban-v7", 16, unban_request())),
        v7("unlocked-ban-v7", response("unlocked-ban-v7", 16, Response::Unlocked { cleared: 1 })),
        v7("verdict-banned-v7", banned_verdict("verdict-banned-v7")),
        v6("verdict-banned-v6", banned_verdict("verdict-banned-v6")),
        v6("error-ban-needs-v7-v6", response("error-ban-needs-v7-v6", 15, ban_refused_in_v6())),
    ];
    cases.extend(v7_cases);
    cases
}

/// `ban-v7`: 203.0.113.0/24 for two hours, with a reason.
fn ban_request() -> Request<'static> {
    Request::Ban {
        network: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 0)),
        prefix_len: 24,
        for_ms: 7_200_000,
        reason: "stuffing",
    }
}

/// `unban-v7`: lifts the ban of `ban-v7`.
fn unban_request() -> Request<'static> {
    Request::Unban { network: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 0)), prefix_len: 24 }
}

/// A check from a banned network: denied until the ban ends, by no rule
/// of the route (`ban`).
fn banned_verdict(name: &'static str) -> Case {
    response(
        name,
        1,
        Response::Verdict(Verdict {
            decision: Decision::Deny,
            retry_after_ms: 7_200_000,
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: 7_200_000,
            reason: Reason::Banned,
            rule: Cow::Borrowed("ban"),
        }),
    )
}

/// `error-ban-needs-v7-v6`: a `ban` in a version-6 frame.
fn ban_refused_in_v6() -> Response<'static> {
    Response::Error(ErrorReply {
        code: ErrorCode::Malformed,
        message: "request `ban` needs protocol version 7; this frame is version 6".into(),
    })
}

/// `inspect-login-v6`: the subject of `check-login-v4`, looked up.
fn inspect_login() -> Request<'static> {
    Request::Inspect { route: "login", subject: alice_from_v4() }
}

/// `inspection-v6`: a lockout on `source_failures`, and a rule that does
/// not apply (its key and figures empty).
fn inspection_locked() -> Inspection {
    Inspection {
        now_ms: 1_700_000_010_000,
        route: "login".into(),
        device: String::new(),
        shared: false,
        rules: vec![
            InspectedRule {
                name: "source_failures".into(),
                kind: "failures".into(),
                key: "0123456789abcdef0123456789abcdef".into(),
                limit: 5,
                failures: 5,
                locked: true,
                refuses: true,
                until_ms: 1_700_000_900_001,
                retry_after_ms: 890_001,
                reset_ms: 1_790_000,
                ..InspectedRule::default()
            },
            InspectedRule {
                name: "known_device_failures".into(),
                kind: "failures".into(),
                skipped: "known devices only".into(),
                ..InspectedRule::default()
            },
        ],
    }
}

/// `error-inspect-needs-v6-v5`: an `inspect` in a version-5 frame.
fn inspect_refused_in_v5() -> Response<'static> {
    Response::Error(ErrorReply {
        code: ErrorCode::Malformed,
        message: "request `inspect` needs protocol version 6; this frame is version 5".into(),
    })
}

/// A deny by places in flight (reason added in version 5): 5 attempts
/// checked and not yet reported fill `source_failures`.
fn places_verdict(name: &'static str) -> Case {
    response(
        name,
        1,
        Response::Verdict(Verdict {
            decision: Decision::Deny,
            retry_after_ms: 30_000,
            delay_ms: 0,
            limit: 5,
            remaining: 0,
            reset_ms: 0,
            reason: Reason::AttemptsInFlight,
            rule: Cow::Borrowed("source_failures"),
        }),
    )
}

/// `abandon-login-v5`: the subject of `check-login-v4`, whose attempt it ends.
fn abandon_login() -> Request<'static> {
    Request::Abandon {
        route: "login",
        subject: Subject {
            peer: Some(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7))),
            account: Some("alice"),
            ..Subject::default()
        },
    }
}

/// `error-abandon-needs-v5-v4`: an `abandon` in a version-4 frame.
fn abandon_refused_in_v4() -> Response<'static> {
    Response::Error(ErrorReply {
        code: ErrorCode::Malformed,
        message: "request `abandon` needs protocol version 5; this frame is version 4".into(),
    })
}

/// An account as the version-4 vectors show it: `acct:` and 16 hex digits
/// of its keyed digest, never the account.
const ACCOUNT_TAG: &str = "acct:0123456789abcdef";

/// The operator's view in `activity-v4`: one route, a latency histogram cut
/// to 3 buckets (the daemon sends `LATENCY_BUCKETS`; a message may carry
/// any number), one of each list, today's failures sampled one account in 4.
fn activity_small() -> Activity {
    Activity {
        now_ms: 1_700_000_000_000,
        since_ms: 1_699_999_940_000,
        routes: vec![RouteActivity {
            name: "login".into(),
            checks: DecisionCounts { allow: 120, delay: 0, challenge: 2, deny: 5, would_refuse: 1 },
            reports: DecisionCounts { allow: 95, delay: 0, challenge: 0, deny: 3, would_refuse: 0 },
            failures: 12,
            successes: 86,
        }],
        // Buckets 0 to 2 hold values below 80, 96 and 112 ns; each
        // percentile is the bound of the bucket it falls in.
        latency: LatencyHistogram {
            samples: 6,
            sample_every: 8,
            p50_ns: 96,
            p90_ns: 112,
            p99_ns: 112,
            p999_ns: 112,
            max_ns: 105,
            buckets: vec![2, 3, 1],
        },
        top_window_ms: 300_000,
        top_refused_prefixes: vec![PrefixCount {
            prefix: "203.0.113.0/24".into(),
            class: "hosting".into(),
            refusals: 40,
            error: 2,
        }],
        top_failing_accounts: vec![AccountCount { account: ACCOUNT_TAG.into(), failures: 9, error: 0 }],
        recent_refusals: vec![RecentRefusal {
            at_ms: 1_699_999_998_000,
            route: "login".into(),
            rule: "source_failures".into(),
            decision: Decision::Deny,
            reason: Reason::TooManyFailures,
            prefix: "203.0.113.0/24".into(),
            class: "hosting".into(),
        }],
        recent_lockouts: vec![RecentLockout {
            at_ms: 1_699_999_990_000,
            route: "login".into(),
            rule: "account_failures".into(),
            prefix: "203.0.113.0/24".into(),
            account: ACCOUNT_TAG.into(),
            retry_after_ms: 899_250,
        }],
        // Three sampled accounts failed today (1, 1 and 2 times), one in
        // 2^2 sampled: 12 accounts estimated. `max` is the top-K summary's 9.
        distributions: vec![Distribution {
            name: "failures".into(),
            day: "today".into(),
            day_start_ms: 1_699_920_000_000,
            accounts: 12,
            accounts_sampled: 3,
            sample_shift: 2,
            p50: 1,
            p90: 2,
            p99: 2,
            p999: 2,
            max: 9,
            histogram: vec![HistogramBucket { upto: 1, accounts: 8 }, HistogramBucket { upto: 2, accounts: 4 }],
        }],
        events: 150,
        events_dropped: 0,
        decision_log: None,
    }
}

/// The `Samples` reply in `samples-v4`: one would-be refusal of a
/// monitor-mode rule, of 37 since the daemon started.
fn samples_one() -> Response<'static> {
    Response::Samples {
        samples: vec![WouldBeRefusal {
            at_ms: 1_699_999_995_000,
            route: "login".into(),
            rule: "account_failures".into(),
            op: "check".into(),
            reason: Reason::MonitorTooManyFailures,
            prefix: "198.51.100.0/24".into(),
            class: String::new(),
            account: ACCOUNT_TAG.into(),
            device: "dev:fedcba9876543210".into(),
            known_device: false,
        }],
        seen: 37,
        since_ms: 1_699_999_940_000,
    }
}

/// The daemon's reply to `activity-request-v4`'s message in a version-3
/// frame: versions 1 to 3 have no request 6.
fn activity_refused_in_v3() -> Response<'static> {
    Response::Error(ErrorReply {
        code: ErrorCode::Malformed,
        message: "request `activity` needs protocol version 4; this frame is version 3".into(),
    })
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("a valid address")
}

fn alice_from_v4() -> Subject<'static> {
    Subject { peer: Some(ip("198.51.100.7")), account: Some("alice"), ..Subject::default() }
}

/// Every version-1 vector in the file, by name.
fn v1_cases() -> Vec<Case> {
    vec![
        request("check-login-v4", 1, Request::Check { route: "login", subject: alice_from_v4() }),
        request(
            "report-login-failure",
            2,
            Request::Report {
                route: "login",
                subject: alice_from_v4(),
                outcome: Outcome::Failure,
                password_digest: None,
            },
        ),
        request(
            "report-login-failure-with-password-digest",
            10,
            Request::Report {
                route: "login",
                subject: alice_from_v4(),
                outcome: Outcome::Failure,
                password_digest: Some(std::array::from_fn(|i| i as u8)),
            },
        ),
        request(
            "check-login-v6-all-fields",
            3,
            Request::Check {
                route: "login",
                subject: Subject {
                    peer: Some(ip("2001:db8::10")),
                    forwarded_for: Some("203.0.113.9"),
                    account: Some("bob"),
                    device: Some("phone-1"),
                    tenant: Some("acme"),
                    client_id: Some("web"),
                },
            },
        ),
        request("status", 4, Request::Status),
        request("lockouts-100", 5, Request::Lockouts { limit: 100 }),
        request(
            "unlock-with-source",
            6,
            Request::Unlock { route: "login", account: "alice", source: Some(ip("198.51.100.7")) },
        ),
        request("unlock-every-source", 7, Request::Unlock { route: "login", account: "alice", source: None }),
        request("clock-advance-15min", 8, Request::ClockAdvance { by_ms: 900_000 }),
        response(
            "verdict-allow",
            1,
            Response::Verdict(Verdict {
                decision: Decision::Allow,
                retry_after_ms: 0,
                delay_ms: 0,
                limit: 5,
                remaining: 4,
                reset_ms: 900_000,
                reason: Reason::Allowed,
                rule: Cow::Borrowed("source_failures"),
            }),
        ),
        response(
            "verdict-deny",
            2,
            Response::Verdict(Verdict {
                decision: Decision::Deny,
                retry_after_ms: 899_250,
                delay_ms: 0,
                limit: 5,
                remaining: 0,
                reset_ms: 899_250,
                reason: Reason::TooManyFailures,
                rule: Cow::Borrowed("source_failures"),
            }),
        ),
        response(
            "verdict-deny-lockout",
            2,
            Response::Verdict(Verdict {
                decision: Decision::Deny,
                retry_after_ms: 899_251,
                delay_ms: 0,
                limit: 5,
                remaining: 0,
                reset_ms: 1_799_250,
                reason: Reason::TooManyFailures,
                rule: Cow::Borrowed("source_failures"),
            }),
        ),
        response(
            "verdict-delay",
            1,
            Response::Verdict(Verdict {
                decision: Decision::Delay,
                retry_after_ms: 5_230,
                delay_ms: 2_000,
                limit: 10,
                remaining: 0,
                reset_ms: 19_800,
                reason: Reason::RateLimited,
                rule: Cow::Borrowed("source_rate"),
            }),
        ),
        response(
            "verdict-allow-monitored",
            10,
            Response::Verdict(Verdict {
                decision: Decision::Allow,
                retry_after_ms: 0,
                delay_ms: 0,
                limit: 50,
                remaining: 0,
                reset_ms: 874_500,
                reason: Reason::MonitorTooManyFailures,
                rule: Cow::Borrowed("account_failures"),
            }),
        ),
        response(
            "status-small",
            4,
            Response::Status(Box::new(Status {
                version: "0.1.0".into(),
                uptime_ms: 60_000,
                now_ms: 1_700_000_000_000,
                manual_clock: false,
                connections: 1,
                verdicts: VerdictCounts { allow: 3, delay: 1, challenge: 0, deny: 0, errors: 0 },
                routes: vec![RouteStatus {
                    name: "request".into(),
                    fail_policy: "closed".into(),
                    rules: vec![RuleStatus {
                        name: "source_rate".into(),
                        kind: "rate".into(),
                        key: vec!["prefix".into()],
                        limit: 100,
                        burst: 100,
                        period_ms: 60_000,
                        cleared_by_success: false,
                        entries: 2,
                        entries_max: 1_000_000,
                        refused_full: 0,
                        monitor: false,
                        responses: vec!["delay".into(), "deny".into()],
                        devices: "all".into(),
                        refused: 1,
                        would_refuse: 0,
                        class_limits: vec![ClassLimit {
                            class: "hosting".into(),
                            limit: 20,
                            burst: 10,
                            period_ms: 60_000,
                        }],
                    }],
                    known_devices: 0,
                    known_devices_max: 0,
                    recent_passwords: 0,
                }],
                limits: vec![NamedLimit { name: "request_payload_bytes_max".into(), value: 16_384 }],
                persistence: PersistenceStatus {
                    state_path: "/var/lib/tollgate/state.redb".into(),
                    snapshot_interval_ms: 1_000,
                    commits: 12,
                    write_failures: 0,
                    last_error: None,
                    changes_unwritten: 0,
                    changes_dropped: 0,
                },
                class_prefixes: 3,
                reloads: 1,
                reload_failures: 0,
                last_reload_error: None,
                log_lines_suppressed: 7,
            })),
        ),
        response(
            "lockouts-one",
            5,
            Response::Lockouts {
                lockouts: vec![Lockout {
                    route: "login".into(),
                    rule: "source_failures".into(),
                    key: "0f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
                    count: 5,
                    until_ms: 1_700_000_900_000,
                    retry_after_ms: 899_250,
                }],
                total: 1,
            },
        ),
        response("unlocked-2", 6, Response::Unlocked { cleared: 2 }),
        response("clock-advanced", 8, Response::ClockAdvanced { now_ms: 1_893_456_900_000 }),
        response(
            "error-unknown-route",
            9,
            Response::Error(ErrorReply { code: ErrorCode::UnknownRoute, message: "unknown route `signup`".into() }),
        ),
        response(
            "error-frame-too-large",
            0,
            Response::Error(ErrorReply {
                code: ErrorCode::FrameTooLarge,
                message: "frame of 16385 bytes is over the maximum of 16384; closing".into(),
            }),
        ),
    ]
}

fn encode(case: &Case) -> Vec<u8> {
    let mut out = Vec::new();
    match &case.message {
        Message::Request(r) => {
            let extras = RequestExtras { password_tag: case.password_tag };
            encode_request_with_extras(case.version, case.id, r, &extras, &mut out)
        }
        Message::Response(r) => {
            let extras =
                ReplyExtras { degraded: case.degraded, shared: case.shared.as_ref(), signals: case.signals.as_ref() };
            encode_response_versioned(case.version, case.id, r, &extras, &mut out)
        }
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if let Some(bad) = digits.iter().find(|b| !b.is_ascii_hexdigit()) {
        return Err(format!("`{}` is not a hex digit in `{}`", char::from(*bad), text.trim()));
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in `{}`", text.trim()));
    }
    let value = |d: u8| char::from(d).to_digit(16).expect("checked above") as u8;
    Ok(digits.chunks(2).map(|pair| value(pair[0]) << 4 | value(pair[1])).collect())
}

/// The vector file, as PROTOCOL.md section 10 describes it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorFile {
    #[allow(dead_code)] // for readers of the file
    about: String,
    /// The newest version the file has vectors for.
    protocol_version: u8,
    vectors: Vec<FileVector>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileVector {
    name: String,
    kind: String,
    id: u64,
    /// Absent for version 1, so the version-1 vectors read as they always did.
    #[serde(default = "version_1")]
    version: u8,
    #[allow(dead_code)] // for readers of the file
    description: String,
    frame: String,
    fields: Vec<FileField>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileField {
    hex: String,
    meaning: String,
}

fn version_1() -> u8 {
    1
}

/// One annotated run of bytes and what it means (`<type> <field> = <value>`).
struct Field {
    /// Where it is written, for messages: `file:line` or `vector field n`.
    at: String,
    bytes: Vec<u8>,
    comment: String,
}

/// A vector as read from the file (or from PROTOCOL.md's inline example),
/// with its bytes parsed.
struct Vector {
    name: String,
    /// Where it is written, for messages.
    at: String,
    kind: Option<String>,
    id: Option<u64>,
    version: Option<u8>,
    frame: Vec<u8>,
    fields: Vec<Field>,
}

impl Vector {
    fn field_bytes(&self) -> Vec<u8> {
        self.fields.iter().flat_map(|f| f.bytes.iter().copied()).collect()
    }
}

fn read(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn read_document() -> String {
    read(DOC)
}

/// Every vector in the file, its hex parsed; the frame must be exactly its
/// fields' bytes joined.
fn parse_file(text: &str) -> Result<Vec<Vector>, String> {
    let file: VectorFile = serde_json::from_str(text).map_err(|e| format!("{VECTORS}: {e}"))?;
    if file.protocol_version != PROTOCOL_VERSION {
        return Err(format!("{VECTORS}: protocol_version {} is not {PROTOCOL_VERSION}", file.protocol_version));
    }
    let mut vectors = Vec::new();
    for (i, v) in file.vectors.into_iter().enumerate() {
        let at = format!("{VECTORS}: vectors[{i}] `{}`", v.name);
        let frame = parse_hex(&v.frame).map_err(|e| format!("{at}: frame: {e}"))?;
        let mut fields = Vec::new();
        for (n, f) in v.fields.into_iter().enumerate() {
            let bytes = parse_hex(&f.hex).map_err(|e| format!("{at}: fields[{n}]: {e}"))?;
            if bytes.is_empty() {
                return Err(format!("{at}: fields[{n}] has no bytes"));
            }
            fields.push(Field { at: format!("{at} fields[{n}]"), bytes, comment: f.meaning });
        }
        let vector =
            Vector { name: v.name, at, kind: Some(v.kind), id: Some(v.id), version: Some(v.version), frame, fields };
        if vector.field_bytes() != vector.frame {
            return Err(format!(
                "{}: the fields join to {}, but the frame is {}",
                vector.at,
                hex(&vector.field_bytes()),
                hex(&vector.frame)
            ));
        }
        vectors.push(vector);
    }
    Ok(vectors)
}

/// The vectors PROTOCOL.md still shows inline (its worked example). Such a
/// vector is a fenced block whose first line is `vector: <name>`, followed
/// by `hex:` and the frame's bytes; text after `#` on a line is that line's
/// annotation, and a line without one continues the field above.
fn parse_document_vectors(doc: &str) -> Result<Vec<Vector>, String> {
    let mut vectors = Vec::new();
    let mut in_fence = false;
    let mut current: Option<Vector> = None;
    let mut in_hex = false;
    for (i, raw) in doc.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.starts_with("```") {
            if let Some(mut vector) = current.take() {
                if vector.fields.is_empty() {
                    return Err(format!("{}: vector `{}` has no bytes", vector.at, vector.name));
                }
                vector.frame = vector.field_bytes();
                vectors.push(vector);
            }
            in_fence = !in_fence;
            in_hex = false;
            continue;
        }
        if let Some(name) = line.strip_prefix("vector:") {
            if !in_fence {
                return Err(format!("{DOC}:{n}: `vector:` outside a fenced block"));
            }
            if let Some(open) = &current {
                return Err(format!("{DOC}:{n}: second vector in the block of `{}`", open.name));
            }
            let at = format!("{DOC}:{n}");
            current = Some(Vector {
                name: name.trim().to_string(),
                at,
                kind: None,
                id: None,
                version: None,
                frame: Vec::new(),
                fields: Vec::new(),
            });
            continue;
        }
        let Some(vector) = current.as_mut() else { continue };
        let rest = match line.strip_prefix("hex:") {
            Some(_) if in_hex => return Err(format!("{DOC}:{n}: second `hex:` in vector `{}`", vector.name)),
            Some(rest) => {
                in_hex = true;
                rest
            }
            None if in_hex || line.is_empty() => line,
            None => return Err(format!("{DOC}:{n}: expected `hex:` in vector `{}`", vector.name)),
        };
        let (digits, comment) = match rest.split_once('#') {
            Some((digits, comment)) => (digits, Some(comment.trim())),
            None => (rest, None),
        };
        let bytes = parse_hex(digits).map_err(|e| format!("{DOC}:{n}: {e}"))?;
        let at = format!("{DOC}:{n}");
        match (comment, vector.fields.last_mut()) {
            // A line with only a comment, or an empty line, adds nothing.
            _ if bytes.is_empty() => {}
            (Some(comment), _) => vector.fields.push(Field { at, bytes, comment: comment.to_string() }),
            (None, Some(field)) => field.bytes.extend(bytes),
            (None, None) => vector.fields.push(Field { at, bytes, comment: String::new() }),
        }
    }
    if in_fence {
        return Err(format!("{DOC}: a fenced block is never closed"));
    }
    Ok(vectors)
}

fn file_vectors() -> Vec<Vector> {
    parse_file(&read(VECTORS)).unwrap_or_else(|e| panic!("{e}"))
}

fn kind(message: &Message) -> &'static str {
    match message {
        Message::Request(_) => "request",
        Message::Response(_) => "response",
    }
}

/// The file's vectors by name, and the cases by name, both checked to be
/// one-to-one, with matching kind and id.
fn pairs() -> Vec<(Vector, Case)> {
    let mut by_name: BTreeMap<&str, Case> = BTreeMap::new();
    for case in cases() {
        let name = case.name;
        assert!(by_name.insert(name, case).is_none(), "test case `{name}` is listed twice");
    }
    let mut pairs = Vec::new();
    let mut problems = Vec::new();
    let mut seen = BTreeMap::new();
    for vector in file_vectors() {
        if let Some(first) = seen.insert(vector.name.clone(), vector.at.clone()) {
            problems.push(format!("{}: vector `{}` is listed twice (first at {first})", vector.at, vector.name));
            continue;
        }
        match by_name.remove(vector.name.as_str()) {
            Some(case) => {
                if vector.kind.as_deref() != Some(kind(&case.message)) {
                    problems.push(format!(
                        "{}: kind is {:?}, the case is a {}",
                        vector.at,
                        vector.kind,
                        kind(&case.message)
                    ));
                }
                if vector.id != Some(case.id) {
                    problems.push(format!("{}: id is {:?}, the case's is {}", vector.at, vector.id, case.id));
                }
                if vector.version != Some(case.version) {
                    problems.push(format!(
                        "{}: version is {:?}, the case's is {}",
                        vector.at, vector.version, case.version
                    ));
                }
                pairs.push((vector, case))
            }
            None => problems.push(format!("{}: vector `{}` has no test case", vector.at, vector.name)),
        }
    }
    for name in by_name.keys() {
        problems.push(format!("test case `{name}` is not in {VECTORS}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    pairs
}

/// Checks that an annotation (`<type> <field> = <value> ...`) describes
/// exactly the bytes it stands beside.
fn check_annotation(field: &Field) -> Result<(), String> {
    let comment = field.comment.as_str();
    let (kind, rest) = comment.split_once(' ').ok_or("no `<type> <field> = <value>` annotation")?;
    let value = rest.split_once('=').map(|(_, v)| v.trim()).ok_or("the annotation has no `= <value>`")?;
    let first = value.split_whitespace().next().unwrap_or("");
    let bad = |e: &dyn std::fmt::Display| format!("`{first}` is not a {kind}: {e}");
    let expected: Vec<u8> = match kind {
        "u8" => vec![first.parse::<u8>().map_err(|e| bad(&e))?],
        "u32" => first.parse::<u32>().map_err(|e| bad(&e))?.to_le_bytes().to_vec(),
        "u64" => first.parse::<u64>().map_err(|e| bad(&e))?.to_le_bytes().to_vec(),
        "i64" => first.parse::<i64>().map_err(|e| bad(&e))?.to_le_bytes().to_vec(),
        "bool" => match first {
            "false" => vec![0],
            "true" => vec![1],
            _ => return Err(bad(&"expected true or false")),
        },
        "utf8" => {
            let text = value
                .strip_prefix('"')
                .and_then(|v| v.rfind('"').map(|end| &v[..end]))
                .ok_or("a utf8 value must be in double quotes")?;
            text.as_bytes().to_vec()
        }
        "ipv4" => first.parse::<Ipv4Addr>().map_err(|e| bad(&e))?.octets().to_vec(),
        "ipv6" => first.parse::<Ipv6Addr>().map_err(|e| bad(&e))?.octets().to_vec(),
        "bytes" => parse_hex(first).map_err(|e| bad(&e))?,
        other => return Err(format!("unknown annotation type `{other}`")),
    };
    if expected != field.bytes {
        return Err(format!("the annotation means {} but the bytes are {}", hex(&expected), hex(&field.bytes)));
    }
    Ok(())
}

fn fail_on(problems: Vec<String>) {
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_vector_in_the_file_has_a_case_and_every_case_is_in_the_file() {
    assert!(!pairs().is_empty());
}

#[test]
fn the_encoder_writes_exactly_the_bytes_in_the_file() {
    let mut problems = Vec::new();
    for (vector, case) in pairs() {
        let encoded = encode(&case);
        if encoded != vector.frame {
            problems.push(format!(
                "{}\n  in the file {}\n  encoder     {}",
                vector.at,
                hex(&vector.frame),
                hex(&encoded)
            ));
        }
        let max = match case.message {
            Message::Request(_) => REQUEST_PAYLOAD_BYTES_MAX,
            Message::Response(_) => RESPONSE_PAYLOAD_BYTES_MAX,
        };
        if frame_len(&vector.frame, max) != Ok(Some(vector.frame.len())) {
            problems.push(format!("{}: not exactly one frame", vector.at));
        }
    }
    fail_on(problems);
}

#[test]
fn the_bytes_in_the_file_decode_to_the_case() {
    let mut problems = Vec::new();
    for (vector, case) in pairs() {
        let payload = vector.frame.get(FRAME_HEADER_BYTES..).unwrap_or_default();
        let mismatch = match &case.message {
            _ if request_version(payload) != Some(case.version) => {
                Some(format!("has version byte {:?}, not {}", request_version(payload), case.version))
            }
            Message::Request(expected) => match decode_request_versioned(payload) {
                Ok((id, request, extras))
                    if (id, &request, extras.password_tag) == (case.id, expected, case.password_tag) =>
                {
                    None
                }
                Ok(decoded) => {
                    Some(format!("decodes to {decoded:?}, not {:?}", (case.id, expected, case.password_tag)))
                }
                Err(failure) => Some(format!("does not decode: {}", failure.error)),
            },
            Message::Response(expected) => match decode_response_versioned(payload) {
                Ok((id, response, extras))
                    if (id, &response, extras.degraded, &extras.shared, &extras.signals)
                        == (case.id, &as_sent(&case, expected), case.degraded, &case.shared, &case.signals) =>
                {
                    None
                }
                Ok(decoded) => Some(format!(
                    "decodes to {decoded:?}, not {:?}",
                    (case.id, as_sent(&case, expected), case.degraded, &case.shared, &case.signals)
                )),
                Err(failure) => Some(format!("does not decode: {}", failure.error)),
            },
        };
        if let Some(mismatch) = mismatch {
            problems.push(format!("{} {mismatch}", vector.at));
        }
    }
    fail_on(problems);
}

#[test]
fn every_annotation_matches_its_bytes() {
    let mut problems = Vec::new();
    for (vector, _) in pairs() {
        for field in &vector.fields {
            if let Err(e) = check_annotation(field) {
                problems.push(format!("{}: {e}", field.at));
            }
        }
    }
    fail_on(problems);
}

/// PROTOCOL.md links the file, and a vector it shows inline as a worked
/// example is the file's vector of that name, field for field.
#[test]
fn the_document_links_the_file_and_its_inline_examples_are_the_files() {
    let doc = read_document();
    assert!(doc.contains(VECTORS), "{DOC} does not mention {VECTORS}");
    let inline = parse_document_vectors(&doc).unwrap_or_else(|e| panic!("{e}"));
    assert!(!inline.is_empty(), "{DOC} shows no worked example");
    let file = file_vectors();
    let mut problems = Vec::new();
    for example in &inline {
        let Some(vector) = file.iter().find(|v| v.name == example.name) else {
            problems.push(format!("{}: vector `{}` is not in {VECTORS}", example.at, example.name));
            continue;
        };
        let fields = |v: &Vector| v.fields.iter().map(|f| (f.bytes.clone(), f.comment.clone())).collect::<Vec<_>>();
        if fields(example) != fields(vector) {
            problems.push(format!("{}: vector `{}` differs from {}", example.at, example.name, vector.at));
        }
        for field in &example.fields {
            if let Err(e) = check_annotation(field) {
                problems.push(format!("{}: {e}", field.at));
            }
        }
    }
    fail_on(problems);
}

/// `error-activity-needs-v4-v3` is what the codec says of a version-3
/// frame of request 6 (and of request 7, naming it; and in versions 1 and 2,
/// naming them); in version 4 both decode.
#[test]
fn an_older_frame_of_a_version_4_request_gets_the_error_in_the_file() {
    let Response::Error(in_file) = activity_refused_in_v3() else { unreachable!() };
    for (request, name) in [(Request::Activity { limit: 10 }, "activity"), (Request::Samples { limit: 10 }, "samples")]
    {
        for version in 1..ACTIVITY_VERSION {
            let mut frame = Vec::new();
            encode_request_with_extras(version, 11, &request, &RequestExtras::default(), &mut frame);
            let failure = decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).expect_err("refused");
            let expected = in_file
                .message
                .replace("`activity`", &format!("`{name}`"))
                .replace("is version 3", &format!("is version {version}"));
            assert_eq!((failure.id, failure.error.to_string()), (Some(11), expected), "version {version}");
        }
        let mut frame = Vec::new();
        encode_request_with_extras(ACTIVITY_VERSION, 11, &request, &RequestExtras::default(), &mut frame);
        assert_eq!(decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).map(|(_, r, _)| r), Ok(request));
    }
}

/// `error-abandon-needs-v5-v4` is what the codec says of request 8 in a
/// version-1 to 4 frame (naming the frame's version); in version 5 it decodes.
#[test]
fn an_older_frame_of_an_abandon_gets_the_error_in_the_file() {
    let Response::Error(in_file) = abandon_refused_in_v4() else { unreachable!() };
    for version in 1..ABANDON_VERSION {
        let mut frame = Vec::new();
        encode_request_with_extras(version, 13, &abandon_login(), &RequestExtras::default(), &mut frame);
        let failure = decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).expect_err("refused");
        let expected = in_file.message.replace("is version 4", &format!("is version {version}"));
        assert_eq!((failure.id, failure.error.to_string()), (Some(13), expected), "version {version}");
    }
    let mut frame = Vec::new();
    encode_request_with_extras(ABANDON_VERSION, 13, &abandon_login(), &RequestExtras::default(), &mut frame);
    assert_eq!(decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).map(|(_, r, _)| r), Ok(abandon_login()));
}

/// `error-inspect-needs-v6-v5` is what the codec says of request 9 in a
/// version-1 to 5 frame (naming the frame's version); in version 6 it decodes.
#[test]
fn an_older_frame_of_an_inspect_gets_the_error_in_the_file() {
    let Response::Error(in_file) = inspect_refused_in_v5() else { unreachable!() };
    for version in 1..INSPECT_VERSION {
        let mut frame = Vec::new();
        encode_request_with_extras(version, 14, &inspect_login(), &RequestExtras::default(), &mut frame);
        let failure = decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).expect_err("refused");
        let expected = in_file.message.replace("is version 5", &format!("is version {version}"));
        assert_eq!((failure.id, failure.error.to_string()), (Some(14), expected), "version {version}");
    }
    let mut frame = Vec::new();
    encode_request_with_extras(INSPECT_VERSION, 14, &inspect_login(), &RequestExtras::default(), &mut frame);
    assert_eq!(decode_request_versioned(&frame[FRAME_HEADER_BYTES..]).map(|(_, r, _)| r), Ok(inspect_login()));
}

/// Every variant of both message enums. `variant` below is exhaustive, so
/// a new variant does not compile until it is named there; add it here too,
/// and the test below fails until the vector file has a vector for it.
const VARIANTS: [&str; 22] = [
    "Request::Check",
    "Request::Report",
    "Request::Status",
    "Request::Lockouts",
    "Request::Unlock",
    "Request::ClockAdvance",
    "Response::Verdict",
    "Response::Status",
    "Response::Lockouts",
    "Response::Unlocked",
    "Response::ClockAdvanced",
    "Response::Error",
    "Request::Activity",
    "Request::Samples",
    "Response::Activity",
    "Response::Samples",
    "Request::Abandon",
    "Request::Inspect",
    "Request::Ban",
    "Request::Unban",
    "Response::Inspection",
    "Response::Banned",
];

fn variant(message: &Message) -> &'static str {
    match message {
        Message::Request(r) => match r {
            Request::Check { .. } => "Request::Check",
            Request::Report { .. } => "Request::Report",
            Request::Status => "Request::Status",
            Request::Lockouts { .. } => "Request::Lockouts",
            Request::Unlock { .. } => "Request::Unlock",
            Request::ClockAdvance { .. } => "Request::ClockAdvance",
            Request::Activity { .. } => "Request::Activity",
            Request::Samples { .. } => "Request::Samples",
            Request::Abandon { .. } => "Request::Abandon",
            Request::Inspect { .. } => "Request::Inspect",
            Request::Ban { .. } => "Request::Ban",
            Request::Unban { .. } => "Request::Unban",
        },
        Message::Response(r) => match r {
            Response::Verdict(_) => "Response::Verdict",
            Response::Status(_) => "Response::Status",
            Response::Lockouts { .. } => "Response::Lockouts",
            Response::Unlocked { .. } => "Response::Unlocked",
            Response::ClockAdvanced { .. } => "Response::ClockAdvanced",
            Response::Error(_) => "Response::Error",
            Response::Activity(_) => "Response::Activity",
            Response::Samples { .. } => "Response::Samples",
            Response::Inspection(_) => "Response::Inspection",
            Response::Banned { .. } => "Response::Banned",
        },
    }
}

#[test]
fn every_request_and_response_variant_has_a_vector() {
    let covered: Vec<&str> = pairs().iter().map(|(_, case)| variant(&case.message)).collect();
    let missing: Vec<&str> = VARIANTS.iter().copied().filter(|v| !covered.contains(v)).collect();
    assert!(missing.is_empty(), "no vector in {VECTORS} for {missing:?}");
}

/// Every value of a fieldless enum, found by decoding discriminants 0, 1, ...
/// until one is refused, with the name it serializes to (its JSON name).
fn wire_values<T: bincode::Decode<()> + serde::Serialize>() -> Vec<(u32, String)> {
    (0u32..)
        .map_while(|i| {
            let (value, _) = bincode::decode_from_slice::<T, _>(&i.to_le_bytes(), WIRE).ok()?;
            let name = serde_json::to_value(&value).expect("plain data serializes");
            Some((i, name.as_str().expect("a fieldless variant serializes to a string").to_string()))
        })
        .collect()
}

/// The rows of the table whose header starts with "| `<name>` value |": the
/// number in the first column and the backquoted name in the second.
fn documented_values(doc: &str, name: &str) -> Result<Vec<(u32, String)>, String> {
    let header = format!("`{name}` value");
    let mut lines = doc.lines().skip_while(|l| l.split('|').nth(1).map(str::trim) != Some(header.as_str()));
    if lines.next().is_none() {
        return Err(format!("{DOC} has no table headed `{header}`"));
    }
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            match (cells.get(1).and_then(|c| c.parse().ok()), cells.get(2)) {
                (Some(value), Some(name)) => Ok((value, name.trim_matches('`').to_string())),
                _ => Err(format!("{name}: cannot read the table row `{row}`")),
            }
        })
        .collect()
}

#[test]
fn enum_tables_list_every_value_with_its_name() {
    let doc = read_document();
    let mut problems = Vec::new();
    for (name, code) in [
        ("Outcome", wire_values::<Outcome>()),
        ("Decision", wire_values::<Decision>()),
        ("Reason", wire_values::<Reason>()),
        ("ErrorCode", wire_values::<ErrorCode>()),
    ] {
        match documented_values(&doc, name) {
            Ok(documented) if documented == code => {}
            Ok(documented) => problems.push(format!("{name}: {DOC} lists {documented:?}; the code has {code:?}")),
            Err(e) => problems.push(e),
        }
    }
    fail_on(problems);
}
