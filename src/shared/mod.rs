//! The shared store: the security counters of global rules kept
//! in Redis or Valkey, so that N hosts behind a load balancer enforce one
//! limit, not N. Every call waits at most `timeout_ms`; a breaker stops the
//! waiting altogether when the store is away, and the limiter then counts
//! global rules on this host at ceil(limit / N) (degraded).
//!
//! The request path submits an op to a queue and awaits its reply with a
//! deadline; dispatcher tasks gather the ops of every connection into one
//! EVALSHA per batch, so a hundred connections cost a few round trips, not
//! a hundred. The driver (redis-rs, multiplexed) only carries bytes:
//! tollgate owns the deadline, the breaker and the reconnection, because a
//! stopped (SIGSTOP) or black-holed server keeps a socket that looks alive,
//! and only dropping it and connecting again finds out.

pub mod breaker;
pub mod hot;
pub mod nodes;
pub mod script;
mod ticket;

pub use ticket::Ticket;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{mpsc, oneshot, Semaphore};

pub use breaker::State;
use breaker::{Breaker, LateRun};
use nodes::{Change, Nodes};
use script::{batch_command, batch_eval_command, op_slot, split_batch, Op, Reply, ReplyError, SCRIPT};

use crate::config::SharedConfig;

/// The target of the shared store's log lines.
pub const LOG_TARGET: &str = "tollgate::shared";
/// How long a batch's future may wait for a late reply after its callers
/// gave up: long enough to learn which places a late check took (and give
/// them back), short enough that a dead connection's batches do not pile up.
pub const LATE_REPLY_WAIT_MS: u64 = 1000;
/// How long before `LATE_REPLY_WAIT_MS` runs out a check sent to the store
/// stops taking places there (for the reply's way back).
const CHECK_EXPIRY_MARGIN_MS: u64 = 100;
/// Unlock messages the store's log keeps at most (a host replays them
/// all when it subscribes).
const UNLOCK_LOG_MAX: usize = 10_000;
/// Batches one dispatcher keeps in flight on its connection: the driver
/// pipelines them, and Redis runs each script whole.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// How long the learned host count remembers a host it no longer sees: a
/// host restarting for a deploy still counts, so the share of each host
/// does not jump up and down with every restart.
pub const HOSTS_LEARNED_MEMORY_MS: u64 = 10 * 60 * 1000;

/// In a cluster, a failure within this long of a success is one node's
/// (its slots are away), not the store's: only that call is answered on
/// this host, and the breaker does not move, so the other nodes' keys stay
/// decided by the store. A cluster that answers nothing at all opens the
/// breaker once this has passed since its last answer.
pub const CLUSTER_PARTIAL_FAILURE_WINDOW_MS: u64 = 1000;
/// Retry waits of the cluster client (it retries once, after refreshing
/// its slot map): short, because the caller waits `timeout_ms` at most.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 5;
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 50;

/// The driver's connection: one multiplexed connection to a single store,
/// or the cluster client's (one multiplexed connection per node, slot
/// routing, MOVED/ASK). Both are cheap clones of a shared handle.
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// Why a call was answered without the store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("the breaker is {0}: the store is not asked")]
    NotAsked(&'static str),
    #[error("the queue to the store is full")]
    QueueFull,
    /// In a cluster: the node serving the op's slot is away (its own
    /// breaker is open); the other nodes' slots are still asked.
    #[error("cluster node {0} is away (its breaker is open): its slots are not asked")]
    NodeAway(String),
    #[error("no reply within the timeout")]
    Timeout,
    /// A check with no reply within the timeout, in a run of late calls
    /// younger than `busy_max_ms` (`SharedStore::late_is_busy`), while
    /// another check of this host waits on one of its keys: part of a
    /// burst on them, queued, not lost. The caller refuses rather than
    /// answer on its share, and the breaker does not move.
    #[error("the store is busy: no reply within the timeout, late for less than busy_max_ms")]
    Busy,
    /// The same, for a check alone on its keys: answered on the share, as
    /// for a store away, but the breaker does not move.
    #[error("no reply within the timeout from a busy store")]
    Late,
    /// A check the store ran past its batch's deadline, so it took no
    /// place: to a caller still waiting, a late store
    /// (`Ticket::wait` takes it as the deadline passing).
    #[error("the store ran the check too late")]
    Expired,
    #[error("the store failed: {0}")]
    Failed(String),
    /// A value at one of the op's keys that tollgate did not write: only
    /// this decision is degraded, the breaker does not move.
    #[error("{0}")]
    BadValue(ReplyError),
}

/// Counters for `status` and metrics.
#[derive(Default)]
pub struct SharedStats {
    pub calls: AtomicU64,
    pub timeouts: AtomicU64,
    pub errors: AtomicU64,
    pub bad_values: AtomicU64,
    pub not_asked: AtomicU64,
    pub noscript_reloads: AtomicU64,
    pub late_replies: AtomicU64,
    pub releases_sent: AtomicU64,
    pub batches: AtomicU64,
    pub batched_ops: AtomicU64,
    pub rtt_us_sum: AtomicU64,
    pub rtt_us_max: AtomicU64,
    pub known_lockout_refusals: AtomicU64,
    pub written_back: AtomicU64,
    /// Answers of global rules given on this host's degraded share.
    pub degraded_answers: AtomicU64,
    pub messages_heard: AtomicU64,
    pub messages_published: AtomicU64,
    pub messages_ignored: AtomicU64,
    pub degraded_us_total: AtomicU64,
    pub transitions: AtomicU64,
}

struct Pending {
    op: Op,
    reply: oneshot::Sender<Result<Reply, CallError>>,
}

/// The store's handle, shared by every connection.
pub struct SharedStore {
    pub config: SharedConfig,
    sha: String,
    queue: mpsc::Sender<Pending>,
    receiver: Mutex<Option<mpsc::Receiver<Pending>>>,
    connection: Mutex<Option<Connection>>,
    /// When a call was last answered (`micros`), 0 never: tells one
    /// cluster node's failure from the store's.
    last_success_us: AtomicU64,
    /// The current run of late request calls.
    late_run: Mutex<LateRun>,
    /// The keys this host's checks wait on.
    hot: hot::HotKeys,
    state: AtomicU8,
    breaker: Mutex<Breaker>,
    /// In a cluster: which node serves each slot, and a breaker per node.
    nodes: Mutex<Nodes>,
    /// A slot map read is running (`refresh_slots_in_background`).
    refreshing_slots: AtomicBool,
    /// A cluster node came back: the lockouts this host took on its share
    /// meanwhile are to be written back (`take_write_back_due`).
    write_back_due: AtomicBool,
    pub stats: SharedStats,
    /// Hosts counted for degraded limits (ceil(limit / N)).
    hosts_in_force: AtomicU32,
    hosts_live: AtomicU32,
    /// The host count read from the state file at start (0: none), until
    /// the store's first learned count.
    hosts_remembered: AtomicU32,
    /// The store's clock minus this host's, from the last reply (µs).
    clock_offset_us: AtomicI64,
    /// Each node's clock (by name, "" for a single store) minus
    /// `micros()`, from its last batch's reply: the store's time now
    /// without the daemon's clock (a test's manual clock is not the
    /// store's), node by node (a cluster's clocks may differ).
    node_clocks: Mutex<HashMap<String, i64>>,
    /// When degraded began (this host's wall µs), 0 when not degraded.
    degraded_since_us: AtomicU64,
    last_error: Mutex<Option<String>>,
    epoch: Instant,
}

impl SharedStore {
    pub fn new(config: SharedConfig) -> Arc<SharedStore> {
        if config.url.starts_with("rediss://") {
            install_tls_provider();
        }
        let (queue, receiver) = mpsc::channel(config.pending_max);
        let breaker =
            Breaker::new(config.breaker_failures, config.probe_interval_ms * 1000, config.probe_max_ms * 1000);
        let hosts = if config.hosts > 0 { config.hosts } else { config.hosts_when_unknown };
        Arc::new(SharedStore {
            sha: redis::Script::new(SCRIPT).get_hash().to_string(),
            queue,
            receiver: Mutex::new(Some(receiver)),
            connection: Mutex::new(None),
            last_success_us: AtomicU64::new(0),
            late_run: Mutex::new(LateRun::default()),
            hot: hot::HotKeys::default(),
            state: AtomicU8::new(State::Open.to_u8()),
            breaker: Mutex::new(breaker),
            nodes: Mutex::new(Nodes::new(
                config.breaker_failures,
                config.probe_interval_ms * 1000,
                config.probe_max_ms * 1000,
            )),
            refreshing_slots: AtomicBool::new(false),
            write_back_due: AtomicBool::new(false),
            stats: SharedStats::default(),
            hosts_in_force: AtomicU32::new(hosts),
            hosts_live: AtomicU32::new(0),
            hosts_remembered: AtomicU32::new(0),
            clock_offset_us: AtomicI64::new(0),
            node_clocks: Mutex::new(HashMap::new()),
            degraded_since_us: AtomicU64::new(crate::clock::Clock::System.now_us()),
            last_error: Mutex::new(None),
            epoch: Instant::now(),
            config,
        })
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether the store is a Redis Cluster (`[shared] nodes`).
    pub fn is_cluster(&self) -> bool {
        !self.config.nodes.is_empty()
    }

    /// Whether global rules are answered by the store now.
    pub fn is_up(&self) -> bool {
        self.state() == State::Closed
    }

    pub fn hosts_in_force(&self) -> u32 {
        self.hosts_in_force.load(Ordering::Relaxed)
    }

    pub fn hosts_live(&self) -> u32 {
        self.hosts_live.load(Ordering::Relaxed)
    }

    pub fn clock_offset_us(&self) -> i64 {
        self.clock_offset_us.load(Ordering::Relaxed)
    }

    pub fn note_store_time(&self, store_now_us: u64, local_now_us: u64) {
        self.clock_offset_us.store(store_now_us as i64 - local_now_us as i64, Ordering::Relaxed);
    }

    /// The store's time after which a batch sent now takes no place for a
    /// check: `CHECK_EXPIRY_MARGIN_MS` before this host stops waiting for
    /// its reply, so a place the store takes is one this host can give
    /// back. 0 (none) before the node's time is known. The estimate is
    /// late by the last reply's transit at most, so it errs towards
    /// keeping a check; a check expired by a wrong estimate answers with
    /// the node's time, which corrects it.
    fn checks_until_us(&self, node: &str) -> u64 {
        match self.node_clocks.lock().unwrap_or_else(|e| e.into_inner()).get(node) {
            None => 0,
            Some(offset) => {
                (self.micros() as i64 + offset).max(0) as u64 + (LATE_REPLY_WAIT_MS - CHECK_EXPIRY_MARGIN_MS) * 1000
            }
        }
    }

    /// Learns a node's clock from a batch's replies: a check's or
    /// report's (its second integer is the store's time), or an expired
    /// check's.
    fn note_node_clock(&self, node: &str, ops: &[&Op], replies: &[Result<Reply, ReplyError>]) {
        let store_now = ops.iter().zip(replies).find_map(|(op, reply)| match reply {
            Ok(reply) if matches!(op.kind, b'C' | b'R') => reply.ints.get(1).map(|&t| t.max(0) as u64),
            Err(ReplyError::Expired { store_now }) => Some(*store_now),
            _ => None,
        });
        if let Some(store_now) = store_now.filter(|&t| t > 0) {
            let offset = store_now as i64 - self.micros() as i64;
            self.node_clocks.lock().unwrap_or_else(|e| e.into_inner()).insert(node.to_string(), offset);
        }
    }

    pub fn degraded_since_us(&self) -> Option<u64> {
        match self.degraded_since_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(us),
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_last_error(&self, e: impl ToString) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
    }

    fn micros(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn set_state(&self, state: State) {
        let before = State::from_u8(self.state.swap(state.to_u8(), Ordering::AcqRel));
        if before == state {
            return;
        }
        self.stats.transitions.fetch_add(1, Ordering::Relaxed);
        let wall = crate::clock::Clock::System.now_us();
        if state == State::Closed {
            let since = self.degraded_since_us.swap(0, Ordering::Relaxed);
            if since > 0 {
                self.stats.degraded_us_total.fetch_add(wall.saturating_sub(since), Ordering::Relaxed);
            }
        } else if before == State::Closed {
            self.degraded_since_us.store(wall, Ordering::Relaxed);
        }
    }

    fn failed(&self, e: &CallError) {
        self.set_last_error(e);
        let last_success = self.last_success_us.load(Ordering::Relaxed);
        if self.is_cluster()
            && last_success > 0
            && self.micros().saturating_sub(last_success) < CLUSTER_PARTIAL_FAILURE_WINDOW_MS * 1000
        {
            return;
        }
        let opened = self.breaker.lock().unwrap_or_else(|e| e.into_inner()).failed(self.micros());
        if opened {
            self.set_state(State::Open);
            tracing::warn!(
                target: LOG_TARGET,
                error = %e,
                hosts = self.hosts_in_force(),
                "shared store unreachable; degraded: global rules counted on this host at ceil(limit / hosts)"
            );
        }
    }

    /// Starts the dispatchers. Call once, inside the runtime.
    pub fn start(self: &Arc<SharedStore>) {
        let Some(mut receiver) = self.receiver.lock().unwrap_or_else(|e| e.into_inner()).take() else { return };
        let store = self.clone();
        tokio::spawn(async move {
            let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
            let mut batch: Vec<Pending> = Vec::with_capacity(store.config.batch_max);
            while let Some(first) = receiver.recv().await {
                batch.push(first);
                while batch.len() < store.config.batch_max {
                    match receiver.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                // A caller that already gave up needs nothing sent, but for
                // a check (it may take places, given back when its reply
                // comes late) and a release (sent though nobody waits for
                // it: the places it gives back are the point). A report's
                // caller that gave up counted it on the share.
                batch.retain(|p| !p.reply.is_closed() || matches!(p.op.kind, b'C' | b'X'));
                if batch.is_empty() {
                    continue;
                }
                let permit = in_flight.clone().acquire_owned().await.expect("never closed");
                let sent = std::mem::replace(&mut batch, Vec::with_capacity(store.config.batch_max));
                let store = store.clone();
                tokio::spawn(async move {
                    store.send_batch(sent).await;
                    drop(permit);
                });
            }
        });
    }

    async fn send_batch(self: &Arc<SharedStore>, batch: Vec<Pending>) {
        let connection = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(connection) = connection else {
            for p in batch {
                let _ = p.reply.send(Err(CallError::Failed("not connected".into())));
            }
            return;
        };
        if !self.is_cluster() {
            self.send_group(connection, batch, None).await;
            return;
        }
        // A script's keys must all hash to one slot (CROSSSLOT otherwise):
        // one EVALSHA per slot, sent together; each group's callers are
        // answered as soon as its node answers. The batch holds its
        // in-flight place for at most the callers' deadline: a dead node's
        // group (waiting out its backstop) must not stall the dispatcher
        // and with it the live nodes' slots.
        let mut groups: Vec<(Option<u16>, Vec<Pending>)> = Vec::new();
        for p in batch {
            match op_slot(&p.op) {
                Ok(slot) => match groups.iter_mut().find(|(s, _)| *s == slot) {
                    Some((_, group)) => group.push(p),
                    None => groups.push((slot, vec![p])),
                },
                Err(()) => {
                    let _ = p.reply.send(Err(CallError::Failed("an op's keys span cluster slots".into())));
                }
            }
        }
        // A group whose node is away is answered at once, but for one
        // probe in each probe delay.
        let now = self.micros();
        let groups: Vec<_> = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
            groups
                .into_iter()
                .filter_map(|(slot, group)| match slot {
                    Some(s) if !nodes.admit(s, now) => {
                        let name = nodes.name_of(s).unwrap_or("?").to_string();
                        for p in group {
                            let _ = p.reply.send(Err(CallError::NodeAway(name.clone())));
                        }
                        None
                    }
                    _ => Some((slot, group)),
                })
                .collect()
        };
        let sends: Vec<_> = groups
            .into_iter()
            .map(|(slot, group)| {
                let (store, connection) = (self.clone(), connection.clone());
                tokio::spawn(async move {
                    let answered = store.send_group(connection, group, slot).await;
                    if let Some(slot) = slot {
                        store.node_outcome(slot, answered);
                    }
                })
            })
            .collect();
        let deadline = Duration::from_millis(self.config.timeout_ms);
        let _ = tokio::time::timeout(deadline, futures_util::future::join_all(sends)).await;
    }

    /// A cluster call's outcome, on its node's breaker; a change is logged
    /// and shown as the last error.
    fn node_outcome(&self, slot: u16, answered: bool) {
        let change = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).outcome(slot, answered, self.micros());
        match change {
            Change::None => {}
            Change::Opened(node) => {
                let e = CallError::NodeAway(node.clone());
                self.set_last_error(&e);
                tracing::warn!(target: LOG_TARGET, node = %node,
                    "cluster node away; its slots are answered on this host (degraded) and probed, the other nodes' slots are still asked");
            }
            Change::Closed(node) => {
                self.write_back_due.store(true, Ordering::Release);
                tracing::info!(target: LOG_TARGET, node = %node, "cluster node back; its slots are asked again");
            }
        }
    }

    /// Whether a cluster node came back since the last call: the
    /// supervisor then writes back the lockouts taken on this host's share
    /// while it was away, as after the whole store comes back.
    pub fn take_write_back_due(&self) -> bool {
        self.write_back_due.swap(false, Ordering::AcqRel)
    }

    /// Reads the cluster's slot map for the node breakers on a task of its
    /// own, unless a read is still running (each waits at most
    /// `connect_timeout_ms`). Called at every heartbeat.
    pub fn refresh_slots_in_background(self: &Arc<SharedStore>) {
        if !self.is_cluster() || self.refreshing_slots.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            if let Err(e) = store.refresh_slots().await {
                tracing::debug!(target: LOG_TARGET, error = %e, "cluster slot map not read; the last one stands");
            }
            store.refreshing_slots.store(false, Ordering::Release);
        });
    }

    /// Reads the cluster's slot map (`CLUSTER SLOTS`) for the node
    /// breakers. Off the request path.
    pub async fn refresh_slots(&self) -> Result<(), String> {
        if !self.is_cluster() {
            return Ok(());
        }
        let connection = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(mut connection) = connection else { return Err("not connected".into()) };
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = tokio::time::timeout(timeout, cmd.query_async::<redis::Value>(&mut connection))
            .await
            .map_err(|_| "CLUSTER SLOTS timed out".to_string())?
            .map_err(|e| e.to_string())?;
        self.nodes.lock().unwrap_or_else(|e| e.into_inner()).remap(&reply).map_err(str::to_string)
    }

    /// One EVALSHA for `batch` (one slot's ops in a cluster), its replies
    /// handed to the callers. True if the store answered the batch.
    async fn send_group(&self, mut connection: Connection, batch: Vec<Pending>, slot: Option<u16>) -> bool {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.batched_ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let ops: Vec<&Op> = batch.iter().map(|p| &p.op).collect();
        let cluster = self.is_cluster();
        let node = match slot {
            Some(slot) => self.nodes.lock().unwrap_or_else(|e| e.into_inner()).name_of(slot).unwrap_or("?").to_string(),
            None => String::new(),
        };
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_millis(LATE_REPLY_WAIT_MS), async {
            let checks_until_us = self.checks_until_us(&node);
            let cmd = batch_command(&self.sha, &ops, checks_until_us);
            match cmd.query_async::<redis::Value>(&mut connection).await {
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    // A restarted or flushed store: load the script and try
                    // once more. In a cluster only the node of this slot is
                    // known to lack it, and EVAL loads it exactly there.
                    self.stats.noscript_reloads.fetch_add(1, Ordering::Relaxed);
                    if cluster {
                        batch_eval_command(&ops, checks_until_us).query_async::<redis::Value>(&mut connection).await
                    } else {
                        redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query_async::<String>(&mut connection).await?;
                        cmd.query_async::<redis::Value>(&mut connection).await
                    }
                }
                other => other,
            }
        })
        .await;
        let rtt = started.elapsed().as_micros() as u64;
        self.stats.rtt_us_sum.fetch_add(rtt, Ordering::Relaxed);
        self.stats.rtt_us_max.fetch_max(rtt, Ordering::Relaxed);
        let replies = match result {
            Ok(Ok(value)) => {
                split_batch(value, batch.len()).map_err(|e| CallError::Failed(e.to_string())).inspect(|replies| {
                    let ops: Vec<&Op> = batch.iter().map(|p| &p.op).collect();
                    self.note_node_clock(&node, &ops, replies);
                })
            }
            Ok(Err(e)) => Err(CallError::Failed(e.to_string())),
            Err(_) => Err(CallError::Timeout),
        };
        match replies {
            Ok(replies) => {
                for (p, reply) in batch.into_iter().zip(replies) {
                    // A check the store ran too late took nothing: to a
                    // caller still waiting, the store was late.
                    let reply = reply.map_err(|e| match e {
                        ReplyError::Expired { .. } => CallError::Expired,
                        e => CallError::BadValue(e),
                    });
                    if let Err(reply) = p.reply.send(reply) {
                        self.stats.late_replies.fetch_add(1, Ordering::Relaxed);
                        // A check answered on this host after all: the places
                        // it took in the store must not also hold.
                        let release = match &reply {
                            Ok(reply) => p.op.release_taken(reply).ok().flatten(),
                            Err(_) => None,
                        };
                        if let Some(release) = release {
                            self.stats.releases_sent.fetch_add(1, Ordering::Relaxed);
                            let (tx, _) = oneshot::channel();
                            let _ = self.queue.try_send(Pending { op: release, reply: tx });
                        }
                    }
                }
            }
            Err(e) => {
                for p in batch {
                    let _ = p.reply.send(Err(e.clone()));
                }
                return false;
            }
        }
        true
    }

    /// Drops the connection and makes a new one, loads the script and
    /// checks the secret's fingerprint. Bounded by `connect_timeout_ms`
    /// per step. Off the request path (the supervisor).
    pub async fn connect(&self, fingerprint: &str) -> Result<(), ProbeError> {
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let mut connection = if self.is_cluster() {
            let client = self.cluster_client().map_err(ProbeError::Unreachable)?;
            Connection::Cluster(
                tokio::time::timeout(connect_timeout, client.get_async_connection())
                    .await
                    .map_err(|_| ProbeError::Unreachable("connect timed out".into()))?
                    .map_err(|e| ProbeError::Unreachable(e.to_string()))?,
            )
        } else {
            let client = self.client(&self.config.url).map_err(ProbeError::Unreachable)?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(Duration::from_millis(LATE_REPLY_WAIT_MS)));
            Connection::Single(
                tokio::time::timeout(connect_timeout, client.get_multiplexed_async_connection_with_config(&config))
                    .await
                    .map_err(|_| ProbeError::Unreachable("connect timed out".into()))?
                    .map_err(|e| ProbeError::Unreachable(e.to_string()))?,
            )
        };
        // In a cluster the client sends SCRIPT LOAD to every primary. A
        // primary that is away must not keep the others from serving their
        // slots: its batches answer NOSCRIPT later and load it by EVAL.
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(SCRIPT);
        let loaded = tokio::time::timeout(connect_timeout, load.query_async::<String>(&mut connection))
            .await
            .map_err(|_| "SCRIPT LOAD timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match loaded {
            Ok(_) => {}
            Err(e) if self.is_cluster() => {
                tracing::warn!(target: LOG_TARGET, error = %e, "SCRIPT LOAD did not reach every cluster primary; a node that lacks it loads it on first use");
            }
            Err(e) => return Err(ProbeError::Unreachable(e)),
        }
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = Some(connection);
        self.assert_fingerprint(fingerprint).await
    }

    /// Records this host's secret fingerprint in the store if none is
    /// (a first join, or a store that lost its data), and refuses if
    /// another is. At every connection and every heartbeat: after a flush
    /// the running hosts write it back within a heartbeat, so a host keyed
    /// otherwise cannot claim the store. Bounded by `connect_timeout_ms`.
    pub async fn assert_fingerprint(&self, fingerprint: &str) -> Result<(), ProbeError> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let join = Op::join(format!("{}:{{meta}}", self.config.key_prefix), fingerprint);
        let reply = self.call_unchecked(join, connect_timeout).await.map_err(|e| match e {
            CallError::BadValue(_) => ProbeError::Refused(format!(
                "the store holds a key {}:{{meta}} tollgate did not write; choose another key_prefix",
                self.config.key_prefix
            )),
            e => ProbeError::Unreachable(e.to_string()),
        })?;
        let recorded = reply.strings.first().map(String::as_str).unwrap_or("");
        if recorded != fingerprint {
            return Err(ProbeError::Refused(format!(
                "shared store {} was joined with another secret key (fingerprint {recorded}, this host's is {fingerprint}): \
                 copy the secret file from a host that is already in, or set [shared] key_prefix to another prefix",
                self.config.url
            )));
        }
        Ok(())
    }

    /// A client for the configured store, with its credentials (read from
    /// the password file each time, so a rotated password is picked up by
    /// the next connection) and, for rediss://, the CA bundle to trust (read
    /// each time too, so a renewed CA is picked up the same way).
    fn client(&self, url: &str) -> Result<redis::Client, String> {
        let mut info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| e.to_string())?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.config.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = self.password()? {
            settings = settings.set_password(password);
        }
        info = info.set_redis_settings(settings);
        match self.tls_files()? {
            // Without a CA file a rediss:// URL trusts the platform's roots
            // (rustls-native-certs), as redis-rs does by itself.
            None => redis::Client::open(info).map_err(|e| e.to_string()),
            Some(certs) => redis::Client::build_with_tls(info, certs).map_err(|e| self.tls_error(e)),
        }
    }

    /// The CA bundle of a TLS store (`tls_ca_file`) and this host's client
    /// certificate and key (`tls_cert_file`, `tls_key_file`), if any is
    /// configured.
    fn tls_files(&self) -> Result<Option<redis::TlsCertificates>, String> {
        let read = |key: &str, path: &Path| {
            std::fs::read(path).map_err(|e| format!("cannot read {key} {}: {e}", path.display()))
        };
        let c = &self.config;
        let root_cert = c.tls_ca_file.as_deref().map(|path| read("tls_ca_file", path)).transpose()?;
        let client_tls = match (&c.tls_cert_file, &c.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert_file", cert)?,
                client_key: read("tls_key_file", key)?,
            }),
            _ => None,
        };
        if root_cert.is_none() && client_tls.is_none() {
            return Ok(None);
        }
        Ok(Some(redis::TlsCertificates { client_tls, root_cert }))
    }

    /// A client that cannot be built from the TLS files says which ones.
    fn tls_error(&self, e: redis::RedisError) -> String {
        let c = &self.config;
        let files: Vec<String> =
            [("tls_ca_file", &c.tls_ca_file), ("tls_cert_file", &c.tls_cert_file), ("tls_key_file", &c.tls_key_file)]
                .into_iter()
                .filter_map(|(key, path)| path.as_ref().map(|p| format!("{key} {}", p.display())))
                .collect();
        if files.is_empty() {
            e.to_string()
        } else {
            format!("{}: {e}", files.join(", "))
        }
    }

    fn password(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.config.password_file else { return Ok(None) };
        let password = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(Some(password.trim_end_matches(['\n', '\r']).to_string()))
    }

    /// The cluster client for the seed nodes, with the same credentials on
    /// every node. It retries once (after refreshing its slot map, which
    /// follows a failover), with short waits: tollgate's own deadline and
    /// breaker decide how long a caller waits, not the driver.
    fn cluster_client(&self) -> Result<redis::cluster::ClusterClient, String> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.config.nodes.iter().map(String::as_str))
            .connection_timeout(Duration::from_millis(self.config.connect_timeout_ms))
            .response_timeout(Duration::from_millis(LATE_REPLY_WAIT_MS))
            .overall_response_timeout(Some(Duration::from_millis(LATE_REPLY_WAIT_MS)))
            .retries(1)
            .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
            .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS);
        if let Some(user) = &self.config.username {
            builder = builder.username(user);
        }
        if let Some(password) = self.password()? {
            builder = builder.password(password);
        }
        // rediss:// seed nodes make every node's connection TLS; the CA
        // bundle, if any, is what their certificates must chain to.
        if let Some(certs) = self.tls_files()? {
            builder = builder.certs(certs);
        }
        builder.build().map_err(|e| self.tls_error(e))
    }

    /// A subscription: on the store, or in a cluster on the first seed node
    /// that answers (a cluster's PUBLISH, a script's too, reaches the
    /// subscribers of every node).
    async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, String> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let urls: Vec<&str> = if self.is_cluster() {
            self.config.nodes.iter().map(String::as_str).collect()
        } else {
            vec![self.config.url.as_str()]
        };
        let mut why = String::from("no node to subscribe on");
        for url in urls {
            let attempt = async {
                let client = self.client(url)?;
                let mut pubsub = tokio::time::timeout(connect_timeout, client.get_async_pubsub())
                    .await
                    .map_err(|_| "subscribing timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                tokio::time::timeout(connect_timeout, pubsub.subscribe(channel))
                    .await
                    .map_err(|_| "subscribing timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(pubsub)
            };
            match attempt.await {
                Ok(pubsub) => return Ok(pubsub),
                Err(e) => why = e,
            }
        }
        Err(why)
    }

    /// Listens for the lockouts and unlocks other hosts publish, calling
    /// `heard` with each message, until the connection ends. Once
    /// subscribed, first replays the unlocks logged in `unlock_log`: those
    /// published while this host was not listening (the store restarted,
    /// this host was down) among them. Hearing an unlock again only
    /// forgets known lockouts, which the store still refuses if it knows.
    pub async fn listen(
        &self,
        channel: &str,
        unlock_log: &str,
        mut heard: impl FnMut(&str, Option<u64>),
    ) -> Result<(), String> {
        use futures_util::StreamExt;
        let pubsub = self.subscribe(channel).await?;
        let connection = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(mut connection) = connection {
            let mut cmd = redis::cmd("ZRANGEBYSCORE");
            cmd.arg(unlock_log).arg("-inf").arg("+inf").arg("LIMIT").arg(0).arg(UNLOCK_LOG_MAX);
            let timeout = Duration::from_millis(self.config.connect_timeout_ms);
            match tokio::time::timeout(timeout, cmd.query_async::<Vec<String>>(&mut connection)).await {
                Ok(Ok(logged)) => {
                    for entry in logged {
                        // "<wall µs> <message>": the stamp keeps equal
                        // messages apart in the set.
                        let Some((at, message)) = entry.split_once(' ') else { continue };
                        let Ok(at) = at.parse::<u64>() else { continue };
                        self.stats.messages_heard.fetch_add(1, Ordering::Relaxed);
                        heard(message, Some(at));
                    }
                }
                // Not fatal: the live messages still come, as before there
                // was a log (a store user not allowed ZRANGEBYSCORE).
                Ok(Err(e)) => tracing::warn!(target: LOG_TARGET, error = %e, "the unlock log was not read"),
                Err(_) => tracing::warn!(target: LOG_TARGET, "reading the unlock log timed out"),
            }
        }
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if let Ok(text) = std::str::from_utf8(message.get_payload_bytes()) {
                self.stats.messages_heard.fetch_add(1, Ordering::Relaxed);
                heard(text, None);
            }
        }
        Ok(())
    }

    /// Publishes a message for the other hosts, not waited for.
    pub fn publish(self: &Arc<SharedStore>, channel: String, message: String) {
        let Some(mut connection) = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let store = self.clone();
        tokio::spawn(async move {
            let mut cmd = redis::cmd("PUBLISH");
            cmd.arg(channel).arg(message);
            if let Ok(Ok(_)) = tokio::time::timeout(timeout, cmd.query_async::<i64>(&mut connection)).await {
                store.stats.messages_published.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    /// Logs unlock messages in `log.0`, a sorted set by `now_us` holding
    /// `log.1` µs of them (and at most `UNLOCK_LOG_MAX`), for the hosts
    /// not listening when they were published; then, with `publish_last`,
    /// publishes the last one on `channel`. Not waited for.
    pub fn log_and_publish(
        self: &Arc<SharedStore>,
        (unlock_log, keep_us): (String, u64),
        channel: String,
        messages: Vec<String>,
        publish_last: bool,
        now_us: u64,
    ) {
        let Some(mut connection) = self.connection.lock().unwrap_or_else(|e| e.into_inner()).clone() else { return };
        if messages.is_empty() {
            return;
        }
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let store = self.clone();
        tokio::spawn(async move {
            let mut pipe = redis::pipe();
            for message in &messages {
                pipe.cmd("ZADD").arg(&unlock_log).arg(now_us).arg(format!("{now_us} {message}")).ignore();
            }
            pipe.cmd("ZREMRANGEBYSCORE").arg(&unlock_log).arg("-inf").arg(now_us.saturating_sub(keep_us)).ignore();
            pipe.cmd("ZREMRANGEBYRANK").arg(&unlock_log).arg(0).arg(-(UNLOCK_LOG_MAX as i64) - 1).ignore();
            pipe.cmd("PEXPIRE").arg(&unlock_log).arg(keep_us.div_ceil(1000).max(1)).ignore();
            if let Err(e) = tokio::time::timeout(timeout, pipe.query_async::<()>(&mut connection))
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            {
                tracing::warn!(target: LOG_TARGET, error = %e, "an unlock was not logged; hosts not listening now miss it");
            }
            if publish_last {
                let mut cmd = redis::cmd("PUBLISH");
                cmd.arg(channel).arg(messages.last().expect("not empty"));
                if let Ok(Ok(_)) = tokio::time::timeout(timeout, cmd.query_async::<i64>(&mut connection)).await {
                    store.stats.messages_published.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }

    /// This host is alive; learns how many are. Returns the live count.
    pub async fn heartbeat(&self, host: &str, local_now_us: u64) -> Result<u32, CallError> {
        let op = Op::heartbeat(format!("{}:{{hosts}}", self.config.key_prefix), host, self.config.host_ttl_ms * 1000);
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let reply = self.call_unchecked(op, timeout).await?;
        let mut ints = script::Ints::new(&reply);
        let live = ints.u32().map_err(CallError::BadValue)?;
        let store_now = ints.unsigned().map_err(CallError::BadValue)?;
        self.note_store_time(store_now, local_now_us);
        self.hosts_live.store(live, Ordering::Relaxed);
        Ok(live)
    }

    pub fn set_hosts_in_force(&self, n: u32) -> bool {
        self.hosts_in_force.swap(n.max(1), Ordering::Relaxed) != n.max(1)
    }

    /// At start, with `hosts = 0`: the count learned before the restart
    /// (kept in the state file) stands until the store is heard from.
    pub fn remember_hosts(&self, n: u32) {
        if self.config.hosts == 0 && n > 0 {
            self.hosts_in_force.store(n, Ordering::Relaxed);
            self.hosts_remembered.store(n, Ordering::Relaxed);
        }
    }

    /// The count remembered from the state file, until the store's first
    /// learned count replaces it.
    pub fn hosts_remembered(&self) -> Option<u32> {
        Some(self.hosts_remembered.load(Ordering::Relaxed)).filter(|n| *n > 0)
    }

    /// Forgets the remembered count; whether there was one.
    pub fn take_hosts_remembered(&self) -> bool {
        self.hosts_remembered.swap(0, Ordering::Relaxed) > 0
    }

    /// Breaker steps for the supervisor.
    pub fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now_us(&self) -> u64 {
        self.micros()
    }

    /// Applies the breaker's state to what requests see.
    pub fn publish_state(&self) {
        let state = self.breaker().state;
        self.set_state(state);
    }

    pub fn note_error(&self, e: impl ToString) {
        self.set_last_error(e);
    }
}

/// rustls needs one process-wide crypto provider; tollgate builds rustls
/// with ring only. Installing it twice (another store, a test's second
/// daemon in the same process) is not an error.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Unreachable(String),
    /// Joining would mix this host's keys with another secret's.
    #[error("{0}")]
    Refused(String),
}
