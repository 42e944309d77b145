//! What the decision log records of a request: the subject's digests and
//! resolved address, derived here because only the limiter holds the
//! secret and the source policy. Called on the request thread, and only
//! while the log is on.

use std::net::IpAddr;

use super::Limiter;
use crate::decision_log::{mask_64, Attempt, Name, Op, Record};
use crate::keys::Component;
use crate::protocol::{Subject, Verdict};
use crate::source::forwarded_tail;

/// `KeyDeriver::logged`'s `what` for a report's password digest and for
/// an attempt's password tag.
const LOGGED_PASSWORD_DIGEST: u8 = 1;
const LOGGED_PASSWORD_TAG: u8 = 2;

impl Limiter {
    /// The decision log's record of one verdict: digests of the subject's
    /// fields (never the fields), the client's address as the running
    /// source policy resolves it (IPv6 cut to its /64), and the verdict.
    pub(crate) fn decision_record(
        &self,
        route: &str,
        subject: &Subject<'_>,
        attempt: &Attempt,
        verdict: &Verdict<'_>,
        now_us: u64,
    ) -> Record {
        let digest = |component, value: Option<&str>| value.map(|v| self.keys.component(component, v.as_bytes()));
        let address = subject.peer.map(|peer| {
            match self.source.client_address(peer, subject.forwarded_for.map(forwarded_tail)) {
                IpAddr::V6(v6) => IpAddr::V6(mask_64(v6)),
                v4 => v4,
            }
        });
        Record {
            time_us: now_us,
            op: attempt.outcome.map_or(Op::Check, Op::Report),
            decision: verdict.decision,
            reason: verdict.reason,
            route: Name::from_slice(route.as_bytes()),
            rule: Name::from_slice(verdict.rule.as_bytes()),
            address,
            account: digest(Component::Account, subject.account),
            device: digest(Component::Device, subject.device),
            tenant: digest(Component::Tenant, subject.tenant),
            client_id: digest(Component::ClientId, subject.client_id),
            password_digest: attempt.password_digest.map(|d| self.keys.logged(LOGGED_PASSWORD_DIGEST, &d)),
            password_tag: attempt.password_tag.map(|t| self.keys.logged(LOGGED_PASSWORD_TAG, &t)),
        }
    }
}
