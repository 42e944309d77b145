//! Configuration in two stages: `RawConfig` is the TOML file as written
//! (every field optional, unknown keys refused by the parser with their
//! line), then `Config::build` lays it over the built-in defaults and
//! validates everything, reporting every invalid key at once.
//!
//! No I/O except `Config::load`, which reads the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;

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

#[derive(Clone, Debug, PartialEq)]
pub enum RuleKind {
    /// GCRA: `limit` per `period_us` sustained, `burst` at once.
    Rate { limit: u32, period_us: u64, burst: u32, entries_max: usize },
    /// Failure counting in a sliding window; locked at `threshold`.
    Failures { threshold: u32, window_us: u64, cleared_by_success: bool, entries_max: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct RuleConfig {
    pub name: String,
    pub key: Vec<Component>,
    pub kind: RuleKind,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub fail_policy: FailPolicy,
    pub rules: Vec<RuleConfig>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    pub connections_max: usize,
    pub frame_read_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub socket: PathBuf,
    pub state: PathBuf,
    pub secret: PathBuf,
    pub snapshot_interval_ms: u64,
    pub source: SourcePolicy,
    pub server: ServerConfig,
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
    #[serde(default)]
    pub source: RawSource,
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub routes: BTreeMap<String, RawRoute>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSource {
    pub trusted_proxies: Option<Vec<String>>,
    pub trusted_hops: Option<u8>,
    pub ipv4_prefix_len: Option<u8>,
    pub ipv6_prefix_len: Option<u8>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub connections_max: Option<usize>,
    pub frame_read_timeout_ms: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub fail_policy: Option<FailPolicy>,
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
/// these key by key.
pub fn builtin_routes() -> BTreeMap<String, RawRoute> {
    let route = |policy, rules: Vec<(&str, RawRule)>| RawRoute {
        fail_policy: Some(policy),
        rules: rules.into_iter().map(|(n, r)| (n.to_string(), r)).collect(),
    };
    BTreeMap::from([
        (
            "login".to_string(),
            route(
                FailPolicy::Open,
                vec![
                    ("source_rate", rate(LOGIN_RATE_LIMIT_DEFAULT, LOGIN_RATE_BURST_DEFAULT)),
                    ("source_failures", failures(&["account", "prefix"], SOURCE_FAILURES_THRESHOLD_DEFAULT, true)),
                    ("account_failures", failures(&["account"], ACCOUNT_FAILURES_THRESHOLD_DEFAULT, false)),
                ],
            ),
        ),
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

    /// Reads and validates a config file.
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        let raw = Config::read_raw(path, required)?;
        Config::build(raw).map_err(|errors| ConfigError::Invalid { path: path.into(), errors })
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
        let source = build_source(raw.source, &mut errors);
        let server = build_server(raw.server, &mut errors);

        let mut merged = builtin_routes();
        for (name, user) in raw.routes {
            let route = merged.entry(name).or_default();
            if user.fail_policy.is_some() {
                route.fail_policy = user.fail_policy;
            }
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
                source,
                server,
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
    RawRule {
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
        match cidr.parse::<IpNet>() {
            Ok(net) => policy.trusted_proxies.push(net.trunc()),
            Err(_) => errors.push(format!("source.trusted_proxies[{i}]: `{cidr}` is not a CIDR")),
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
    };
    if !(1..=65_536).contains(&server.connections_max) {
        errors.push("server.connections_max: must be 1..=65536".into());
    }
    if !(1..=600_000).contains(&server.frame_read_timeout_ms) {
        errors.push("server.frame_read_timeout_ms: must be 1..=600000".into());
    }
    if server.shutdown_grace_ms > 600_000 {
        errors.push("server.shutdown_grace_ms: must be at most 600000".into());
    }
    server
}

fn build_route(name: &str, raw: RawRoute, errors: &mut Vec<String>) -> Option<RouteConfig> {
    let path = format!("routes.{name}");
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
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
    Some(RouteConfig { name: name.to_string(), fail_policy: raw.fail_policy.unwrap_or(FailPolicy::Open), rules })
}

fn build_rule(path: &str, name: &str, raw: RawRule, errors: &mut Vec<String>) -> Option<RuleConfig> {
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
            RuleKind::Rate { limit, period_us: period_secs * 1_000_000, burst, entries_max }
        }
        Some("failures") => {
            for (field, set) in [
                ("limit", raw.limit.is_some()),
                ("period_secs", raw.period_secs.is_some()),
                ("burst", raw.burst.is_some()),
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
                window_us: window_secs * 1_000_000,
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
    (errors.len() == before).then(|| RuleConfig { name: name.to_string(), key, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_have_login_reauth_and_request() {
        let config = Config::default();
        let names: Vec<_> = config.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["login", "reauth", "request"]);
        let login = config.route("login").unwrap();
        assert_eq!(login.rules.len(), 3);
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
        assert!(matches!(api.rules[0].kind, RuleKind::Rate { limit: 10, burst: 2, .. }));
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
}
