//! The daemon's shared state: `Daemon` (the limiter a reload swaps, the
//! clock, the counters and log caps every connection shares) and its
//! reload. `request` is its one dispatch: it turns each decoded request
//! into a reply.
//! `start` brings the daemon up and down (state file, listener, signals,
//! snapshots, systemd); `server` owns the socket and the connections.

mod bans;
mod exemptions;
mod inspect;
mod lifecycle;
mod listings;
mod request;
mod scrape;
mod shared;
mod state_file;
mod status;
mod teach;

pub use lifecycle::{check_config, serve};

pub(crate) use listings::Listing;
use listings::{LOCKOUTS_MADE_CONCURRENTLY_MAX, LOCKOUTS_REPLY_BYTES_MAX};
pub(crate) use request::{Answer, Job, Started};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;

use crate::access::{Access, Permissions};
use crate::activity::{ActivityLink, Observer};
use crate::audit::LogCap;
use crate::classes::ClassTable;
use crate::clock::Clock;
use crate::config::{Config, ServerConfig, ACCEPT_ERROR_LINES_PER_SEC_MAX};
use crate::decision_log::{DecisionLog, DecisionLogStats};
use crate::limiter::{Limiter, RequestError};
use crate::protocol::{ErrorCode, Response};
use crate::shared::SharedStore;
use crate::store::StoreStats;
use crate::unpoisoned::Unpoisoned;

/// Everything a connection needs, shared.
pub struct Daemon {
    /// Swapped whole by a reload; a connection takes the current one per
    /// batch of frames.
    limiter: ArcSwap<Limiter>,
    clock: Clock,
    /// `[server]`, fixed for the process's life (a reload keeps it).
    server: ServerConfig,
    store_stats: Arc<StoreStats>,
    started_us: u64,
    access: Access,
    /// Lockout and permission-denied lines: their own cap, so that a flood
    /// of refusals (one request each) cannot push them out of the log.
    audit: LogCap,
    /// Refusal lines (and monitor mode's would-be refusals).
    refusals: LogCap,
    /// "accept failed" lines: at the open-file limit every retry fails.
    accept_errors: LogCap,
    /// Shares of `LOCKOUTS_REPLY_BYTES_MAX`, one byte a permit.
    lockouts_reply_bytes: Semaphore,
    /// `LOCKOUTS_MADE_CONCURRENTLY_MAX` permits.
    lockouts_makers: Semaphore,
    /// The soft open-file limit in force (`raise_open_file_limit`), for
    /// `status`; 0 if unknown.
    open_files_max: u64,
    connections: AtomicU64,
    verdicts: [AtomicU64; ERRORS + 1],
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    last_reload_error: std::sync::Mutex<Option<String>>,
    /// The configuration in force: what the limiter was built from, and
    /// what a reload does not apply kept at its running value, so that
    /// `status` shows what runs. Held while the limiter is rebuilt (a
    /// reload, a new host count), so two rebuilds cannot undo each other.
    config: std::sync::Mutex<Config>,
    /// Shared mode: the store global rules are decided in.
    shared: Option<Arc<SharedStore>>,
    /// The task hearing the other hosts' lockouts (shared mode).
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Spray detection's engine (for `status`) and the limiter's link to it.
    spray: Option<Spray>,
    /// The operator's view: the request path's link and the thread's state.
    activity: Observing,
    /// `[decision_log]`: where every check and report verdict goes, when on.
    decision_log: Option<DecisionLog>,
}

/// The operator's view as the daemon holds it (see `activity`).
#[derive(Clone)]
pub(crate) struct Observing {
    pub(crate) link: Arc<ActivityLink>,
    pub(crate) observer: Arc<std::sync::Mutex<Observer>>,
}

/// Spray detection as the daemon holds it.
pub(crate) struct Spray {
    pub(crate) engine: Arc<std::sync::Mutex<crate::signals::Signals>>,
    pub(crate) link: Arc<crate::signals::pump::SignalsLink>,
}

/// The target of the daemon's audit, refusal and reload lines: the one they
/// had when `Daemon` lived in `server.rs`. The formatter prints it on every
/// line and `TOLLGATE_LOG` filters by it, so journal searches and filters
/// written for it keep working.
pub(crate) const LOG_TARGET: &str = "tollgate::server";

/// Where `Response::Error` is counted among the verdict counters.
pub(crate) const ERRORS: usize = 4;
/// Allow, delay, challenge, deny (by `Decision as usize`), then errors.
pub(crate) type VerdictCounters = [u64; ERRORS + 1];

impl Daemon {
    pub(crate) fn new(
        limiter: Limiter,
        clock: Clock,
        config: Config,
        access: Access,
        store_stats: Arc<StoreStats>,
        activity: Observing,
    ) -> Daemon {
        Daemon {
            activity,
            audit: LogCap::new(config.server.log_lines_per_sec_max),
            refusals: LogCap::new(config.server.log_lines_per_sec_max),
            accept_errors: LogCap::new(ACCEPT_ERROR_LINES_PER_SEC_MAX),
            lockouts_reply_bytes: Semaphore::new(LOCKOUTS_REPLY_BYTES_MAX),
            lockouts_makers: Semaphore::new(LOCKOUTS_MADE_CONCURRENTLY_MAX),
            open_files_max: 0,
            access,
            limiter: ArcSwap::from_pointee(limiter),
            started_us: clock.now_us(),
            clock,
            store_stats,
            connections: AtomicU64::new(0),
            verdicts: Default::default(),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            last_reload_error: std::sync::Mutex::new(None),
            shared: config.shared.clone().map(SharedStore::new),
            listener: std::sync::Mutex::new(None),
            spray: None,
            decision_log: None,
            server: config.server.clone(),
            config: std::sync::Mutex::new(config),
        }
    }

    /// Connects spray detection: its engine for `status`, its link for
    /// the queue's drop count. Before the daemon is shared.
    pub(crate) fn set_spray(&mut self, spray: Spray) {
        self.spray = Some(spray);
    }

    /// Request latency, which `server` measures.
    pub(crate) fn latency(&self) -> &crate::activity::latency::Latency {
        &self.activity.link.latency
    }

    /// Connects the decision log. Before the daemon is shared.
    pub(crate) fn set_decision_log(&mut self, log: DecisionLog) {
        self.decision_log = Some(log);
    }

    /// The decision log's counters, when `[decision_log]` is on.
    pub fn decision_log_stats(&self) -> Option<DecisionLogStats> {
        self.decision_log.as_ref().map(DecisionLog::stats)
    }

    /// Writes what the decision log has queued and stops its thread.
    pub(crate) fn stop_decision_log(&self) {
        if let Some(log) = &self.decision_log {
            log.stop();
        }
    }

    /// The limiter in force; a reload swaps it whole.
    pub fn limiter(&self) -> &ArcSwap<Limiter> {
        &self.limiter
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn server_config(&self) -> &ServerConfig {
        &self.server
    }

    /// What a peer with these credentials may ask.
    pub(crate) fn permissions(&self, uid: u32, gid: u32) -> Permissions {
        self.access.of(uid, gid)
    }

    /// Counts an open connection for `status`; the guard uncounts it.
    pub(crate) fn connection_opened(&self) -> impl Drop + '_ {
        struct Open<'d>(&'d AtomicU64);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.connections.fetch_add(1, Ordering::Relaxed);
        Open(&self.connections)
    }

    /// Adds a connection's verdict counts to the daemon's and zeroes them.
    pub(crate) fn add_verdicts(&self, counts: &mut VerdictCounters) {
        for (total, n) in self.verdicts.iter().zip(counts.iter_mut()) {
            if *n > 0 {
                total.fetch_add(*n, Ordering::Relaxed);
                *n = 0;
            }
        }
    }

    /// Whether to log an "accept failed" line now, and how many went unlogged.
    pub(crate) fn admit_accept_error(&self, now_us: u64) -> Option<u64> {
        self.accept_errors.admit(now_us)
    }

    /// Applies a reloaded configuration, keeping every table of the rules
    /// it shares with the running one; or, given the reason a reload
    /// failed, keeps the running configuration and records why.
    pub fn reload(&self, loaded: Result<(Config, Arc<ClassTable>), String>, sender: Option<Sender>) {
        // The store's connection and its limits are set up once, at start.
        let mut in_force = self.config.locked();
        let loaded = loaded.and_then(|(config, classes)| {
            if config.shared != in_force.shared {
                return Err(
                    "[shared] differs from the running configuration's; changing it needs a restart".to_string()
                );
            }
            if config.decision_log != in_force.decision_log {
                return Err(
                    "[decision_log] differs from the running configuration's; changing it needs a restart".to_string()
                );
            }
            Ok((config, classes))
        });
        match loaded {
            Ok((mut config, classes)) => {
                let unapplied = config.keep_what_needs_a_restart(&in_force);
                if !unapplied.is_empty() {
                    tracing::warn!(target: LOG_TARGET, keys = %unapplied.join(", "),
                        "changed in the file, but these need a restart; their running values stay in force");
                }
                let next = self.limiter.load().reconfigured(&config, classes, self.clock.now_us());
                exemptions::audit_changes(&in_force.exemptions, &config.exemptions, sender);
                if let Some(spray) = &self.spray {
                    let mut engine = spray.engine.locked();
                    match &config.signals {
                        Some(signals) => engine.reconfigure(signals),
                        None => {
                            engine.clear_flags();
                            spray.link.withdraw();
                        }
                    }
                }
                self.limiter.store(Arc::new(next));
                *in_force = config;
                drop(in_force);
                self.reloads.fetch_add(1, Ordering::Relaxed);
                *self.last_reload_error.locked() = None;
                tracing::info!(target: LOG_TARGET, by_uid = sender.map(|s| s.uid), by_pid = sender.map(|s| s.pid),
                    "configuration reloaded");
            }
            Err(why) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: LOG_TARGET, error = %why, by_uid = sender.map(|s| s.uid),
                    by_pid = sender.map(|s| s.pid), "reload failed; keeping the running configuration");
                *self.last_reload_error.locked() = Some(why);
            }
        }
    }
}

/// Who sent a reload's SIGHUP, as the kernel reports it (`kill`'s caller:
/// the unit's `ExecReload=`, or an admin's shell). A sender using
/// `sigqueue` fills these in itself, so they are a claim by a process
/// already allowed to signal the daemon (root or the service user).
#[derive(Clone, Copy, Debug)]
pub struct Sender {
    pub pid: i32,
    pub uid: u32,
}

/// The connection's peer, from SO_PEERCRED when the connection opens.
pub(crate) struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub permissions: Permissions,
}

fn request_error(e: RequestError) -> Response<'static> {
    let code = match e {
        RequestError::UnknownRoute { .. } => ErrorCode::UnknownRoute,
        RequestError::MissingField { .. } => ErrorCode::MissingField,
        RequestError::FieldTooLong { .. } => ErrorCode::FieldTooLong,
    };
    Response::error(code, e.to_string())
}
