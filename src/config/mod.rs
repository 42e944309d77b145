//! Configuration in two stages: the TOML file as written (`file.rs`: every
//! field optional, unknown keys refused by the parser with their line; a
//! closed set of words typed as a `Word`), then `Config::build` (`validate.rs`) lays it over the
//! built-in defaults (`defaults.rs`, with every bound) and validates
//! everything, reporting every invalid key at once. This module holds what
//! comes out: the built, validated `Config`, and the public API.
//!
//! No I/O except `Config::read_raw`, which reads the file.

use std::fmt;
use std::ops::{Index, IndexMut};
use std::path::PathBuf;

use crate::classes::SourceClass;
use crate::keys::Component;
use crate::source::SourcePolicy;

mod builtin_routes;
mod defaults;
mod file;
mod reload;
mod validate;

pub use builtin_routes::builtin_routes;
pub use defaults::*;
pub use file::{
    RawActivity, RawClassLimit, RawConfig, RawCountDetector, RawDecisionLog, RawDetector, RawMetrics, RawResponses,
    RawRoute, RawRule, RawRuleKind, RawServer, RawShared, RawSignals, RawSource, Word,
};

/// What a client does for a route when the daemon cannot answer in time:
/// the client crate's type, so the daemon's file and the client agree.
pub use tollgate_client::FailPolicy;

/// A rate: `limit` per `period_us` sustained, `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    pub limit: u32,
    pub period_us: u64,
    pub burst: u32,
}

/// One rung of the response ladder; the file spells it as `name` does
/// (see `Spelled`).
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

/// Which attempts a rule counts, by whether the device is known; the file
/// spells it as `name` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
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

/// Where a rule's counters live when `[shared]` is set; the file spells it
/// as `name` does. Without `[shared]` every rule counts on this host alone,
/// whatever its scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// In this host's tables only, so the limit holds per host.
    Host,
    /// In the shared store, so the limit holds across every host.
    Global,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Host => "host",
            Scope::Global => "global",
        }
    }

    /// The scope of a rule whose file does not give one. Failures and
    /// anything keyed on an account protect accounts and credentials: a
    /// guesser spreading attempts over hosts must meet one count, so they
    /// are global. The rest (rates per source, tenant or client) protect
    /// this host's capacity, which another host's traffic does not use, and
    /// keeping them per host keeps them off the store's round trip.
    pub fn default_for(kind: &RuleKind, key: &[Component]) -> Scope {
        // Flags are this host's: a signal rule has nothing in the store.
        if matches!(kind, RuleKind::Signal { .. }) {
            Scope::Host
        } else if matches!(kind, RuleKind::Failures { .. }) || key.contains(&Component::Account) {
            Scope::Global
        } else {
            Scope::Host
        }
    }
}

/// One value per source class, indexed by the class:
/// `by_class[SourceClass::Hosting]`. It has a slot for each of
/// `SourceClass::ALL`, in that order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByClass<T>([T; SourceClass::ALL.len()]);

// A class's slot is its discriminant: `SourceClass::ALL` must list the
// classes in declaration order, so no two share a slot and none is out of
// bounds.
const _: () = {
    let mut slot = 0;
    while slot < SourceClass::ALL.len() {
        assert!(SourceClass::ALL[slot] as usize == slot, "SourceClass::ALL lists the classes in declaration order");
        slot += 1;
    }
};

impl<T> ByClass<T> {
    /// The values, in `SourceClass::ALL` order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }

    /// Each class with its value, in `SourceClass::ALL` order.
    pub fn entries(&self) -> impl Iterator<Item = (SourceClass, &T)> {
        SourceClass::ALL.into_iter().zip(&self.0)
    }
}

impl<T> Index<SourceClass> for ByClass<T> {
    type Output = T;

    fn index(&self, class: SourceClass) -> &T {
        &self.0[class as usize]
    }
}

impl<T> IndexMut<SourceClass> for ByClass<T> {
    fn index_mut(&mut self, class: SourceClass) -> &mut T {
        &mut self.0[class as usize]
    }
}

/// A spray detector: a distinct count over a sliding window
/// that flags a subject for signal rules to act on. The file spells it as
/// `name` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Detector {
    /// One password tag failing on many accounts.
    PasswordSpray,
    /// One source prefix failing on many accounts.
    NarrowSpray,
    /// One wide prefix (IPv4 /24, IPv6 /48) failing on many accounts.
    WideSpray,
    /// One account failing from many source prefixes.
    AccountDistributed,
    /// A tenant's (or route's) failure ratio far above its own baseline.
    TenantAnomaly,
}

impl Detector {
    pub const ALL: [Detector; 5] = [
        Detector::PasswordSpray,
        Detector::NarrowSpray,
        Detector::WideSpray,
        Detector::AccountDistributed,
        Detector::TenantAnomaly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Detector::PasswordSpray => "password_spray",
            Detector::NarrowSpray => "narrow_spray",
            Detector::WideSpray => "wide_spray",
            Detector::AccountDistributed => "account_distributed",
            Detector::TenantAnomaly => "tenant_anomaly",
        }
    }

    /// The detector's bit in a `DetectorSet`.
    pub fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of detectors, one bit each (`Detector::bit`).
pub type DetectorSet = u8;

/// What a detector does: nothing, raise flags that rules only count, or
/// raise flags that rules enforce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DetectorMode {
    Off,
    Monitor,
    Enforce,
}

impl DetectorMode {
    pub fn name(self) -> &'static str {
        match self {
            DetectorMode::Off => "off",
            DetectorMode::Monitor => "monitor",
            DetectorMode::Enforce => "enforce",
        }
    }
}

/// One distinct-count detector's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DetectorConfig {
    pub mode: DetectorMode,
    /// Distinct elements (accounts or prefixes) in the window that raise a flag.
    pub threshold: u32,
    /// Source detectors only: the share of failed among failed and succeeded
    /// distinct accounts at or above which the count may flag (an office's
    /// typos come with thousands of successes; a spray's do not).
    pub failure_share_min: f64,
    /// `wide_spray` only (unbounded elsewhere): the accounts one source
    /// (an IPv4 address, an IPv6 /56) adds to its wide prefix's count at
    /// most, so that a few customers' failures never flag their neighbours.
    pub accounts_per_source_max: u32,
}

/// The tenant (or route) failure-ratio detector.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantAnomalyConfig {
    pub mode: DetectorMode,
    /// Flag when the window's ratio is at least baseline × factor ...
    pub ratio_factor: f64,
    /// ... and at least baseline + margin ...
    pub ratio_margin: f64,
    /// ... with at least this many failures in the window ...
    pub failures_min: u32,
    /// ... once the baseline has seen this many hours.
    pub warmup_hours: u32,
    /// The baseline's memory: an EWMA over about this many hours.
    pub baseline_hours: u32,
}

/// Adaptive IPv6 grouping: a block whose /64s fail widely counts as one source.
#[derive(Clone, Debug, PartialEq)]
pub struct WideningConfig {
    pub mode: DetectorMode,
    /// Distinct failing /64s that widen a /56 ...
    pub per_56: u32,
    /// ... and distinct failing /56s that widen a /48.
    pub per_48: u32,
    pub failure_share_min: f64,
    /// How long a block stays widened after the condition last held.
    pub hold_us: u64,
    /// Classes never widened (carriers give each phone its own /64).
    pub never_classes: Vec<SourceClass>,
}

/// `[signals]`: cross-key detection of spraying, stuffing and rotation.
/// Bounds and why are beside the defaults in `defaults.rs`.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalsConfig {
    pub window_us: u64,
    pub queue_max: usize,
    pub publish_interval_ms: u64,
    pub flag_ttl_us: u64,
    /// Heap of every sketch together.
    pub sketch_bytes_max: usize,
    pub prefixes_max: usize,
    pub wide_prefixes_max: usize,
    pub blocks_max: usize,
    pub accounts_max: usize,
    pub passwords_max: usize,
    pub tenants_max: usize,
    pub flags_max: usize,
    /// One account (IPv6: one block) in this many has its successes
    /// counted in the failure shares, each weighing this many.
    pub success_sample: u32,
    /// Sources one account's successes dilute failure shares at, per window.
    pub success_sources_max: u32,
    pub password_spray: DetectorConfig,
    pub narrow_spray: DetectorConfig,
    pub wide_spray: DetectorConfig,
    pub account_distributed: DetectorConfig,
    pub tenant_anomaly: TenantAnomalyConfig,
    pub ipv6_widening: WideningConfig,
}

impl SignalsConfig {
    pub fn mode(&self, detector: Detector) -> DetectorMode {
        match detector {
            Detector::PasswordSpray => self.password_spray.mode,
            Detector::NarrowSpray => self.narrow_spray.mode,
            Detector::WideSpray => self.wide_spray.mode,
            Detector::AccountDistributed => self.account_distributed.mode,
            Detector::TenantAnomaly => self.tenant_anomaly.mode,
        }
    }

    pub fn threshold(&self, detector: Detector) -> u32 {
        match detector {
            Detector::PasswordSpray => self.password_spray.threshold,
            Detector::NarrowSpray => self.narrow_spray.threshold,
            Detector::WideSpray => self.wide_spray.threshold,
            Detector::AccountDistributed => self.account_distributed.threshold,
            Detector::TenantAnomaly => self.tenant_anomaly.failures_min,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum RuleKind {
    /// GCRA, with optional per-source-class limits.
    Rate { rate: RateLimit, by_class: ByClass<Option<RateLimit>>, entries_max: usize },
    /// Failure counting in a sliding window; locked at `threshold`.
    Failures { threshold: u32, window_us: u64, cleared_by_success: bool, entries_max: usize },
    /// Acts on the flags of the named detectors (spray detection): a
    /// refusal on the rule's ladder while its subject is flagged.
    /// `entries_max` bounds the ladder's table.
    Signal { detectors: DetectorSet, entries_max: usize },
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
    /// Resolved even without `[shared]` (where it changes nothing), so a
    /// file's scopes are judged before the store is turned on.
    pub scope: Scope,
}

/// The store that global rules count in (`[shared]`). Bounds and why are
/// beside the defaults in `defaults.rs`.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedConfig {
    /// redis://host:port[/db], rediss://host:port[/db] (TLS),
    /// redis+unix:///path/to.sock or unix:///path/to.sock;
    /// in cluster mode the first seed node, so `status` and log lines name
    /// the store the same way in both modes.
    pub url: String,
    /// Redis Cluster seed nodes (redis://host:port or rediss://host:port,
    /// all alike). Empty: one store at
    /// `url`; otherwise a cluster, and `url` only describes it.
    pub nodes: Vec<String>,
    pub username: Option<String>,
    /// Read by the daemon at start, never here, so validating a file needs
    /// no access to the secret.
    pub password_file: Option<PathBuf>,
    /// PEM CA bundle that a rediss:// store's certificate must chain to;
    /// None: the platform's roots. Read at every connection, like the
    /// password file, so a renewed CA is picked up without a restart.
    pub tls_ca_file: Option<PathBuf>,
    /// Mutual TLS: the PEM certificate chain and private key this host
    /// presents to a store that asks for one (`tls-auth-clients yes`). Both
    /// or neither; read at every connection, like the CA bundle.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub key_prefix: String,
    pub timeout_ms: u64,
    /// A late call in a run of late calls younger than this is refused (a
    /// busy store), not answered on the share; 0: never.
    pub busy_max_ms: u64,
    pub connect_timeout_ms: u64,
    pub probe_interval_ms: u64,
    pub probe_max_ms: u64,
    pub breaker_failures: u32,
    pub batch_max: usize,
    pub pending_max: usize,
    /// 0: learn the number of hosts from the store's heartbeats.
    pub hosts: u32,
    pub hosts_when_unknown: u32,
    pub heartbeat_ms: u64,
    pub host_ttl_ms: u64,
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
    /// How identifiers become keys, asked of the state file (`None`: a
    /// new file's is the newest, an existing file keeps its own).
    pub key_derivation: Option<crate::keys::Derivation>,
    pub snapshot_interval_ms: u64,
    /// See `ATTEMPT_TIMEOUT_MS_DEFAULT`.
    pub attempt_timeout_ms: u64,
    pub source: SourcePolicy,
    /// CIDR file mapping prefixes to source classes.
    pub class_file: Option<PathBuf>,
    /// `[[source.exemptions]]`, in the file's order: validated, none
    /// overlapping another or a trusted proxy. Applied by a reload.
    pub exemptions: Vec<crate::exemptions::Exemption>,
    pub server: ServerConfig,
    pub responses: ResponsePolicy,
    /// Sorted by name.
    pub routes: Vec<RouteConfig>,
    /// None: every rule counts on this host alone.
    pub shared: Option<SharedConfig>,
    /// None: `[signals] enabled = false`.
    pub signals: Option<SignalsConfig>,
    pub activity: ActivityConfig,
    /// None: no `[decision_log]` (the default).
    pub decision_log: Option<DecisionLogConfig>,
    /// None: no metrics listener (the default).
    pub metrics: Option<MetricsListen>,
}

/// Where `[metrics] listen` serves `/metrics`: a loopback address (a
/// scraper on this host, or a proxy in front) or a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsListen {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

/// `[activity]`: the bounds of what the operator's view keeps (see
/// `activity/`). Always on: each is a fixed-size structure off the request
/// path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivityConfig {
    /// Events waiting for the activity thread; a full queue drops them.
    pub queue_max: usize,
    /// Entries of each top-K summary (refused prefixes, failing accounts).
    pub top_entries_max: usize,
    /// The top-K summaries cover this window and the one before it.
    pub top_window_ms: u64,
    /// Recent refusals and recent lockouts kept, each.
    pub recent_max: usize,
    /// Accounts counted exactly per day (a hash-chosen sample of them).
    pub accounts_sampled_max: usize,
    /// Monitor mode's would-be refusals kept as a uniform sample.
    pub samples_max: usize,
}

/// `[decision_log]`: a compact log of every check and report verdict
/// (digests, never names) for `tollgate replay`. Bounds and why are
/// beside the defaults in `defaults.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionLogConfig {
    /// The directory the files go in.
    pub path: PathBuf,
    /// A file is closed and a new one begun at this size.
    pub file_bytes_max: u64,
    /// At most this many files are kept; the oldest go first.
    pub files_max: u32,
    /// A file whose newest record is older than this is deleted.
    pub age_max_us: u64,
    /// Records waiting for the writer thread; a full queue drops.
    pub queue_max: usize,
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

impl Default for Config {
    fn default() -> Self {
        Config::build(RawConfig::default()).expect("built-in defaults are valid")
    }
}

impl Config {
    pub fn route(&self, name: &str) -> Option<&RouteConfig> {
        self.routes.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests;
