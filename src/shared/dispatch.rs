//! The dispatcher: callers' ops gathered into batches, one script call
//! a batch (a cluster's split by slot), the replies handed back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::nodes::Change;
use super::script::{batch_command, batch_eval_command, op_slot, split_batch, Op, Reply, ReplyError, SCRIPT};
use super::{CallError, Connection, Pending, SharedStore, BATCHES_IN_FLIGHT_MAX, LATE_REPLY_WAIT_MS, LOG_TARGET};
use crate::unpoisoned::Unpoisoned;

/// How long before `LATE_REPLY_WAIT_MS` runs out a check sent to the store
/// stops taking places there (for the reply's way back).
const CHECK_EXPIRY_MARGIN_MS: u64 = 100;

impl SharedStore {
    /// The store's time after which a batch sent now takes no place for a
    /// check: `CHECK_EXPIRY_MARGIN_MS` before this host stops waiting for
    /// its reply, so a place the store takes is one this host can give
    /// back. 0 (none) before the node's time is known, or for a slot whose
    /// node is not yet mapped ("?": several nodes' clocks would mix). The
    /// estimate lags the node by the last reply's script time and way
    /// back, so it errs towards expiring a check (taking no place), never
    /// towards a place nobody gives back; an expired check answers with the
    /// node's time, which corrects it.
    fn checks_until_us(&self, node: &str) -> u64 {
        if node == "?" {
            return 0;
        }
        match self.node_clocks.locked().get(node) {
            None => 0,
            Some(offset) => {
                (self.micros() as i64 + offset).max(0) as u64 + (LATE_REPLY_WAIT_MS - CHECK_EXPIRY_MARGIN_MS) * 1000
            }
        }
    }

    /// A time in the store's clock, for a key named `name`, as this host's
    /// (`now_us` is its time now). In a Cluster each node has its own
    /// clock: the one of the node holding the key, once a reply from it
    /// gave its offset; else the store's last reply's.
    pub fn host_time_of(&self, name: &str, store_us: u64, now_us: u64) -> u64 {
        let store_us = store_us.min(i64::MAX as u64) as i64;
        let node_offset = self.is_cluster().then(|| {
            let slot = super::script::hash_slot(name.as_bytes());
            let node = self.nodes.locked().name_of(slot).map(str::to_string)?;
            self.node_clocks.locked().get(&node).copied()
        });
        match node_offset.flatten() {
            // The offset is to this store's running clock: how long ago
            // that was, taken from now.
            Some(offset) => {
                let ago = (self.micros() as i64).saturating_sub(store_us.saturating_sub(offset));
                (now_us as i64).saturating_sub(ago).max(0) as u64
            }
            None => store_us.saturating_sub(self.clock_offset_us()).max(0) as u64,
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
            // Updated in place: a node's name is allocated once, not once
            // a batch.
            let mut clocks = self.node_clocks.locked();
            match clocks.get_mut(node) {
                Some(known) => *known = offset,
                None => {
                    clocks.insert(node.to_string(), offset);
                }
            }
        }
    }

    /// Starts the dispatchers. Call once, inside the runtime.
    pub fn start(self: &Arc<SharedStore>) {
        let Some(mut receiver) = self.receiver.locked().take() else { return };
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
                batch.retain(Pending::wanted);
                if batch.is_empty() {
                    continue;
                }
                let permit = in_flight.clone().acquire_owned().await.expect("never closed");
                // Sized to the batch, not to batch_max: a 64-op buffer for
                // every batch was a large allocation on its own.
                let mut sent = Vec::with_capacity(batch.len());
                sent.append(&mut batch);
                let store = store.clone();
                tokio::spawn(async move {
                    store.send_batch(sent).await;
                    drop(permit);
                });
            }
        });
    }

    async fn send_batch(self: &Arc<SharedStore>, batch: Vec<Pending>) {
        let connection = self.connection.locked().clone();
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
            let mut nodes = self.nodes.locked();
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

    /// A batch goes to the store (and `slot`'s node, in a cluster): owed
    /// from now, unless one already is (`breaker::replying`).
    fn sent(&self, slot: Option<u16>) {
        let now = self.micros().max(1);
        let _ = self.owing_since_us.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        if let Some(slot) = slot {
            self.nodes.locked().sent(slot, now);
        }
    }

    /// The store (and `slot`'s node) replied to a batch, late or not: it
    /// owes none.
    fn replied(&self, slot: Option<u16>) {
        self.owing_since_us.store(0, Ordering::Relaxed);
        if let Some(slot) = slot {
            self.nodes.locked().replied(slot);
        }
    }

    /// A cluster call's outcome, on its node's breaker; a change is logged
    /// and shown as the last error.
    fn node_outcome(&self, slot: u16, answered: bool) {
        let change = self.nodes.locked().outcome(slot, answered, self.micros());
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

    /// A lockout's merge failed: write back again at the next heartbeat.
    pub fn retry_write_back(&self) {
        self.write_back_retry.store(true, Ordering::Release);
    }

    /// Whether a failed merge is to be tried again (once a heartbeat).
    pub fn take_write_back_retry(&self) -> bool {
        self.write_back_retry.swap(false, Ordering::AcqRel)
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
        let connection = self.connection.locked().clone();
        let Some(mut connection) = connection else { return Err("not connected".into()) };
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = tokio::time::timeout(timeout, cmd.query_async::<redis::Value>(&mut connection))
            .await
            .map_err(|_| "CLUSTER SLOTS timed out".to_string())?
            .map_err(|e| e.to_string())?;
        self.nodes.locked().remap(&reply).map_err(str::to_string)
    }

    /// One EVALSHA for `batch` (one slot's ops in a cluster), its replies
    /// handed to the callers. True if the store answered the batch.
    async fn send_group(&self, mut connection: Connection, batch: Vec<Pending>, slot: Option<u16>) -> bool {
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.batched_ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let ops: Vec<&Op> = batch.iter().map(|p| &p.op).collect();
        let cluster = self.is_cluster();
        let node = match slot {
            Some(slot) => self.nodes.locked().name_of(slot).unwrap_or("?").to_string(),
            None => String::new(),
        };
        let started = Instant::now();
        self.sent(slot);
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
                    self.replied(slot);
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
                    let orphan = p.is_orphan();
                    if let Err(reply) = p.reply.send(reply) {
                        // An orphan's reply has nobody to be late for.
                        if !orphan {
                            self.stats.late_replies.fetch_add(1, Ordering::Relaxed);
                        }
                        // A check answered on this host after all: the places
                        // it took in the store must not also hold.
                        let release = match &reply {
                            Ok(reply) => p.op.release_taken(reply).ok().flatten(),
                            Err(_) => None,
                        };
                        if let Some(release) = release {
                            self.release_unwaited(release);
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
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;
    use crate::config::Config;

    /// A published store time is made this host's with the clock of the
    /// node holding the key: a Cluster's nodes may disagree, and the last
    /// reply's offset may be another node's (a red team's finding).
    #[test]
    fn a_store_time_is_made_this_hosts_by_its_keys_node_clock() {
        let text = "[shared]\nnodes = [\"redis://127.0.0.1:7000\"]\n";
        let config = Config::build(Config::parse(text).expect("parses")).expect("valid");
        let store = SharedStore::new(config.shared.expect("shared"));
        let slots = |port: i64| {
            Value::Array(vec![
                Value::Int(0),
                Value::Int(16383),
                Value::Array(vec![Value::BulkString(b"127.0.0.1".to_vec()), Value::Int(port)]),
            ])
        };
        store.nodes.locked().remap(&Value::Array(vec![slots(7000)])).expect("a slot map");
        let name = "tg:{00000000deadbeef}:f:login/x:00";
        let now = 1_000_000_000;
        // The last reply (another node's, say) put the store 5 s ahead.
        store.note_store_time(now + 5_000_000, now);
        assert_eq!(store.host_time_of(name, now + 5_000_000, now), now, "no offset of its node yet");
        // Its node runs 2 s behind this host: its time `t` is this host's `t + 2 s`.
        let node_now = now - 2_000_000;
        store.node_clocks.locked().insert("127.0.0.1:7000".into(), node_now as i64 - store.micros() as i64);
        let got = store.host_time_of(name, node_now - 300_000, now);
        assert!(got.abs_diff(now - 300_000) < 50_000, "{got} is not 300 ms ago");
    }
}
