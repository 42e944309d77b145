//! The Rust client an auth server links: pooled connections, a per-call
//! timeout, and each route's fail policy applied when the daemon cannot
//! answer in time, surfaced to the caller as such (never as a fake verdict).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::answer::{Answer, Answered, ClientError, FullStatus};
use crate::codec::{self, DecodedExtras, RequestExtras, FRAME_HEADER_BYTES, RESPONSE_PAYLOAD_BYTES_MAX};
use crate::config::ClientConfig;
use crate::gcra::decide;
use crate::late_replies::LateReplies;
use crate::preflight::{bounded, refused_before_sending};
use crate::protocol::{
    Activity, ErrorCode, Inspection, Lockout, Outcome, Request, Response, SharedStatus, Status, Subject,
    WouldBeRefusal, ACTIVITY_VERSION, BAN_VERSION, INSPECT_VERSION, PROTOCOL_VERSION_MIN,
};
use crate::unpoisoned::Unpoisoned;
use crate::FailPolicy;

/// Idle connections kept for reuse.
pub const POOL_CONNECTIONS_MAX: usize = 64;

struct Connection {
    stream: UnixStream,
    buf: Vec<u8>,
    /// The version this connection's requests go out in: lowered once for
    /// each newer version its daemon refused, for as long as the connection
    /// lives.
    version: u8,
}

/// A client for one daemon. Share it (`Arc<Client>`); calls may run
/// concurrently, each on its own pooled connection.
pub struct Client {
    config: ClientConfig,
    pool: Mutex<Vec<Connection>>,
    next_id: AtomicU64,
    /// Per closed route with a static budget: its GCRA TAT.
    budget_tats: Mutex<HashMap<String, u64>>,
    started: std::time::Instant,
    /// When the daemon last answered a call in time (µs since `started`,
    /// plus one; 0 never): a daemon never heard from is not busy.
    last_answered_us: AtomicU64,
    /// Replies heard after their call's deadline.
    late_replies: Arc<LateReplies>,
    /// The current run of timeouts: (when it began, the last one; 0 none),
    /// µs as above. A daemon late at a stretch for longer than `busy_max`,
    /// with no call answered within it, in time or late, is down or
    /// overloaded, not busy with a burst: the fail policy applies again.
    late_run: Mutex<(u64, u64)>,
    /// The checks waiting, per account (or address) and per requester.
    bursts: crate::burst::Bursts,
    /// Per requester, how long it has been refused as busy in others'
    /// bursts.
    busy_window: crate::burst::BusyWindow,
    /// Requesters a success was reported for through this client.
    known: crate::burst::KnownRequesters,
}

impl Client {
    pub fn new(config: ClientConfig) -> Client {
        let started = std::time::Instant::now();
        Client {
            config,
            pool: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            budget_tats: Mutex::new(HashMap::new()),
            started,
            last_answered_us: AtomicU64::new(0),
            late_replies: LateReplies::new(started),
            late_run: Mutex::new((0, 0)),
            bursts: Default::default(),
            busy_window: Default::default(),
            known: Default::default(),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Asks before the expensive work: may this attempt proceed?
    pub async fn check(&self, route: &str, subject: &Subject<'_>) -> Answer {
        self.check_answered(route, subject).await.answer
    }

    /// `check`, with whether the verdict was degraded.
    pub async fn check_answered(&self, route: &str, subject: &Subject<'_>) -> Answered {
        self.check_tagged(route, subject, None).await
    }

    /// `check_answered`, with the attempted password's tag (see
    /// [`password_tag`](crate::password_tag)), so that a password failing
    /// across many accounts can be refused. A daemon older than version 3
    /// never sees the tag.
    pub async fn check_tagged(&self, route: &str, subject: &Subject<'_>, password_tag: Option<[u8; 16]>) -> Answered {
        let request = Request::Check { route, subject: bounded(subject) };
        self.decide(route, &request, &RequestExtras { password_tag }).await
    }

    /// `report_with_password`, with whether the verdict was degraded.
    pub async fn report_answered(
        &self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
    ) -> Answered {
        self.report_tagged(route, subject, outcome, password_digest, None).await
    }

    /// `report_answered`, with the attempted password's tag (see
    /// [`password_tag`](crate::password_tag)): a failure's tag counts the
    /// password across accounts. A daemon older than version 3 never sees
    /// the tag.
    pub async fn report_tagged(
        &self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        password_tag: Option<[u8; 16]>,
    ) -> Answered {
        let request = Request::Report { route, subject: bounded(subject), outcome, password_digest };
        self.decide(route, &request, &RequestExtras { password_tag }).await
    }

    /// Tells the outcome after verifying the credential.
    pub async fn report(&self, route: &str, subject: &Subject<'_>, outcome: Outcome) -> Answer {
        self.report_with_password(route, subject, outcome, None).await
    }

    /// Like `report`, with the attempted password's digest (see
    /// [`password_digest`](crate::password_digest)), so that a failure
    /// repeating a recent wrong password is not counted again.
    pub async fn report_with_password(
        &self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
    ) -> Answer {
        self.report_answered(route, subject, outcome, password_digest).await.answer
    }

    pub(crate) async fn decide(&self, route: &str, request: &Request<'_>, extras: &RequestExtras) -> Answered {
        if let Some(refusal) = refused_before_sending(request) {
            return Answered { answer: Answer::Rejected(refusal), degraded: false };
        }
        // Only a check is an attempt: a report of its outcome must not spend
        // a second unit of the static budget.
        let spend = matches!(request, Request::Check { .. });
        let burst = match request {
            Request::Check { route, subject } => Some(self.bursts.enter(route, subject)),
            // The auth server found the password right: her address is hers.
            // A requester that is its burst key (no address) is never asked
            // about: its overlaps are all its own.
            Request::Report { route, subject, outcome: Outcome::Success, .. } => {
                let keys = self.bursts.keys(route, subject);
                if keys.requester != keys.burst {
                    self.known.succeeded(keys, self.now_us());
                }
                None
            }
            _ => None,
        };
        let result = match self.call_with_extras(request, extras).await {
            // Busy stops a login only in a burst on its account: a lone
            // user's timeout during a flood on others is an outage for the
            // fail policy, not a refusal. A burst not its own (others'
            // checks on her account) stops a known user's for busy_max a
            // window only.
            Err(ClientError::Busy(t)) if !burst.as_ref().is_some_and(|b| self.busy_in(b)) => {
                Err(ClientError::Timeout(t))
            }
            other => other,
        };
        drop(burst);
        let (answer, degraded) = match result {
            Ok((Response::Verdict(v), extras)) => (Answer::Verdict(v), extras.degraded),
            Ok((Response::Error(e), _)) => (Answer::Rejected(e), false),
            Ok((other, _)) => (self.unavailable(route, ClientError::Protocol(format!("{other:?}")), spend), false),
            Err(error) => (self.unavailable(route, error, spend), false),
        };
        Answered { answer, degraded }
    }

    /// Whether a busy timeout of the check `burst` counts stays busy: its
    /// own burst (parallel checks on one account and address), or a burst
    /// on its account, for a known requester within its `BusyWindow`.
    fn busy_in(&self, burst: &crate::burst::BurstGuard<'_>) -> bool {
        let (now_us, busy_max_us) = (self.now_us(), self.config.busy_max.as_micros() as u64);
        let requester = burst.requester();
        burst.own_burst()
            || (burst.in_burst()
                && (!self.known.known(requester, now_us) || self.busy_window.excused(requester, now_us, busy_max_us)))
    }

    /// µs since the client started, never 0.
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64 + 1
    }

    /// The route's fail policy; for a closed route, whether the static
    /// budget has room (spent from only when `spend`).
    pub(crate) fn unavailable(&self, route: &str, error: ClientError, spend: bool) -> Answer {
        let policy = self.config.fail_policies.get(route).copied().unwrap_or(self.config.default_fail_policy);
        // A busy daemon is not an outage: the budget is not spent on it.
        let within_static_budget = policy == FailPolicy::Closed
            && !matches!(error, ClientError::Busy(_))
            && self.config.static_budgets.get(route).is_some_and(|spec| {
                let now = self.started.elapsed().as_micros() as u64 + 1;
                let mut tats = self.budget_tats.locked();
                let tat = tats.get(route).copied();
                let (decision, after) = decide(*spec, tat, now, spend);
                tats.insert(route.to_string(), after);
                decision.allowed
            });
        Answer::Unavailable { policy, error, within_static_budget }
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        self.status_with_shared().await.map(|(status, _)| status)
    }

    /// The status, and the shared store's (`None` without `[shared]`, and
    /// from a daemon that speaks version 1 only).
    pub async fn status_with_shared(&self) -> Result<(Status, Option<SharedStatus>), ClientError> {
        self.status_full().await.map(|full| (full.status, full.shared))
    }

    /// The status with the shared store's and spray detection's (each
    /// `None` when the daemon runs without it or speaks an older version).
    pub async fn status_full(&self) -> Result<FullStatus, ClientError> {
        match self.call_versioned(&Request::Status).await? {
            (Response::Status(s), extras) => {
                Ok(FullStatus { status: *s, shared: extras.shared, signals: extras.signals })
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    /// The operator's view (`tollgate top`): at most `limit` entries in each
    /// list. Needs a daemon that speaks version 4.
    pub async fn activity(&self, limit: u32) -> Result<Activity, ClientError> {
        match self.call_versioned(&Request::Activity { limit }).await? {
            (Response::Activity(a), _) => Ok(*a),
            (other, extras) => Err(needs_version(other, extras.version, ACTIVITY_VERSION)),
        }
    }

    /// A sample of monitor mode's would-be refusals, at most `limit`, with
    /// how many there were since the sample began and when that was.
    /// Needs a daemon that speaks version 4.
    pub async fn samples(&self, limit: u32) -> Result<(Vec<WouldBeRefusal>, u64, u64), ClientError> {
        match self.call_versioned(&Request::Samples { limit }).await? {
            (Response::Samples { samples, seen, since_ms }, _) => Ok((samples, seen, since_ms)),
            (other, extras) => Err(needs_version(other, extras.version, ACTIVITY_VERSION)),
        }
    }

    pub async fn lockouts(&self, limit: u32) -> Result<(Vec<Lockout>, u64), ClientError> {
        match self.call(&Request::Lockouts { limit }).await? {
            Response::Lockouts { lockouts, total } => Ok((lockouts, total)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn unlock(
        &self,
        route: &str,
        account: &str,
        source: Option<std::net::IpAddr>,
    ) -> Result<u32, ClientError> {
        match self.call(&Request::Unlock { route, account, source }).await? {
            Response::Unlocked { cleared } => Ok(cleared),
            other => Err(unexpected(other)),
        }
    }

    /// The subject's standing on each rule of `route`, read without
    /// changing anything (admin). Needs a daemon that speaks version 6.
    pub async fn inspect(&self, route: &str, subject: &Subject<'_>) -> Result<Inspection, ClientError> {
        match self.call_versioned(&Request::Inspect { route, subject: bounded(subject) }).await? {
            (Response::Inspection(i), _) => Ok(*i),
            (other, extras) => Err(needs_version(other, extras.version, INSPECT_VERSION)),
        }
    }

    /// Refuses every check from `network`/`prefix_len` for `duration`
    /// (admin): durable, listed among the lockouts, lifted by `unban`.
    /// Returns when it ends on the daemon's clock (ms) and whether it
    /// replaced a ban on that network. Needs a daemon that speaks version 7.
    pub async fn ban(
        &self,
        network: std::net::IpAddr,
        prefix_len: u8,
        duration: Duration,
        reason: &str,
    ) -> Result<(u64, bool), ClientError> {
        let for_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        match self.call_versioned(&Request::Ban { network, prefix_len, for_ms, reason }).await? {
            (Response::Banned { until_ms, replaced }, _) => Ok((until_ms, replaced)),
            (other, extras) => Err(needs_version(other, extras.version, BAN_VERSION)),
        }
    }

    /// Lifts the ban on exactly `network`/`prefix_len` (admin): 1 if there
    /// was one, else 0. Needs a daemon that speaks version 7.
    pub async fn unban(&self, network: std::net::IpAddr, prefix_len: u8) -> Result<u32, ClientError> {
        match self.call_versioned(&Request::Unban { network, prefix_len }).await? {
            (Response::Unlocked { cleared }, _) => Ok(cleared),
            (other, extras) => Err(needs_version(other, extras.version, BAN_VERSION)),
        }
    }

    pub async fn advance_clock(&self, by: Duration) -> Result<u64, ClientError> {
        match self.call(&Request::ClockAdvance { by_ms: by.as_millis() as u64 }).await? {
            Response::ClockAdvanced { now_ms } => Ok(now_ms),
            other => Err(unexpected(other)),
        }
    }

    /// One request and its reply, within the configured timeout. A daemon
    /// error reply is `Ok(Response::Error(..))`.
    pub async fn call(&self, request: &Request<'_>) -> Result<Response<'static>, ClientError> {
        self.call_versioned(request).await.map(|(response, _)| response)
    }

    /// `call`, with what a version-2 reply carries beyond version 1's
    /// message (and the reply's version).
    pub async fn call_versioned(
        &self,
        request: &Request<'_>,
    ) -> Result<(Response<'static>, DecodedExtras), ClientError> {
        self.call_with_extras(request, &RequestExtras::default()).await
    }

    /// `call_versioned`, with what a version-3 check or report carries
    /// beyond version 2's message (dropped on a connection that fell back
    /// to an older version).
    pub async fn call_with_extras(
        &self,
        request: &Request<'_>,
        extras: &RequestExtras,
    ) -> Result<(Response<'static>, DecodedExtras), ClientError> {
        let timeout = self.config.timeout;
        let now_us = || self.started.elapsed().as_micros() as u64 + 1;
        match tokio::time::timeout(timeout, self.call_untimed(request, extras)).await {
            // Only a missing socket, nobody listening or no permission says
            // the daemon cannot be reached. Anything else is taken for late:
            // a full accept queue (a stalled daemon leaves each timed-out
            // client's connection in it: EAGAIN), or this process out of
            // descriptors or memory (which an attacker can cause on the auth
            // server). Taken for unreachable, either let login fail open
            // past the busy rule.
            Ok(Err(ClientError::Connect { source, .. })) if !says_unreachable(&source) => Err(self.late(timeout)),
            Ok(result) => {
                if result.is_ok() {
                    // A timely answer busy_max after the run's last timeout
                    // ends the run (quiet gaps alone do not: a frozen
                    // daemon's sparse calls are one run that grows old).
                    let mut run = self.late_run.locked();
                    let now = now_us();
                    self.last_answered_us.store(now, Ordering::Relaxed);
                    if run.1 != 0 && now.saturating_sub(run.1) >= self.config.busy_max.as_micros() as u64 {
                        run.1 = 0;
                    }
                }
                result
            }
            Err(_) => Err(self.late(timeout)),
        }
    }

    /// A call the daemon was late for: it joins the run of late calls, and
    /// is `Busy` from a daemon that has answered this client in time while
    /// the run is younger than `busy_max` or the daemon answered a call,
    /// in time or late, within `busy_max`; else `Timeout`. A daemon that
    /// still answers is not down: an attacker's bursts closer together
    /// than `busy_max`, or keeping it late for every call, would otherwise
    /// age one run past it and fail open.
    fn late(&self, timeout: Duration) -> ClientError {
        let busy_max_us = self.config.busy_max.as_micros() as u64;
        let last = self.last_answered_us.load(Ordering::Relaxed);
        let busy = {
            // The time is read under the lock: read before it, a task could
            // start the run after this one's instant.
            let mut run = self.late_run.locked();
            let now = self.started.elapsed().as_micros() as u64 + 1;
            let heard = self.late_replies.heard_us();
            // A reply heard after the run's last timeout shows the daemon
            // alive after that run: this timeout begins a new one. Else a
            // quiet gap longer than busy_max, then a burst that times out
            // before any of its replies is heard, would fail open against
            // a daemon that answers every call. A frozen one is never
            // heard, and its sparse calls still make one run that ages.
            if run.1 == 0 || heard > run.1 {
                run.0 = now;
            }
            run.1 = run.1.max(now);
            now.saturating_sub(run.0) < busy_max_us
                || now.saturating_sub(last) < busy_max_us
                || (heard > 0 && now.saturating_sub(heard) < busy_max_us)
        };
        if last > 0 && busy {
            ClientError::Busy(timeout)
        } else {
            ClientError::Timeout(timeout)
        }
    }

    async fn call_untimed(
        &self,
        request: &Request<'_>,
        extras: &RequestExtras,
    ) -> Result<(Response<'static>, DecodedExtras), ClientError> {
        let pooled = self.pool.locked().pop();
        let Some(conn) = pooled else {
            return self.call_on(self.connect().await?, request, extras).await;
        };
        match self.call_on(conn, request, extras).await {
            // A pooled connection the daemon closed while it sat idle (or a
            // restarted daemon): nothing was read, so ask once more on a
            // fresh connection.
            Err(ClientError::Io(e)) if is_closed(&e) => self.call_on(self.connect().await?, request, extras).await,
            other => other,
        }
    }

    async fn connect(&self) -> Result<Connection, ClientError> {
        let stream = UnixStream::connect(&self.config.socket)
            .await
            .map_err(|source| ClientError::Connect { path: self.config.socket.clone(), source })?;
        Ok(Connection { stream, buf: Vec::with_capacity(512), version: self.config.protocol_version })
    }

    /// One exchange; the connection goes back to the pool only if it ended
    /// cleanly (on any error or timeout its state is unknown: dropped, or
    /// listened to for its late reply).
    async fn call_on(
        &self,
        conn: Connection,
        request: &Request<'_>,
        extras: &RequestExtras,
    ) -> Result<(Response<'static>, DecodedExtras), ClientError> {
        let mut call =
            InCall { conn: Some(conn), awaiting_reply: false, late: &self.late_replies, horizon: self.config.busy_max };
        let mut reply = self.exchange(&mut call, request, extras).await?;
        // A daemon older than the connection's version refuses it in version
        // 1's bytes, which every daemon has: ask again one version lower (3,
        // then 2, then 1), each step once per connection.
        while call.connection().version > PROTOCOL_VERSION_MIN && refuses_version(&reply) {
            call.connection().version -= 1;
            reply = self.exchange(&mut call, request, extras).await?;
        }
        let conn = call.conn.take().expect("a call's connection is taken only here");
        let mut pool = self.pool.locked();
        if pool.len() < POOL_CONNECTIONS_MAX {
            pool.push(conn);
        }
        Ok(reply)
    }

    /// Writes the request in the connection's version and reads its reply.
    async fn exchange(
        &self,
        call: &mut InCall<'_>,
        request: &Request<'_>,
        extras: &RequestExtras,
    ) -> Result<(Response<'static>, DecodedExtras), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = call.conn.as_mut().expect("a call has its connection until it ends");
        conn.buf.clear();
        codec::encode_request_with_extras(conn.version, id, request, extras, &mut conn.buf);
        conn.stream.write_all(&conn.buf).await?;
        call.awaiting_reply = true;
        let response = read_response(conn).await;
        call.awaiting_reply = false;
        let response = response?;
        let (reply_id, response, extras) =
            codec::decode_response_versioned(&response).map_err(|f| ClientError::Protocol(f.error.to_string()))?;
        // Id 0 is the daemon's reply to a frame it could not read at all.
        if reply_id != id && !(reply_id == 0 && matches!(response, Response::Error(_))) {
            return Err(ClientError::Protocol(format!("reply id {reply_id} for request {id}")));
        }
        Ok((response, extras))
    }
}

/// A call's connection. Dropped while it awaits its reply (the call timed
/// out, or its caller gave up), it is listened to for that reply
/// (`LateReplies`): a daemon that answers late is busy, not down.
struct InCall<'c> {
    conn: Option<Connection>,
    awaiting_reply: bool,
    late: &'c Arc<LateReplies>,
    horizon: Duration,
}

impl InCall<'_> {
    fn connection(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("a call has its connection until it ends")
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        if let (true, Some(conn)) = (self.awaiting_reply, self.conn.take()) {
            self.late.listen(conn.stream, self.horizon);
        }
    }
}

/// Whether a failed connect means the daemon cannot be reached (rather
/// than that it, or this process, is overloaded).
fn says_unreachable(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionRefused, NotFound, PermissionDenied};
    matches!(error.kind(), NotFound | ConnectionRefused | PermissionDenied)
}

/// A reply to `activity`, `samples` or `inspect` that is not one: from a
/// daemon that speaks an older version than `first`, a plain sentence
/// saying so.
fn needs_version(reply: Response<'static>, version: u8, first: u8) -> ClientError {
    if version < first {
        return ClientError::Protocol(format!(
            "the daemon speaks protocol version {version}; this needs version {first} (upgrade the daemon)"
        ));
    }
    unexpected(reply)
}

/// A version-1 `unsupported_version` reply: an old daemon's answer to a
/// newer version (a daemon never refuses a version it speaks).
fn refuses_version((response, extras): &(Response<'static>, DecodedExtras)) -> bool {
    extras.version == 1 && matches!(response, Response::Error(e) if e.code == ErrorCode::UnsupportedVersion)
}

fn is_closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), BrokenPipe | ConnectionReset | UnexpectedEof)
}

async fn read_response(conn: &mut Connection) -> Result<Vec<u8>, ClientError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    conn.stream.read_exact(&mut header).await?;
    let len = u32::from_le_bytes(header) as usize;
    if len > RESPONSE_PAYLOAD_BYTES_MAX {
        return Err(ClientError::Protocol(format!("reply of {len} bytes is over the maximum")));
    }
    let mut payload = vec![0u8; len];
    conn.stream.read_exact(&mut payload).await?;
    Ok(payload)
}

fn unexpected(response: Response<'static>) -> ClientError {
    match response {
        Response::Error(e) => ClientError::Daemon(e),
        other => ClientError::Protocol(format!("{other:?}")),
    }
}
