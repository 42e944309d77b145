//! Every message on the wire. One enum lists every request; one lists every
//! response. PROTOCOL.md documents their bytes; `codec` turns them into frames.
//!
//! Requests borrow their strings from the read buffer, so decoding a check
//! allocates nothing.

use std::borrow::Cow;
use std::net::IpAddr;

use bincode::{BorrowDecode, Decode, Encode};

/// The version this client sends (and the newest the daemon speaks).
/// Version byte at the start of every payload; a frame with a version
/// outside `PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION` gets an
/// `unsupported_version` error and the connection survives.
pub const PROTOCOL_VERSION: u8 = 7;
/// The oldest version the daemon still answers, in that version's bytes:
/// auth servers linking an older client keep working across an upgrade.
pub const PROTOCOL_VERSION_MIN: u8 = 1;
/// Longest account, device, tenant or client id accepted. Longer input is
/// refused rather than truncated, so two long names cannot share a key.
pub const IDENTIFIER_BYTES_MAX: usize = 512;
/// The first version whose `Check` and `Report` carry a password tag and
/// whose replies may carry the spray-detection reasons and status.
pub const SIGNALS_VERSION: u8 = 3;

const _: () = assert!(PROTOCOL_VERSION_MIN < SIGNALS_VERSION && SIGNALS_VERSION <= PROTOCOL_VERSION);
/// The first version with the operator's view: the `Activity` and
/// `Samples` requests (what `tollgate top` and `tollgate sample` ask).
pub const ACTIVITY_VERSION: u8 = 4;

const _: () = assert!(SIGNALS_VERSION < ACTIVITY_VERSION && ACTIVITY_VERSION <= PROTOCOL_VERSION);
/// The first version with `Abandon` (an attempt that ends without an
/// outcome gives back the places its check took) and with the reason
/// `attempts_in_flight`.
pub const ABANDON_VERSION: u8 = 5;

const _: () = assert!(ACTIVITY_VERSION < ABANDON_VERSION && ABANDON_VERSION <= PROTOCOL_VERSION);
/// The first version with `Inspect` (an account's standing on each rule of
/// a route, read without changing anything; admin).
pub const INSPECT_VERSION: u8 = 6;

const _: () = assert!(ABANDON_VERSION < INSPECT_VERSION && INSPECT_VERSION <= PROTOCOL_VERSION);
/// The first version with manual bans: `Ban` and `Unban` (admin), the
/// `Banned` reply and the reason `banned`.
pub const BAN_VERSION: u8 = 7;

const _: () = assert!(INSPECT_VERSION < BAN_VERSION && BAN_VERSION <= PROTOCOL_VERSION);

/// Who is attempting what. The daemon derives every key from these fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, BorrowDecode)]
pub struct Subject<'a> {
    /// Address of the TCP peer the auth server saw.
    pub peer: Option<IpAddr>,
    /// The raw X-Forwarded-For header, if any; only trusted hops are honoured.
    pub forwarded_for: Option<&'a str>,
    /// The account as typed (whether or not it exists).
    pub account: Option<&'a str>,
    pub device: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub client_id: Option<&'a str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Outcome {
    Success,
    Failure,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, BorrowDecode)]
pub enum Request<'a> {
    /// May this attempt proceed? Spends from rate budgets.
    Check {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// The attempt's credential was verified: moves failure counters.
    /// `password_digest` is an optional keyed digest of the attempted
    /// password, computed by the client with its own key (the password never
    /// leaves the auth server): a failure repeating one of the last few
    /// digests for the same (account, source) is not counted again.
    Report {
        route: &'a str,
        subject: Subject<'a>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
    },
    Status,
    /// Active lockouts, at most `limit` of them.
    Lockouts {
        limit: u32,
    },
    /// Clears an account's failure entries on a route (admin).
    Unlock {
        route: &'a str,
        account: &'a str,
        source: Option<IpAddr>,
    },
    /// Moves a `--manual-clock` daemon's clock forward (admin).
    ClockAdvance {
        by_ms: u64,
    },
    /// The operator's view (version 4): verdicts by route, check latency,
    /// the top refused prefixes and failing accounts, recent refusals and
    /// lockouts, and attempts per account per day; at most `limit` entries
    /// in each list.
    Activity {
        limit: u32,
    },
    /// A sample of monitor mode's would-be refusals (version 4), at most
    /// `limit` of them, newest first.
    Samples {
        limit: u32,
    },
    /// The attempt a check admitted ended without an outcome (version 5):
    /// its handler was cancelled, the end user hung up, a deadline passed.
    /// Gives back the place the check took on each failure rule and counts
    /// nothing: an attempt whose result never reached its sender taught
    /// nobody anything, so it is not a guess. Same subject as the check.
    Abandon {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// The subject's standing on each rule of the route (version 6,
    /// admin): what a check would find, read without spending, taking a
    /// place, climbing a ladder or being logged as an attempt.
    Inspect {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// Refuses every check from a source network for `for_ms` (version 7,
    /// admin): durable, listed among the lockouts, lifted by `Unban` or
    /// when it ends. Banning a network already banned replaces that ban.
    Ban {
        network: IpAddr,
        prefix_len: u8,
        for_ms: u64,
        /// Why, for the audit line and the lockouts list; may be empty.
        reason: &'a str,
    },
    /// Lifts the ban on exactly this network (version 7, admin); answered
    /// with `Unlocked` (1 if it was banned, else 0).
    Unban {
        network: IpAddr,
        prefix_len: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Decision {
    Allow,
    Delay,
    Challenge,
    Deny,
}

/// Why a verdict is what it is. For logs and the audit trail only: the end
/// user sees one refusal form whatever the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Reason {
    /// Every rule consulted has room.
    Allowed,
    /// A rate rule's budget is spent.
    RateLimited,
    /// A failure rule's threshold is reached.
    TooManyFailures,
    /// Allowed because the rule that would have refused runs in monitor
    /// mode: it would have been `rate_limited`.
    MonitorRateLimited,
    /// Allowed because the rule that would have refused runs in monitor
    /// mode: it would have been `too_many_failures`.
    MonitorTooManyFailures,
    /// A signal rule refused: spray detection has flagged the attempt's
    /// source prefix or wider prefix (it failed against many distinct
    /// accounts) or its password tag (one password failing across many
    /// accounts). Version 3 and later; sent as `TooManyFailures` in
    /// versions 1 and 2.
    SpraySuspected,
    /// A signal rule refused: spray detection has flagged the account, whose
    /// failures come from many distinct source prefixes (a distributed
    /// attack on one account). Version 3 and later; sent as
    /// `TooManyFailures` in versions 1 and 2.
    DistributedAttack,
    /// A signal rule refused: spray detection has flagged the tenant (or
    /// route), whose failure ratio is far above its own baseline. Version 3
    /// and later; sent as `TooManyFailures` in versions 1 and 2.
    TenantAnomaly,
    /// Allowed because the signal rule that would have refused, or its
    /// detector, runs in monitor mode: it would have been one of the three
    /// above. Version 3 and later; sent as `MonitorTooManyFailures` in
    /// versions 1 and 2.
    MonitorSignal,
    /// A failure rule refused because the attempts in flight on its key
    /// (checked, not yet reported or abandoned) fill its threshold; its
    /// failures alone would not. Version 5 and later; sent as
    /// `TooManyFailures` in versions 1 to 4.
    AttemptsInFlight,
    /// The source is in a network an operator banned (`tollgate ban`).
    /// Version 7 and later; sent as `TooManyFailures` in versions 1 to 6.
    Banned,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Verdict<'a> {
    pub decision: Decision,
    /// When refused: wait at least this long before trying again.
    pub retry_after_ms: u64,
    /// With `delay`: hold the attempt this long before proceeding.
    pub delay_ms: u64,
    /// Limit of the tightest rule consulted.
    pub limit: u32,
    /// What is left of it.
    pub remaining: u32,
    /// Time until that rule is back to its full limit.
    pub reset_ms: u64,
    pub reason: Reason,
    /// The rule that decided (the tightest one when allowed); empty if none.
    pub rule: Cow<'a, str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ErrorCode {
    /// The payload does not decode as a request.
    Malformed,
    UnsupportedVersion,
    UnknownRoute,
    /// The route's rules need a subject field the request lacks.
    MissingField,
    /// An identifier is longer than the daemon accepts.
    FieldTooLong,
    PermissionDenied,
    /// `clock advance` on a daemon that runs on the system clock.
    NotManualClock,
    /// The frame's length prefix is over the maximum; the connection closes.
    FrameTooLarge,
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct VerdictCounts {
    pub allow: u64,
    pub delay: u64,
    pub challenge: u64,
    pub deny: u64,
    pub errors: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RuleStatus {
    pub name: String,
    /// `rate` or `failures`.
    pub kind: String,
    /// The subject fields the key is derived from.
    pub key: Vec<String>,
    /// Rate rules: requests per `period_ms`; failure rules: the threshold.
    pub limit: u32,
    /// Rate rules: requests allowed at once; failure rules: 0.
    pub burst: u32,
    /// Rate rules: the period; failure rules: the window.
    pub period_ms: u64,
    pub cleared_by_success: bool,
    pub entries: u64,
    pub entries_max: u64,
    /// Failures not counted because the table was full of lockouts.
    pub refused_full: u64,
    /// Evaluated and counted, never enforced.
    pub monitor: bool,
    /// The response ladder, e.g. `["delay", "challenge", "deny"]`.
    pub responses: Vec<String>,
    /// `all`, `unknown` or `known`: which devices' attempts the rule counts.
    pub devices: String,
    /// Checks this rule refused (enforcing).
    pub refused: u64,
    /// Checks this rule would have refused (monitor mode).
    pub would_refuse: u64,
    /// Rate rules: limits that replace the rule's for a source class.
    pub class_limits: Vec<ClassLimit>,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClassLimit {
    pub class: String,
    pub limit: u32,
    pub burst: u32,
    pub period_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RouteStatus {
    pub name: String,
    /// `open` or `closed`: what a client does when the daemon is unreachable.
    pub fail_policy: String,
    pub rules: Vec<RuleStatus>,
    /// Known-device table fill (0/0 when the route has none).
    pub known_devices: u64,
    pub known_devices_max: u64,
    /// Wrong-password digests remembered per (account, source); 0 = off.
    pub recent_passwords: u8,
}

/// A named bound of the daemon itself, with its unit in the name.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NamedLimit {
    pub name: String,
    pub value: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PersistenceStatus {
    pub state_path: String,
    pub snapshot_interval_ms: u64,
    pub commits: u64,
    pub write_failures: u64,
    pub last_error: Option<String>,
    /// Changes held in memory for retry after failed commits.
    pub changes_unwritten: u64,
    /// Changes given up on because the retry buffer was full.
    pub changes_dropped: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Status {
    pub version: String,
    pub uptime_ms: u64,
    pub now_ms: u64,
    pub manual_clock: bool,
    pub connections: u64,
    pub verdicts: VerdictCounts,
    pub routes: Vec<RouteStatus>,
    pub limits: Vec<NamedLimit>,
    pub persistence: PersistenceStatus,
    /// Prefixes in the source class file (0 without one).
    pub class_prefixes: u64,
    pub reloads: u64,
    pub reload_failures: u64,
    pub last_reload_error: Option<String>,
    /// Refusal and audit log lines suppressed by the per-second cap.
    pub log_lines_suppressed: u64,
}

/// Version 2's status of the shared store (absent when the daemon runs without `[shared]`).
/// A separate trailing value rather than a `Status` field, so that `Status`
/// keeps version 1's bytes for version-1 clients.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SharedStatus {
    pub url: String,
    /// closed | open | recovering | refused
    pub state: String,
    pub degraded: bool,
    pub degraded_for_ms: u64,
    pub degraded_total_ms: u64,
    pub transitions: u64,
    pub hosts_in_force: u32,
    pub hosts_live: u32,
    /// configured | learned | assumed
    pub hosts_source: String,
    pub calls: u64,
    pub timeouts: u64,
    pub errors: u64,
    pub bad_values: u64,
    pub not_asked: u64,
    pub degraded_answers: u64,
    pub noscript_reloads: u64,
    pub late_replies: u64,
    pub releases_sent: u64,
    pub batches: u64,
    pub batched_ops: u64,
    pub rtt_mean_us: u64,
    pub rtt_max_us: u64,
    pub known_lockouts: u64,
    pub known_lockout_refusals: u64,
    pub written_back: u64,
    pub clock_offset_us: i64,
    pub last_error: Option<String>,
    /// `route/rule` of every rule decided in the store.
    pub global_rules: Vec<String>,
}

/// Version 3's status of spray detection (absent when `[signals]` is off),
/// trailing the version-2 extras for the same reason `SharedStatus` does.
/// Subjects are prefixes or truncated digests, never raw identifiers.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SignalsStatus {
    pub window_ms: u64,
    pub sub_windows: u32,
    pub queue_max: u32,
    pub events_total: u64,
    /// Events dropped because the queue was full (never blocks a report).
    pub events_dropped: u64,
    pub sketch_bytes: u64,
    pub sketch_bytes_max: u64,
    pub flags: u32,
    pub flags_max: u32,
    pub flags_dropped: u64,
    pub families: Vec<SignalFamilyStatus>,
    pub detectors: Vec<DetectorStatus>,
    /// The most recently raised flags and widened blocks, newest first.
    pub flagged: Vec<FlaggedSubject>,
}

/// One bounded table of tracked subjects (prefixes, accounts, passwords, tenants).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SignalFamilyStatus {
    pub name: String,
    pub entries: u64,
    pub entries_max: u64,
    pub heap_bytes: u64,
    pub evicted: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DetectorStatus {
    pub name: String,
    /// off | monitor | enforce
    pub mode: String,
    pub threshold: u32,
    pub raised_total: u64,
    pub active: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FlaggedSubject {
    pub detector: String,
    /// A prefix in CIDR form, or `acct:`, `pw:` or `tenant:` and 16 hex digits of a digest.
    pub subject: String,
    pub estimate: u32,
    pub threshold: u32,
    pub since_ms: u64,
    pub until_ms: u64,
}

/// Version 4's operator view (`tollgate top`). Every list is bounded by
/// the daemon (named limits `activity.*` in `status`) and by the request's
/// `limit`. Accounts appear as `acct:` and 16 hex digits of their keyed
/// digest (the same as spray detection's flags), prefixes in CIDR form:
/// never a raw identifier.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Activity {
    pub now_ms: u64,
    /// When the counters below began (the daemon's start).
    pub since_ms: u64,
    pub routes: Vec<RouteActivity>,
    /// Check and report latency inside the daemon: from the start of the
    /// batch of frames a read delivered to the verdict's reply encoded (so a
    /// pipelined frame's includes the frames before it in its batch); one
    /// batch in `sample_every` per connection (see `LATENCY_BUCKETS`).
    pub latency: LatencyHistogram,
    /// The top-K summaries cover the current window and the one before it.
    pub top_window_ms: u64,
    pub top_refused_prefixes: Vec<PrefixCount>,
    pub top_failing_accounts: Vec<AccountCount>,
    /// Newest first.
    pub recent_refusals: Vec<RecentRefusal>,
    /// Newest first.
    pub recent_lockouts: Vec<RecentLockout>,
    /// Attempts and failures per account per day: today so far and yesterday.
    pub distributions: Vec<Distribution>,
    /// Events handed to the activity thread, and those dropped because its
    /// queue was full (the request path never waits for it).
    pub events: u64,
    pub events_dropped: u64,
    /// The decision log, when `[decision_log]` is on.
    pub decision_log: Option<DecisionLogStatus>,
}

/// Verdicts given on one route since the daemon started.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RouteActivity {
    pub name: String,
    pub checks: DecisionCounts,
    /// Reports' verdicts (a report answers with what a check would now say).
    pub reports: DecisionCounts,
    pub failures: u64,
    pub successes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DecisionCounts {
    pub allow: u64,
    pub delay: u64,
    pub challenge: u64,
    pub deny: u64,
    /// Allowed, but a rule in monitor mode would have refused.
    pub would_refuse: u64,
}

/// A log-linear histogram of nanoseconds: bucket `i` holds values below
/// `latency_bucket_upper_ns(i)` and at or above the bucket before's bound.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LatencyHistogram {
    /// Requests measured: one in `sample_every` of each connection's.
    pub samples: u64,
    pub sample_every: u32,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// `LATENCY_BUCKETS` counts, so that a viewer can take percentiles of
    /// the difference between two snapshots (the last second's).
    pub buckets: Vec<u64>,
}

/// Buckets of `LatencyHistogram`: four per power of two from 64 ns (the
/// first holds everything below 80 ns), so a bucket's upper bound
/// overstates any value in it by at most 25%; the last is unbounded.
pub const LATENCY_BUCKETS: usize = 4 * 30;

/// The exclusive upper bound of latency bucket `i`, in nanoseconds
/// (`u64::MAX` for the last).
pub fn latency_bucket_upper_ns(i: usize) -> u64 {
    if i + 1 >= LATENCY_BUCKETS {
        return u64::MAX;
    }
    let octave = (i / 4) as u32;
    let step = (i % 4) as u64 + 1;
    // 64 * 2^octave * (1 + step / 4)
    (64u64 << octave) + (16u64 << octave) * step
}

/// The bucket a latency of `ns` falls in.
pub fn latency_bucket(ns: u64) -> usize {
    if ns < 80 {
        return 0;
    }
    let scaled = ns / 16; // >= 5
    let octave = 63 - u64::leading_zeros(scaled) as usize; // floor(log2(scaled)) >= 2
                                                           // Within the octave [4 * 2^(octave-2), 8 * 2^(octave-2)) of `scaled`, 4 steps.
    let unit = 1u64 << (octave - 2);
    let step = (scaled / unit - 4) as usize; // 0..=3
    let i = (octave - 2) * 4 + step;
    // `upper(i)` = 16 * unit * (5 + step); the value may sit on a bound's
    // far side because of the division: one more bucket.
    let i = if ns >= latency_bucket_upper_ns(i) { i + 1 } else { i };
    i.min(LATENCY_BUCKETS - 1)
}

/// A source prefix and how many refusals it drew (a space-saving
/// summary: `refusals` may overstate by at most `error`).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PrefixCount {
    pub prefix: String,
    /// The source class, or empty when the address is in none.
    pub class: String,
    pub refusals: u64,
    pub error: u64,
}

/// An account digest (`acct:` and 16 hex digits) and its failures.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AccountCount {
    pub account: String,
    pub failures: u64,
    pub error: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RecentRefusal {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    pub decision: Decision,
    pub reason: Reason,
    pub prefix: String,
    pub class: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RecentLockout {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    pub prefix: String,
    /// `acct:` and 16 hex digits, or empty when the route has no account.
    pub account: String,
    pub retry_after_ms: u64,
}

/// How many attempts (or failures) accounts made in one day, from a
/// uniform sample of accounts chosen by a keyed hash: each sampled account
/// is counted exactly, from its first attempt of the day.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Distribution {
    /// `attempts` (checks) or `failures` (failed reports).
    pub name: String,
    /// `today` or `yesterday` (UTC days on the daemon's clock).
    pub day: String,
    pub day_start_ms: u64,
    /// Accounts seen that day, estimated: sampled accounts times 2^`sample_shift`.
    pub accounts: u64,
    pub accounts_sampled: u64,
    /// One account in 2^`sample_shift` is sampled.
    pub sample_shift: u32,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub p999: u32,
    /// The most of any account seen: the larger of the sample's and the
    /// top-K summary's (which sees every failure, not only the sample's).
    pub max: u32,
    pub histogram: Vec<HistogramBucket>,
}

/// Accounts whose count was at most `upto` and above the bucket before's.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct HistogramBucket {
    pub upto: u32,
    /// Estimated accounts (sampled times 2^`sample_shift`).
    pub accounts: u64,
}

/// One would-be refusal of a rule in monitor mode: enough to walk it to
/// its cause, and nothing that names anyone.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WouldBeRefusal {
    pub at_ms: u64,
    pub route: String,
    pub rule: String,
    /// `check` (only checks count would-be refusals; the field leaves room
    /// for a later daemon's `report`).
    pub op: String,
    pub reason: Reason,
    pub prefix: String,
    pub class: String,
    /// `acct:` and 16 hex digits, or empty.
    pub account: String,
    /// `dev:` and 16 hex digits of the device's keyed digest, or empty.
    pub device: String,
    /// Whether the account has succeeded from this device before.
    pub known_device: bool,
}

/// The decision log's state (`[decision_log]`).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DecisionLogStatus {
    /// The directory the files are in.
    pub path: String,
    pub records_written: u64,
    /// Records lost: the queue was full, or the file could not be written.
    pub records_dropped: u64,
    pub bytes_written: u64,
    /// Log files in the directory now (the one being written among them).
    pub files: u64,
    pub write_errors: u64,
    pub last_error: Option<String>,
}

/// A key currently refused by a failure rule. The key is a digest: the
/// daemon never holds the account it came from.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Lockout {
    pub route: String,
    pub rule: String,
    pub key: String,
    pub count: u32,
    pub until_ms: u64,
    pub retry_after_ms: u64,
}

/// An `Inspect` reply (version 6): the subject's standing on each rule of
/// the route, as of `now_ms`. Keys are keyed digests, as `lockouts` shows
/// them; the request's identifiers are not echoed.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Inspection {
    pub now_ms: u64,
    pub route: String,
    /// `known` or `unknown` when the route keeps known devices and the
    /// request names an account and a device; empty otherwise.
    pub device: String,
    /// The daemon runs with a shared store: global rules are decided
    /// there, and their figures here are this host's view only (its
    /// degraded share and the store's lockouts it has learned).
    pub shared: bool,
    /// Every rule of the route, in order.
    pub rules: Vec<InspectedRule>,
}

/// One rule's standing for the inspected subject.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct InspectedRule {
    pub name: String,
    /// `rate`, `failures` or `signal`.
    pub kind: String,
    /// Why the rule does not apply to this subject (`needs peer`,
    /// `unknown devices only`, ...); empty when it applies. A rule that
    /// does not apply has no key and every figure 0.
    pub skipped: String,
    /// The key's keyed digest, 32 hex digits (as `lockouts` lists it).
    pub key: String,
    /// Evaluated and counted, never enforced.
    pub monitor: bool,
    /// Shared mode: decided in the store (see `Inspection::shared`).
    pub global: bool,
    /// Failure rules: the threshold; rate rules: the burst.
    pub limit: u32,
    /// Failure rules: failures in the sliding window, rounded up as a
    /// check counts them.
    pub failures: u32,
    /// Failure rules: attempts checked and not yet reported (places).
    pub in_flight: u32,
    /// Checks the rule would still admit now (failure rules: the threshold
    /// less failures and places; rate rules: the budget left).
    pub remaining: u32,
    /// Failure rules: the failures reach the threshold (a lockout).
    pub locked: bool,
    /// Signal rules: the detector whose flag covers the subject, or empty.
    pub flagged_by: String,
    /// A check now would be refused by this rule (or, in monitor mode,
    /// would have been).
    pub refuses: bool,
    /// When the refusal ends on the daemon's clock, and how long from now;
    /// 0 when it does not refuse (a signal rule's flag promises no end: 0).
    pub until_ms: u64,
    pub retry_after_ms: u64,
    /// Rate rules: until the budget is full again; failure rules: until
    /// the counts expire.
    pub reset_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "type", rename_all = "snake_case"))]
pub enum Response<'a> {
    Verdict(Verdict<'a>),
    Status(Box<Status>),
    Lockouts {
        lockouts: Vec<Lockout>,
        total: u64,
    },
    Unlocked {
        cleared: u32,
    },
    ClockAdvanced {
        now_ms: u64,
    },
    Error(ErrorReply),
    Activity(Box<Activity>),
    /// `seen`: every would-be refusal since the sample began, of which
    /// `samples` is a uniform sample.
    Samples {
        samples: Vec<WouldBeRefusal>,
        seen: u64,
        since_ms: u64,
    },
    /// The reply to `Inspect` (version 6).
    Inspection(Box<Inspection>),
    /// The reply to `Ban` (version 7): when the ban ends on the daemon's
    /// clock, and whether it replaced a ban on the same network.
    Banned {
        until_ms: u64,
        replaced: bool,
    },
}

impl Response<'_> {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response<'static> {
        Response::Error(ErrorReply { code, message: message.into() })
    }

    pub fn into_owned(self) -> Response<'static> {
        match self {
            Response::Verdict(v) => Response::Verdict(v.into_owned()),
            Response::Status(s) => Response::Status(s),
            Response::Lockouts { lockouts, total } => Response::Lockouts { lockouts, total },
            Response::Unlocked { cleared } => Response::Unlocked { cleared },
            Response::ClockAdvanced { now_ms } => Response::ClockAdvanced { now_ms },
            Response::Error(e) => Response::Error(e),
            Response::Activity(a) => Response::Activity(a),
            Response::Samples { samples, seen, since_ms } => Response::Samples { samples, seen, since_ms },
            Response::Inspection(i) => Response::Inspection(i),
            Response::Banned { until_ms, replaced } => Response::Banned { until_ms, replaced },
        }
    }
}

impl Reason {
    /// Every reason, in the wire's order (its discriminant is its place).
    pub const ALL: [Reason; 11] = [
        Reason::Allowed,
        Reason::RateLimited,
        Reason::TooManyFailures,
        Reason::MonitorRateLimited,
        Reason::MonitorTooManyFailures,
        Reason::SpraySuspected,
        Reason::DistributedAttack,
        Reason::TenantAnomaly,
        Reason::MonitorSignal,
        Reason::AttemptsInFlight,
        Reason::Banned,
    ];

    /// A rule in monitor mode would have refused: allowed, counted, logged.
    pub fn is_monitored(self) -> bool {
        matches!(self, Reason::MonitorRateLimited | Reason::MonitorTooManyFailures | Reason::MonitorSignal)
    }

    /// The reason as a reply of `version` carries it. Versions 1 and 2 know
    /// only the first five, versions 3 and 4 the first nine, and their
    /// clients refuse an unknown discriminant: a spray-detection refusal
    /// goes to versions 1 and 2 as `TooManyFailures` and its monitor-mode
    /// twin as `MonitorTooManyFailures`, and `AttemptsInFlight` to versions
    /// 1 to 4 and `Banned` to versions 1 to 6 as `TooManyFailures`, the
    /// nearest reason they can read.
    pub fn for_version(self, version: u8) -> Reason {
        if version >= BAN_VERSION {
            return self;
        }
        match self {
            Reason::Banned => Reason::TooManyFailures,
            _ if version >= ABANDON_VERSION => self,
            Reason::AttemptsInFlight => Reason::TooManyFailures,
            _ if version >= SIGNALS_VERSION => self,
            Reason::SpraySuspected | Reason::DistributedAttack | Reason::TenantAnomaly => Reason::TooManyFailures,
            Reason::MonitorSignal => Reason::MonitorTooManyFailures,
            Reason::Allowed
            | Reason::RateLimited
            | Reason::TooManyFailures
            | Reason::MonitorRateLimited
            | Reason::MonitorTooManyFailures => self,
        }
    }
}

impl Verdict<'_> {
    pub fn into_owned(self) -> Verdict<'static> {
        Verdict { rule: Cow::Owned(self.rule.into_owned()), ..self }
    }

    /// Whether the caller may go ahead (after `delay_ms` for a delay).
    pub fn proceeds(&self) -> bool {
        matches!(self.decision, Decision::Allow | Decision::Delay)
    }
}
