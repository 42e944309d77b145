//! The daemon's side of the shared store: a check or report with global
//! rules waits for the store at most its timeout, then is answered on this
//! host; a supervisor task probes the store while it is away, writes back
//! the lockouts taken meanwhile, keeps this host's heartbeat, and learns
//! how many hosts share the limits.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::Daemon;
use crate::limiter::{AwaitingStore, Begun, Echo, Limiter, Stored};
use crate::protocol::Verdict;
use crate::shared::script::Reply;
use crate::shared::{
    CallError, LateReply, ProbeError, SharedStore, State, Ticket, HOSTS_LEARNED_MEMORY_MS, LOG_TARGET,
};
use crate::store::Durable;
use crate::unpoisoned::Unpoisoned;

/// How often the supervisor looks at the breaker: the granularity of a
/// probe's back-off and of the heartbeat.
const SUPERVISOR_TICK_MS: u64 = 10;
/// Lockouts written back per batch after an outage (and devices taught
/// per chunk after a loss of data: `teach.rs`).
pub(super) const WRITE_BACK_BATCH: usize = 64;

impl Daemon {
    pub(crate) fn shared(&self) -> Option<&Arc<SharedStore>> {
        self.shared.as_ref()
    }

    /// A check's or report's store half, begun by the limiter
    /// (`Begun`): the op for its global rules queued to the store (not
    /// waited for). Done here for a known lockout, or if the store cannot
    /// be asked (this host's degraded share).
    #[inline(never)]
    pub(super) fn start_shared<'s, 'l>(
        &self,
        store: &'s Arc<SharedStore>,
        limiter: &'l Limiter,
        begun: Begun<'l>,
        now: u64,
    ) -> SharedStart<Reported<'l>, Ticket<'s>, AwaitingStore<'l>> {
        let mut pending = match begun {
            Begun::Done(verdict, durable) => return SharedStart::Done((verdict, durable, false)),
            Begun::KnownLockout(verdict) => {
                store.stats.known_lockout_refusals.fetch_add(1, Ordering::Relaxed);
                // From memory either way; degraded when the store could
                // not have been asked.
                if !store.is_up() {
                    return SharedStart::Done((degraded(store, verdict), Vec::new(), true));
                }
                return SharedStart::Done((verdict, Vec::new(), false));
            }
            Begun::Store(pending) => pending,
        };
        match store.submit(pending.take_op()) {
            Ok(ticket) => SharedStart::Waiting(ticket, pending),
            Err(e) => SharedStart::Done(self.answered(store, limiter, pending, (Err(e), &[]), now)),
        }
    }

    /// A check's or report's second half: the store's reply (or its
    /// absence by the deadline), and the verdict from it or from this
    /// host's share.
    pub(super) async fn finish_shared<'l>(
        &self,
        limiter: &'l Limiter,
        ticket: Ticket<'_>,
        pending: AwaitingStore<'l>,
        now: u64,
    ) -> Reported<'l> {
        // A check's keys, for marking the crowded ones (a report marks none).
        let keys = if pending.is_check() { ticket.key_hashes() } else { SmallVec::new() };
        let (reply, late) = ticket.wait_or_hear_later().await;
        let store = self.shared().expect("a ticket comes from the store");
        if let Some(late) = late {
            self.hear_later(store, limiter, pending.echo(), late, now);
        }
        self.answered(store, limiter, pending, (reply, &keys), now)
    }

    /// A reply the busy store sends after its request was answered: read
    /// off the request path (`Limiter::heard_late`), so the store's word
    /// reaches this host's share and its lockouts the other hosts. With
    /// the limiter reloaded meanwhile it is left to the dispatcher, which
    /// gives back what a late check took.
    fn hear_later(&self, store: &Arc<SharedStore>, limiter: &Limiter, echo: Echo, late: LateReply, now: u64) {
        let current = self.limiter().load_full();
        if !std::ptr::eq(Arc::as_ptr(&current), limiter) {
            return;
        }
        let (store, clock) = (store.clone(), self.clock.clone());
        tokio::spawn(async move {
            let Some(reply) = late.heard().await else { return };
            store.stats.late_replies.fetch_add(1, Ordering::Relaxed);
            // Its words last from when it is heard.
            let heard = current.heard_late(&echo, &reply, clock.now_us().max(now));
            if let Some(op) = heard.give_back {
                store.release_unwaited(op);
            }
            for message in heard.locked {
                store.publish(current.shared_channel(), message);
            }
        });
    }

    fn answered<'l>(
        &self,
        store: &Arc<SharedStore>,
        limiter: &'l Limiter,
        pending: AwaitingStore<'l>,
        (reply, keys): (Result<Reply, CallError>, &[u64]),
        now: u64,
    ) -> Reported<'l> {
        let pending = match reply {
            Ok(reply) => match limiter.finish_stored(pending, &reply, now) {
                Ok(Stored { verdict, store_now, durable, locked, give_back, teach, crowded }) => {
                    store.note_store_time(store_now, now);
                    // Others' attempts in flight there: the next late check
                    // on these keys is part of a burst, from whichever host.
                    let crowded: SmallVec<[u64; 4]> = crowded.iter().filter_map(|&j| keys.get(j).copied()).collect();
                    if !crowded.is_empty() {
                        store.mark_crowded(&crowded);
                    }
                    if let Some(op) = give_back {
                        store.release_unwaited(op);
                    }
                    if let Some(op) = teach {
                        store.send_unwaited(op);
                    }
                    for message in locked {
                        store.publish(limiter.shared_channel(), message);
                    }
                    return (verdict, durable, false);
                }
                Err((pending, e)) => {
                    self.bad_store_value(store, &e.to_string(), now);
                    pending
                }
            },
            // A check queued behind a burst on its own keys (another check
            // of this host waited on one, or the store showed others'
            // attempts in flight there): refused, so the burst cannot add
            // this host's share to the store's limit. Its op still runs;
            // the places a late admission takes are given back when its
            // reply comes. A lone late check (`Late`) is answered on the
            // share, as is a report.
            Err(CallError::Busy) => match limiter.finish_busy(pending, now) {
                Ok(verdict) => return (verdict, Vec::new(), false),
                Err(pending) => pending,
            },
            Err(e) => {
                if let CallError::BadValue(e) = &e {
                    self.bad_store_value(store, &e.to_string(), now);
                }
                pending
            }
        };
        let (verdict, durable) = limiter.finish_locally(pending, now);
        (degraded(store, verdict), durable, true)
    }

    /// An unlock's store half: every global rule's entries of the account
    /// (or of the account and source), in the store; the keys unlocked are
    /// forgotten here and published to the other hosts. How many entries
    /// held failures, or why the store was not reached.
    pub(super) async fn unlock_shared(
        &self,
        store: &Arc<SharedStore>,
        limiter: &Limiter,
        route: &str,
        account: &str,
        source: Option<std::net::IpAddr>,
        now: u64,
    ) -> Result<u32, String> {
        let ops = limiter.unlock_ops(route, account, source, now).map_err(|e| e.to_string())?;
        if !store.is_up() {
            return Err(format!("the store is {}", store.state().name()));
        }
        // What the other hosts must forget is logged (a host not
        // subscribed now, after a store restart say, reads it when it
        // subscribes again), stamped in the store's time (hosts' clocks
        // differ, the store's is one): a source's keys, or the account's
        // message (every host forgets its known lockouts by its tag, which
        // works after the store lost its index). Then the script unlocks
        // and publishes each key it unlocked in the same step, to the
        // hosts listening, even if this host dies right after.
        let log = (limiter.shared_unlock_log(), limiter.unlock_log_keep_us());
        let stamp = || (self.clock().now_us() as i64 + store.clock_offset_us()).max(0) as u64;
        let first: Vec<String> = match source {
            Some(_) => ops.iter().filter_map(|op| op.keys.first()).map(|name| format!("U {name}")).collect(),
            None => vec![limiter.account_unlock_message(route, account)],
        };
        // Every rule's op in flight at once (as many as the queue takes),
        // beside the log write, which is sent first on the same
        // connection: a slow store costs the unlock one round trip, not
        // one per rule or one more for the log.
        let total = ops.len();
        let unlocking = async {
            let (mut cleared, mut done, mut failed) = (0, 0, None);
            // An account's entries the script named, logged too: a host
            // that restored a lockout from its state file knows it by name
            // only.
            let mut named = Vec::new();
            for chunk in ops.chunks(store.config.pending_max.max(1)) {
                let calls = chunk.iter().map(|op| store.call_recovering(op.clone()));
                for reply in futures_util::future::join_all(calls).await {
                    match reply {
                        Ok(reply) => {
                            done += 1;
                            cleared += reply.ints.first().copied().unwrap_or(0).clamp(0, u32::MAX as i64) as u32;
                            for name in &reply.strings {
                                limiter.forget_known_lockout(name, u64::MAX, self.clock().now_us());
                                limiter.forget_count_unlocked(name);
                                if source.is_none() {
                                    named.push(format!("U {name}"));
                                }
                            }
                        }
                        Err(e) => failed = Some(e.to_string()),
                    }
                }
            }
            (cleared, done, failed, named)
        };
        let logged_at = stamp();
        let ((), (mut cleared, done, failed, named)) =
            tokio::join!(store.log_unlocks(log.clone(), &first, logged_at), unlocking);
        if done == 0 {
            // Nothing was unlocked in the store: a host replaying the log
            // must not forget lockouts the store still holds.
            store.unlog_unlocks(log.0.clone(), first.clone(), logged_at);
        }
        // After the store lost its data the index of the account's entries
        // is gone and nothing above named them: every host forgets the
        // account's known lockouts by its tag, this one now, the others
        // when they hear the message (logged above).
        if source.is_none() && done > 0 {
            cleared +=
                limiter.forget_account_lockouts(route, limiter.account_tag(account), u64::MAX, self.clock().now_us());
            limiter.forget_account_counts_unlocked(route, account);
            let (logging, at) = (store.clone(), stamp());
            tokio::spawn(async move { logging.log_unlocks(log, &named, at).await });
            store.publish(limiter.shared_channel(), first[0].clone());
        }
        match failed {
            None => Ok(cleared),
            Some(e) if done > 0 => {
                Err(format!("{e}; {done} of the {total} rules were unlocked there ({cleared} entries cleared)"))
            }
            Some(e) => Err(e),
        }
    }

    fn bad_store_value(&self, store: &SharedStore, error: &str, now: u64) {
        store.note_error(error);
        if let Some(suppressed) = self.audit.admit(now) {
            tracing::error!(target: LOG_TARGET, error, suppressed,
                "shared store holds a value tollgate did not write at one of this request's keys; answering on this host \
                 (delete the key or set [shared] key_prefix to another prefix)");
        }
    }
}

/// A report's verdict, the durable writes its reply waits for, and whether
/// it was decided on this host's degraded share.
pub(crate) type Reported<'l> = (Verdict<'l>, Vec<Durable>, bool);

/// A shared-mode request's first half: answered, or its op queued to the
/// store and the limiter's pending half kept for the reply.
pub(crate) enum SharedStart<D, T, P> {
    Done(D),
    Waiting(T, P),
}

/// Counts an answer given on this host's degraded share.
fn degraded<'l>(store: &SharedStore, verdict: Verdict<'l>) -> Verdict<'l> {
    store.stats.degraded_answers.fetch_add(1, Ordering::Relaxed);
    verdict
}

/// Connects at start. A store joined with another secret stops the start
/// (the error); an unreachable one leaves the breaker open, so the daemon
/// starts degraded and the supervisor keeps probing.
pub(super) async fn join_at_start(daemon: &Arc<Daemon>, fingerprint: &str, host: &str) -> Result<(), String> {
    let Some(store) = daemon.shared() else { return Ok(()) };
    store.start();
    // Read before the join: the offset errs towards the store's clock
    // being ahead, which holds a published lockout back, never forward.
    let asked_us = daemon.clock().now_us();
    match store.connect(fingerprint, host).await {
        Ok(store_now) => {
            store.note_store_time(store_now, asked_us);
            store.breaker().probe_succeeded();
            recover(daemon, store).await;
            Ok(())
        }
        Err(ProbeError::Refused(why)) => Err(why),
        Err(ProbeError::Unreachable(why)) => {
            store.note_error(&why);
            let now = store.now_us();
            store.breaker().probe_failed(now);
            tracing::warn!(target: LOG_TARGET, error = %why, hosts = store.hosts_in_force(),
                "shared store unreachable at start; degraded: global rules counted on this host at ceil(limit / hosts)");
            Ok(())
        }
    }
}

/// Hears the other hosts' lockouts and unlocks: a lockout is refused here
/// from memory until it ends; an unlock forgets it. Lossy (a message sent
/// while this host is not subscribed is not heard): the store still
/// refuses such a key on the next check, one round trip later.
async fn listen(daemon: Arc<Daemon>, store: Arc<SharedStore>, replayed: tokio::sync::oneshot::Sender<()>) {
    let (channel, unlock_log) = {
        let limiter = daemon.limiter().load();
        (limiter.shared_channel(), limiter.shared_unlock_log())
    };
    let result = store
        .listen(
            &channel,
            &unlock_log,
            || {
                let _ = replayed.send(());
            },
            |message, logged_at| {
                let limiter = daemon.limiter().load();
                let now = daemon.clock().now_us();
                // A replayed unlock forgets only the lockouts learned before it.
                // Its stamp is the store's time, made this host's (saturating:
                // whoever can write the log can stamp anything).
                let before = logged_at.map_or(u64::MAX, |at| {
                    (at.min(i64::MAX as u64) as i64).saturating_sub(store.clock_offset_us()).max(0) as u64
                });
                let words: Vec<&str> = message.split(' ').collect();
                let understood = match words.as_slice() {
                    // Unstamped: as a host of the previous version sends it (every
                    // host sends this form too, for those).
                    ["L", name, remaining] => {
                        remaining.parse::<u64>().is_ok_and(|r| limiter.learn_known_lockout(name, r, None, now))
                    }
                    ["L", name, remaining, ran] => match (remaining.parse::<u64>(), ran.parse::<u64>()) {
                        (Ok(r), Ok(ran)) => {
                            limiter.learn_known_lockout(name, r, Some(store.host_time_of(name, ran, now)), now)
                        }
                        _ => false,
                    },
                    ["U", name] => limiter.forget_known_lockout(name, before, now),
                    ["A", route, account_tag] => limiter.forget_account_lockouts_heard(route, account_tag, before, now),
                    _ => false,
                };
                if !understood {
                    store.stats.messages_ignored.fetch_add(1, Ordering::Relaxed);
                }
            },
        )
        .await;
    if let Err(e) = result {
        tracing::warn!(target: LOG_TARGET, error = %e, "not subscribed to the other hosts' lockouts; will retry");
    }
}

/// Writes back what was locked while degraded, then closes the breaker.
async fn recover(daemon: &Arc<Daemon>, store: &Arc<SharedStore>) {
    // A new subscription on a new connection: the old one may be a
    // black-holed socket that never ends by itself.
    let log_read = {
        let mut listener = daemon.listener.locked();
        if let Some(old) = listener.take() {
            old.abort();
        }
        let (replayed, log_read) = tokio::sync::oneshot::channel();
        *listener = Some(tokio::spawn(listen(daemon.clone(), store.clone(), replayed)));
        log_read
    };
    // The unlocks logged while this host was away are heard first: a merge
    // that fails is refused from memory unless an unlock since its entry
    // began was heard. Each of the listener's two steps waits at most
    // `connect_timeout_ms`.
    let _ = tokio::time::timeout(Duration::from_millis(2 * store.config.connect_timeout_ms), log_read).await;
    store.publish_state();
    let since = store.degraded_since_us();
    let written = write_back(daemon, store, false).await;
    store.breaker().recovered();
    store.publish_state();
    let degraded_ms = since.map(|s| crate::clock::Clock::System.now_us().saturating_sub(s) / 1000);
    tracing::info!(target: LOG_TARGET, degraded_ms, written_back = written, hosts = store.hosts_in_force(),
        "shared store reachable; global rules answered by the store");
}

/// Sends every lockout this host holds on a global rule's degraded table
/// to the store (a merge: the later lockout wins, an unlock made since
/// wins), and clears it here once the store has it.
/// `retrying`: the heartbeat's try after a failed one, whose failure is
/// logged at debug level only (the first was warned of).
async fn write_back(daemon: &Arc<Daemon>, store: &Arc<SharedStore>, retrying: bool) -> usize {
    let limiter = daemon.limiter().load_full();
    let listed = std::time::Instant::now();
    // A chunk's merges are queued together: no more than the queue holds,
    // or the ones past it would be refused (QueueFull) and not written.
    let chunk = WRITE_BACK_BATCH.min(store.config.pending_max);
    let tried = std::mem::take(&mut *store.write_back_tried.locked());
    let mut pass = limiter.write_back_pass(daemon.clock().now_us(), chunk, &tried);
    while let Some(merges) = pass.next_chunk(listed.elapsed().as_micros() as u64) {
        let replies = futures_util::future::join_all(merges.into_iter().map(|op| store.call_recovering(op))).await;
        // The merge's first integer: 1 if the store took it, 0 if an
        // unlock made since the lockout won.
        pass.answered(replies.into_iter().map(|reply| reply.map(|r| r.ints.first() == Some(&1))));
    }
    store.stats.written_back.fetch_add(pass.written as u64, Ordering::Relaxed);
    *store.write_back_tried.locked() = std::mem::take(&mut pass.tried);
    if pass.retry {
        store.retry_write_back();
    }
    if let Some(e) = pass.last_error {
        let failed = pass.failed;
        if retrying {
            tracing::debug!(target: LOG_TARGET, error = %e, failed, "lockouts still not written back");
        } else {
            tracing::warn!(target: LOG_TARGET, error = %e, failed,
                "lockouts not written back; this host refuses them, and sends them again at each heartbeat");
        }
    }
    pass.written
}

/// The supervisor: probes while the breaker is open, beats while it is
/// closed, and learns the host count. Runs for the daemon's life.
pub(super) async fn supervise(daemon: Arc<Daemon>, fingerprint: String, host: String) {
    let Some(store) = daemon.shared().cloned() else { return };
    let heartbeat = Duration::from_millis(store.config.heartbeat_ms);
    let mut last_beat = tokio::time::Instant::now() - heartbeat;
    let mut seen: std::collections::VecDeque<(tokio::time::Instant, u32)> = Default::default();
    // The count remembered from before a restart counts as seen now: a
    // deploy restarting every host does not swing the share to 1 and back.
    if let Some(remembered) = store.hosts_remembered() {
        seen.push_back((tokio::time::Instant::now(), remembered));
    }
    let mut teaching = super::teach::Teaching::default();
    let mut tick = tokio::time::interval(Duration::from_millis(SUPERVISOR_TICK_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let state = store.state();
        match state {
            // Refused probes too, at the longest delay: the record may be
            // removed, or taken back by this host's fingerprint.
            State::Open | State::Recovering | State::Refused => {
                let now = store.now_us();
                if now < store.breaker().next_probe_us() {
                    continue;
                }
                let asked_us = daemon.clock().now_us();
                match store.connect(&fingerprint, &host).await {
                    Ok(store_now) => {
                        // Known before the replay and the write-back that
                        // `recover` runs read store times; read before the
                        // join, as at start.
                        store.note_store_time(store_now, asked_us);
                        store.breaker().probe_succeeded();
                        recover(&daemon, &store).await;
                    }
                    Err(ProbeError::Refused(why)) => {
                        store.breaker().refuse(store.now_us());
                        store.publish_state();
                        // Told once a reason: a refused host probes every
                        // `probe_max_ms`.
                        if state != State::Refused || store.last_error().as_deref() != Some(why.as_str()) {
                            tracing::error!(target: LOG_TARGET, error = %why, "shared store refused; this host stays degraded");
                        }
                        store.note_error(&why);
                    }
                    Err(ProbeError::Unreachable(why)) => {
                        store.note_error(&why);
                        let now = store.now_us();
                        store.breaker().probe_failed(now);
                    }
                }
            }
            State::Closed => {
                if store.take_write_back_due() {
                    let written = write_back(&daemon, &store, false).await;
                    tracing::info!(target: LOG_TARGET, written_back = written,
                        "lockouts taken while a cluster node was away written back");
                }
                if last_beat.elapsed() < heartbeat {
                    continue;
                }
                last_beat = tokio::time::Instant::now();
                if store.take_write_back_retry() {
                    let written = write_back(&daemon, &store, true).await;
                    if written > 0 {
                        tracing::info!(target: LOG_TARGET, written_back = written, "lockouts written back after a failed try");
                    }
                }
                // A subscription that ended (or never began) is made again,
                // at most once a heartbeat.
                {
                    let mut listener = daemon.listener.locked();
                    if listener.as_ref().is_none_or(|l| l.is_finished()) {
                        let (replayed, _) = tokio::sync::oneshot::channel();
                        *listener = Some(tokio::spawn(listen(daemon.clone(), store.clone(), replayed)));
                    }
                }
                // A failover or resharding moves slots between nodes: the
                // node breakers follow the cluster's map. On a task of its
                // own: the driver sends CLUSTER SLOTS to a random node, and
                // a frozen one must not hold up the heartbeat or a probe.
                store.refresh_slots_in_background();
                // A store that lost its data (FLUSHALL, a restart without
                // persistence) gets this host's fingerprint back at once.
                if let Err(ProbeError::Refused(why)) = store.assert_fingerprint(&fingerprint, &host).await {
                    store.breaker().refuse(store.now_us());
                    store.publish_state();
                    store.note_error(&why);
                    tracing::error!(target: LOG_TARGET, error = %why,
                        "shared store now records another secret key; this host stays degraded");
                    continue;
                }
                teaching.after_heartbeat(&daemon, &store);
                let Ok(live) = store.heartbeat(&host, daemon.clock().now_us()).await else { continue };
                if store.config.hosts > 0 {
                    continue;
                }
                // The most hosts seen lately: a host restarting for a
                // deploy still counts, so the share does not swing.
                let now = tokio::time::Instant::now();
                seen.push_back((now, live));
                while seen
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at).as_millis() as u64 > HOSTS_LEARNED_MEMORY_MS)
                {
                    seen.pop_front();
                }
                let learned = seen.iter().map(|(_, n)| *n).max().unwrap_or(live).max(1);
                let was_remembered = store.take_hosts_remembered();
                if store.set_hosts_in_force(learned) || was_remembered {
                    daemon.set_hosts(learned);
                    daemon.limiter().load().journal().hosts_learned(learned);
                    tracing::info!(target: LOG_TARGET, hosts = learned, "hosts sharing the limits learned from the store");
                }
            }
        }
    }
}

impl Daemon {
    /// Rebuilds the limiter's degraded shares for `hosts` hosts.
    pub(super) fn set_hosts(&self, hosts: u32) {
        // Under the reload lock: a reload and this rebuild each start from
        // the limiter in force, and neither may undo the other.
        let config = self.config.locked();
        let limiter = self.limiter.load();
        let next = limiter.with_hosts(&config, hosts, self.clock.now_us());
        self.limiter.store(Arc::new(next));
    }
}
