//! The request path: `Daemon::start` and, for a request that waits,
//! `Daemon::finish` turn each decoded request into a reply, asking the limiter
//! for verdicts; in shared mode `start` queues a request's store op and
//! `finish` waits for it. Kept apart from the daemon's state and reload
//! because this is the code every check and report runs through.

use crate::access::Permissions;
use crate::activity::Event;
use crate::clock::ceil_ms;
use crate::codec::RequestExtras;
use crate::decision_log::Attempt;
use crate::limiter::{AwaitingStore, Begun, CheckPlan, Facts, Limiter, Report, RequestError};
use crate::protocol::{Decision, ErrorCode, Outcome, Request, Response, Subject, Verdict};
use crate::shared::Ticket;
use crate::store::Durable;

use super::listings::{lockouts_listed, lockouts_reply, samples_reply};
use super::shared::{Reported, SharedStart};
use super::{request_error, Daemon, Peer, LOG_TARGET};

impl Daemon {
    /// A request's first half, at `now` (read once per batch of frames):
    /// everything but waiting. Answered here unless it waits for the
    /// shared store (a check or report with global rules: its op is queued
    /// now, so a run's ops ride one batch) or is an unlock (its store half
    /// is awaited by `finish`, as are a ban and an unban).
    pub(crate) fn start<'b, 'l>(
        &'b self,
        limiter: &'l Limiter,
        job: Job<'b, 'l>,
        peer: &Peer,
        now: u64,
    ) -> Started<'b, 'l> {
        let (subject, attempt, facts, begun) = match job {
            Job::Denied(operation) => return self.denied(operation, peer, now),
            Job::Check { subject, plan } => {
                let plan = match plan {
                    Ok(plan) => plan,
                    Err(e) => return Started::Ready((request_error(e), Vec::new(), false)),
                };
                let attempt = Attempt::check(plan.password_tag());
                let facts = plan.facts();
                (subject, Some(attempt), facts, limiter.begin_check(plan, now))
            }
            Job::Report { route, subject, report } => {
                // An abandoned attempt (no outcome) has nothing to log.
                let attempt =
                    report.outcome.map(|outcome| Attempt::report(outcome, report.password_digest, report.password_tag));
                match limiter.begin_report(route, &subject, &report, now) {
                    Ok((facts, begun)) => (subject, attempt, facts, begun),
                    Err(e) => return Started::Ready((request_error(e), Vec::new(), false)),
                }
            }
            Job::Other(request) => return self.other(limiter, request, peer, now),
        };
        // Local and shared mode take one path: the limiter begins the
        // request and decides it unless global rules need the store, whose
        // op is then queued (`daemon/shared.rs`). Global rules exist only
        // with `[shared]`, which also made `self.shared`, and a reload
        // cannot change it.
        let reported = match begun {
            Begun::Done(verdict, durable) => (verdict, durable, false),
            begun => {
                let store = self.shared.as_ref().expect("global rules come with their store");
                match self.start_shared(store, limiter, begun, now) {
                    SharedStart::Done(reported) => reported,
                    SharedStart::Waiting(ticket, pending) => {
                        return Started::Waiting(Box::new(Waiting { facts, subject, attempt, ticket, pending }));
                    }
                }
            }
        };
        Started::Ready(self.answer(facts, &subject, attempt.as_ref(), reported, now))
    }

    #[cold]
    #[inline(never)]
    fn denied<'b, 'l>(&self, operation: &str, peer: &Peer, now: u64) -> Started<'b, 'l> {
        if let Some(suppressed) = self.audit.admit(now) {
            tracing::warn!(target: LOG_TARGET, uid = peer.uid, gid = peer.gid, operation, suppressed, "permission denied");
        }
        let message = format!("permission denied: uid {} may not {operation}", peer.uid);
        Started::Ready((Response::error(ErrorCode::PermissionDenied, message), Vec::new(), false))
    }

    /// Any request but a check or a report: answered at once, or (an
    /// unlock, a ban, an unban) left for `finish`. Kept out of `start`'s
    /// code (cold): inlined, it spread a check's few hundred bytes of
    /// instructions over kilobytes, and a login's code no longer fitted
    /// the instruction cache.
    #[cold]
    #[inline(never)]
    fn other<'b, 'l>(&self, limiter: &'l Limiter, request: Request<'b>, peer: &Peer, now: u64) -> Started<'b, 'l> {
        Started::Ready(match request {
            Request::Check { .. } | Request::Report { .. } | Request::Abandon { .. } => {
                unreachable!("Job::new makes every check, report and abandon a job of its own")
            }
            // Which networks skip the per-source rules is for admins.
            Request::Status => {
                (Response::Status(Box::new(self.status(limiter, peer.permissions.admin))), Vec::new(), false)
            }
            // `serve_connection` answers these three itself (`Daemon::listing_reply`:
            // off the runtime threads, within the reply budget); this is the
            // same answer.
            // Without the request's version, no bans: they are listed only
            // to an admin asking in version 7 (`serve_connection` knows).
            Request::Lockouts { limit } => {
                (lockouts_reply(limiter, lockouts_listed(limit), false, now), Vec::new(), false)
            }
            Request::Activity { limit } => {
                (Response::Activity(Box::new(self.activity(limiter, limit, now))), Vec::new(), false)
            }
            Request::Samples { limit } => (samples_reply(&self.activity, limit), Vec::new(), false),
            request @ (Request::Unlock { .. } | Request::Ban { .. } | Request::Unban { .. }) => {
                return Started::Admin(request)
            }
            Request::Inspect { route, subject } => {
                (self.inspect(limiter, route, &subject, peer, now), Vec::new(), false)
            }
            Request::ClockAdvance { by_ms } => match self.clock.advance(by_ms.saturating_mul(1000)) {
                Some(now) => (Response::ClockAdvanced { now_ms: ceil_ms(now) }, Vec::new(), false),
                None => (
                    Response::error(
                        ErrorCode::NotManualClock,
                        "the daemon runs on the system clock; start it with --manual-clock",
                    ),
                    Vec::new(),
                    false,
                ),
            },
        })
    }

    /// A request's second half: waits for the store (at most until the
    /// deadline fixed when its op was queued) and answers. The durable
    /// writes, if any, must complete before the reply is sent.
    pub(crate) async fn finish<'l>(
        &self,
        limiter: &'l Limiter,
        started: Started<'_, 'l>,
        peer: &Peer,
        now: u64,
    ) -> Answer<'l> {
        match started {
            Started::Ready(answer) => answer,
            Started::Waiting(waiting) => {
                let Waiting { facts, subject, attempt, ticket, pending } = *waiting;
                let reported = self.finish_shared(limiter, ticket, pending, now).await;
                self.answer(facts, &subject, attempt.as_ref(), reported, now)
            }
            Started::Admin(request @ Request::Unlock { .. }) => self.unlock(limiter, request, peer, now).await,
            Started::Admin(Request::Ban { network, prefix_len, for_ms, reason }) => {
                self.ban(limiter, (network, prefix_len), for_ms, reason, peer, now).await
            }
            Started::Admin(Request::Unban { network, prefix_len }) => {
                self.unban(limiter, (network, prefix_len), peer).await
            }
            Started::Admin(other) => unreachable!("only unlock, ban and unban are deferred: {other:?}"),
        }
    }

    /// A check's or report's reply, observed: `attempt` is None for an
    /// abandoned attempt, which gave back its places and counts nowhere.
    fn answer<'l>(
        &self,
        facts: Facts<'_>,
        subject: &Subject<'_>,
        attempt: Option<&Attempt>,
        (verdict, durable, degraded): Reported<'l>,
        now: u64,
    ) -> Answer<'l> {
        if let Some(attempt) = attempt {
            self.observe(&Seen { facts, subject, attempt, verdict: &verdict }, &durable, now);
        }
        (Response::Verdict(verdict), durable, degraded)
    }

    /// Every check and report answered with a verdict passes here once,
    /// after the verdict and before the reply (an abandoned attempt and a
    /// request error do not): the route's counters, the activity stream,
    /// the decision log, and the refusal and lockout log lines. A check is
    /// an attempt without an outcome (`Attempt::check`); it has no durable
    /// writes, only a report can lock. Everything it needs of the request
    /// is in `facts`, as the decision derived it: it asks the limiter
    /// nothing.
    fn observe(&self, seen: &Seen<'_>, durable: &[Durable], now: u64) {
        let Seen { facts, subject, attempt, verdict } = *seen;
        let link = &self.activity.link;
        match attempt.outcome {
            None => {
                facts.count_check(verdict);
                if let Some(account) = subject.account {
                    let sample = link.sample(account);
                    if link.in_sample(sample, now) {
                        link.send(Event::Attempt { at_us: now, sample });
                    }
                }
            }
            Some(outcome) => {
                facts.count_report(verdict, outcome);
                if let (Outcome::Failure, Some(account)) = (outcome, subject.account) {
                    let sample = link.sample(account);
                    link.send(Event::Failure { at_us: now, sample, account: facts.account_tag(account) });
                }
            }
        }
        self.log_decision(seen, now);
        // A check's refusal, and monitor mode's would-be refusals too: the
        // log is how an operator judges a rule before enforcing it. A
        // report's refusal is the lockout below, or one already told.
        let refused = verdict.decision != Decision::Allow || verdict.reason.is_monitored();
        if attempt.outcome.is_none() && refused {
            self.observe_refusal(seen, now);
        }
        if !durable.is_empty() {
            self.log_lockouts(seen, durable, now);
        }
    }

    /// A check's refusal: its log line and its event in the activity
    /// stream. Out of line, as the lockouts below: inlined, the two spread
    /// an admitted check's code over five kilobytes, more than the
    /// instruction cache keeps between one request and the next.
    #[inline(never)]
    fn observe_refusal(&self, seen: &Seen<'_>, now: u64) {
        self.log_refusal(seen, now);
        let refused = seen.facts.describe_refusal(seen.subject, seen.verdict, "check", now);
        self.activity.link.send(Event::Refused(Box::new(refused)));
    }

    /// The lockouts a report just took: one audit line per rule that
    /// locked, and one event each in the activity stream.
    #[cold]
    #[inline(never)]
    fn log_lockouts(&self, seen: &Seen<'_>, durable: &[Durable], now: u64) {
        let Seen { facts, subject, verdict, .. } = *seen;
        let route = facts.route();
        if let Some(suppressed) = self.audit.admit(now) {
            let client = facts.client_origin(subject).map(|(prefix, _)| prefix.to_string());
            // One line per rule that locked, named as itself (the
            // verdict names only the tightest rule), and whether
            // it is in monitor mode (its lock refuses no one).
            let mut named = 0;
            for (rule, monitor) in durable.iter().filter_map(|d| facts.rule_of_write(d.rule()?)) {
                named += 1;
                tracing::info!(target: LOG_TARGET, route, rule = %rule, monitor, client, suppressed, "lockout");
            }
            if named == 0 {
                tracing::info!(target: LOG_TARGET, route, rule = %verdict.rule, client, suppressed, "lockout");
            }
        }
        // One line in the stream per rule that locked, monitor
        // mode's excepted: its lock refuses no one.
        for rule in durable.iter().filter_map(|d| d.rule()) {
            if let Some(locked) = facts.describe_lockout(subject, rule, verdict, now) {
                self.activity.link.send(Event::Lockout(Box::new(locked)));
            }
        }
    }

    async fn unlock<'l>(&self, limiter: &'l Limiter, request: Request<'_>, peer: &Peer, now: u64) -> Answer<'l> {
        let Request::Unlock { route, account, source } = request else { unreachable!("only an unlock is deferred") };
        match limiter.unlock(route, account, source, now) {
            Ok((mut cleared, writes)) => {
                let in_store = match &self.shared {
                    Some(store) if limiter.is_shared() => {
                        self.unlock_shared(store, limiter, route, account, source, now).await
                    }
                    _ => Ok(0),
                };
                cleared += *in_store.as_ref().unwrap_or(&0);
                // Audit lines for admin actions are never capped. The account
                // as `top` and the lockouts' keys show it: its keyed tag.
                let account = crate::activity::account_text(limiter.account_tag(account));
                let source = source.map(|s| s.to_string());
                tracing::info!(target: LOG_TARGET, route, %account, source, cleared, uid = peer.uid,
                    store_error = in_store.as_ref().err(), "unlock");
                match in_store {
                    Ok(_) => (Response::Unlocked { cleared }, writes, false),
                    Err(why) => (
                        Response::error(
                            ErrorCode::Internal,
                            format!(
                                "cleared {cleared} entries on this host, but not in the shared store ({why}); \
                                 unlock again when the store is reachable"
                            ),
                        ),
                        writes,
                        false,
                    ),
                }
            }
            Err(e) => (request_error(e), Vec::new(), false),
        }
    }
}

/// A request begun by `Daemon::start`: answered, or waiting.
pub(crate) enum Started<'b, 'l> {
    Ready(Answer<'l>),
    /// A check or report whose global rules' op is queued to the store.
    /// Boxed, so that every request's `Started` is small: the box is the
    /// one allocation beside a store round trip, and none in local mode.
    Waiting(Box<Waiting<'b, 'l>>),
    /// An unlock, ban or unban (admin, rare): answered whole by `finish`,
    /// which waits for the store or the state file before replying.
    Admin(Request<'b>),
}

/// A check or report (an abandoned attempt: no `attempt`) waiting for the
/// store's reply.
pub(crate) struct Waiting<'b, 'l> {
    facts: Facts<'l>,
    subject: Subject<'b>,
    attempt: Option<Attempt>,
    ticket: Ticket<'b>,
    pending: AwaitingStore<'l>,
}

/// A reply, the durable writes that must complete before it is sent, and
/// whether a global rule was decided on this host's degraded share (a
/// version-2 reply's flag).
pub(crate) type Answer<'l> = (Response<'l>, Vec<Durable>, bool);

/// An answered check or report, as observation sees it: what the request
/// asked and the verdict it got.
#[derive(Clone, Copy)]
struct Seen<'a> {
    facts: Facts<'a>,
    subject: &'a Subject<'a>,
    attempt: &'a Attempt,
    verdict: &'a Verdict<'a>,
}

/// A decoded request, ready to answer: a peer's permission already
/// decided, and a check's keys already derived (`Limiter::plan_check`), so
/// that a batch's table slots can be prefetched before any is decided.
pub(crate) enum Job<'b, 'l> {
    Check {
        subject: Subject<'b>,
        plan: Result<CheckPlan<'l>, RequestError>,
    },
    /// A report, with its password tag (version 3), which `Request` has no
    /// room for; an outcome of None is an abandoned attempt (version 5).
    Report {
        route: &'b str,
        subject: Subject<'b>,
        report: Report,
    },
    /// The peer may not ask this (the operation, for the reply and the log).
    Denied(&'static str),
    /// Any other request the peer may ask; never a check or a report.
    Other(Request<'b>),
}

impl<'b, 'l> Job<'b, 'l> {
    /// `extras` is what a version-3 check or report carries beyond its
    /// message: the password tag goes on the check's plan or with the report.
    pub(crate) fn new(
        limiter: &'l Limiter,
        request: Request<'b>,
        extras: RequestExtras,
        permissions: Permissions,
        now: u64,
    ) -> Job<'b, 'l> {
        let RequestExtras { password_tag } = extras;
        match request {
            Request::Check { .. } | Request::Report { .. } if !permissions.attempts => Job::Denied("check or report"),
            Request::Abandon { .. } if !permissions.attempts => Job::Denied("abandon"),
            Request::Unlock { .. } if !permissions.admin => Job::Denied("unlock"),
            Request::ClockAdvance { .. } if !permissions.admin => Job::Denied("clock advance"),
            // It reveals an account's standing: as private as an unlock.
            Request::Inspect { .. } if !permissions.admin => Job::Denied("inspect"),
            Request::Ban { .. } if !permissions.admin => Job::Denied("ban"),
            Request::Unban { .. } if !permissions.admin => Job::Denied("unban"),
            Request::Check { route, subject } => {
                // The tag is set in place: a plan is too large to move
                // through a `map` on every check.
                let mut plan = limiter.plan_check(route, &subject, now);
                if let Ok(plan) = &mut plan {
                    plan.set_password_tag(password_tag);
                }
                Job::Check { subject, plan }
            }
            Request::Report { route, subject, outcome, password_digest } => {
                let report = Report { outcome: Some(outcome), password_digest, password_tag };
                Job::Report { route, subject, report }
            }
            Request::Abandon { route, subject } => Job::Report { route, subject, report: Report::default() },
            other => Job::Other(other),
        }
    }
}

impl Daemon {
    /// Hands a verdict to the decision log, when it is on (when off: one
    /// branch). The digests are derived here, on the request thread.
    #[inline]
    fn log_decision(&self, seen: &Seen<'_>, now: u64) {
        if let Some(log) = &self.decision_log {
            log.send(seen.facts.decision_record(seen.subject, seen.attempt, seen.verdict, now));
        }
    }

    fn log_refusal(&self, seen: &Seen<'_>, now: u64) {
        let Seen { facts, subject, verdict, .. } = *seen;
        if let Some(suppressed) = self.refusals.admit(now) {
            let client = facts.client_origin(subject).map(|(prefix, _)| prefix.to_string());
            tracing::info!(target: LOG_TARGET,
                route = facts.route(),
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
