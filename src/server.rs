//! The daemon's socket side: accept connections, read frames, dispatch each
//! request to the limiter, write replies; stop gracefully on a signal.
//!
//! A connection handles its frames in order and writes every reply it has
//! before reading again, so a client may pipeline many requests (ids tell
//! the replies apart) and pays one write per batch, not per request.
//! In shared mode a run of pipelined requests is begun whole (every store
//! op queued) before any is answered, so the run waits for the store about
//! once, within `[shared] timeout_ms`, not once per request.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::access::Permissions;
use crate::clock::{Clock, Stopwatch};
use crate::codec::ReplyExtras;
use crate::codec::{self, FrameError, PayloadError, FRAME_HEADER_BYTES, REQUEST_PAYLOAD_BYTES_MAX};
use crate::config::{
    ACCEPT_RETRY_DELAY_MS_MAX, ACCEPT_RETRY_DELAY_MS_MIN, READ_BUFFER_BYTES, REPLY_BUFFER_RESTING_BYTES,
    REPLY_BYTES_BUFFERED_MAX,
};
use crate::daemon::{Answer, Daemon, Job, Listing, Peer, Started, VerdictCounters, ERRORS};
use crate::limiter::Limiter;
use crate::protocol::{
    ErrorCode, Request, Response, BAN_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, SIGNALS_VERSION,
};

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

/// Serves until `shutdown` completes, then stops accepting, lets every
/// connection answer what it has read, and returns within the grace period.
pub async fn run(listener: UnixListener, daemon: Arc<Daemon>, shutdown: impl Future<Output = ()>) {
    let mut shutdown_requested = std::pin::pin!(shutdown);
    // Connections hear of the stop through this channel; `run` tells them.
    let (stop_connections, shutdown) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(daemon.server_config().connections_max));
    let mut connections = JoinSet::new();
    let mut accept_retry = Duration::ZERO;
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("semaphore never closed"),
            () = &mut shutdown_requested => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_retry = Duration::ZERO;
                    let daemon = daemon.clone();
                    let shutdown = shutdown.clone();
                    connections.spawn(async move {
                        let open = daemon.connection_opened();
                        serve_connection(stream, &daemon, shutdown).await;
                        drop((open, permit));
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
                    if let Some(suppressed) = daemon.admit_accept_error(Clock::System.now_us()) {
                        let retry_ms = accept_retry.as_millis() as u64;
                        tracing::warn!(error = %e, retry_ms, suppressed, "accept failed");
                    }
                    tokio::select! {
                        () = tokio::time::sleep(accept_retry) => {}
                        () = &mut shutdown_requested => break,
                    }
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown_requested => break,
        }
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_connections.send(true);
    let grace = Duration::from_millis(daemon.server_config().shutdown_grace_ms);
    let drained = tokio::time::timeout(grace, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(open = connections.len(), "grace period over; closing remaining connections");
        connections.abort_all();
    }
}

/// Verdict counts kept per connection and added to the daemon's every batch,
/// so two cores do not bounce one cache line per request.
#[derive(Default)]
struct LocalCounts(VerdictCounters);

impl LocalCounts {
    fn count(&mut self, response: &Response<'_>) {
        match response {
            Response::Verdict(v) => self.0[v.decision as usize] += 1,
            Response::Error(_) => self.0[ERRORS] += 1,
            _ => {}
        }
    }

    fn flush(&mut self, daemon: &Daemon) {
        daemon.add_verdicts(&mut self.0);
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
    /// The request's protocol version, which its reply is written in (1 for
    /// a frame whose version is not spoken: its error reply is version 1's).
    version: u8,
    step: Step<'b, 'l>,
    frame_bytes: usize,
}

/// Where a frame of the run is.
// A job is in every step's past and moved whole; boxing it would allocate
// for every request (a waiting request's state is boxed by `Started`).
#[allow(clippy::large_enum_variant)]
enum Step<'b, 'l> {
    /// Decoded and planned, not begun.
    Job(Job<'b, 'l>),
    /// Begun (`Daemon::start`) and answered without waiting.
    Ready(Answer<'l>),
    /// Begun and waiting (a store op queued, or an admin request).
    Waiting(Started<'b, 'l>),
    /// The error reply of a frame that did not decode.
    Error(Response<'static>),
    /// Replied to.
    Answered,
}

impl Step<'_, '_> {
    /// A request that must see the effects of every earlier request of the
    /// run, and whose effects every later one must see: nothing after it is
    /// begun before it is answered. `lockouts` (answered by
    /// `Daemon::listing_reply`) and `unlock` (admin; waits for the store
    /// inline).
    fn is_barrier(&self) -> bool {
        matches!(self, Step::Job(Job::Other(Request::Lockouts { .. } | Request::Unlock { .. })))
    }
}

/// Begins the frames of `run` up to its first barrier (or the barrier
/// itself, if it comes first: that one is answered whole), so that every
/// store op among them is queued before any is waited for: they ride one
/// batch and share one deadline. How many frames that is.
fn start_segment<'b, 'l>(
    daemon: &'b Daemon,
    limiter: &'l Limiter,
    run: &mut [Planned<'b, 'l>],
    peer: &Peer,
    now: u64,
) -> usize {
    for (n, planned) in run.iter_mut().enumerate() {
        if planned.step.is_barrier() {
            return n.max(1);
        }
        if let Step::Job(_) = planned.step {
            let Step::Job(job) = std::mem::replace(&mut planned.step, Step::Answered) else { unreachable!() };
            planned.step = match daemon.start(limiter, job, peer, now) {
                Started::Ready(answer) => Step::Ready(answer),
                waiting => Step::Waiting(waiting),
            };
        }
    }
    run.len()
}

fn plan_frame<'b, 'l>(
    limiter: &'l Limiter,
    payload: &'b [u8],
    frame_bytes: usize,
    peer: &Peer,
    now: u64,
) -> Planned<'b, 'l> {
    let version = match codec::request_version(payload) {
        Some(v) if (PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&v) => v,
        _ => PROTOCOL_VERSION_MIN,
    };
    match codec::decode_request_versioned(payload) {
        Ok((id, request, extras)) => {
            let job = Job::new(limiter, request, extras, peer.permissions, now);
            Planned { id, version, step: Step::Job(job), frame_bytes }
        }
        // A frame that did not decode is answered in its own version when
        // the daemon speaks it and could read its id; otherwise (no id, a
        // version it does not speak) in version 1, which every client reads
        // (PROTOCOL.md §8).
        Err(failure) => Planned {
            id: failure.id.unwrap_or(0),
            version: if failure.id.is_some() { version } else { PROTOCOL_VERSION_MIN },
            step: Step::Error(payload_error(&failure.error)),
            frame_bytes,
        },
    }
}

/// Writes every buffered reply, or gives up on a client that does not take
/// them within `timeout` (false: close the connection). A buffer grown past
/// `REPLY_BUFFER_RESTING_BYTES` is given back.
async fn send_replies(writer: &mut OwnedWriteHalf, out: &mut Vec<u8>, timeout: Duration) -> bool {
    // Replies nearly always fit the socket's buffer: one non-blocking write
    // sends them without a timer, which a request at a time would pay for
    // on every reply. Only what did not fit waits, within the timeout.
    if out.is_empty() {
        return true;
    }
    let written = match writer.try_write(out) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(_) => {
            out.clear();
            return false;
        }
    };
    let rest = &out[written..];
    let sent = if rest.is_empty() {
        // A write spends one unit of the task's cooperative budget, as
        // `write_all` does: without it a connection pipelining small
        // requests without pause would yield only on its reads, and hold
        // its worker longer than before while other clients wait.
        tokio::task::coop::consume_budget().await;
        true
    } else {
        matches!(tokio::time::timeout(timeout, writer.write_all(rest)).await, Ok(Ok(())))
    };
    out.clear();
    if out.capacity() > REPLY_BUFFER_RESTING_BYTES {
        *out = Vec::with_capacity(REPLY_BUFFER_RESTING_BYTES);
    }
    sent
}

async fn serve_connection(stream: UnixStream, daemon: &Daemon, mut shutdown: watch::Receiver<bool>) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer { uid: c.uid(), gid: c.gid(), permissions: daemon.permissions(c.uid(), c.gid()) },
        // Without credentials a peer gets nothing but status and lockouts.
        Err(_) => Peer { uid: u32::MAX, gid: u32::MAX, permissions: Permissions { attempts: false, admin: false } },
    };
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    let (mut start, mut filled) = (0usize, 0usize);
    let mut out = Vec::with_capacity(REPLY_BUFFER_RESTING_BYTES);
    let mut counts = LocalCounts::default();
    let server = daemon.server_config();
    let read_timeout = Duration::from_millis(server.frame_read_timeout_ms);
    let idle_timeout = Duration::from_millis(server.idle_timeout_ms);
    let write_timeout = Duration::from_millis(server.reply_write_timeout_ms);
    let batch_max = server.in_flight_per_connection_max;
    let mut stopping = false;
    // When the frame now being read must be complete.
    let mut frame_deadline: Option<tokio::time::Instant> = None;
    // The current limiter, re-read only when a reload swapped it: a plain
    // load per batch instead of a reference-count bump that every core
    // would bounce.
    let mut limiters = arc_swap::Cache::new(daemon.limiter());
    // One shutdown waiter and one idle timer for the connection's life, not
    // one per read: registering a waiter and a timer per read cost more
    // than a pipelined batch's limiter work. The timer fires at most once
    // per idle period and re-arms from the last read.
    let mut shutdown_signal = std::pin::pin!(shutdown.changed());
    let mut last_read = tokio::time::Instant::now();
    let mut idle = std::pin::pin!(tokio::time::sleep_until(last_read + idle_timeout));
    // One batch in `sample_every` has its replies' latency measured.
    let latency = daemon.latency();
    let mut batches: u32 = 0;
    loop {
        // Answer every complete frame we hold, all with one limiter.
        let limiter = limiters.load();
        let now = daemon.clock().now_us();
        let stopwatch = batches.is_multiple_of(latency.sample_every()).then(Stopwatch::start);
        batches = batches.wrapping_add(1);
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
                            version: PROTOCOL_VERSION_MIN,
                            step: Step::Error(Response::error(
                                ErrorCode::FrameTooLarge,
                                format!("frame of {len} bytes is over the maximum of {max}; closing"),
                            )),
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
                if let Step::Job(Job::Check { plan: Ok(plan), .. }) = &planned.step {
                    limiter.prefetch(plan);
                }
            }
            let full_run = run.len() == PLAN_AHEAD;
            let two_pass = daemon.shared().is_some() && limiter.is_shared();
            // In shared mode, each segment of the run is begun whole
            // before any of it is answered (`start_segment`); otherwise
            // (nothing waits) each frame is its own segment.
            let mut next = 0;
            while next < run.len() {
                let end = if two_pass {
                    next + start_segment(daemon, limiter, &mut run[next..], &peer, now)
                } else {
                    next + 1
                };
                for planned in run[next..end].iter_mut() {
                    let step = std::mem::replace(&mut planned.step, Step::Answered);
                    let listing = match &step {
                        Step::Job(Job::Other(request)) => {
                            Listing::of(request, peer.permissions.admin && planned.version >= BAN_VERSION)
                        }
                        _ => None,
                    };
                    if let Some(listing) = listing {
                        // Replies buffered before it are written first, so a
                        // connection holds one share of the budget at a time
                        // and two can never each wait for the share the other
                        // holds.
                        if !send_replies(&mut writer, &mut out, write_timeout).await {
                            return;
                        }
                        let made = daemon.listing_reply(limiter, planned.version, planned.id, listing, now).await;
                        let Some((mut reply, share)) = made else {
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
                    let (response, durable, degraded) = match step {
                        // Most requests are answered by `start` alone; only
                        // one that waits builds `finish`'s future (a few
                        // hundred bytes, copied on every build).
                        Step::Job(job) => match daemon.start(limiter, job, &peer, now) {
                            Started::Ready(answer) => answer,
                            started => daemon.finish(limiter, started, &peer, now).await,
                        },
                        Step::Ready(answer) => answer,
                        Step::Waiting(started) => daemon.finish(limiter, started, &peer, now).await,
                        Step::Error(error) => (error, Vec::new(), false),
                        Step::Answered => unreachable!("a frame is answered once"),
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
                    // A version-2 status carries the shared store's, and a
                    // version-3 one spray detection's; computed here, where
                    // the reply is written, as status is rare.
                    let status = matches!(response, Response::Status(_));
                    let shared = if status && planned.version >= 2 { daemon.shared_status(limiter) } else { None };
                    let signals =
                        if status && planned.version >= SIGNALS_VERSION { daemon.signals_status() } else { None };
                    let extras = ReplyExtras { degraded, shared: shared.as_ref(), signals: signals.as_ref() };
                    codec::encode_response_versioned(planned.version, planned.id, &response, &extras, &mut out);
                    if let (Some(stopwatch), Response::Verdict(_)) = (stopwatch, &response) {
                        latency.record(stopwatch.elapsed_ns());
                    }
                    start += planned.frame_bytes;
                    answered += 1;
                    frame_deadline = None;
                    if out.len() >= REPLY_BYTES_BUFFERED_MAX
                        && !send_replies(&mut writer, &mut out, write_timeout).await
                    {
                        return;
                    }
                }
                next = end;
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
