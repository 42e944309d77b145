//! What `status` shows of the limiter: every route, rule and table fill.

use std::sync::atomic::Ordering;

use super::route::{Full, Rule, Table};
use super::Limiter;
use crate::classes::SourceClass;
use crate::protocol::{ClassLimit, RouteStatus, RuleStatus, Subject};
use crate::source::forwarded_tail;

impl Limiter {
    /// The source prefix a subject is counted under (for log lines).
    pub fn client_prefix(&self, subject: &Subject<'_>) -> Option<crate::source::Prefix> {
        self.client_origin(subject).map(|(prefix, _)| prefix)
    }

    /// The client's prefix and its source class.
    pub fn client_origin(&self, subject: &Subject<'_>) -> Option<(crate::source::Prefix, Option<SourceClass>)> {
        let peer = subject.peer?;
        let forwarded = subject.forwarded_for.map(forwarded_tail);
        let address = self.source.client_address(peer, forwarded);
        let class = self.classes.lookup(address);
        Some((self.source.prefix_in_class(address, class), class))
    }

    pub fn class_prefixes(&self) -> usize {
        self.classes.len()
    }

    /// Each source exemption for `status`'s named values, after the route
    /// limits: named `source.exemption <prefix> <reason>`, valued with the
    /// checks it has exempted (PROTOCOL.md: a name with a space is not a
    /// bound), so that `Status` keeps its bytes for every version.
    pub fn exemption_values(&self) -> Vec<(String, u64)> {
        self.exemptions.entries().map(|(e, checks)| (e.status_name(), checks)).collect()
    }

    /// Route-scoped bounds for `status`'s named limits, as `route.name`.
    pub fn route_limits(&self) -> Vec<(String, u64)> {
        let known = self.routes.iter().filter_map(|r| Some((&r.name, r.known_devices.as_ref()?)));
        let mut limits: Vec<(String, u64)> = known
            .map(|(name, k)| (format!("{name}.known_devices_per_account_max"), u64::from(k.per_account_max)))
            .collect();
        for route in &self.routes {
            if let Some(lockouts) = &route.known_lockouts {
                let max = lockouts.each().map(|t| t.entries_max() as u64).sum();
                limits.push((format!("{}.known_lockouts_max", route.name), max));
            }
        }
        limits
    }

    /// Shared mode: `route/rule` of every rule the store decides.
    pub fn global_rules(&self) -> Vec<String> {
        let rules = self.routes.iter().flat_map(|r| &r.rules);
        rules.filter(|r| r.global.is_some()).map(|r| r.id.to_string()).collect()
    }

    /// Lockouts the store reported that this host refuses from memory.
    pub fn known_lockouts(&self, now_us: u64) -> u64 {
        let tables = self.routes.iter().filter_map(|r| r.known_lockouts.as_ref());
        tables.flat_map(|t| t.each()).map(|t| t.live(now_us).len() as u64).sum()
    }

    pub fn route_status(&self) -> Vec<RouteStatus> {
        self.routes
            .iter()
            .map(|route| {
                let (known_devices, known_devices_max) = route.known_devices.as_ref().map_or((0, 0), |k| {
                    k.shards.each().fold((0, 0), |(n, m), t| (n + t.len() as u64, m + t.entries_max() as u64))
                });
                RouteStatus {
                    name: route.name.clone(),
                    fail_policy: route.fail_policy.name().to_string(),
                    rules: route.rules.iter().map(rule_status).collect(),
                    known_devices,
                    known_devices_max,
                    recent_passwords: route.recent_passwords.as_ref().map_or(0, |r| r.remembered as u8),
                }
            })
            .collect()
    }
}

fn rule_status(rule: &Rule) -> RuleStatus {
    let key = rule.key.iter().map(|c| c.name().to_string()).collect();
    // A global rule's table holds this host's degraded share; status
    // shows the rule's whole limit, the one the store enforces.
    let (full_rate, full_by_class, full_spec) = match (&rule.global, &rule.table) {
        (Some(Full::Rate { rate, by_class }), _) => (Some(*rate), Some(*by_class), None),
        (Some(Full::Failures(spec)), _) => (None, None, Some(*spec)),
        _ => (None, None, None),
    };
    let (kind, limit, burst, period_ms, cleared_by_success, class_limits, (entries, entries_max, refused_full)) =
        match &rule.table {
            Table::Rate { rate, by_class, shards } => {
                let rate = full_rate.as_ref().unwrap_or(rate);
                let by_class = full_by_class.as_ref().unwrap_or(by_class);
                let class_limits = SourceClass::ALL
                    .iter()
                    .filter_map(|c| {
                        by_class[*c].map(|r| ClassLimit {
                            class: c.name().into(),
                            limit: r.limit,
                            burst: r.burst,
                            period_ms: r.period_us / 1000,
                        })
                    })
                    .collect();
                let fill =
                    shards.each().fold((0, 0, 0), |(n, m, f), t| (n + t.len() as u64, m + t.entries_max() as u64, f));
                ("rate", rate.limit, rate.burst, rate.period_us / 1000, false, class_limits, fill)
            }
            Table::Failures { spec, cleared_by_success, shards } => {
                let spec = full_spec.as_ref().unwrap_or(spec);
                let fill = shards.each().fold((0, 0, 0), |(n, m, f), t| {
                    (n + t.len() as u64, m + t.entries_max() as u64, f + t.refused_full() + t.presumed_failures())
                });
                ("failures", spec.threshold, 0, spec.window_us / 1000, *cleared_by_success, Vec::new(), fill)
            }
            // Its table is its ladder; its detectors' figures are in the
            // signals section of `status`.
            Table::Signal { window_us, .. } => {
                let fill = rule
                    .escalation
                    .each()
                    .fold((0, 0, 0), |(n, m, f), t| (n + t.len() as u64, m + t.entries_max() as u64, f));
                ("signal", 0, 0, window_us / 1000, false, Vec::new(), fill)
            }
        };
    RuleStatus {
        name: rule.name.clone(),
        kind: kind.into(),
        key,
        limit,
        burst,
        period_ms,
        cleared_by_success,
        entries,
        entries_max,
        refused_full,
        monitor: rule.monitor,
        responses: rule.responses.iter().map(|r| r.name().to_string()).collect(),
        devices: rule.devices.name().into(),
        refused: rule.counters.refused.load(Ordering::Relaxed),
        would_refuse: rule.counters.would_refuse.load(Ordering::Relaxed),
        class_limits,
    }
}
