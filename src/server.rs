//! The daemon's socket side: accept connections, read frames, dispatch each
//! request to the limiter, write replies; stop gracefully on a signal.
//!
//! A connection handles its frames in order and writes every reply it has
//! before reading again, so a client may pipeline many requests (ids tell
//! the replies apart) and pays one write per batch, not per request.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore, SemaphorePermit};
use tokio::task::JoinSet;

use crate::access::{Access, Permissions};
use crate::audit::LogCap;
use crate::classes::ClassTable;
use crate::clock::{ceil_ms, Clock};
use crate::codec::{self, FrameError, PayloadError, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX};
use crate::config::Config;
use crate::limiter::{CheckPlan, Limiter, RequestError};
use crate::protocol::{
    Decision, ErrorCode, NamedLimit, PersistenceStatus, Request, Response, Status, Subject, Verdict, VerdictCounts,
};
use crate::store::{Durable, StoreStats};

/// Bytes read per connection buffer: a whole maximal frame fits, and a
/// client pipelining small checks gets hundreds read in one syscall.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;
const _: () = assert!(READ_BUFFER_BYTES >= FRAME_HEADER_BYTES + REQUEST_PAYLOAD_BYTES_MAX);
/// Reply bytes a connection holds before it writes them, even mid-batch: a
/// client pipelining hundreds of `lockouts` or `status` requests and not
/// reading would otherwise make one batch's replies hundreds of megabytes.
/// A pipelined check batch's replies (about 80 bytes each) stay far below.
pub const REPLY_BYTES_BUFFERED_MAX: usize = 256 * 1024;
/// A connection's reply buffer at rest, and what it returns to once its
/// replies are written: a batch of a couple of hundred pipelined checks
/// (about 80 bytes a reply) fits without growing it. A batch that grows it
/// past this gives the memory back when written, so connections that once
/// took a large reply and then idle hold no more than any other.
pub const REPLY_BUFFER_RESTING_BYTES: usize = 16 * 1024;
/// Lockouts returned by one `lockouts` request when the client names no limit.
pub const LOCKOUTS_LISTED_DEFAULT: u32 = 100;
/// Most lockouts one reply lists, so a reply stays well inside a frame.
pub const LOCKOUTS_LISTED_MAX: u32 = 10_000;
/// What one listed lockout costs while its reply is made and sent, counted
/// generously: the `Lockout` (96 bytes), its three strings' allocations
/// (about 110), its encoding (about 90), the copy of its key and counts
/// taken under the shard lock (28), and the slack of vectors that grew by
/// doubling. Measured: 300 clients each taking a 10,000-entry reply (four
/// made or sent at a time) raised the daemon's peak resident memory by
/// 18 MB, 6 of them the connections' own: about 3 MB a reply.
pub const LOCKOUT_REPLY_BYTES_ESTIMATE: usize = 400;
/// Bytes all connections' `lockouts` replies may hold at once, counted at
/// `LOCKOUT_REPLY_BYTES_ESTIMATE` a listed entry: four 10,000-entry
/// replies. `lockouts` is open to anyone who can connect; without this, a
/// thousand clients each asking for 10,000 entries at once would make the
/// daemon hold a gigabyte (and the allocator keeps much of what a peak
/// took: this is also about what the daemon's resident size can grow by).
/// A request over the budget waits for a share of it (checks and reports
/// never do).
pub const LOCKOUTS_REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// `lockouts` replies made at once, each on a blocking thread. One: making
/// a 10,000-entry reply keeps a core busy for milliseconds, and with more
/// at once a two-core host has no core left for the runtime threads that
/// answer checks: with three clients pipelining such requests, another
/// client's check p99 was 2.5 ms with three made at once and 0.2 to 1.5 ms
/// with one (p50 11 to 21 µs either way; 2 cores). `lockouts` is an
/// operator's view, not the request path: it may queue.
pub const LOCKOUTS_MADE_CONCURRENTLY_MAX: usize = 1;
const _: () = assert!(LOCKOUTS_LISTED_MAX as usize * LOCKOUT_REPLY_BYTES_ESTIMATE <= LOCKOUTS_REPLY_BYTES_MAX);
const _: () = assert!(LOCKOUTS_REPLY_BYTES_MAX <= u32::MAX as usize, "semaphore permits are u32");
/// Open files the daemon needs besides its connections: standard streams,
/// the listener, the state file, the runtime's epoll and wakers, the signal
/// pipe, the notify socket, and a config or class file read by a reload,
/// with room to spare. The start-up check warns when `connections_max` plus
/// these does not fit under the open-file limit.
pub const FILES_RESERVED_COUNT: u64 = 64;
/// After a failed `accept` (EMFILE: the open-file limit is reached), the
/// listener waits this long before trying again, doubling on each failure
/// in a row up to `ACCEPT_RETRY_DELAY_MS_MAX`. 1 ms: a descriptor freed by a
/// closing connection is used almost at once.
pub const ACCEPT_RETRY_DELAY_MS_MIN: u64 = 1;
/// The longest wait between failed `accept`s: at most ten futile calls a
/// second while the table stays full, and a new connection waits at most
/// this long once a descriptor is free.
pub const ACCEPT_RETRY_DELAY_MS_MAX: u64 = 100;
/// "accept failed" lines a second (wall clock); the rest are counted, the
/// count is logged with the next line and added to `log_lines_suppressed`.
/// One line a second says the condition persists; more says nothing new.
pub const ACCEPT_ERROR_LINES_PER_SEC_MAX: u64 = 1;

/// Everything a connection needs, shared.
pub struct Daemon {
    /// Swapped whole by a reload; a connection takes the current one per
    /// batch of frames.
    pub limiter: ArcSwap<Limiter>,
    pub clock: Clock,
    pub config: Config,
    pub store_stats: Arc<StoreStats>,
    started_us: u64,
    access: Access,
    /// Lockout and permission-denied lines: their own cap, so that a flood
    /// of refusals (one request each) cannot push them out of the log.
    pub audit: LogCap,
    /// Refusal lines (and monitor mode's would-be refusals).
    pub refusals: LogCap,
    /// "accept failed" lines: at the open-file limit every retry fails.
    accept_errors: LogCap,
    /// Shares of `LOCKOUTS_REPLY_BYTES_MAX`, one byte a permit.
    lockouts_reply_bytes: Semaphore,
    /// `LOCKOUTS_MADE_CONCURRENTLY_MAX` permits.
    lockouts_makers: Semaphore,
    /// The soft open-file limit in force (`raise_open_file_limit`), for
    /// `status`; 0 if unknown.
    pub open_files_max: u64,
    connections: AtomicU64,
    verdicts: [AtomicU64; 5],
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    last_reload_error: std::sync::Mutex<Option<String>>,
}

const ERRORS: usize = 4;

impl Daemon {
    pub fn new(limiter: Limiter, clock: Clock, config: Config, access: Access, store_stats: Arc<StoreStats>) -> Daemon {
        Daemon {
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
            config,
            store_stats,
            connections: AtomicU64::new(0),
            verdicts: Default::default(),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            last_reload_error: std::sync::Mutex::new(None),
        }
    }

    /// Applies a reloaded configuration, keeping every table of the rules
    /// it shares with the running one; or, given the reason a reload
    /// failed, keeps the running configuration and records why.
    pub fn reload(&self, loaded: Result<(Config, Arc<ClassTable>), String>) {
        match loaded {
            Ok((config, classes)) => {
                let next = self.limiter.load().reconfigured(&config, classes, self.clock.now_us());
                self.limiter.store(Arc::new(next));
                self.reloads.fetch_add(1, Ordering::Relaxed);
                *self.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
                tracing::info!("configuration reloaded");
            }
            Err(why) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %why, "reload failed; keeping the running configuration");
                *self.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
            }
        }
    }

    fn status(&self, limiter: &Limiter) -> Status {
        let now = self.clock.now_us();
        let count = |i: usize| self.verdicts[i].load(Ordering::Relaxed);
        let server = &self.config.server;
        let limit = |name: &str, value: u64| NamedLimit { name: name.into(), value };
        let stats = &self.store_stats;
        Status {
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: (now.saturating_sub(self.started_us)) / 1000,
            now_ms: now / 1000,
            manual_clock: self.clock.is_manual(),
            connections: self.connections.load(Ordering::Relaxed),
            verdicts: VerdictCounts {
                allow: count(Decision::Allow as usize),
                delay: count(Decision::Delay as usize),
                challenge: count(Decision::Challenge as usize),
                deny: count(Decision::Deny as usize),
                errors: count(ERRORS),
            },
            routes: limiter.route_status(),
            limits: [
                limit("connections_max", server.connections_max as u64),
                limit("frame_read_timeout_ms", server.frame_read_timeout_ms),
                limit("idle_timeout_ms", server.idle_timeout_ms),
                limit("reply_write_timeout_ms", server.reply_write_timeout_ms),
                limit("reply_bytes_buffered_max", REPLY_BYTES_BUFFERED_MAX as u64),
                limit("in_flight_per_connection_max", server.in_flight_per_connection_max as u64),
                limit("log_lines_per_sec_max", server.log_lines_per_sec_max),
                limit("socket_mode", server.socket_mode as u64),
                limit("shutdown_grace_ms", server.shutdown_grace_ms),
                limit("request_payload_bytes_max", REQUEST_PAYLOAD_BYTES_MAX as u64),
                limit("read_buffer_bytes", READ_BUFFER_BYTES as u64),
                limit("reply_buffer_resting_bytes", REPLY_BUFFER_RESTING_BYTES as u64),
                limit("identifier_bytes_max", crate::limiter::IDENTIFIER_BYTES_MAX as u64),
                limit("forwarded_for_bytes_max", crate::limiter::FORWARDED_FOR_BYTES_MAX as u64),
                limit("lockouts_listed_max", LOCKOUTS_LISTED_MAX as u64),
                limit("lockouts_reply_bytes_max", LOCKOUTS_REPLY_BYTES_MAX as u64),
                limit("lockouts_made_concurrently_max", LOCKOUTS_MADE_CONCURRENTLY_MAX as u64),
                limit("open_files_max", self.open_files_max),
                limit("files_reserved_count", FILES_RESERVED_COUNT),
                limit("accept_retry_delay_ms_max", ACCEPT_RETRY_DELAY_MS_MAX),
                limit("accept_error_lines_per_sec_max", ACCEPT_ERROR_LINES_PER_SEC_MAX),
                limit("snapshot_interval_ms", self.config.snapshot_interval_ms),
                limit("attempt_timeout_ms", self.config.attempt_timeout_ms),
            ]
            .into_iter()
            .chain(limiter.route_limits().into_iter().map(|(name, value)| NamedLimit { name, value }))
            .collect(),
            persistence: PersistenceStatus {
                state_path: self.config.state.display().to_string(),
                snapshot_interval_ms: self.config.snapshot_interval_ms,
                commits: stats.commits.load(Ordering::Relaxed),
                write_failures: stats.write_failures.load(Ordering::Relaxed),
                last_error: stats.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                changes_unwritten: stats.changes_unwritten.load(Ordering::Relaxed),
                changes_dropped: stats.changes_dropped.load(Ordering::Relaxed),
            },
            class_prefixes: limiter.class_prefixes() as u64,
            reloads: self.reloads.load(Ordering::Relaxed),
            reload_failures: self.reload_failures.load(Ordering::Relaxed),
            last_reload_error: self.last_reload_error.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            log_lines_suppressed: self.audit.suppressed_total()
                + self.refusals.suppressed_total()
                + self.accept_errors.suppressed_total(),
        }
    }

    /// One request, one reply, at `now` (read once per batch of frames). The
    /// durable writes, if any, must complete before the reply is sent.
    /// A `check` arrives with its plan (`Limiter::plan_check`), made when
    /// its batch was read.
    fn handle<'l>(
        &self,
        limiter: &'l Limiter,
        request: &Request<'_>,
        plan: Option<Result<CheckPlan<'l>, RequestError>>,
        peer: &Peer,
        now: u64,
    ) -> (Response<'l>, Vec<Durable>) {
        let refused = |what: &str| {
            if let Some(suppressed) = self.audit.admit(now) {
                tracing::warn!(uid = peer.uid, gid = peer.gid, operation = what, suppressed, "permission denied");
            }
            Response::error(ErrorCode::PermissionDenied, format!("permission denied: uid {} may not {what}", peer.uid))
        };
        match request {
            Request::Check { .. } | Request::Report { .. } if !peer.permissions.attempts => {
                (refused("check or report"), Vec::new())
            }
            Request::Check { route, subject } => match plan
                .unwrap_or_else(|| limiter.plan_check(route, subject, now))
                .map(|plan| limiter.decide_check(plan, now))
            {
                Ok(verdict) => {
                    // Monitor mode's would-be refusals are logged too: the
                    // log is how an operator judges a rule before enforcing it.
                    if verdict.decision != Decision::Allow || verdict.reason.is_monitored() {
                        self.log_refusal(limiter, route, subject, &verdict, now);
                    }
                    (Response::Verdict(verdict), Vec::new())
                }
                Err(e) => (request_error(e), Vec::new()),
            },
            Request::Report { route, subject, outcome, password_digest } => {
                match limiter.report(route, subject, *outcome, *password_digest, now) {
                    Ok((verdict, durable)) => {
                        if !durable.is_empty() {
                            if let Some(suppressed) = self.audit.admit(now) {
                                let client = limiter.client_prefix(subject).map(|p| p.to_string());
                                tracing::info!(route, rule = %verdict.rule, client, suppressed, "lockout");
                            }
                        }
                        (Response::Verdict(verdict), durable)
                    }
                    Err(e) => (request_error(e), Vec::new()),
                }
            }
            Request::Status => (Response::Status(Box::new(self.status(limiter))), Vec::new()),
            // `serve_connection` answers these itself (`make_lockouts_reply`:
            // off the runtime threads, within the reply budget); this is the
            // same answer.
            Request::Lockouts { limit } => (lockouts_reply(limiter, lockouts_listed(*limit), now), Vec::new()),
            Request::Unlock { route, account, source } => {
                if !peer.permissions.admin {
                    return (refused("unlock"), Vec::new());
                }
                match limiter.unlock(route, account, *source) {
                    Ok((cleared, writes)) => {
                        // Audit lines for admin actions are never capped.
                        tracing::info!(route, cleared, uid = peer.uid, "unlock");
                        (Response::Unlocked { cleared }, writes)
                    }
                    Err(e) => (request_error(e), Vec::new()),
                }
            }
            Request::ClockAdvance { by_ms } => {
                if !peer.permissions.admin {
                    return (refused("clock advance"), Vec::new());
                }
                match self.clock.advance(by_ms.saturating_mul(1000)) {
                    Some(now) => (Response::ClockAdvanced { now_ms: ceil_ms(now) }, Vec::new()),
                    None => (
                        Response::error(
                            ErrorCode::NotManualClock,
                            "the daemon runs on the system clock; start it with --manual-clock",
                        ),
                        Vec::new(),
                    ),
                }
            }
        }
    }
}

impl Daemon {
    fn log_refusal(&self, limiter: &Limiter, route: &str, subject: &Subject<'_>, verdict: &Verdict<'_>, now: u64) {
        if let Some(suppressed) = self.refusals.admit(now) {
            let client = limiter.client_prefix(subject).map(|p| p.to_string());
            tracing::info!(
                route,
                rule = %verdict.rule,
                decision = ?verdict.decision,
                reason = ?verdict.reason,
                monitor = verdict.reason.is_monitored(),
                retry_after_ms = verdict.retry_after_ms,
                client,
                suppressed,
                "refused"
            );
        }
    }
}

/// The lockouts a `lockouts` request with `limit` lists at most.
fn lockouts_listed(limit: u32) -> usize {
    (if limit == 0 { LOCKOUTS_LISTED_DEFAULT } else { limit.min(LOCKOUTS_LISTED_MAX) }) as usize
}

fn lockouts_reply(limiter: &Limiter, listed: usize, now: u64) -> Response<'static> {
    let (lockouts, total) = limiter.lockouts(listed, now);
    Response::Lockouts { lockouts, total }
}

/// Makes a `lockouts` reply: waits for its share of
/// `LOCKOUTS_REPLY_BYTES_MAX` and its turn to be made, then makes and
/// encodes it on a blocking thread (a 10,000-entry reply takes
/// milliseconds; on a runtime thread it would hold up every check waiting
/// for that thread). Returns the encoded reply and the share, both to be
/// dropped once written; `None`: close the connection.
async fn make_lockouts_reply<'d>(
    daemon: &'d Daemon,
    limiter: &Arc<Limiter>,
    id: u64,
    limit: u32,
    now: u64,
) -> Option<(Vec<u8>, SemaphorePermit<'d>)> {
    let listed = lockouts_listed(limit);
    let share = (listed * LOCKOUT_REPLY_BYTES_ESTIMATE) as u32;
    let share = daemon.lockouts_reply_bytes.acquire_many(share).await.expect("the budget is never closed");
    let maker = daemon.lockouts_makers.acquire().await.expect("the makers' semaphore is never closed");
    let limiter = limiter.clone();
    let made = tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::new();
        codec::encode_response(id, &lockouts_reply(&limiter, listed, now), &mut bytes);
        bytes
    })
    .await;
    drop(maker);
    match made {
        Ok(bytes) => Some((bytes, share)),
        Err(e) => {
            tracing::error!(error = %e, "making a lockouts reply failed; closing the connection");
            None
        }
    }
}

/// The connection's peer, from SO_PEERCRED when the connection opens.
struct Peer {
    uid: u32,
    gid: u32,
    permissions: Permissions,
}

fn request_error(e: RequestError) -> Response<'static> {
    let code = match e {
        RequestError::UnknownRoute(_) => ErrorCode::UnknownRoute,
        RequestError::MissingField { .. } => ErrorCode::MissingField,
        RequestError::FieldTooLong { .. } => ErrorCode::FieldTooLong,
    };
    Response::error(code, e.to_string())
}

fn payload_error(e: &PayloadError) -> Response<'static> {
    let code = match e {
        PayloadError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
        _ => ErrorCode::Malformed,
    };
    Response::error(code, e.to_string())
}

/// The socket file's identity, so that a stopping daemon removes only the
/// file it created, never a successor's.
pub fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Binds the socket with the configured mode and group. A socket file
/// nobody answers on (a crashed daemon's) is replaced; one a live daemon
/// answers on is not stolen.
pub async fn bind(path: &Path, mode: u32, group: Option<u32>) -> std::io::Result<UnixListener> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is in use by a running daemon", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    Ok(listener)
}

/// The soft open-file limit before and after `raise_open_file_limit`, and
/// the hard limit it could not pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFileLimit {
    pub soft_before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft open-file limit (RLIMIT_NOFILE) to the hard one. Every
/// connection is a descriptor, and the usual soft default of 1024 is below
/// the default `connections_max` plus the daemon's own files; at the limit
/// `accept` fails with EMFILE. Under the shipped unit `LimitNOFILE=` sets
/// both limits alike, so no call is needed there (its system-call filter
/// refuses `setrlimit` anyway); a refusal leaves the limit as it was.
pub fn raise_open_file_limit() -> std::io::Result<OpenFileLimit> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft_before, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let mut soft = soft_before;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => soft = hard,
            Err(e) => tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit"),
        }
    }
    Ok(OpenFileLimit { soft_before, soft, hard })
}

/// Serves until `shutdown` turns true, then stops accepting, lets every
/// connection answer what it has read, and returns within the grace period.
pub async fn run(listener: UnixListener, daemon: Arc<Daemon>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(daemon.config.server.connections_max));
    let mut connections = JoinSet::new();
    let mut accept_retry = Duration::ZERO;
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
            _ = shutdown.changed() => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_retry = Duration::ZERO;
                    let daemon = daemon.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        daemon.connections.fetch_add(1, Ordering::Relaxed);
                        serve_connection(stream, &daemon, shutdown).await;
                        daemon.connections.fetch_sub(1, Ordering::Relaxed);
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Usually EMFILE: the connection stays in the backlog
                    // and the listener stays readable, so without a pause
                    // this loop would spin. A closing connection frees a
                    // descriptor; the growing pause keeps the futile calls
                    // (and the log) few while none does.
                    accept_retry = (accept_retry * 2).clamp(
                        Duration::from_millis(ACCEPT_RETRY_DELAY_MS_MIN),
                        Duration::from_millis(ACCEPT_RETRY_DELAY_MS_MAX),
                    );
                    // Wall time, even on a manual clock: this cap is about
                    // the journal, not about the limiter's time.
                    if let Some(suppressed) = daemon.accept_errors.admit(Clock::System.now_us()) {
                        let retry_ms = accept_retry.as_millis() as u64;
                        tracing::warn!(error = %e, retry_ms, suppressed, "accept failed");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(accept_retry) => {}
                        _ = shutdown.changed() => break,
                    }
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let grace = Duration::from_millis(daemon.config.server.shutdown_grace_ms);
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(open = connections.len(), "grace period over; closing remaining connections");
        connections.abort_all();
    }
}

/// Verdict counts kept per connection and added to the daemon's every batch,
/// so two cores do not bounce one cache line per request.
#[derive(Default)]
struct LocalCounts([u64; 5]);

impl LocalCounts {
    fn count(&mut self, response: &Response<'_>) {
        match response {
            Response::Verdict(v) => self.0[v.decision as usize] += 1,
            Response::Error(_) => self.0[ERRORS] += 1,
            _ => {}
        }
    }

    fn flush(&mut self, daemon: &Daemon) {
        for (i, n) in self.0.iter_mut().enumerate() {
            if *n > 0 {
                daemon.verdicts[i].fetch_add(*n, Ordering::Relaxed);
                *n = 0;
            }
        }
    }
}

/// Frames decoded and planned ahead of answering: enough to overlap the
/// cache misses of a pipelining client's checks, few enough to stay on the
/// stack.
const PLAN_AHEAD: usize = 16;

/// One frame read ahead: its request (and, for a check, its plan), or the
/// error reply it gets. Answered in place: moving a run of these between
/// the two passes was 8% of the daemon's time.
struct Planned<'b, 'l> {
    id: u64,
    request: Result<Request<'b>, Response<'static>>,
    plan: Option<Result<CheckPlan<'l>, RequestError>>,
    frame_bytes: usize,
}

fn plan_frame<'b, 'l>(
    limiter: &'l Limiter,
    payload: &'b [u8],
    frame_bytes: usize,
    peer: &Peer,
    now: u64,
) -> Planned<'b, 'l> {
    match codec::decode_request(payload) {
        Ok((id, request)) => {
            let plan = match &request {
                Request::Check { route, subject } if peer.permissions.attempts => {
                    Some(limiter.plan_check(route, subject, now))
                }
                _ => None,
            };
            Planned { id, request: Ok(request), plan, frame_bytes }
        }
        Err(failure) => Planned {
            id: failure.id.unwrap_or(0),
            request: Err(payload_error(&failure.error)),
            plan: None,
            frame_bytes,
        },
    }
}

/// Writes every buffered reply, or gives up on a client that does not take
/// them within `timeout` (false: close the connection). A buffer grown past
/// `REPLY_BUFFER_RESTING_BYTES` is given back.
async fn send_replies(writer: &mut OwnedWriteHalf, out: &mut Vec<u8>, timeout: Duration) -> bool {
    let sent = out.is_empty() || matches!(tokio::time::timeout(timeout, writer.write_all(out)).await, Ok(Ok(())));
    out.clear();
    if out.capacity() > REPLY_BUFFER_RESTING_BYTES {
        *out = Vec::with_capacity(REPLY_BUFFER_RESTING_BYTES);
    }
    sent
}

async fn serve_connection(stream: UnixStream, daemon: &Daemon, mut shutdown: watch::Receiver<bool>) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer { uid: c.uid(), gid: c.gid(), permissions: daemon.access.of(c.uid(), c.gid()) },
        // Without credentials a peer gets nothing but status and lockouts.
        Err(_) => Peer { uid: u32::MAX, gid: u32::MAX, permissions: Permissions { attempts: false, admin: false } },
    };
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    let (mut start, mut filled) = (0usize, 0usize);
    let mut out = Vec::with_capacity(REPLY_BUFFER_RESTING_BYTES);
    let mut counts = LocalCounts::default();
    let read_timeout = Duration::from_millis(daemon.config.server.frame_read_timeout_ms);
    let idle_timeout = Duration::from_millis(daemon.config.server.idle_timeout_ms);
    let write_timeout = Duration::from_millis(daemon.config.server.reply_write_timeout_ms);
    let batch_max = daemon.config.server.in_flight_per_connection_max;
    let mut stopping = false;
    // When the frame now being read must be complete.
    let mut frame_deadline: Option<tokio::time::Instant> = None;
    // The current limiter, re-read only when a reload swapped it: a plain
    // load per batch instead of a reference-count bump that every core
    // would bounce.
    let mut limiters = arc_swap::Cache::new(&daemon.limiter);
    // One shutdown waiter and one idle timer for the connection's life, not
    // one per read: registering a waiter and a timer per read cost more
    // than a pipelined batch's limiter work. The timer fires at most once
    // per idle period and re-arms from the last read.
    let mut shutdown_signal = std::pin::pin!(shutdown.changed());
    let mut last_read = tokio::time::Instant::now();
    let mut idle = std::pin::pin!(tokio::time::sleep_until(last_read + idle_timeout));
    loop {
        // Answer every complete frame we hold, all with one limiter.
        let limiter = limiters.load();
        let now = daemon.clock.now_us();
        let mut close = false;
        let mut answered = 0;
        while answered < batch_max && !close {
            // Read ahead: decode a run of frames and plan their checks, so
            // the table slots they need are fetched while earlier ones are
            // answered.
            let mut run: SmallVec<[Planned<'_, '_>; PLAN_AHEAD]> = SmallVec::new();
            let mut at = start;
            while run.len() < PLAN_AHEAD && answered + run.len() < batch_max {
                match codec::frame_len(&buf[at..filled], REQUEST_PAYLOAD_BYTES_MAX) {
                    Ok(Some(end)) => {
                        run.push(plan_frame(limiter, &buf[at + FRAME_HEADER_BYTES..at + end], end, &peer, now));
                        at += end;
                    }
                    Ok(None) => break,
                    Err(FrameError::TooLarge { len, max }) => {
                        close = true;
                        run.push(Planned {
                            id: 0,
                            request: Err(Response::error(
                                ErrorCode::FrameTooLarge,
                                format!("frame of {len} bytes is over the maximum of {max}; closing"),
                            )),
                            plan: None,
                            frame_bytes: 0,
                        });
                        break;
                    }
                }
            }
            if run.is_empty() {
                break;
            }
            // Every slot hint of the run back to back, after the keys: at
            // millions of keys each hint needs a page walk, and issued
            // together those walks overlap instead of each stalling between
            // two key derivations.
            for planned in &run {
                if let Some(Ok(plan)) = &planned.plan {
                    limiter.prefetch(plan);
                }
            }
            let full_run = run.len() == PLAN_AHEAD;
            for planned in run.iter_mut() {
                if let Ok(Request::Lockouts { limit }) = planned.request {
                    // Replies buffered before it are written first, so a
                    // connection holds one share of the budget at a time
                    // and two can never each wait for the share the other
                    // holds.
                    if !send_replies(&mut writer, &mut out, write_timeout).await {
                        return;
                    }
                    let Some((mut reply, share)) = make_lockouts_reply(daemon, limiter, planned.id, limit, now).await
                    else {
                        return;
                    };
                    let sent = send_replies(&mut writer, &mut reply, write_timeout).await;
                    drop((reply, share));
                    if !sent {
                        return;
                    }
                    start += planned.frame_bytes;
                    answered += 1;
                    frame_deadline = None;
                    continue;
                }
                let (response, durable) = match &planned.request {
                    Ok(request) => daemon.handle(limiter, request, planned.plan.take(), &peer, now),
                    // A malformed frame: rare, so a copy of its reply is fine.
                    Err(error) => (error.clone(), Vec::new()),
                };
                counts.count(&response);
                if !durable.is_empty() {
                    // Earlier replies need not wait for this commit.
                    if !send_replies(&mut writer, &mut out, write_timeout).await {
                        return;
                    }
                    for write in durable {
                        if let Err(e) = write.wait().await {
                            tracing::error!(error = %e, "lockout not persisted; answering from memory");
                        }
                    }
                }
                codec::encode_response(planned.id, &response, &mut out);
                start += planned.frame_bytes;
                answered += 1;
                frame_deadline = None;
                if out.len() >= REPLY_BYTES_BUFFERED_MAX && !send_replies(&mut writer, &mut out, write_timeout).await {
                    return;
                }
            }
            if !full_run {
                break;
            }
        }
        counts.flush(daemon);
        if !out.is_empty() && !send_replies(&mut writer, &mut out, write_timeout).await {
            return;
        }
        if close || stopping {
            return;
        }
        if answered == batch_max {
            continue; // more frames may be waiting in the buffer
        }
        // Keep the partial frame at the front of the buffer.
        buf.copy_within(start..filled, 0);
        filled -= start;
        start = 0;

        let read = if filled > 0 {
            // Mid-frame: the whole frame must arrive within the read timeout
            // of its first byte, however slowly the client trickles it.
            // A stop closes it too: a frame not yet whole was never read,
            // so nothing it asked is left half done.
            let deadline = *frame_deadline.get_or_insert_with(|| tokio::time::Instant::now() + read_timeout);
            tokio::select! {
                r = tokio::time::timeout_at(deadline, reader.read(&mut buf[filled..])) => match r {
                    Ok(r) => r,
                    Err(_) => return,
                },
                _ = &mut shutdown_signal => return,
            }
        } else {
            frame_deadline = None;
            loop {
                tokio::select! {
                    // A stop is looked at first, so a client that never
                    // stops sending cannot keep its connection past it.
                    biased;
                    _ = &mut shutdown_signal => {
                        // Answer what the client already sent, then close.
                        stopping = true;
                        break match reader.try_read(&mut buf[filled..]) {
                            Ok(n) => Ok(n),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
                            Err(e) => Err(e),
                        };
                    }
                    r = reader.read(&mut buf[filled..]) => break r,
                    () = idle.as_mut() => {
                        let deadline = last_read + idle_timeout;
                        if tokio::time::Instant::now() >= deadline {
                            return; // idle: the client reconnects when it needs to
                        }
                        idle.as_mut().reset(deadline);
                    }
                }
            }
        };
        last_read = tokio::time::Instant::now();
        match read {
            Ok(0) if !stopping => return,
            Ok(n) => filled += n,
            Err(_) => return,
        }
    }
}
