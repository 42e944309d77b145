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
pub mod busy_runs;
mod connect;
mod dispatch;
pub mod hot;
pub mod nodes;
mod pubsub;
pub mod script;
mod ticket;

pub use connect::{install_tls_provider, store_fingerprint};
pub use ticket::{LateReply, Ticket};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{mpsc, oneshot};

pub use breaker::State;
use breaker::{Breaker, LateRun};
use nodes::Nodes;
use script::{Op, Reply, ReplyError, SCRIPT};

use crate::config::SharedConfig;
use crate::unpoisoned::Unpoisoned;

/// The target of the shared store's log lines.
pub const LOG_TARGET: &str = "tollgate::shared";
/// How long a batch's future may wait for a late reply after its callers
/// gave up: long enough to learn which places a late check took (and give
/// them back), short enough that a dead connection's batches do not pile up.
pub const LATE_REPLY_WAIT_MS: u64 = 1000;
/// Batches one dispatcher keeps in flight on its connection: the driver
/// pipelines them, and Redis runs each script whole.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;

/// Orphaned reports (`ticket::Orphan`: held for queue room when their
/// connection went) waiting for room at once; past it they are lost. A
/// client would have to close mid-run while the queue is full, again and
/// again, to reach it; each waits `LATE_REPLY_WAIT_MS` at most.
pub const ORPHANS_WAITING_MAX: usize = 4096;
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
    /// A check with no reply within the timeout from a busy store
    /// (`SharedStore::lateness`), while another check of this host
    /// waits on one of its keys: part of a burst on them, queued, not
    /// lost. The caller refuses rather than answer on its share, and the
    /// breaker does not move.
    #[error("the store is busy: no reply within the timeout, amid a burst on the check's keys")]
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
    /// A report's: set when its ticket was dropped before its wait ended
    /// (`ticket::Orphan`), so nobody counts it but the store.
    orphaned: Option<Arc<AtomicBool>>,
}

impl Pending {
    /// Whether the op is still worth sending. A caller that gave up needs
    /// nothing sent, but for a check (it may take places, given back when
    /// its reply comes late), a release (sent though nobody waits for it:
    /// the places it gives back are the point) and an orphaned report. A
    /// report whose caller gave up after waiting counted it on the share.
    fn wanted(&self) -> bool {
        // Closed first: an orphan's flag is set before its receiver goes.
        !self.reply.is_closed() || matches!(self.op.kind, b'C' | b'X') || self.is_orphan()
    }

    fn is_orphan(&self) -> bool {
        self.orphaned.as_ref().is_some_and(|o| o.load(Ordering::Acquire))
    }
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
    /// Since when the store has owed a reply (`micros`: the first batch
    /// sent after its last reply, late or not), 0 none; a cluster's nodes'
    /// too (`Nodes::owing_since_us`).
    owing_since_us: AtomicU64,
    /// The keys this host's checks wait on.
    hot: hot::HotKeys,
    /// How long each requester has been refused as busy.
    busy_runs: busy_runs::BusyRuns,
    state: AtomicU8,
    breaker: Mutex<Breaker>,
    /// In a cluster: which node serves each slot, and a breaker per node.
    nodes: Mutex<Nodes>,
    /// A slot map read is running (`refresh_slots_in_background`).
    refreshing_slots: AtomicBool,
    /// A cluster node came back: the lockouts this host took on its share
    /// meanwhile are to be written back (`take_write_back_due`).
    write_back_due: AtomicBool,
    /// A merge failed (timed out, say): the write-back is tried again at
    /// the next heartbeat (`take_write_back_retry`).
    write_back_retry: AtomicBool,
    /// Since when the store's record of the fingerprint is, as this host
    /// last read it (`note_record_since`).
    record_since: Mutex<Option<String>>,
    /// The record was made again since: the store lost its data.
    store_forgot: AtomicBool,
    /// Refused for another fingerprint in the record: this host's joins
    /// then never make a record (`SharedStore::assert_fingerprint`).
    refused_by_record: AtomicBool,
    /// The store names a write-back cut short sent: the next sends them
    /// last (`Limiter::write_back_pass`).
    pub write_back_tried: Mutex<HashSet<String>>,
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
    /// Orphaned reports waiting for queue room (`ticket::Orphan`), at most
    /// `ORPHANS_WAITING_MAX`.
    orphans_waiting: Arc<AtomicUsize>,
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
            owing_since_us: AtomicU64::new(0),
            hot: hot::HotKeys::default(),
            busy_runs: busy_runs::BusyRuns::default(),
            state: AtomicU8::new(State::Open.to_u8()),
            breaker: Mutex::new(breaker),
            nodes: Mutex::new(Nodes::new(
                config.breaker_failures,
                config.probe_interval_ms * 1000,
                config.probe_max_ms * 1000,
            )),
            refreshing_slots: AtomicBool::new(false),
            write_back_due: AtomicBool::new(false),
            write_back_retry: AtomicBool::new(false),
            record_since: Mutex::new(None),
            store_forgot: AtomicBool::new(false),
            refused_by_record: AtomicBool::new(false),
            write_back_tried: Mutex::new(HashSet::new()),
            stats: SharedStats::default(),
            hosts_in_force: AtomicU32::new(hosts),
            hosts_live: AtomicU32::new(0),
            hosts_remembered: AtomicU32::new(0),
            clock_offset_us: AtomicI64::new(0),
            node_clocks: Mutex::new(HashMap::new()),
            degraded_since_us: AtomicU64::new(crate::clock::Clock::System.now_us()),
            last_error: Mutex::new(None),
            epoch: Instant::now(),
            orphans_waiting: Arc::new(AtomicUsize::new(0)),
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

    /// A store time of 0 (none in the reply) leaves the offset as it was.
    pub fn note_store_time(&self, store_now_us: u64, local_now_us: u64) {
        if store_now_us == 0 {
            return;
        }
        self.clock_offset_us.store(store_now_us as i64 - local_now_us as i64, Ordering::Relaxed);
    }

    pub fn degraded_since_us(&self) -> Option<u64> {
        match self.degraded_since_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(us),
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.locked().clone()
    }

    fn set_last_error(&self, e: impl ToString) {
        *self.last_error.locked() = Some(e.to_string());
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
        let opened = self.breaker.locked().failed(self.micros());
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
        self.breaker.locked()
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

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    Unreachable(String),
    /// Joining would mix this host's keys with another secret's.
    #[error("{0}")]
    Refused(String),
}
