//! What a call gives back: the daemon's verdict, its refusal of the
//! request, or that it could not answer in time, with the route's fail
//! policy. A daemon that did not answer is surfaced to the caller as such,
//! never as a fake verdict, so the auth server can tell the two apart.

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::{ErrorReply, SharedStatus, SignalsStatus, Status, Verdict};
use crate::FailPolicy;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach tollgate at {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("connection to tollgate failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("tollgate did not answer within {0:?}")]
    Timeout(Duration),
    /// No answer within the timeout from a daemon that has answered this
    /// client, in a run of timeouts younger than `ClientConfig::busy_max`
    /// or within `busy_max` of its last answer, in time or late,
    /// for a check that another check on the same account (or address)
    /// overlapped on this client: a burst, and the daemon is busy, not
    /// down. The attempt does not proceed,
    /// whatever the route's fail policy: a guess let through because the
    /// limiter was slow is a guess with no limit at all.
    #[error("tollgate is busy: no answer within {0:?}, answered lately")]
    Busy(Duration),
    #[error("unexpected reply from tollgate: {0}")]
    Protocol(String),
    #[error("tollgate refused the request: {}", .0.message)]
    Daemon(ErrorReply),
}

/// What the auth server should do with an attempt.
#[derive(Debug)]
pub enum Answer {
    /// The daemon's verdict.
    Verdict(Verdict<'static>),
    /// The daemon refused the request itself (an identifier too long, an
    /// unknown route): treat the attempt as refused, and fix the caller.
    Rejected(ErrorReply),
    /// The daemon could not answer in time; the route's fail policy
    /// decides. A closed route may still let the attempt through when it is
    /// within the route's static budget (`ClientConfig::static_budget`).
    Unavailable { policy: FailPolicy, error: ClientError, within_static_budget: bool },
}

impl Answer {
    /// Whether the attempt may go ahead (after `delay_ms` for a delay).
    pub fn proceeds(&self) -> bool {
        match self {
            Answer::Verdict(v) => v.proceeds(),
            Answer::Rejected(_) => false,
            Answer::Unavailable { error: ClientError::Busy(_), .. } => false,
            Answer::Unavailable { policy, within_static_budget, .. } => {
                *policy == FailPolicy::Open || *within_static_budget
            }
        }
    }

    /// How long to hold the attempt before it proceeds (a `delay` verdict).
    pub fn delay(&self) -> Option<std::time::Duration> {
        self.verdict()
            .filter(|v| v.decision == crate::protocol::Decision::Delay && v.delay_ms > 0)
            .map(|v| std::time::Duration::from_millis(v.delay_ms))
    }

    /// The `Retry-After` to send with a refusal, in whole seconds (rounded
    /// up, at least 1); 1 when the refusal did not come from a verdict.
    pub fn retry_after_secs(&self) -> u64 {
        self.verdict().map_or(1, |v| v.retry_after_ms.div_ceil(1000).max(1))
    }

    pub fn verdict(&self) -> Option<&Verdict<'static>> {
        match self {
            Answer::Verdict(v) => Some(v),
            _ => None,
        }
    }
}

/// An `Answer` with what a version-2 verdict says beyond it. A separate
/// wrapper because `Answer::Verdict` holds the v1 `Verdict` and callers
/// destructure it: adding the flag there would break every one of them.
#[derive(Debug)]
pub struct Answered {
    pub answer: Answer,
    /// At least one global rule of the verdict was decided on this host's
    /// degraded share (the shared store was unreachable). False for any other
    /// answer, and from a daemon that speaks version 1 only.
    pub degraded: bool,
}

/// A status reply with everything the daemon's version could say: the
/// version-1 `Status`, version 2's shared store and version 3's spray
/// detection (each `None` when the daemon runs without it, or speaks an
/// older version).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullStatus {
    pub status: Status,
    pub shared: Option<SharedStatus>,
    pub signals: Option<SignalsStatus>,
}
