//! tollgate: a per-host login rate limiter.
//!
//! What an auth server links is the client crate, re-exported here as
//! [`client`], [`protocol`] and [`codec`]. The binary's two halves are
//! [`daemon`] (`tollgate serve`) and [`cli`] (every other command). The
//! rest of the crate is private; what is re-exported at the root below are
//! the parts that stand alone (the counters and their tables, key
//! derivation, the state file, the configuration), which the property
//! tests, benches and fuzz targets drive directly.
//!
//! The request path, in order (ARCHITECTURE.md has the map and the
//! invariants): `server` accepts connections and reads frames; `codec`
//! decodes them; `daemon` turns each into a `Job` and answers it
//! (`Daemon::start`, then `finish` if it waits); `limiter` plans a check (derives its keys in
//! `limiter/subject.rs`), then runs one table step per rule (pure: time is
//! passed in) on `gcra` and `failure_window` tables (its `overflow` sketch counts what
//! a table full of lockouts cannot hold; `expiring` is the bounded map
//! behind escalation, known devices and recent passwords); `store` is the
//! redb state file and its writer thread (the only module that touches
//! redb). Around it: `source` and `classes` (who the client is), `keys`
//! (keyed digests of every identifier), `access` (who may ask what),
//! `signals` (spray detection: distinct counts across keys off the request
//! path, flags the request path reads), `sim` (its simulator),
//! `activity` (what `tollgate top` and `sample` show: verdicts per route,
//! latency, top refused prefixes, per-account distributions, counted off
//! the request path),
//! `decision_log` (every verdict as a digest-only record, written off the
//! request path, and `tollgate replay` of it through a candidate config),
//! `audit` (rate-capped log lines), `notify` (systemd), `metrics`
//! (Prometheus text), `config`, `clock` (where the limiter's time is read) and
//! `bench` (the load generator and the echo server). `top` is the
//! operator's live view, a client like `cli` that only reads.
// No unsafe code, with two audited exceptions in `tat_table`, both hints
// that cannot change memory: the cache prefetch (`prefetch_read`) and the
// huge-page advice for large tables (`advise_huge_pages_under`).
#![deny(unsafe_code)]

// The client side is its own crate (what an auth server links); the daemon
// speaks through the same types.
pub use tollgate_client as client;
pub use tollgate_client::{codec, protocol};

pub mod cli;
pub mod daemon;

mod access;
mod activity;
mod audit;
mod bans;
mod bench;
mod classes;
mod clock;
mod config;
mod decision_log;
mod drop_queue;
mod exemptions;
mod expiring;
mod failure_window;
mod format;
mod gcra;
mod keys;
mod limiter;
mod metrics;
mod notify;
mod server;
mod shared;
mod signals;
mod source;
mod stdout;
mod store;
mod tat_table;
mod top;
mod unpoisoned;

// The counters and the tables behind them, usable alone.
pub use expiring::{ExpiringMap, Slot};
pub use failure_window::{
    Change, Counts, FailureWindowTable, Recorded, TableError, WindowSpec, THRESHOLD_MAX, TOP_CLASS_EVICTION_SCAN,
    WINDOW_US_MIN,
};
pub use gcra::{decide, GcraDecision, GcraSpec, GcraTable};
pub use limiter::{Limiter, Report};
pub use tat_table::TatTable;

// Who a request is from, and the digests every identifier becomes.
pub use classes::{fuzz_class_file, ClassTable, SourceClass};
pub use keys::{Component, Derivation, Key, KeyDeriver, Secret, SECRET_BYTES};
pub use source::{
    canonical, forwarded_tail, Prefix, SourcePolicy, FORWARDED_FOR_BYTES_MAX, FORWARDED_HOPS_MAX, IPV4_PREFIX_LEN_MIN,
    IPV6_PREFIX_LEN_MAX, IPV6_PREFIX_LEN_MIN,
};

// The configuration, as written and as validated, with its bounds.
pub use config::{
    Config, DeviceScope, FailPolicy, KnownDevicesConfig, RawConfig, RawRuleKind, RouteConfig, RuleConfig, RuleKind,
    Rung, Scope, SharedConfig, BURST_SPAN_US_MAX, ENTRIES_MAX_LIMIT, KNOWN_DEVICES_PER_ACCOUNT_MAX_LIMIT,
    PERIOD_SECS_MAX, RECENT_PASSWORDS_MAX, RULES_PER_ROUTE_MAX, SNAPSHOT_INTERVAL_MS_MAX, SOCKET_PATH_DEFAULT,
};

// The state file.
pub use store::{Journal, OpenOptions, PersistedCells, PersistedEntry, Store, StoreError};

// The load generator's random numbers (the example login server's test
// draws its traffic from them).
pub use bench::Rng;

// The decision log's codec, for its fuzz target and the tests that read
// the files a daemon wrote.
pub use decision_log::{
    decode_header, decode_record, fuzz_decision_log, read_file_bytes, DecisionLogStats, FileContents, Header,
    HeaderError, Problem, Record, RecordError,
};

// Spray detection's engine, for its micro-benchmark (`benches/tables.rs`).
pub use signals::{in_success_sample, ReportEvent, SignalEvent, Signals};

// Spray detection's simulator: generated attacks and legitimate traffic
// through the real limiter on a simulated clock (`tollgate simulate`,
// `tests/spray_detection.rs`).
pub mod sim;

/// The README's Rust example compiles as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
