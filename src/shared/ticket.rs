//! A call to the store, from its queueing to its reply: `submit` queues
//! an op and returns a ticket, `Ticket::wait` waits for the reply until
//! the deadline, and tells a busy store (an attacker's burst made it late)
//! from a lost one (`lateness`, `HotKeys`).

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};

use super::breaker::replying;
use super::script::{op_slot, Op, Reply};
use super::{hot, CallError, Pending, SharedStore, State, LATE_REPLY_WAIT_MS, ORPHANS_WAITING_MAX};
use crate::unpoisoned::Unpoisoned;

/// An op queued for the store (`SharedStore::submit`), its reply not yet
/// waited for. Its deadline was fixed when it was submitted. Dropped
/// unwaited, a check's op is still sent (its places are given back if it
/// takes any) and a report's too (`Orphan`); any other is not sent if it
/// is still queued.
#[must_use = "an op's reply is waited for, or its breaker effects are lost"]
pub struct Ticket<'s> {
    /// A report's guard. Declared first, so that a ticket dropped unwaited
    /// marks its op orphaned before its reply channel closes.
    orphan: Option<Orphan<'s>>,
    store: &'s SharedStore,
    reply: oneshot::Receiver<Result<Reply, CallError>>,
    deadline: tokio::time::Instant,
    /// A request's call (`submit`), waited for `timeout_ms`: only its
    /// lateness may be a busy store's.
    request: bool,
    /// A report: a busy store's reply is waited for (up to
    /// `LATE_REPLY_WAIT_MS`), so its failure is counted somewhere, in the
    /// store or, if that fails, on the share.
    patient: bool,
    /// A check's keys, counted in flight while it waits.
    hot: Option<hot::HotGuard<'s>>,
    /// In a cluster, a request's slot: its node's replies are the ones
    /// that make its lateness busy.
    slot: Option<u16>,
}

/// A report's ticket dropped before its wait ended (its connection closed
/// while replies were still being written, or was aborted) leaves a report
/// nobody will count on the share: its op is marked orphaned, so the
/// dispatcher sends it though nobody waits for the reply, and a report
/// still held for queue room is queued, waiting up to `LATE_REPLY_WAIT_MS`
/// for room, at most `ORPHANS_WAITING_MAX` of them at once (past that, or
/// at shutdown, it is lost as before). Nobody hears the reply: a lockout it
/// takes is the store's alone, refused to every host that asks (a report
/// answered `Late` is orphaned too, but its caller hears the reply:
/// `LateReply`). Disarmed
/// once the wait has an answer: then the store counted it, or the caller
/// counts it on the share, and an op still queued is not sent.
struct Orphan<'s> {
    store: &'s SharedStore,
    flag: Arc<AtomicBool>,
    /// A report the full queue had no room for: queued by `wait`, or
    /// here if the ticket goes first. Boxed: rare, and inline it made
    /// every ticket, moved a few times on each request, twice the size.
    unsent: Option<Box<Pending>>,
    armed: bool,
}

impl Orphan<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Orphan<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.flag.store(true, Ordering::Release);
        // Before the reply channel closes (its close is no release), so
        // that a dispatcher that sees it closed sees the flag too.
        fence(Ordering::Release);
        let Some(pending) = self.unsent.take() else { return };
        let Err(mpsc::error::TrySendError::Full(pending)) = self.store.queue.try_send(*pending) else { return };
        // No room yet: wait for it off this task, as `wait` would have.
        let waiting = &self.store.orphans_waiting;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if waiting.fetch_add(1, Ordering::Relaxed) >= ORPHANS_WAITING_MAX {
            waiting.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let (queue, waiting) = (self.store.queue.clone(), waiting.clone());
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_millis(LATE_REPLY_WAIT_MS), queue.send(pending)).await;
            waiting.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

impl Ticket<'_> {
    /// A check's keys (hashed), for `SharedStore::mark_crowded`.
    pub fn key_hashes(&self) -> SmallVec<[u64; 6]> {
        self.hot.as_ref().map(|h| SmallVec::from_slice(h.hashes())).unwrap_or_default()
    }

    /// The store's reply, or why there is none by the deadline: every
    /// counter and breaker effect of a call.
    pub async fn wait(self) -> Result<Reply, CallError> {
        self.wait_or_hear_later().await.0
    }

    /// `wait`; and for a call the busy store answers late (`Late`, `Busy`),
    /// its reply still to come: whoever takes it reads it (and gives back
    /// the places a check's op took), not the dispatcher.
    pub async fn wait_or_hear_later(self) -> (Result<Reply, CallError>, Option<LateReply>) {
        let Ticket { orphan, store, reply, deadline, request, patient, hot, slot } = self;
        // `reply` bound before `orphan`: if this future is dropped while
        // it waits, the orphan goes first, and marks the op before the
        // reply channel closes.
        let mut reply = reply;
        let mut orphan = orphan;
        let answer = store.answer(&mut orphan, &mut reply, deadline, request.then_some(slot), patient, hot).await;
        if let Some(orphan) = orphan {
            orphan.disarm();
        }
        // A reply already taken (a check the store ran too late) is no
        // reply to come.
        let late = matches!(answer, Err(CallError::Late | CallError::Busy)) && !reply.is_terminated();
        let late = late.then_some(LateReply(reply));
        (answer, late)
    }
}

/// A late call's reply, still to come (`Ticket::wait_or_hear_later`).
/// Dropped before it comes, the dispatcher gives back what a check's op
/// took, as for any reply nobody waits for.
pub struct LateReply(oneshot::Receiver<Result<Reply, CallError>>);

impl LateReply {
    /// The reply, if the store sends one within `LATE_REPLY_WAIT_MS`.
    pub async fn heard(mut self) -> Option<Reply> {
        match tokio::time::timeout(Duration::from_millis(LATE_REPLY_WAIT_MS), &mut self.0).await {
            Ok(Ok(Ok(reply))) => Some(reply),
            Ok(_) => None,
            Err(_) => {
                // Closed first: a reply sent before is read here, one after
                // is the dispatcher's (never lost between the two).
                self.0.close();
                self.0.try_recv().ok().and_then(Result::ok)
            }
        }
    }
}

impl SharedStore {
    /// `Ticket::wait`'s body. A held report stays in `orphan` until the
    /// queue has room for it, so that if this is dropped first the orphan
    /// queues it. `request`: a request's call, and its slot in a cluster.
    async fn answer(
        &self,
        orphan: &mut Option<Orphan<'_>>,
        reply: &mut oneshot::Receiver<Result<Reply, CallError>>,
        deadline: tokio::time::Instant,
        request: Option<Option<u16>>,
        patient: bool,
        hot: Option<hot::HotGuard<'_>>,
    ) -> Result<Reply, CallError> {
        let store = self;
        if let Some(held) = orphan.as_mut().filter(|o| o.unsent.is_some()) {
            let late = Duration::from_millis(LATE_REPLY_WAIT_MS);
            match tokio::time::timeout(late, store.queue.reserve()).await {
                Ok(Ok(room)) => room.send(*held.unsent.take().expect("held until now")),
                _ => {
                    store.stats.calls.fetch_sub(1, Ordering::Relaxed);
                    store.stats.not_asked.fetch_add(1, Ordering::Relaxed);
                    return Err(CallError::QueueFull);
                }
            }
            let received = tokio::time::timeout(late, &mut *reply).await;
            return match received {
                Ok(received) => store.received(received, false),
                Err(_) => {
                    store.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    store.failed(&CallError::Timeout);
                    Err(CallError::Timeout)
                }
            };
        }
        let received = match tokio::time::timeout_at(deadline, &mut *reply).await {
            // A check the store ran too late (only checks expire) is late.
            Ok(Ok(Err(CallError::Expired))) => return store.late_check(request, hot),
            Ok(received) => return store.received(received, true),
            Err(_) => {
                if !patient {
                    return store.late_check(request, hot);
                }
                store.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                let lateness = request.map(|slot| (store.lateness(slot, None), store.replying_now(slot)));
                match lateness {
                    Some((Lateness::Late, _)) => {}
                    // A store still replying, its run grown old under a
                    // burst (the report late behind the burst's checks):
                    // counted on the share now, and, orphaned, in the store
                    // when it runs; the breaker does not move. Three such
                    // reports, failures, opened it amid close bursts.
                    Some((_, true)) => {
                        drop(orphan.take());
                        return Err(CallError::Late);
                    }
                    _ => {
                        store.failed(&CallError::Timeout);
                        return Err(CallError::Timeout);
                    }
                }
                // A report's caller has its answer in a moment either way;
                // its failure must be counted in the store or on the share.
                match tokio::time::timeout(Duration::from_millis(LATE_REPLY_WAIT_MS), &mut *reply).await {
                    Ok(received) => received,
                    Err(_) => {
                        store.failed(&CallError::Timeout);
                        return Err(CallError::Timeout);
                    }
                }
            }
        };
        store.received(received, false)
    }

    /// A call not answered by its deadline (or run by the store too late
    /// to take a place): a failure of the store, unless it is busy
    /// (`lateness`); then a check in a burst on its keys may be `Busy`,
    /// and any other is `Late`, and the breaker does not move.
    fn late_check(&self, request: Option<Option<u16>>, hot: Option<hot::HotGuard<'_>>) -> Result<Reply, CallError> {
        self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
        let burst = hot.as_ref().and_then(|h| h.burst());
        match request.map_or(Lateness::Lost, |slot| self.lateness(slot, burst)) {
            Lateness::Busy => Err(CallError::Busy),
            Lateness::Late => Err(CallError::Late),
            Lateness::Lost => {
                self.failed(&CallError::Timeout);
                Err(CallError::Timeout)
            }
        }
    }

    /// Queues one op for the store without waiting: the breaker is looked
    /// at and the op handed to the dispatchers now, and the ticket's
    /// deadline is `timeout_ms` from now (less the timer's slack,
    /// `request_wait`). A caller with several ops (a
    /// connection's pipelined run) submits them all before waiting for
    /// any, so they share one batch and one deadline, not one each in turn.
    pub fn submit(&self, op: Op) -> Result<Ticket<'_>, CallError> {
        let state = self.state();
        if state != State::Closed {
            self.stats.not_asked.fetch_add(1, Ordering::Relaxed);
            return Err(CallError::NotAsked(state.name()));
        }
        let (check, patient) = (op.kind == b'C', op.kind == b'R');
        let hot = check.then(|| self.hot.enter(&op.keys, op.chosen_keys));
        let slot = if self.is_cluster() { op_slot(&op).ok().flatten() } else { None };
        // A report is held until the queue has room: never sent, its
        // failure would be counted only on the share, which the store does
        // not read while it answers.
        let mut ticket = match self.submit_or_hold(op, request_wait(self.config.timeout_ms), patient) {
            Ok(ticket) => ticket,
            // A check queued behind a full queue, in a burst on its keys, is
            // refused like a late one. A report that found no room is
            // counted on the share: it was never sent.
            Err(CallError::QueueFull)
                if hot
                    .as_ref()
                    .and_then(|h| h.burst())
                    .is_some_and(|b| self.lateness(slot, Some(b)) == Lateness::Busy) =>
            {
                return Err(CallError::Busy)
            }
            Err(e) => return Err(e),
        };
        ticket.request = true;
        ticket.patient = patient;
        ticket.hot = hot;
        ticket.slot = slot;
        Ok(ticket)
    }

    pub(super) fn submit_unchecked(&self, op: Op, timeout: Duration) -> Result<Ticket<'_>, CallError> {
        self.submit_or_hold(op, timeout, false)
    }

    /// `submit_unchecked`; with `hold`, an op the full queue has no room
    /// for is held by the ticket, and queued by its `wait` when room comes.
    fn submit_or_hold(&self, op: Op, timeout: Duration, hold: bool) -> Result<Ticket<'_>, CallError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (tx, rx) = oneshot::channel();
        // Only a report (`hold`) can be orphaned: see `Orphan`.
        let flag = hold.then(|| Arc::new(AtomicBool::new(false)));
        let unsent = match self.queue.try_send(Pending { op, reply: tx, orphaned: flag.clone() }) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(pending)) if hold => Some(Box::new(pending)),
            Err(_) => {
                self.stats.not_asked.fetch_add(1, Ordering::Relaxed);
                return Err(CallError::QueueFull);
            }
        };
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let orphan = flag.map(|flag| Orphan { store: self, flag, unsent, armed: true });
        Ok(Ticket { orphan, store: self, reply: rx, deadline, request: false, patient: false, hot: None, slot: None })
    }

    pub(super) async fn call_unchecked(&self, op: Op, timeout: Duration) -> Result<Reply, CallError> {
        self.submit_unchecked(op, timeout)?.wait().await
    }

    /// An op sent while recovering (the write-back), before requests are
    /// sent again: bounded by `connect_timeout_ms`, off the request path.
    pub async fn call_recovering(&self, op: Op) -> Result<Reply, CallError> {
        self.call_unchecked(op, Duration::from_millis(self.config.connect_timeout_ms)).await
    }

    /// What came back for a call: every counter and breaker effect. A
    /// reply `on_time` ends a run of late calls `busy_max_ms` after its
    /// last one; a late one does not.
    pub(super) fn received(
        &self,
        received: Result<Result<Reply, CallError>, oneshot::error::RecvError>,
        on_time: bool,
    ) -> Result<Reply, CallError> {
        match received {
            Ok(Ok(reply)) => {
                let now = self.micros().max(1);
                self.last_success_us.store(now, Ordering::Relaxed);
                if on_time {
                    let busy_max_us = self.config.busy_max_ms.saturating_mul(1000);
                    self.late_run.locked().answered(now, busy_max_us);
                }
                self.breaker.locked().succeeded();
                Ok(reply)
            }
            Ok(Err(CallError::BadValue(e))) => {
                self.stats.bad_values.fetch_add(1, Ordering::Relaxed);
                Err(CallError::BadValue(e))
            }
            Ok(Err(e @ CallError::NodeAway(_))) => {
                // Queued, but never sent: a call not asked, as one the
                // store's breaker keeps back, and not a call made.
                self.stats.calls.fetch_sub(1, Ordering::Relaxed);
                self.stats.not_asked.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
            Ok(Err(e)) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                self.failed(&e);
                Err(e)
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                let e = CallError::Failed("the dispatcher dropped the call".into());
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Gives back the places a check's op took for a request answered
    /// without it: queued now, its reply waited for by nobody, so a busy
    /// store's lateness is no failure of it.
    pub fn release_unwaited(&self, op: Op) {
        self.stats.releases_sent.fetch_add(1, Ordering::Relaxed);
        let (tx, _) = oneshot::channel();
        let _ = self.queue.try_send(Pending { op, reply: tx, orphaned: None });
    }

    /// Queues a report op whose reply nobody waits for, marked orphaned so
    /// that it is still sent (`Pending::wanted`); dropped if the queue is
    /// full (the next check that finds it due sends it again).
    pub fn send_unwaited(&self, op: Op) {
        let (tx, _) = oneshot::channel();
        let orphaned = Some(Arc::new(AtomicBool::new(true)));
        let _ = self.queue.try_send(Pending { op, reply: tx, orphaned });
    }

    /// The store's reply to a check showed other attempts in flight on its
    /// keys (from any host): a late check on them within `busy_max_ms` is
    /// part of a burst.
    pub fn mark_crowded(&self, key_hashes: &[u64]) {
        self.hot.mark_crowded(key_hashes, self.config.busy_max_ms.saturating_mul(1000));
    }

    /// A request's call is late: whether the store is busy (the breaker
    /// does not move) rather than lost or overloaded (`Lost`: a failure,
    /// and the share answers). Busy while the breaker is closed and the
    /// run of late calls this one belongs to (`LateRun`: it ends only with
    /// a timely answer, a heartbeat's too) is younger than `busy_max_ms`:
    /// then a lone call is `Late` (a check answered on the share, a report
    /// waited for), so a store late at a stretch for longer (frozen, dead,
    /// or kept saturated) turns the hosts to their shares and no one can
    /// keep every login refused. A check in a `burst` on its keys is
    /// `Busy`, refused and admitting nothing, while the run is young or
    /// the store (the node serving `slot`, in a cluster) has owed a reply
    /// for less than `busy_max_ms` (`replying`: bursts closer together
    /// than that, or after a quiet moment, are each held exactly): for as long as
    /// the burst is its requester's own (parallel guesses), else for
    /// `busy_max_ms` a window (`BusyRuns`), and then as a lone call, so no
    /// flood on a user's keys keeps her refused.
    pub fn lateness(&self, slot: Option<u16>, burst: Option<hot::Burst>) -> Lateness {
        let Some((young, there)) = self.busy_now(slot) else { return Lateness::Lost };
        if let Some(burst) = burst {
            let busy_max_us = self.config.busy_max_ms.saturating_mul(1000);
            if there && (burst.own || self.busy_runs.excused(burst.requester, self.micros(), busy_max_us)) {
                return Lateness::Busy;
            }
        }
        if young {
            Lateness::Late
        } else {
            Lateness::Lost
        }
    }

    /// Whether the store (`slot`'s node) is there (`busy_now`).
    fn replying_now(&self, slot: Option<u16>) -> bool {
        self.busy_now(slot).is_some_and(|(_, there)| there)
    }

    /// With the breaker closed, whether the run of late calls is young
    /// (counting this late call in it), and whether the store is there:
    /// young, or it has owed a reply for less than `busy_max_ms`.
    fn busy_now(&self, slot: Option<u16>) -> Option<(bool, bool)> {
        let busy_max_us = self.config.busy_max_ms.saturating_mul(1000);
        let now = self.micros();
        let young = self.late_run.locked().late(now, busy_max_us);
        if self.state() != State::Closed {
            return None;
        }
        Some((young, young || replying(now, busy_max_us, self.owing_since_us(slot))))
    }

    /// Since when the store has owed a reply (`replying`): in a cluster,
    /// the node serving `slot` if the slot map names it (a frozen node's
    /// slots are not kept busy by the others' replies), else any.
    fn owing_since_us(&self, slot: Option<u16>) -> u64 {
        let node = slot.and_then(|slot| self.nodes.locked().owing_since_us(slot));
        node.unwrap_or_else(|| self.owing_since_us.load(Ordering::Relaxed))
    }
}

/// What a request's late call is (`SharedStore::lateness`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lateness {
    /// A busy store, to a check in a burst: refused.
    Busy,
    /// A busy store, to a lone call: a check answered on the share, a
    /// report's reply waited for.
    Late,
    /// A store lost or overloaded: a failure.
    Lost,
}

/// How long a request's ticket waits for the store: `timeout_ms` less the
/// timer's millisecond. Tokio's timer fires on the first whole
/// millisecond at or after a deadline, so a deadline `timeout_ms` out was
/// met up to a millisecond late, and the frozen store's p99 stood above
/// `timeout_ms` + 1 ms once the daemon's own work was added (3.6 ms with
/// the default 2; half a millisecond off still left 3.1 to 3.2). The cost:
/// with the default the store has 1 to 2 ms to answer, so a store further
/// away needs a larger `timeout_ms`. At least half of `timeout_ms`.
fn request_wait(timeout_ms: u64) -> Duration {
    let timeout_us = timeout_ms.saturating_mul(1000);
    Duration::from_micros(timeout_us.saturating_sub(TIMER_SLACK_US).max(timeout_us / 2))
}

/// The timer's resolution (tokio's wheel counts whole milliseconds).
const TIMER_SLACK_US: u64 = 1000;
