//! Configuration in two stages: `RawConfig` is the TOML file as written
//! (every field optional, unknown keys refused by the parser with their
//! line), then `Config::build` lays it over the built-in defaults and
//! validates everything, reporting every invalid key at once.
//!
//! No I/O except `Config::read_raw`, which reads the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::classes::SourceClass;
use crate::failure_window::{THRESHOLD_MAX, WINDOW_US_MIN};
use crate::keys::Component;
use crate::source::{self, SourcePolicy};

pub const SOCKET_PATH_DEFAULT: &str = "/run/tollgate/tollgate.sock";
pub const STATE_PATH_DEFAULT: &str = "/var/lib/tollgate/state.redb";
pub const CONFIG_PATH_DEFAULT: &str = "/etc/tollgate/tollgate.toml";
/// Name of the secret key file, next to the state file unless configured.
pub const SECRET_FILE_NAME: &str = "secret";

/// How often live failure counters are written to the state file. A crash
/// loses at most this much of sub-threshold counts (never a lockout, which is
/// written before its report is answered). One second keeps the loss to a
/// handful of failures per key at any attack rate the rate rules allow.
pub const SNAPSHOT_INTERVAL_MS_DEFAULT: u64 = 1000;
pub const SNAPSHOT_INTERVAL_MS_MAX: u64 = 60_000;
/// How long an attempt admitted by `check` holds its place on failure rules
/// while no `report` settles it. A place that lapses before its attempt's
/// report frees room for another guess, so this must outlast the auth
/// server's own request deadline (an attacker who can slow the auth server's
/// password hashing past it would otherwise get a threshold's worth of
/// guesses in flight per lapse): 30 s covers the usual HTTP handler timeout.
/// A place whose report never comes (a crashed handler) holds its key for
/// this long.
pub const ATTEMPT_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// Longer would let a crashed auth server's attempts hold their keys' places
/// for more than ten minutes.
pub const ATTEMPT_TIMEOUT_MS_MAX: u64 = 600_000;

/// The login window: long enough that 5 guesses per window is ~480 a day per
/// (account, source), short enough that a typo-locked owner waits minutes.
pub const LOGIN_WINDOW_SECS_DEFAULT: u64 = 15 * 60;
/// Failures per (account, source prefix) per window. Five covers a user's
/// typos and caps one source's guesses at 5 per window.
pub const SOURCE_FAILURES_THRESHOLD_DEFAULT: u32 = 5;
/// Failures per account from everywhere per window: ten sources' worth, so a
/// distributed guesser is stopped while one stranger cannot lock the owner.
pub const ACCOUNT_FAILURES_THRESHOLD_DEFAULT: u32 = 50;
/// Re-auth (UIA) failures per (account, device) per window.
pub const REAUTH_FAILURES_THRESHOLD_DEFAULT: u32 = 5;
/// Entries per failure table: ~50 bytes each, so ~5 MB per table at the cap.
pub const FAILURE_ENTRIES_MAX_DEFAULT: usize = 100_000;
/// Login attempts per source prefix: 600 a minute sustained with a burst of
/// 300. A 22,000-person office behind 4 addresses peaks near 165 logins a
/// minute per address; this leaves 3.6x headroom for it while a single
/// address still cannot exceed 10 attempts a second.
pub const LOGIN_RATE_LIMIT_DEFAULT: u32 = 600;
pub const LOGIN_RATE_BURST_DEFAULT: u32 = 300;
/// Generic API route groups: 100 a minute per prefix, burst 100.
pub const REQUEST_RATE_LIMIT_DEFAULT: u32 = 100;
pub const REQUEST_RATE_BURST_DEFAULT: u32 = 100;
pub const RATE_PERIOD_SECS_DEFAULT: u64 = 60;
/// Keys per rate table: 16 bytes plus hash-map overhead each.
pub const RATE_ENTRIES_MAX_DEFAULT: usize = 1_000_000;
/// Retry-After escalation per key: the n-th refusal of a key within a
/// cool-down says "retry after" at least this long (the last step repeats).
/// A client that honours it backs off; one that ignores it stands out.
pub const RETRY_AFTER_STEPS_SECS_DEFAULT: [u64; 4] = [1, 5, 30, 120];
/// Jitter added to each escalated Retry-After, as a percentage of the step
/// (never subtracted, so waiting it out is always enough), so refused
/// clients do not retry in lock-step.
pub const JITTER_PERCENT_DEFAULT: u8 = 10;
/// First `delay` of a key, doubling per refusal up to the cap: slow enough to
/// cost a guesser, short enough that a human barely notices the first.
pub const DELAY_BASE_MS_DEFAULT: u64 = 1000;
pub const DELAY_MAX_MS_DEFAULT: u64 = 10_000;
/// How long a device stays known after a successful login from it.
pub const KNOWN_DEVICE_TTL_SECS_DEFAULT: u64 = 30 * 86_400;
pub const KNOWN_DEVICES_MAX_DEFAULT: usize = 1_000_000;
/// New devices one account may make known per TTL. Without a cap one
/// account's successes could flush the table (it evicts the entry expiring
/// soonest), putting victims' devices back under the account ceiling.
pub const KNOWN_DEVICES_PER_ACCOUNT_MAX_DEFAULT: u16 = 16;
pub const KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT: u16 = 1000;
/// Wrong-password digests remembered per (account, source prefix): a mail
/// client retrying a stale password repeats one of a few, not many.
pub const RECENT_PASSWORDS_DEFAULT: u8 = 4;
pub const RECENT_PASSWORDS_MAX: u8 = 4;
pub const RECENT_PASSWORD_ENTRIES_MAX_DEFAULT: usize = 100_000;

/// Longest a rate rule's burst may take to refill (burst × period / limit):
/// a year. Beyond it the numbers are a typo, and the GCRA tolerance would
/// approach the range of its microsecond arithmetic.
pub const BURST_SPAN_US_MAX: u64 = 366 * 86_400_000_000;

fn rate_fits(r: RateLimit) -> bool {
    let interval = r.period_us.div_ceil(r.limit.max(1) as u64);
    interval.checked_mul(r.burst as u64).is_some_and(|span| span <= BURST_SPAN_US_MAX)
}

/// Rules one route may have: a request derives at most one key per rule,
/// kept on the stack, and no real route needs more.
pub const RULES_PER_ROUTE_MAX: usize = 16;
/// Upper bound on any table's entries, so a typo cannot exhaust memory.
pub const ENTRIES_MAX_LIMIT: usize = 100_000_000;
/// Longest rate period and failure window a rule may have (one day).
pub const PERIOD_SECS_MAX: u64 = 86_400;

/// Open connections the daemon serves at once; more wait in the backlog.
/// An auth server pools a few dozen; 1024 leaves room for the CLI and bursts.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// A client that has sent part of a frame must send the rest within this,
/// or it is dropped (it holds a buffer and a connection slot).
pub const FRAME_READ_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// A connection that sends nothing for this long is closed; the client
/// reconnects on its next call. Ten minutes keeps an auth server's pooled
/// connections while bounding what abandoned ones hold.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 600_000;
/// A client must take its replies within this, or it is dropped: one that
/// pipelines requests and never reads would otherwise hold its connection,
/// and the replies buffered for it, for as long as it liked.
pub const REPLY_WRITE_TIMEOUT_MS_DEFAULT: u64 = 5_000;
/// Requests answered per connection before its replies are written: a
/// client pipelining faster than it reads cannot make one batch grow
/// without bound.
pub const IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT: usize = 1024;
/// Refusal and audit log lines per second; the rest are counted and the
/// count is logged with the next line, so an attack cannot flood the journal.
pub const LOG_LINES_PER_SEC_MAX_DEFAULT: u64 = 100;
/// Owner and group may connect: the auth server joins the socket's group.
pub const SOCKET_MODE_DEFAULT: u32 = 0o660;
/// Graceful stop: in-flight requests get this long to be answered before
/// the final snapshot is written regardless.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;

/// What a client does for a route when the daemon cannot answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailPolicy {
    /// Let the attempt proceed: the rule protects users, and refusing every
    /// login while the limiter is down would be the bigger harm.
    Open,
    /// Refuse the attempt: the rule protects the system.
    Closed,
}

impl FailPolicy {
    pub fn name(self) -> &'static str {
        match self {
            FailPolicy::Open => "open",
            FailPolicy::Closed => "closed",
        }
    }
}

/// A rate: `limit` per `period_us` sustained, `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub limit: u32,
    pub period_us: u64,
    pub burst: u32,
}

/// One rung of the response ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rung {
    /// Hold the attempt, then let it proceed.
    Delay,
    /// Let it proceed only after a step-up challenge.
    Challenge,
    Deny,
}

impl Rung {
    pub fn name(self) -> &'static str {
        match self {
            Rung::Delay => "delay",
            Rung::Challenge => "challenge",
            Rung::Deny => "deny",
        }
    }
}

/// Which attempts a rule counts, by whether the device is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceScope {
    All,
    /// Skipped when the attempt comes from a device the account has logged
    /// in from before (the account ceiling: the owner's device is exempt).
    UnknownDevices,
    /// Applies only to attempts from a known device.
    KnownDevices,
}

impl DeviceScope {
    pub fn name(self) -> &'static str {
        match self {
            DeviceScope::All => "all",
            DeviceScope::UnknownDevices => "unknown",
            DeviceScope::KnownDevices => "known",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum RuleKind {
    /// GCRA, with optional per-source-class limits (by `SourceClass as usize`).
    Rate { rate: RateLimit, by_class: [Option<RateLimit>; 4], entries_max: usize },
    /// Failure counting in a sliding window; locked at `threshold`.
    Failures { threshold: u32, window_us: u64, cleared_by_success: bool, entries_max: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RuleConfig {
    pub name: String,
    pub key: Vec<Component>,
    pub kind: RuleKind,
    /// Evaluate and count, never enforce.
    pub monitor: bool,
    /// The ladder: the n-th refusal of a key uses `responses[min(n, len−1)]`.
    pub responses: Vec<Rung>,
    /// Without it, a request lacking a key field is an error; with it false,
    /// the rule is skipped for such requests.
    pub required: bool,
    pub devices: DeviceScope,
}

/// How refusals are phrased (all rules).
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsePolicy {
    pub retry_after_steps_us: Vec<u64>,
    pub jitter_percent: u8,
    pub delay_base_us: u64,
    pub delay_max_us: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub fail_policy: FailPolicy,
    pub rules: Vec<RuleConfig>,
    /// The route's known-device table, if it has one.
    pub known_devices: Option<KnownDevicesConfig>,
    /// (digests per key, entries_max) of repeated-password forgiveness.
    pub recent_passwords: Option<(u8, usize)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KnownDevicesConfig {
    pub ttl_us: u64,
    pub entries_max: usize,
    /// New devices one account may make known within `ttl_us` of its last.
    pub per_account_max: u16,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    pub connections_max: usize,
    pub frame_read_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
    pub idle_timeout_ms: u64,
    pub reply_write_timeout_ms: u64,
    pub in_flight_per_connection_max: usize,
    pub log_lines_per_sec_max: u64,
    /// Permission bits of the socket file the daemon creates.
    pub socket_mode: u32,
    /// Group to give the socket file (a name or a number).
    pub socket_group: Option<String>,
    /// Who may `check` and `report` (users and primary groups, by name or
    /// number). Both empty: whoever can open the socket.
    pub client_users: Vec<String>,
    pub client_groups: Vec<String>,
    /// Who may run admin operations besides root and the daemon's own user.
    pub admin_users: Vec<String>,
    pub admin_groups: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub socket: PathBuf,
    pub state: PathBuf,
    pub secret: PathBuf,
    pub snapshot_interval_ms: u64,
    /// See `ATTEMPT_TIMEOUT_MS_DEFAULT`.
    pub attempt_timeout_ms: u64,
    pub source: SourcePolicy,
    /// CIDR file mapping prefixes to source classes.
    pub class_file: Option<PathBuf>,
    pub server: ServerConfig,
    pub responses: ResponsePolicy,
    /// Sorted by name.
    pub routes: Vec<RouteConfig>,
}

// ---- the file as written ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub socket: Option<PathBuf>,
    pub state: Option<PathBuf>,
    pub secret: Option<PathBuf>,
    pub snapshot_interval_ms: Option<u64>,
    pub attempt_timeout_ms: Option<u64>,
    #[serde(default)]
    pub source: RawSource,
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub responses: RawResponses,
    #[serde(default)]
    pub routes: BTreeMap<String, RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponses {
    pub retry_after_steps_secs: Option<Vec<u64>>,
    pub jitter_percent: Option<u8>,
    pub delay_base_ms: Option<u64>,
    pub delay_max_ms: Option<u64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClassPrefix {
    pub ipv4_prefix_len: Option<u8>,
    pub ipv6_prefix_len: Option<u8>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClassLimit {
    pub limit: Option<u32>,
    pub period_secs: Option<u64>,
    pub burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    pub trusted_proxies: Option<Vec<String>>,
    pub trusted_hops: Option<u8>,
    pub ipv4_prefix_len: Option<u8>,
    pub ipv6_prefix_len: Option<u8>,
    pub class_file: Option<PathBuf>,
    /// Prefix lengths per source class.
    #[serde(default)]
    pub classes: BTreeMap<String, RawClassPrefix>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub connections_max: Option<usize>,
    pub frame_read_timeout_ms: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub reply_write_timeout_ms: Option<u64>,
    pub in_flight_per_connection_max: Option<usize>,
    pub log_lines_per_sec_max: Option<u64>,
    pub socket_mode: Option<u32>,
    pub socket_group: Option<String>,
    pub client_users: Option<Vec<String>>,
    pub client_groups: Option<Vec<String>>,
    pub admin_users: Option<Vec<String>>,
    pub admin_groups: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub fail_policy: Option<FailPolicy>,
    /// 0 turns known devices off for the route.
    pub known_device_ttl_secs: Option<u64>,
    pub known_devices_max: Option<usize>,
    pub known_devices_per_account_max: Option<u16>,
    /// 0 turns repeated-password forgiveness off for the route.
    pub recent_passwords: Option<u8>,
    pub recent_passwords_max: Option<usize>,
    #[serde(default)]
    pub rules: BTreeMap<String, RawRule>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    /// `rate` or `failures`.
    pub kind: Option<String>,
    pub key: Option<Vec<String>>,
    /// `false` removes a built-in rule.
    pub enabled: Option<bool>,
    pub limit: Option<u32>,
    pub period_secs: Option<u64>,
    pub burst: Option<u32>,
    pub threshold: Option<u32>,
    pub window_secs: Option<u64>,
    pub cleared_by_success: Option<bool>,
    pub entries_max: Option<usize>,
    pub monitor: Option<bool>,
    pub responses: Option<Vec<String>>,
    pub required: Option<bool>,
    /// `all`, `unknown` or `known`.
    pub devices: Option<String>,
    /// Rate rules: limits per source class.
    pub classes: Option<BTreeMap<String, RawClassLimit>>,
}

/// Every problem found in a configuration, one `key: message` per line.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path} is invalid:\n{errors}")]
    Invalid { path: PathBuf, errors: ConfigErrors },
}

fn rate(limit: u32, burst: u32) -> RawRule {
    RawRule {
        kind: Some("rate".into()),
        key: Some(vec!["prefix".into()]),
        limit: Some(limit),
        period_secs: Some(RATE_PERIOD_SECS_DEFAULT),
        burst: Some(burst),
        entries_max: Some(RATE_ENTRIES_MAX_DEFAULT),
        ..RawRule::default()
    }
}

fn keyed(mut rule: RawRule, key: &[&str]) -> RawRule {
    rule.key = Some(key.iter().map(|k| k.to_string()).collect());
    rule
}

fn per(mut rule: RawRule, period_secs: u64) -> RawRule {
    if rule.kind.as_deref() == Some("rate") {
        rule.period_secs = Some(period_secs);
    } else {
        rule.window_secs = Some(period_secs);
    }
    rule
}

fn failures(key: &[&str], threshold: u32, cleared_by_success: bool) -> RawRule {
    RawRule {
        kind: Some("failures".into()),
        key: Some(key.iter().map(|k| k.to_string()).collect()),
        threshold: Some(threshold),
        window_secs: Some(LOGIN_WINDOW_SECS_DEFAULT),
        cleared_by_success: Some(cleared_by_success),
        entries_max: Some(FAILURE_ENTRIES_MAX_DEFAULT),
        ..RawRule::default()
    }
}

/// The built-in routes, as if written in a file. A user file is laid over
/// these key by key. README.md's preset table describes them.
pub fn builtin_routes() -> BTreeMap<String, RawRoute> {
    let route = |policy, rules: Vec<(&str, RawRule)>| RawRoute {
        fail_policy: Some(policy),
        rules: rules.into_iter().map(|(n, r)| (n.to_string(), r)).collect(),
        ..RawRoute::default()
    };
    let class_limits = |pairs: &[(&str, u32, u32)]| {
        Some(
            pairs
                .iter()
                .map(|&(class, limit, burst)| {
                    (class.to_string(), RawClassLimit { limit: Some(limit), period_secs: None, burst: Some(burst) })
                })
                .collect(),
        )
    };
    // Login per source prefix: tight for hosting networks (where bots live
    // and people rarely do), loose for carrier and office gateways that put
    // thousands of people behind one address.
    let login_rate = RawRule {
        classes: class_limits(&[("hosting", 30, 10), ("mobile", 1200, 600), ("business", 1200, 600)]),
        ..rate(LOGIN_RATE_LIMIT_DEFAULT, LOGIN_RATE_BURST_DEFAULT)
    };
    let mut login = route(
        FailPolicy::Open,
        vec![
            ("source_rate", login_rate),
            ("source_failures", failures(&["account", "prefix"], SOURCE_FAILURES_THRESHOLD_DEFAULT, true)),
            (
                "account_failures",
                RawRule {
                    devices: Some("unknown".into()),
                    ..failures(&["account"], ACCOUNT_FAILURES_THRESHOLD_DEFAULT, false)
                },
            ),
            (
                "known_device_failures",
                RawRule {
                    devices: Some("known".into()),
                    ..failures(&["account", "device"], SOURCE_FAILURES_THRESHOLD_DEFAULT, true)
                },
            ),
        ],
    );
    login.known_device_ttl_secs = Some(KNOWN_DEVICE_TTL_SECS_DEFAULT);
    login.recent_passwords = Some(RECENT_PASSWORDS_DEFAULT);
    BTreeMap::from([
        ("login".to_string(), login),
        (
            "reauth".to_string(),
            route(
                FailPolicy::Open,
                vec![("device_failures", failures(&["account", "device"], REAUTH_FAILURES_THRESHOLD_DEFAULT, true))],
            ),
        ),
        (
            "request".to_string(),
            route(
                FailPolicy::Closed,
                vec![("source_rate", rate(REQUEST_RATE_LIMIT_DEFAULT, REQUEST_RATE_BURST_DEFAULT))],
            ),
        ),
        // Verification attempts per account per window, whatever code they
        // target: resending a code buys no fresh guesses.
        (
            "mfa_verify".to_string(),
            route(FailPolicy::Closed, vec![("account_failures", failures(&["account"], 5, true))]),
        ),
        (
            "mfa_resend".to_string(),
            route(FailPolicy::Closed, vec![("account_rate", per(keyed(rate(3, 3), &["account"]), 900))]),
        ),
        (
            "password_reset".to_string(),
            route(
                FailPolicy::Closed,
                vec![
                    ("account_rate", per(keyed(rate(3, 3), &["account"]), 3600)),
                    ("source_rate", per(rate(20, 10), 3600)),
                    ("tenant_rate", RawRule { required: Some(false), ..per(keyed(rate(300, 100), &["tenant"]), 3600) }),
                ],
            ),
        ),
        ("registration".to_string(), route(FailPolicy::Closed, vec![("source_rate", per(rate(10, 5), 3600))])),
        // Never keyed on client_id alone: anyone can name a victim's client.
        (
            "token".to_string(),
            route(
                FailPolicy::Closed,
                vec![
                    ("client_rate", keyed(rate(600, 100), &["client_id", "prefix"])),
                    ("client_failures", failures(&["client_id", "prefix"], 10, true)),
                ],
            ),
        ),
    ])
}

impl Default for Config {
    fn default() -> Self {
        Config::build(RawConfig::default()).expect("built-in defaults are valid")
    }
}

impl Config {
    /// Parses TOML text (no defaults applied yet).
    pub fn parse(text: &str) -> Result<RawConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Reads a config file as written. `required` is false for the default
    /// path, where a missing file means "built-in defaults".
    pub fn read_raw(path: &Path, required: bool) -> Result<RawConfig, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => String::new(),
            Err(source) => return Err(ConfigError::Read { path: path.into(), source }),
        };
        Config::parse(&text).map_err(|message| ConfigError::Parse { path: path.into(), message })
    }

    /// Lays `raw` over the defaults and validates the result.
    pub fn build(raw: RawConfig) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let state = raw.state.unwrap_or_else(|| STATE_PATH_DEFAULT.into());
        let secret =
            raw.secret.unwrap_or_else(|| state.parent().unwrap_or_else(|| Path::new(".")).join(SECRET_FILE_NAME));
        let snapshot_interval_ms = raw.snapshot_interval_ms.unwrap_or(SNAPSHOT_INTERVAL_MS_DEFAULT);
        if !(1..=SNAPSHOT_INTERVAL_MS_MAX).contains(&snapshot_interval_ms) {
            errors.push(format!("snapshot_interval_ms: must be 1..={SNAPSHOT_INTERVAL_MS_MAX}"));
        }
        let attempt_timeout_ms = raw.attempt_timeout_ms.unwrap_or(ATTEMPT_TIMEOUT_MS_DEFAULT);
        if !(1..=ATTEMPT_TIMEOUT_MS_MAX).contains(&attempt_timeout_ms) {
            errors.push(format!("attempt_timeout_ms: must be 1..={ATTEMPT_TIMEOUT_MS_MAX}"));
        }
        let class_file = raw.source.class_file.clone();
        let source = build_source(raw.source, &mut errors);
        let server = build_server(raw.server, &mut errors);
        let responses = build_responses(raw.responses, &mut errors);

        let mut merged = builtin_routes();
        for (name, user) in raw.routes {
            let route = merged.entry(name).or_default();
            route.fail_policy = user.fail_policy.or(route.fail_policy);
            route.known_device_ttl_secs = user.known_device_ttl_secs.or(route.known_device_ttl_secs);
            route.known_devices_max = user.known_devices_max.or(route.known_devices_max);
            route.known_devices_per_account_max =
                user.known_devices_per_account_max.or(route.known_devices_per_account_max);
            route.recent_passwords = user.recent_passwords.or(route.recent_passwords);
            route.recent_passwords_max = user.recent_passwords_max.or(route.recent_passwords_max);
            for (rule_name, rule) in user.rules {
                let base = route.rules.entry(rule_name).or_default();
                *base = overlay(base.clone(), rule);
            }
        }
        let routes: Vec<RouteConfig> =
            merged.into_iter().filter_map(|(name, raw)| build_route(&name, raw, &mut errors)).collect();

        if errors.is_empty() {
            Ok(Config {
                socket: raw.socket.unwrap_or_else(|| SOCKET_PATH_DEFAULT.into()),
                state,
                secret,
                snapshot_interval_ms,
                attempt_timeout_ms,
                source,
                class_file,
                server,
                responses,
                routes,
            })
        } else {
            Err(ConfigErrors(errors))
        }
    }

    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }
}

fn overlay(base: RawRule, user: RawRule) -> RawRule {
    let classes = match (base.classes, user.classes) {
        (Some(mut base), Some(user)) => {
            for (class, limit) in user {
                let merged = base.get(&class).map_or(limit, |b| RawClassLimit {
                    limit: limit.limit.or(b.limit),
                    period_secs: limit.period_secs.or(b.period_secs),
                    burst: limit.burst.or(b.burst),
                });
                base.insert(class, merged);
            }
            Some(base)
        }
        (base, user) => user.or(base),
    };
    RawRule {
        classes,
        monitor: user.monitor.or(base.monitor),
        responses: user.responses.or(base.responses),
        required: user.required.or(base.required),
        devices: user.devices.or(base.devices),
        kind: user.kind.or(base.kind),
        key: user.key.or(base.key),
        enabled: user.enabled.or(base.enabled),
        limit: user.limit.or(base.limit),
        period_secs: user.period_secs.or(base.period_secs),
        burst: user.burst.or(base.burst),
        threshold: user.threshold.or(base.threshold),
        window_secs: user.window_secs.or(base.window_secs),
        cleared_by_success: user.cleared_by_success.or(base.cleared_by_success),
        entries_max: user.entries_max.or(base.entries_max),
    }
}

fn build_source(raw: RawSource, errors: &mut Vec<String>) -> SourcePolicy {
    let mut policy = SourcePolicy::default();
    for (i, cidr) in raw.trusted_proxies.unwrap_or_default().iter().enumerate() {
        match source::parse_cidr(cidr) {
            Some(net) => policy.trusted_proxies.push(net.trunc()),
            None => errors.push(format!("source.trusted_proxies[{i}]: `{cidr}` is not a CIDR")),
        }
    }
    policy.trusted_hops = raw.trusted_hops.unwrap_or(0);
    if policy.trusted_hops as usize > source::FORWARDED_HOPS_MAX {
        errors.push(format!("source.trusted_hops: must be at most {}", source::FORWARDED_HOPS_MAX));
    }
    if policy.trusted_hops > 0 && !policy.trusted_proxies.is_empty() {
        errors.push("source.trusted_hops: set either trusted_hops or trusted_proxies, not both".into());
    }
    policy.ipv4_prefix_len = raw.ipv4_prefix_len.unwrap_or(source::IPV4_PREFIX_LEN_DEFAULT);
    if !(source::IPV4_PREFIX_LEN_MIN..=32).contains(&policy.ipv4_prefix_len) {
        errors.push(format!("source.ipv4_prefix_len: must be {}..=32", source::IPV4_PREFIX_LEN_MIN));
    }
    policy.ipv6_prefix_len = raw.ipv6_prefix_len.unwrap_or(source::IPV6_PREFIX_LEN_DEFAULT);
    // Hosting networks rent out neighbouring IPv4 addresses to one tenant,
    // so one hosting /24 is one source unless the file says otherwise.
    policy.class_prefix_lens[SourceClass::Hosting as usize] = Some((24, policy.ipv6_prefix_len));
    for (name, lens) in &raw.classes {
        let Some(class) = SourceClass::parse(name) else {
            errors.push(format!("source.classes.{name}: unknown class (hosting, mobile, business, residential)"));
            continue;
        };
        let v4 = lens.ipv4_prefix_len.unwrap_or(policy.ipv4_prefix_len);
        let v6 = lens.ipv6_prefix_len.unwrap_or(policy.ipv6_prefix_len);
        if !(source::IPV4_PREFIX_LEN_MIN..=32).contains(&v4) {
            errors.push(format!("source.classes.{name}.ipv4_prefix_len: must be {}..=32", source::IPV4_PREFIX_LEN_MIN));
        }
        if !(source::IPV6_PREFIX_LEN_MIN..=source::IPV6_PREFIX_LEN_MAX).contains(&v6) {
            errors.push(format!(
                "source.classes.{name}.ipv6_prefix_len: must be {}..={}",
                source::IPV6_PREFIX_LEN_MIN,
                source::IPV6_PREFIX_LEN_MAX
            ));
        }
        policy.class_prefix_lens[class as usize] = Some((v4, v6));
    }
    if !(source::IPV6_PREFIX_LEN_MIN..=source::IPV6_PREFIX_LEN_MAX).contains(&policy.ipv6_prefix_len) {
        errors.push(format!(
            "source.ipv6_prefix_len: must be {}..={} (never /128: one line holds 2^64 addresses)",
            source::IPV6_PREFIX_LEN_MIN,
            source::IPV6_PREFIX_LEN_MAX
        ));
    }
    policy
}

fn build_server(raw: RawServer, errors: &mut Vec<String>) -> ServerConfig {
    let server = ServerConfig {
        connections_max: raw.connections_max.unwrap_or(CONNECTIONS_MAX_DEFAULT),
        frame_read_timeout_ms: raw.frame_read_timeout_ms.unwrap_or(FRAME_READ_TIMEOUT_MS_DEFAULT),
        shutdown_grace_ms: raw.shutdown_grace_ms.unwrap_or(SHUTDOWN_GRACE_MS_DEFAULT),
        idle_timeout_ms: raw.idle_timeout_ms.unwrap_or(IDLE_TIMEOUT_MS_DEFAULT),
        reply_write_timeout_ms: raw.reply_write_timeout_ms.unwrap_or(REPLY_WRITE_TIMEOUT_MS_DEFAULT),
        in_flight_per_connection_max: raw.in_flight_per_connection_max.unwrap_or(IN_FLIGHT_PER_CONNECTION_MAX_DEFAULT),
        log_lines_per_sec_max: raw.log_lines_per_sec_max.unwrap_or(LOG_LINES_PER_SEC_MAX_DEFAULT),
        socket_mode: raw.socket_mode.unwrap_or(SOCKET_MODE_DEFAULT),
        socket_group: raw.socket_group,
        client_users: raw.client_users.unwrap_or_default(),
        client_groups: raw.client_groups.unwrap_or_default(),
        admin_users: raw.admin_users.unwrap_or_default(),
        admin_groups: raw.admin_groups.unwrap_or_default(),
    };
    if !(1_000..=86_400_000).contains(&server.idle_timeout_ms) {
        errors.push("server.idle_timeout_ms: must be 1000..=86400000".into());
    }
    if !(1..=65_536).contains(&server.in_flight_per_connection_max) {
        errors.push("server.in_flight_per_connection_max: must be 1..=65536".into());
    }
    if server.log_lines_per_sec_max > 1_000_000 {
        errors.push("server.log_lines_per_sec_max: must be at most 1000000".into());
    }
    if server.socket_mode & !0o777 != 0 || server.socket_mode & 0o600 != 0o600 {
        errors.push("server.socket_mode: permission bits (e.g. 0o660) that let the owner read and write".into());
    }
    if !(1..=65_536).contains(&server.connections_max) {
        errors.push("server.connections_max: must be 1..=65536".into());
    }
    if !(1..=600_000).contains(&server.frame_read_timeout_ms) {
        errors.push("server.frame_read_timeout_ms: must be 1..=600000".into());
    }
    if !(1..=600_000).contains(&server.reply_write_timeout_ms) {
        errors.push("server.reply_write_timeout_ms: must be 1..=600000".into());
    }
    if server.shutdown_grace_ms > 600_000 {
        errors.push("server.shutdown_grace_ms: must be at most 600000".into());
    }
    server
}

fn build_responses(raw: RawResponses, errors: &mut Vec<String>) -> ResponsePolicy {
    let steps = raw.retry_after_steps_secs.unwrap_or_else(|| RETRY_AFTER_STEPS_SECS_DEFAULT.to_vec());
    if steps.is_empty() || steps.len() > 16 || steps.iter().any(|s| *s > PERIOD_SECS_MAX) {
        errors.push(format!("responses.retry_after_steps_secs: 1 to 16 steps, each 0..={PERIOD_SECS_MAX}"));
    }
    let policy = ResponsePolicy {
        retry_after_steps_us: steps.iter().map(|s| s.saturating_mul(1_000_000)).collect(),
        jitter_percent: raw.jitter_percent.unwrap_or(JITTER_PERCENT_DEFAULT),
        delay_base_us: raw.delay_base_ms.unwrap_or(DELAY_BASE_MS_DEFAULT).saturating_mul(1000),
        delay_max_us: raw.delay_max_ms.unwrap_or(DELAY_MAX_MS_DEFAULT).saturating_mul(1000),
    };
    if policy.jitter_percent > 100 {
        errors.push("responses.jitter_percent: must be 0..=100".into());
    }
    if policy.delay_max_us > 60_000_000 || policy.delay_base_us > policy.delay_max_us {
        errors.push("responses.delay_max_ms: must be at most 60000 and at least delay_base_ms".into());
    }
    policy
}

fn build_route(name: &str, raw: RawRoute, errors: &mut Vec<String>) -> Option<RouteConfig> {
    let path = format!("routes.{name}");
    if !is_plain_name(name) {
        errors.push(format!("{path}: route names are 1-64 characters of [A-Za-z0-9_-]"));
        return None;
    }
    let rules: Vec<RuleConfig> = raw
        .rules
        .into_iter()
        .filter(|(_, rule)| rule.enabled != Some(false))
        .filter_map(|(rule_name, rule)| build_rule(&format!("{path}.rules.{rule_name}"), &rule_name, rule, errors))
        .collect();
    if rules.len() > RULES_PER_ROUTE_MAX {
        errors.push(format!("{path}.rules: at most {RULES_PER_ROUTE_MAX} rules per route"));
    }
    let known_devices = match raw.known_device_ttl_secs.unwrap_or(0) {
        0 => None,
        ttl if ttl > 366 * 86_400 => {
            errors.push(format!("{path}.known_device_ttl_secs: at most a year (31622400)"));
            None
        }
        ttl => Some(KnownDevicesConfig {
            ttl_us: ttl.saturating_mul(1_000_000),
            entries_max: raw.known_devices_max.unwrap_or(KNOWN_DEVICES_MAX_DEFAULT),
            per_account_max: raw.known_devices_per_account_max.unwrap_or(KNOWN_DEVICES_PER_ACCOUNT_MAX_DEFAULT),
        }),
    };
    if raw.known_devices_per_account_max.is_some_and(|m| m == 0 || m > KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT) {
        errors.push(format!("{path}.known_devices_per_account_max: must be 1..={KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT}"));
    }
    let recent_passwords = match raw.recent_passwords.unwrap_or(0) {
        0 => None,
        n if n > RECENT_PASSWORDS_MAX => {
            errors.push(format!("{path}.recent_passwords: at most {RECENT_PASSWORDS_MAX}"));
            None
        }
        n => Some((n, raw.recent_passwords_max.unwrap_or(RECENT_PASSWORD_ENTRIES_MAX_DEFAULT))),
    };
    for (field, max) in
        [("known_devices_max", raw.known_devices_max), ("recent_passwords_max", raw.recent_passwords_max)]
    {
        if max.is_some_and(|m| m == 0 || m > ENTRIES_MAX_LIMIT) {
            errors.push(format!("{path}.{field}: must be 1..={ENTRIES_MAX_LIMIT}"));
        }
    }
    if known_devices.is_none() && rules.iter().any(|r| r.devices != DeviceScope::All) {
        errors.push(format!("{path}: rules scoped by `devices` need known_device_ttl_secs > 0"));
    }
    Some(RouteConfig {
        name: name.to_string(),
        fail_policy: raw.fail_policy.unwrap_or(FailPolicy::Open),
        rules,
        known_devices,
        recent_passwords,
    })
}

/// Route and rule names reach logs, `status`, metric labels and the state
/// file's rule ids: plain characters only, so none can carry a terminal
/// escape or a separator.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn build_rule(path: &str, name: &str, raw: RawRule, errors: &mut Vec<String>) -> Option<RuleConfig> {
    if !is_plain_name(name) {
        errors.push(format!("{path}: rule names are 1-64 characters of [A-Za-z0-9_-]"));
        return None;
    }
    let before = errors.len();
    let mut missing = |field: &str| errors.push(format!("{path}.{field}: required"));
    let key: Vec<Component> = match raw.key {
        None => {
            missing("key");
            Vec::new()
        }
        Some(names) => {
            let mut key = Vec::new();
            for n in names {
                match Component::parse(&n) {
                    Some(c) if !key.contains(&c) => key.push(c),
                    Some(_) => errors.push(format!("{path}.key: `{n}` appears twice")),
                    None => errors.push(format!(
                        "{path}.key: unknown component `{n}` (one of prefix, account, device, tenant, client_id)"
                    )),
                }
            }
            if key.is_empty() {
                errors.push(format!("{path}.key: must name at least one component"));
            }
            key
        }
    };
    let in_range = |errors: &mut Vec<String>, field: &str, value: u64, lo: u64, hi: u64| {
        if !(lo..=hi).contains(&value) {
            errors.push(format!("{path}.{field}: must be {lo}..={hi}"));
        }
    };
    let kind = match raw.kind.as_deref() {
        Some("rate") => {
            for (field, set) in [
                ("threshold", raw.threshold.is_some()),
                ("window_secs", raw.window_secs.is_some()),
                ("cleared_by_success", raw.cleared_by_success.is_some()),
            ] {
                if set {
                    errors.push(format!("{path}.{field}: not a setting of a rate rule"));
                }
            }
            let limit = raw.limit.unwrap_or(0);
            let period_secs = raw.period_secs.unwrap_or(RATE_PERIOD_SECS_DEFAULT);
            let burst = raw.burst.unwrap_or(limit);
            let entries_max = raw.entries_max.unwrap_or(RATE_ENTRIES_MAX_DEFAULT);
            in_range(errors, "limit", limit as u64, 1, 1_000_000_000);
            in_range(errors, "period_secs", period_secs, 1, PERIOD_SECS_MAX);
            in_range(errors, "burst", burst as u64, 1, 1_000_000_000);
            in_range(errors, "entries_max", entries_max as u64, 1, ENTRIES_MAX_LIMIT as u64);
            let mut by_class = [None; 4];
            for (class_name, c) in raw.classes.clone().unwrap_or_default() {
                let Some(class) = SourceClass::parse(&class_name) else {
                    errors.push(format!(
                        "{path}.classes.{class_name}: unknown class (hosting, mobile, business, residential)"
                    ));
                    continue;
                };
                let limit = c.limit.unwrap_or(limit);
                let period_secs = c.period_secs.unwrap_or(period_secs);
                let burst = c.burst.unwrap_or(burst);
                in_range(errors, &format!("classes.{class_name}.limit"), limit as u64, 1, 1_000_000_000);
                in_range(errors, &format!("classes.{class_name}.period_secs"), period_secs, 1, PERIOD_SECS_MAX);
                in_range(errors, &format!("classes.{class_name}.burst"), burst as u64, 1, 1_000_000_000);
                by_class[class as usize] =
                    Some(RateLimit { limit, period_us: period_secs.saturating_mul(1_000_000), burst });
            }
            let rate = RateLimit { limit, period_us: period_secs.saturating_mul(1_000_000), burst };
            let all = std::iter::once(("", rate))
                .chain(SourceClass::ALL.iter().filter_map(|c| by_class[*c as usize].map(|r| (c.name(), r))));
            for (class, r) in all {
                if !rate_fits(r) {
                    let at = if class.is_empty() { String::new() } else { format!(".classes.{class}") };
                    errors.push(format!(
                        "{path}{at}: burst x period_secs / limit is over {} days; a key would never refill",
                        BURST_SPAN_US_MAX / 86_400_000_000
                    ));
                }
            }
            RuleKind::Rate { rate, by_class, entries_max }
        }
        Some("failures") => {
            for (field, set) in [
                ("limit", raw.limit.is_some()),
                ("period_secs", raw.period_secs.is_some()),
                ("burst", raw.burst.is_some()),
                ("classes", raw.classes.is_some()),
            ] {
                if set {
                    errors.push(format!("{path}.{field}: not a setting of a failures rule"));
                }
            }
            let threshold = raw.threshold.unwrap_or(0);
            let window_secs = raw.window_secs.unwrap_or(LOGIN_WINDOW_SECS_DEFAULT);
            let entries_max = raw.entries_max.unwrap_or(FAILURE_ENTRIES_MAX_DEFAULT);
            in_range(errors, "threshold", threshold as u64, 1, THRESHOLD_MAX as u64);
            in_range(errors, "window_secs", window_secs, WINDOW_US_MIN / 1_000_000, PERIOD_SECS_MAX);
            in_range(errors, "entries_max", entries_max as u64, 1, ENTRIES_MAX_LIMIT as u64);
            RuleKind::Failures {
                threshold,
                window_us: window_secs.saturating_mul(1_000_000),
                cleared_by_success: raw.cleared_by_success.unwrap_or(false),
                entries_max,
            }
        }
        Some(other) => {
            errors.push(format!("{path}.kind: `{other}` is not `rate` or `failures`"));
            return None;
        }
        None => {
            errors.push(format!("{path}.kind: required (`rate` or `failures`)"));
            return None;
        }
    };
    if key.len() == 1 && key[0] == Component::ClientId {
        errors.push(format!(
            "{path}.key: never key on client_id alone (anyone can name a victim's client); add `prefix`"
        ));
    }
    let mut responses = Vec::new();
    for r in raw.responses.unwrap_or_else(|| vec!["deny".into()]) {
        match r.as_str() {
            "delay" => responses.push(Rung::Delay),
            "challenge" => responses.push(Rung::Challenge),
            "deny" => responses.push(Rung::Deny),
            other => errors.push(format!("{path}.responses: `{other}` is not delay, challenge or deny")),
        }
    }
    if responses.is_empty() || responses.len() > 16 {
        errors.push(format!("{path}.responses: 1 to 16 rungs"));
    }
    let devices = match raw.devices.as_deref().unwrap_or("all") {
        "all" => DeviceScope::All,
        "unknown" => DeviceScope::UnknownDevices,
        "known" => DeviceScope::KnownDevices,
        other => {
            errors.push(format!("{path}.devices: `{other}` is not all, unknown or known"));
            DeviceScope::All
        }
    };
    (errors.len() == before).then(|| RuleConfig {
        name: name.to_string(),
        key,
        kind,
        monitor: raw.monitor.unwrap_or(false),
        responses,
        required: raw.required.unwrap_or(true),
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_have_login_reauth_and_request() {
        let config = Config::default();
        let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            ["login", "mfa_resend", "mfa_verify", "password_reset", "reauth", "registration", "request", "token"]
        );
        let login = config.route("login").unwrap();
        assert_eq!(login.rules.len(), 4);
        assert_eq!(config.secret, PathBuf::from("/var/lib/tollgate/secret"));
    }

    #[test]
    fn file_overrides_one_limit_and_keeps_the_rest() {
        let raw = Config::parse(
            "[routes.login.rules.source_failures]\nthreshold = 3\n[routes.api]\nfail_policy = \"closed\"\n[routes.api.rules.per_tenant]\nkind = \"rate\"\nkey = [\"tenant\"]\nlimit = 10\nburst = 2\n",
        )
        .unwrap();
        let config = Config::build(raw).unwrap();
        let login = config.route("login").unwrap();
        let rule = login.rules.iter().find(|r| r.name == "source_failures").unwrap();
        assert!(matches!(rule.kind, RuleKind::Failures { threshold: 3, window_us: 900_000_000, .. }));
        let api = config.route("api").unwrap();
        assert_eq!(api.fail_policy, FailPolicy::Closed);
        assert!(matches!(api.rules[0].kind, RuleKind::Rate { rate: RateLimit { limit: 10, burst: 2, .. }, .. }));
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        let err = Config::parse("[routes.login.rules.source_failures]\nthreshhold = 3\n").unwrap_err();
        assert!(err.contains("threshhold"), "{err}");
        let err = Config::parse("colour = 1\n").unwrap_err();
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn every_invalid_value_is_reported_at_once() {
        let raw = Config::parse(
            "snapshot_interval_ms = 0\n[source]\nipv6_prefix_len = 128\n[routes.login.rules.source_failures]\nthreshold = 0\n[routes.token.rules.x]\nkind = \"rate\"\nkey = [\"client_id\"]\nlimit = 5\n",
        )
        .unwrap();
        let errors = Config::build(raw).unwrap_err().0;
        let joined = errors.join("\n");
        assert!(joined.contains("snapshot_interval_ms"), "{joined}");
        assert!(joined.contains("source.ipv6_prefix_len"), "{joined}");
        assert!(joined.contains("routes.login.rules.source_failures.threshold"), "{joined}");
        assert!(joined.contains("routes.token.rules.x.key: never key on client_id alone"), "{joined}");
    }

    #[test]
    fn rule_names_that_could_carry_an_escape_or_a_separator_are_refused() {
        for name in ["\"evil\\u001b]0;x\\u0007\"", "\"a/b\"", "\"with space\"", "\"\""] {
            let text = format!("[routes.api.rules.{name}]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 5\n");
            let errors = Config::build(Config::parse(&text).unwrap()).unwrap_err().0.join("\n");
            assert!(errors.contains("rule names are 1-64 characters of [A-Za-z0-9_-]"), "{name}: {errors}");
        }
    }
}
