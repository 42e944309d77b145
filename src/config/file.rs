//! The configuration file as written: every field optional, unknown keys
//! refused by the parser with their line. A closed set (a rule's `kind`,
//! `key` components, `responses` rungs, `devices`, `scope`, class names) is
//! typed here as a `Word`: a string only, a misspelling kept as written for
//! validation to report with its key path. No defaults, no validation of
//! values.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Config, ConfigError, Detector, DetectorMode, DeviceScope, FailPolicy, Rung, Scope};
use crate::classes::SourceClass;
use crate::keys::Component;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub socket: Option<PathBuf>,
    pub state: Option<PathBuf>,
    pub secret: Option<PathBuf>,
    pub key_derivation: Option<u64>,
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
    /// Absent: no store, every rule counts on this host alone.
    pub shared: Option<RawShared>,
    #[serde(default)]
    pub signals: RawSignals,
    #[serde(default)]
    pub activity: RawActivity,
    /// Absent: no decision log (the default).
    pub decision_log: Option<RawDecisionLog>,
    /// Absent: no metrics listener (the default; `tollgate metrics` still
    /// prints them).
    pub metrics: Option<RawMetrics>,
}

/// `[metrics]`: an HTTP listener serving `/metrics` to Prometheus.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen: Option<String>,
}

/// `[activity]`: the bounded structures behind `tollgate top`, `tollgate
/// sample` and the attempts-per-account distribution.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawActivity {
    pub queue_max: Option<usize>,
    pub top_entries_max: Option<usize>,
    pub top_window_secs: Option<u64>,
    pub recent_max: Option<usize>,
    pub accounts_sampled_max: Option<usize>,
    pub samples_max: Option<usize>,
}

/// `[decision_log]`: the what-if replay's input (see `src/decision_log/`).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDecisionLog {
    pub path: Option<PathBuf>,
    pub file_bytes_max: Option<u64>,
    pub files_max: Option<u32>,
    pub age_max_secs: Option<u64>,
    pub queue_max: Option<usize>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSignals {
    pub enabled: Option<bool>,
    pub window_secs: Option<u64>,
    pub queue_max: Option<usize>,
    pub publish_interval_ms: Option<u64>,
    pub flag_ttl_secs: Option<u64>,
    pub sketch_bytes_max: Option<usize>,
    pub prefixes_max: Option<usize>,
    pub wide_prefixes_max: Option<usize>,
    pub blocks_max: Option<usize>,
    pub accounts_max: Option<usize>,
    pub passwords_max: Option<usize>,
    pub tenants_max: Option<usize>,
    pub flags_max: Option<usize>,
    pub success_sample: Option<u32>,
    pub success_sources_max: Option<u32>,
    #[serde(default)]
    pub password_spray: RawCountDetector,
    #[serde(default)]
    pub narrow_spray: RawDetector,
    #[serde(default)]
    pub wide_spray: RawWideDetector,
    #[serde(default)]
    pub account_distributed: RawCountDetector,
    #[serde(default)]
    pub tenant_anomaly: RawTenantAnomaly,
    #[serde(default)]
    pub ipv6_widening: RawWidening,
}

/// A detector that counts without a failure-share gate.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCountDetector {
    pub mode: Option<Word<DetectorMode>>,
    pub threshold: Option<u32>,
}

/// A source detector: a count gated by the failure share.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDetector {
    pub mode: Option<Word<DetectorMode>>,
    pub threshold: Option<u32>,
    pub failure_share_min: Option<f64>,
}

/// The wide source detector: one more gate, its distinct failing sources.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWideDetector {
    pub mode: Option<Word<DetectorMode>>,
    pub threshold: Option<u32>,
    pub failure_share_min: Option<f64>,
    pub accounts_per_source_max: Option<u32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenantAnomaly {
    pub mode: Option<Word<DetectorMode>>,
    pub ratio_factor: Option<f64>,
    pub ratio_margin: Option<f64>,
    pub failures_min: Option<u32>,
    pub warmup_hours: Option<u32>,
    pub baseline_hours: Option<u32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWidening {
    pub mode: Option<Word<DetectorMode>>,
    pub per_56: Option<u32>,
    pub per_48: Option<u32>,
    pub failure_share_min: Option<f64>,
    pub hold_secs: Option<u64>,
    pub never_classes: Option<Vec<Word<SourceClass>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShared {
    pub url: Option<String>,
    pub nodes: Option<Vec<String>>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub tls_ca_file: Option<PathBuf>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub key_prefix: Option<String>,
    pub timeout_ms: Option<u64>,
    pub busy_max_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub probe_interval_ms: Option<u64>,
    pub probe_max_ms: Option<u64>,
    pub breaker_failures: Option<u32>,
    pub batch_max: Option<usize>,
    pub pending_max: Option<usize>,
    pub hosts: Option<u32>,
    pub hosts_when_unknown: Option<u32>,
    pub heartbeat_ms: Option<u64>,
    pub host_ttl_ms: Option<u64>,
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
    pub classes: BTreeMap<Word<SourceClass>, RawClassPrefix>,
    /// `[[source.exemptions]]`: prefixes exempt from per-source rules.
    pub exemptions: Option<Vec<RawExemption>>,
}

/// One `[[source.exemptions]]` entry. Both fields optional here, so that a
/// missing one is reported with the rest of the file's problems.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExemption {
    pub prefix: Option<String>,
    pub reason: Option<String>,
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
    pub kind: Option<Word<RawRuleKind>>,
    pub key: Option<Vec<Word<Component>>>,
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
    pub responses: Option<Vec<Word<Rung>>>,
    pub required: Option<bool>,
    pub devices: Option<Word<DeviceScope>>,
    pub scope: Option<Word<Scope>>,
    /// Rate rules: limits per source class.
    pub classes: Option<BTreeMap<Word<SourceClass>, RawClassLimit>>,
    /// Signal rules: the detectors whose flags the rule acts on.
    pub detectors: Option<Vec<Word<Detector>>>,
}

/// Which `RuleKind` a rule builds: `rate` or `failures` in the file. Its
/// settings are checked against it when the rule is built, since a user's
/// rule may override only some of a built-in one's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RawRuleKind {
    Rate,
    Failures,
    Signal,
}

/// A word from a closed set (a rule's kind, a key component, a rung, a
/// device scope, a rule's scope, a source class), typed as the file is read. Only a string
/// is accepted. A word outside the set is kept as written rather than
/// refused by the parser, so that validation reports it with its key path
/// beside every other problem, and a rule removed with `enabled = false`
/// is not judged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Word<T> {
    Known(T),
    Unknown(String),
}

/// A closed set of words, as the file spells them.
pub trait Spelled: Sized + Copy {
    /// The words accepted, for the error message.
    const ACCEPTED: &'static str;
    fn from_word(word: &str) -> Option<Self>;
}

impl<T: Spelled> Word<T> {
    /// The value, or `None` after recording why `written` is not one
    /// (`{path}.{field}: ...`).
    pub fn known(&self, at: &str, errors: &mut Vec<String>) -> Option<T> {
        match self {
            Word::Known(value) => Some(*value),
            // A `Word` built in code may hold a right spelling as Unknown.
            Word::Unknown(written) => T::from_word(written).or_else(|| {
                errors.push(format!("{at}: `{written}` is not {}", T::ACCEPTED));
                None
            }),
        }
    }
}

impl<T> From<T> for Word<T> {
    fn from(value: T) -> Word<T> {
        Word::Known(value)
    }
}

impl<'de, T: Spelled> Deserialize<'de> for Word<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Word<T>, D::Error> {
        let written = String::deserialize(deserializer)?;
        Ok(T::from_word(&written).map_or(Word::Unknown(written), Word::Known))
    }
}

impl Spelled for RawRuleKind {
    const ACCEPTED: &'static str = "`rate`, `failures` or `signal`";
    fn from_word(word: &str) -> Option<RawRuleKind> {
        match word {
            "rate" => Some(RawRuleKind::Rate),
            "failures" => Some(RawRuleKind::Failures),
            "signal" => Some(RawRuleKind::Signal),
            _ => None,
        }
    }
}

impl Spelled for Component {
    const ACCEPTED: &'static str = "a key component (prefix, account, device, tenant, client_id)";
    fn from_word(word: &str) -> Option<Component> {
        Component::parse(word)
    }
}

impl Spelled for Rung {
    const ACCEPTED: &'static str = "delay, challenge or deny";
    fn from_word(word: &str) -> Option<Rung> {
        [Rung::Delay, Rung::Challenge, Rung::Deny].into_iter().find(|r| r.name() == word)
    }
}

impl Spelled for DeviceScope {
    const ACCEPTED: &'static str = "all, unknown or known";
    fn from_word(word: &str) -> Option<DeviceScope> {
        [DeviceScope::All, DeviceScope::UnknownDevices, DeviceScope::KnownDevices]
            .into_iter()
            .find(|d| d.name() == word)
    }
}

impl Spelled for Scope {
    const ACCEPTED: &'static str = "host or global";
    fn from_word(word: &str) -> Option<Scope> {
        [Scope::Host, Scope::Global].into_iter().find(|s| s.name() == word)
    }
}

impl Spelled for Detector {
    const ACCEPTED: &'static str =
        "a detector (password_spray, narrow_spray, wide_spray, account_distributed, tenant_anomaly)";
    fn from_word(word: &str) -> Option<Detector> {
        Detector::ALL.into_iter().find(|d| d.name() == word)
    }
}

impl Spelled for DetectorMode {
    const ACCEPTED: &'static str = "off, monitor or enforce";
    fn from_word(word: &str) -> Option<DetectorMode> {
        [DetectorMode::Off, DetectorMode::Monitor, DetectorMode::Enforce].into_iter().find(|m| m.name() == word)
    }
}

impl Spelled for SourceClass {
    const ACCEPTED: &'static str = "a source class (hosting, mobile, business, residential)";
    fn from_word(word: &str) -> Option<SourceClass> {
        SourceClass::parse(word)
    }
}

impl Word<SourceClass> {
    /// The class a `classes` table names, or `None` after recording that
    /// `{table}.{name}` names none (a class is a table's key, so the key
    /// path ends with the word itself).
    pub fn class(&self, table: &str, errors: &mut Vec<String>) -> Option<SourceClass> {
        match self {
            Word::Known(class) => Some(*class),
            Word::Unknown(name) => SourceClass::parse(name).or_else(|| {
                errors.push(format!("{table}.{name}: unknown class (hosting, mobile, business, residential)"));
                None
            }),
        }
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
}
