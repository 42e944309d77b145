//! What the operator's view asks of the limiter (`activity/`): verdicts
//! counted per route, and a refusal described by digests and networks.
//! Called after a verdict is given, never while deciding one.

use std::sync::Arc;

use super::{Limiter, Route};
use crate::activity::Refused;
use crate::keys::Component;
use crate::protocol::{Outcome, RouteActivity, Subject, Verdict};

impl Limiter {
    fn route_named(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }

    /// Counts a check's verdict on its route.
    pub fn count_check(&self, route: &str, verdict: &Verdict<'_>) {
        if let Some(route) = self.route_named(route) {
            route.activity.check(verdict);
        }
    }

    /// Counts a report's outcome and verdict on its route.
    pub fn count_report(&self, route: &str, verdict: &Verdict<'_>, outcome: Outcome) {
        if let Some(route) = self.route_named(route) {
            route.activity.report(verdict, outcome);
        }
    }

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

    /// The name of the rule a durable write (`route/rule`) belongs to, and
    /// whether it is in monitor mode; `None` for one this limiter no longer has.
    pub fn rule_of_write(&self, id: &Arc<str>) -> Option<(&str, bool)> {
        let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| r.id == *id)?;
        Some((&rule.name, rule.monitor))
    }

    /// A lockout `rule` (`route/rule`) just took, as the operator's view
    /// keeps it; `None` for a rule in monitor mode (its lock refuses no
    /// one) or one this limiter no longer has.
    pub fn describe_lockout(
        &self,
        route: &str,
        subject: &Subject<'_>,
        rule: &Arc<str>,
        verdict: &Verdict<'_>,
        now_us: u64,
    ) -> Option<Refused> {
        let found = self.route_named(route)?.rules.iter().find(|r| r.id == *rule)?;
        if found.monitor {
            return None;
        }
        let mut locked = self.describe_refusal(route, subject, verdict, "report", now_us);
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
        route: &str,
        subject: &Subject<'_>,
        verdict: &Verdict<'_>,
        op: &'static str,
        now_us: u64,
    ) -> Refused {
        let found = self.route_named(route);
        let rule = found
            .and_then(|r| r.rules.iter().find(|rule| rule.name == verdict.rule))
            .map_or_else(|| Arc::from(format!("{route}/{}", verdict.rule)), |rule| rule.id.clone());
        let (prefix, class) = match self.client_origin(subject) {
            Some((prefix, class)) => (Some(prefix), class),
            None => (None, None),
        };
        // The digests cost a few BLAKE2 calls: an enforced refusal (which a
        // flood can make of every check) shows its network only.
        let detailed = verdict.reason.is_monitored() || op == "report";
        let device = subject.device.filter(|_| detailed).map(|d| {
            let digest = self.keys.component(Component::Device, d.as_bytes());
            u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
        });
        let known_device = detailed
            && found.is_some_and(|r| {
                let mut keys = self.subject_keys(&r.name, subject);
                self.known_device(r, &mut keys, now_us).unwrap_or(false)
            });
        Refused {
            at_us: now_us,
            rule,
            op,
            decision: verdict.decision,
            reason: verdict.reason,
            retry_after_ms: verdict.retry_after_ms,
            prefix,
            class,
            account: subject.account.filter(|_| detailed).map(|a| self.keys.account_tag(a)),
            device,
            known_device,
        }
    }
}
