//! The `Status` reply and the structs nested in it: what `tollgate status`
//! prints. Version 2 and 3 add their parts as separate trailing values
//! (`SharedStatus`, `SignalsStatus`) so that `Status` keeps version 1's
//! bytes for older clients.

use bincode::{Decode, Encode};

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
