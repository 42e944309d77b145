//! `inspect`'s answer, and its audit line: an admin reading an account's
//! standing (`Limiter::inspect` reads; this logs and replies).

use super::{request_error, Daemon, Peer, LOG_TARGET};
use crate::limiter::Limiter;
use crate::protocol::{Response, Subject};

impl Daemon {
    /// An account's standing, read only. Audited as an unlock is (uncapped,
    /// by uid and route, never the account): it is an admin reading
    /// someone's state.
    pub(super) fn inspect(
        &self,
        limiter: &Limiter,
        route: &str,
        subject: &Subject<'_>,
        peer: &Peer,
        now: u64,
    ) -> Response<'static> {
        match limiter.inspect(route, subject, now) {
            Ok(inspection) => {
                let refusing = inspection.rules.iter().filter(|r| r.refuses).count();
                tracing::info!(target: LOG_TARGET, route, refusing, uid = peer.uid, "inspect");
                Response::Inspection(Box::new(inspection))
            }
            Err(e) => request_error(e),
        }
    }
}
