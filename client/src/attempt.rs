//! `Attempt`: a login attempt from its check to its outcome, which gives
//! its places back when it ends without one.
//!
//! An admitted check holds a place on each failure rule until its report,
//! so that parallel guesses cannot all pass before the first failure is
//! counted. A handler that never reports (the end user hung up and the web
//! framework dropped the future, a deadline passed, a panic) would leave
//! its place held until `attempt_timeout_ms`, and a stranger who aborts
//! logins on purpose could keep a real user out with places nobody tried a
//! password for. The guard closes that: dropped without `report`, it tells
//! the daemon the attempt was abandoned, in the background.
//!
//! The handler can be cancelled at any await, including while its check or
//! its report is on the wire. So both run on tasks of their own: the check's
//! task makes the guard and hands it over, and a guard nobody takes (the
//! handler is gone) is dropped there and abandons; the report's task sends
//! the report whether or not anyone still waits for its answer.

use std::net::IpAddr;
use std::sync::Arc;

use crate::answer::{Answer, Answered, ClientError};
use crate::client::Client;
use crate::protocol::{Decision, Outcome, Request, Subject};

/// An owned copy of a `Subject`, so that a dropped guard can still name
/// the attempt it abandons after the request that lent the fields is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct OwnedSubject {
    peer: Option<IpAddr>,
    forwarded_for: Option<String>,
    account: Option<String>,
    device: Option<String>,
    tenant: Option<String>,
    client_id: Option<String>,
}

impl OwnedSubject {
    fn of(subject: &Subject<'_>) -> OwnedSubject {
        OwnedSubject {
            peer: subject.peer,
            forwarded_for: subject.forwarded_for.map(str::to_owned),
            account: subject.account.map(str::to_owned),
            device: subject.device.map(str::to_owned),
            tenant: subject.tenant.map(str::to_owned),
            client_id: subject.client_id.map(str::to_owned),
        }
    }

    fn as_subject(&self) -> Subject<'_> {
        Subject {
            peer: self.peer,
            forwarded_for: self.forwarded_for.as_deref(),
            account: self.account.as_deref(),
            device: self.device.as_deref(),
            tenant: self.tenant.as_deref(),
            client_id: self.client_id.as_deref(),
        }
    }
}

/// A checked attempt, until its outcome is reported ([`Attempt::report`])
/// or it is given up ([`Attempt::abandon`]). Dropped without either while
/// the check had admitted it, it sends `abandon` on a tokio task, so a
/// cancelled future or a panic still gives its places back (without a
/// runtime to spawn on, the places lapse after `attempt_timeout_ms`).
///
/// Only an attempt the daemon allowed holds places: a refused, delayed or
/// unanswered check sends nothing when dropped. In
/// particular a check that timed out is never abandoned: the daemon may
/// not have seen it, and an abandon would then free another attempt's
/// place. Do not drop the guard while the attempt goes on (`if
/// !client.begin(..).await.proceeds()` abandons at once): keep it until
/// the outcome is known.
#[must_use = "report the attempt's outcome, or it is abandoned when dropped"]
pub struct Attempt {
    client: Arc<Client>,
    route: String,
    subject: OwnedSubject,
    answered: Answered,
    /// The check's password tag: a report given none carries it, so a
    /// failure is never invisible to spray detection by omission.
    password_tag: Option<[u8; 16]>,
    /// The daemon admitted the check and no outcome was sent yet.
    holds_places: bool,
}

impl Client {
    /// Checks an attempt and returns it as a guard: report its outcome
    /// with [`Attempt::report`]; if it is dropped first, it is abandoned.
    /// Cancelling this future while the check is on the wire abandons the
    /// attempt too, once the daemon's answer comes.
    pub async fn begin(
        self: &Arc<Self>,
        route: &str,
        subject: &Subject<'_>,
        password_tag: Option<[u8; 16]>,
    ) -> Attempt {
        let client = Arc::clone(self);
        let (route, subject) = (route.to_owned(), OwnedSubject::of(subject));
        let route_name = route.clone();
        let (handed, taken) = tokio::sync::oneshot::channel();
        let checking = tokio::spawn(async move {
            let answered = client.check_tagged(&route, &subject.as_subject(), password_tag).await;
            let holds_places = holds_places(&answered.answer);
            // Sent or not, the guard lives on: in the caller's hands, in the
            // channel until the receiver goes, or dropped right here.
            let _ = handed.send(Attempt { client, route, subject, answered, password_tag, holds_places });
        });
        match taken.await {
            Ok(attempt) => attempt,
            Err(_) => {
                let answered = ended_without_answer(self, &route_name, true, checking.await.err());
                let subject = OwnedSubject::default();
                Attempt {
                    client: Arc::clone(self),
                    route: route_name,
                    subject,
                    answered,
                    password_tag,
                    holds_places: false,
                }
            }
        }
    }

    /// The attempt a check admitted ended without an outcome: its places
    /// are given back and nothing is counted. Prefer [`Client::begin`],
    /// whose guard sends this by itself. A daemon older than protocol
    /// version 5 answers it with a `malformed` error, and the places lapse.
    pub async fn abandon(&self, route: &str, subject: &Subject<'_>) -> Answered {
        let request = Request::Abandon { route, subject: crate::preflight::bounded(subject) };
        self.decide(route, &request, &Default::default()).await
    }
}

impl Attempt {
    /// The check's answer.
    pub fn answered(&self) -> &Answered {
        &self.answered
    }

    pub fn answer(&self) -> &Answer {
        &self.answered.answer
    }

    /// Whether the attempt may go ahead (see [`Answer::proceeds`]).
    pub fn proceeds(&self) -> bool {
        self.answered.answer.proceeds()
    }

    /// Reports the verified outcome; the guard is spent. The report goes
    /// out even if this future is cancelled (the verify happened, so the
    /// outcome counts), on a task of its own. Without a `password_tag` it
    /// carries the check's.
    pub async fn report(
        mut self,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        password_tag: Option<[u8; 16]>,
    ) -> Answered {
        let subject = std::mem::take(&mut self.subject);
        self.send_report(subject, outcome, password_digest, password_tag).await
    }

    /// `report` with the subject as it stands after the verify, such as
    /// the device id issued at a successful sign-in (so the daemon knows
    /// the device next time). The route is the check's.
    pub async fn report_as(
        self,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        password_tag: Option<[u8; 16]>,
    ) -> Answered {
        self.send_report(OwnedSubject::of(subject), outcome, password_digest, password_tag).await
    }

    /// The report, on a task of its own: a handler cancelled while it is on
    /// the wire neither loses it (the verify happened: the failure counts)
    /// nor leaves the place held.
    async fn send_report(
        mut self,
        subject: OwnedSubject,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        password_tag: Option<[u8; 16]>,
    ) -> Answered {
        self.holds_places = false;
        let password_tag = password_tag.or(self.password_tag);
        let client = Arc::clone(&self.client);
        let route = self.route.clone();
        let reporting = tokio::spawn(async move {
            client.report_tagged(&route, &subject.as_subject(), outcome, password_digest, password_tag).await
        });
        let ended = reporting.await;
        ended.unwrap_or_else(|e| ended_without_answer(&self.client, &self.route, false, Some(e)))
    }

    /// Gives the attempt up now, waiting for the daemon's answer (dropping
    /// the guard does the same in the background). Returns None when the
    /// attempt held no place, so there was nothing to send.
    pub async fn abandon(mut self) -> Option<Answered> {
        if !std::mem::take(&mut self.holds_places) {
            return None;
        }
        // On a task of its own, as the report: cancelled here, it still goes.
        let client = Arc::clone(&self.client);
        let (route, subject) = (self.route.clone(), std::mem::take(&mut self.subject));
        let abandoning = tokio::spawn(async move { client.abandon(&route, &subject.as_subject()).await });
        let ended = abandoning.await;
        Some(ended.unwrap_or_else(|e| ended_without_answer(&self.client, &self.route, false, Some(e))))
    }
}

/// A task of this module ended without its answer: it panicked (the panic
/// goes on here), or the runtime is shutting down under it, which is
/// answered as a daemon that cannot be reached is: by the route's fail
/// policy (`spend` as for `Client::unavailable`).
fn ended_without_answer(client: &Client, route: &str, spend: bool, error: Option<tokio::task::JoinError>) -> Answered {
    match error {
        Some(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        _ => {
            let why = std::io::Error::other("the runtime is shutting down: the call's task ended without an answer");
            Answered { answer: client.unavailable(route, ClientError::Io(why), spend), degraded: false }
        }
    }
}

/// Whether a check's answer left places held: only an allowed attempt's
/// (a delayed check gave its places back, though it proceeds).
fn holds_places(answer: &Answer) -> bool {
    matches!(answer, Answer::Verdict(v) if v.decision == Decision::Allow)
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.holds_places {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let client = Arc::clone(&self.client);
        let route = std::mem::take(&mut self.route);
        let subject = std::mem::take(&mut self.subject);
        runtime.spawn(async move {
            client.abandon(&route, &subject.as_subject()).await;
        });
    }
}

impl std::fmt::Debug for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attempt")
            .field("route", &self.route)
            .field("answered", &self.answered)
            .field("holds_places", &self.holds_places)
            .finish_non_exhaustive()
    }
}
