//! What observation (`daemon/request.rs`: counters, the activity stream,
//! the decision log, the refusal and lockout lines) is given with a
//! verdict: `Facts`, the route and what the decision already derived of
//! its subject (the client's class, the account's digest, whether the
//! device is known), so that observing a verdict looks nothing up in the
//! limiter's tables and derives the account's digest only if no rule
//! did. Read after a verdict is given, never while deciding one.

use std::net::IpAddr;
use std::sync::Arc;

use super::subject::SubjectKeys;
use super::{Limiter, Route};
use crate::activity::Refused;
use crate::classes::SourceClass;
use crate::decision_log::{mask_64, Attempt, Name, Op, Record};
use crate::keys::{account_tag_of, Component};
use crate::protocol::{Outcome, RouteActivity, Subject, Verdict};
use crate::source::{forwarded_tail, Prefix};

/// `KeyDeriver::logged`'s `what` for a report's password digest and for
/// an attempt's password tag.
const LOGGED_PASSWORD_DIGEST: u8 = 1;
const LOGGED_PASSWORD_TAG: u8 = 2;

/// A check's or report's route and subject as its decision derived them
/// (see the module doc). Made with the keys, before any table is touched,
/// by the limiter that decides the request.
#[derive(Clone, Copy)]
pub struct Facts<'l> {
    limiter: &'l Limiter,
    pub(super) route: &'l Route,
    /// The account's digest, when a key needed it: a failure's event and
    /// a lockout name the account by it.
    account: Option<[u8; 16]>,
    /// The client's source class.
    pub(super) class: Option<SourceClass>,
    /// Whether this host knows the device, as the decision saw it: a
    /// device remembered after the plan (by an earlier success in the same
    /// pipelined run, or on another connection while a shared check
    /// waits) shows as unknown, as the rules judged it.
    pub(super) known_device: bool,
}

impl<'l> Facts<'l> {
    /// Kept small: every check's plan carries it. What only a refusal,
    /// a lockout or the decision log needs (the client's address, other
    /// digests) is worked out there, without a table or a lock.
    pub(super) fn new(
        limiter: &'l Limiter,
        route: &'l Route,
        keys: &mut SubjectKeys<'_, '_>,
        known: bool,
    ) -> Facts<'l> {
        let account = keys.derived(Component::Account);
        Facts { limiter, route, account, class: keys.source_class(), known_device: known }
    }

    /// The route's name.
    pub fn route(&self) -> &'l str {
        &self.route.name
    }

    /// Counts a check's verdict on its route.
    pub fn count_check(&self, verdict: &Verdict<'_>) {
        self.route.activity.check(verdict);
    }

    /// Counts a report's outcome and verdict on its route.
    pub fn count_report(&self, verdict: &Verdict<'_>, outcome: Outcome) {
        self.route.activity.report(verdict, outcome);
    }

    /// The `account_tag` of the request's account (`account`, the
    /// subject's).
    pub fn account_tag(&self, account: &str) -> u64 {
        let digest =
            self.account.unwrap_or_else(|| self.limiter.keys.component(Component::Account, account.as_bytes()));
        account_tag_of(&digest)
    }

    /// A component's digest: the account's as derived, any other now.
    fn digest(&self, component: Component, value: Option<&str>) -> Option<[u8; 16]> {
        let derived = if component == Component::Account { self.account } else { None };
        let value = value?;
        Some(derived.unwrap_or_else(|| self.limiter.keys.component(component, value.as_bytes())))
    }

    /// The client's address as the rules resolve it (a forwarded address
    /// only through a trusted proxy); None without a peer.
    fn client_address(&self, subject: &Subject<'_>) -> Option<IpAddr> {
        let forwarded = subject.forwarded_for.map(forwarded_tail);
        Some(self.limiter.source.client_address(subject.peer?, forwarded))
    }

    /// The client's prefix (in its class's length) and its class.
    pub fn client_origin(&self, subject: &Subject<'_>) -> Option<(Prefix, Option<SourceClass>)> {
        let address = self.client_address(subject)?;
        Some((self.limiter.source.prefix_in_class(address, self.class), self.class))
    }

    /// The name of the rule a durable write (`route/rule`) belongs to, and
    /// whether it is in monitor mode.
    pub fn rule_of_write(&self, id: &Arc<str>) -> Option<(&'l str, bool)> {
        let rule = self.route.rules.iter().find(|r| r.id == *id)?;
        Some((&rule.name, rule.monitor))
    }

    /// A lockout `rule` (`route/rule`) just took, as the operator's view
    /// keeps it; `None` for a rule in monitor mode (its lock refuses no
    /// one).
    pub fn describe_lockout(
        &self,
        subject: &Subject<'_>,
        rule: &Arc<str>,
        verdict: &Verdict<'_>,
        now_us: u64,
    ) -> Option<Refused> {
        let found = self.route.rules.iter().find(|r| r.id == *rule)?;
        if found.monitor {
            return None;
        }
        let mut locked = self.describe_refusal(subject, verdict, "report", now_us);
        locked.rule = found.id.clone();
        // The verdict's wait is this rule's only when the verdict names it.
        if verdict.rule != found.name {
            locked.retry_after_ms = 0;
        }
        Some(locked)
    }

    /// A verdict that refused (or would have) as the operator's view keeps
    /// it: the rule, the client's network and class, and, for a would-be
    /// refusal or a lockout (`op` "report"), the account's and device's
    /// digests and whether the device is known.
    pub fn describe_refusal(
        &self,
        subject: &Subject<'_>,
        verdict: &Verdict<'_>,
        op: &'static str,
        now_us: u64,
    ) -> Refused {
        let route = self.route;
        let rule = route
            .rules
            .iter()
            .find(|rule| rule.name == verdict.rule)
            .map_or_else(|| Arc::from(format!("{}/{}", route.name, verdict.rule)), |rule| rule.id.clone());
        let (prefix, class) = match self.client_origin(subject) {
            Some((prefix, class)) => (Some(prefix), class),
            None => (None, None),
        };
        // An enforced refusal (which a flood can make of every check)
        // shows its network only: no digest is derived for it.
        let detailed = verdict.reason.is_monitored() || op == "report";
        let device = self
            .digest(Component::Device, subject.device.filter(|_| detailed))
            .map(|digest| u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")));
        Refused {
            at_us: now_us,
            rule,
            op,
            decision: verdict.decision,
            reason: verdict.reason,
            retry_after_ms: verdict.retry_after_ms,
            prefix,
            class,
            account: subject.account.filter(|_| detailed).map(|a| self.account_tag(a)),
            device,
            known_device: detailed && self.known_device,
        }
    }

    /// The decision log's record of one verdict: digests of the subject's
    /// fields (never the fields), the client's address as the running
    /// source policy resolves it (IPv6 cut to its /64), and the verdict.
    pub(crate) fn decision_record(
        &self,
        subject: &Subject<'_>,
        attempt: &Attempt,
        verdict: &Verdict<'_>,
        now_us: u64,
    ) -> Record {
        let keys = &self.limiter.keys;
        let address = self.client_address(subject).map(|address| match address {
            IpAddr::V6(v6) => IpAddr::V6(mask_64(v6)),
            v4 => v4,
        });
        Record {
            time_us: now_us,
            op: attempt.outcome.map_or(Op::Check, Op::Report),
            decision: verdict.decision,
            reason: verdict.reason,
            route: Name::from_slice(self.route.name.as_bytes()),
            rule: Name::from_slice(verdict.rule.as_bytes()),
            address,
            account: self.digest(Component::Account, subject.account),
            device: self.digest(Component::Device, subject.device),
            tenant: self.digest(Component::Tenant, subject.tenant),
            client_id: self.digest(Component::ClientId, subject.client_id),
            password_digest: attempt.password_digest.map(|d| keys.logged(LOGGED_PASSWORD_DIGEST, &d)),
            password_tag: attempt.password_tag.map(|t| keys.logged(LOGGED_PASSWORD_TAG, &t)),
        }
    }
}

impl Limiter {
    /// How many routes there are (what an `activity` reply lists).
    pub fn route_count(&self) -> usize {
        self.routes.len()
    }

    /// Every route's verdicts since the daemon started.
    pub fn route_activity(&self) -> Vec<RouteActivity> {
        self.routes.iter().map(|r| r.activity.read(&r.name)).collect()
    }

    /// The account's `account_tag` (see `KeyDeriver::account_tag`).
    pub fn account_tag(&self, account: &str) -> u64 {
        self.keys.account_tag(account)
    }
}
