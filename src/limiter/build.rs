//! Building a limiter from its configuration, and rebuilding it on reload
//! around the tables of every rule the new configuration keeps.

use std::sync::Arc;

use super::route::{Full, KnownDevices, RecentPasswords, Route, Rule, Table};
use super::shards::{expiring_table, expiring_table_tracked, reuse, Shards};
use super::Limiter;
use crate::classes::ClassTable;
use crate::classes::SourceClass;
use crate::config::{Config, RateLimit, RouteConfig, RuleConfig, RuleKind, Scope};
use crate::exemptions::ExemptionTable;
use crate::failure_window::{FailureWindowTable, WindowSpec};
use crate::gcra::GcraTable;
use crate::keys::{Component, KeyDeriver};
use crate::signals::flags::digest64;
use crate::signals::pump::SignalsLink;
use crate::store::Journal;

impl Limiter {
    /// Connects the limiter to spray detection: reports feed the link's
    /// queue, checks read its flags. Kept by `reconfigured` and `with_hosts`.
    /// The link's pump must hold this limiter's keys (`channel`).
    pub fn with_signals(mut self, link: Option<Arc<SignalsLink>>) -> Limiter {
        assert!(
            link.as_ref().is_none_or(|link| link.derives_as(&self.keys)),
            "spray detection's pump was given other keys than the limiter's"
        );
        self.signals = link;
        self
    }

    pub fn new(config: &Config, classes: Arc<ClassTable>, keys: KeyDeriver, journal: Journal) -> Limiter {
        let hosts = config.shared.as_ref().map_or(1, |s| if s.hosts > 0 { s.hosts } else { s.hosts_when_unknown });
        Limiter::build(config, classes, keys, journal, None, 0, hosts)
    }

    /// The hosts whose share a global rule's degraded table holds.
    /// Where this limiter's changes are written.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    pub fn hosts(&self) -> u32 {
        self.hosts
    }

    /// This limiter with the degraded share of `hosts` hosts: the global
    /// rules' tables are kept and their limits set to ceil(limit / hosts).
    pub fn with_hosts(&self, config: &Config, hosts: u32, now_us: u64) -> Limiter {
        Limiter::build(config, self.classes.clone(), self.keys.clone(), self.journal.clone(), Some(self), now_us, hosts)
    }

    /// A limiter for a new configuration that keeps the tables (counters,
    /// lockouts, known devices) of every rule and route it shares with
    /// `self`, applying new limits to them. A failure rule the reload
    /// removes loses its state, and one it adds starts empty: their rows
    /// are deleted, queued before the new limiter can write any (see
    /// `Journal::drop_rule`).
    pub fn reconfigured(&self, config: &Config, classes: Arc<ClassTable>, now_us: u64) -> Limiter {
        let next =
            Limiter::build(config, classes, self.keys.clone(), self.journal.clone(), Some(self), now_us, self.hosts);
        let before = self.failure_rule_ids();
        let after = next.failure_rule_ids();
        for id in before.symmetric_difference(&after) {
            self.journal.drop_rule(id);
        }
        // Known devices live as long as their route keeps them.
        for route in self.routes.iter().filter(|r| r.known_devices.is_some()) {
            if next.routes.iter().all(|n| n.name != route.name || n.known_devices.is_none()) {
                self.journal.drop_devices(&route.name);
            }
        }
        next
    }

    fn failure_rule_ids(&self) -> std::collections::BTreeSet<&str> {
        let rules = self.routes.iter().flat_map(|r| &r.rules);
        rules.filter(|r| matches!(r.table, Table::Failures { .. })).map(|r| &*r.id).collect()
    }

    fn build(
        config: &Config,
        classes: Arc<ClassTable>,
        keys: KeyDeriver,
        journal: Journal,
        previous: Option<&Limiter>,
        now_us: u64,
        hosts: u32,
    ) -> Limiter {
        // Without `[shared]` every rule is this host's, whatever its scope.
        let hosts_sharing = config.shared.as_ref().map(|_| hosts.max(1));
        // A signal rule's ladder cools down as its flags do.
        let signal_cool_down_us = config.signals.as_ref().map_or(3_600_000_000, |s| s.flag_ttl_us);
        let mut routes: Vec<Route> = config
            .routes
            .iter()
            .map(|r| build_route(r, previous, now_us, hosts_sharing, signal_cool_down_us))
            .collect();
        for route in &mut routes {
            // 0xFF never occurs in a tenant (a string): no tenant shares it.
            let mut name = vec![0xFF];
            name.extend_from_slice(route.name.as_bytes());
            route.pseudo_tenant = digest64(&keys.component(crate::keys::Component::Tenant, &name));
            route.feeds_signals &= config.signals.is_some();
        }
        Limiter {
            signals: previous.and_then(|p| p.signals.clone()),
            signals_on: config.signals.is_some(),
            success_sample: config.signals.as_ref().map_or(1, |s| s.success_sample),
            shared_prefix: config.shared.as_ref().map(|s| s.key_prefix.clone()),
            recent_unlocks: super::known_lockouts::RecentUnlocks::for_limiter(
                config.shared.is_some(),
                previous.map(|p| &p.recent_unlocks),
            ),
            hosts: hosts.max(1),
            routes,
            source: config.source.clone(),
            exemptions: ExemptionTable::new(&config.exemptions, previous.map(|p| &p.exemptions)),
            bans: previous.map_or_else(Default::default, |p| p.bans.clone()),
            classes,
            responses: config.responses.clone(),
            keys,
            journal,
            attempt_timeout_us: config.attempt_timeout_ms * 1000,
        }
    }
}

pub(super) fn build_route(
    config: &RouteConfig,
    previous: Option<&Limiter>,
    now_us: u64,
    hosts_sharing: Option<u32>,
    signal_cool_down_us: u64,
) -> Route {
    let old_route = previous.and_then(|p| p.routes.iter().find(|r| r.name == config.name));
    let rules: Vec<Rule> = config
        .rules
        .iter()
        .map(|rule| build_rule(config, rule, old_route, now_us, hosts_sharing, signal_cool_down_us))
        .collect();
    // Known lockouts, bounded like the largest global failure rule (each
    // is one of its keys).
    let global_failures_max = || {
        config.rules.iter().zip(&rules).filter(|(_, built)| matches!(built.global, Some(Full::Failures(_)))).map(
            |(r, _)| match r.kind {
                RuleKind::Failures { entries_max, .. }
                | RuleKind::Rate { entries_max, .. }
                | RuleKind::Signal { entries_max, .. } => entries_max,
            },
        )
    };
    let lockouts_max = global_failures_max().max();
    let known_lockouts =
        lockouts_max.map(|max| expiring_table_tracked(old_route.and_then(|r| r.known_lockouts.as_ref()), max));
    let spent_keys = lockouts_max.map(|max| expiring_table(old_route.and_then(|r| r.spent_keys.as_ref()), max));
    // One count per key of every global failure rule.
    let store_counted = lockouts_max
        .map(|_| expiring_table(old_route.and_then(|r| r.store_counted.as_ref()), global_failures_max().sum()));
    let known_devices = config.known_devices.map(|known| {
        let old = old_route.and_then(|r| r.known_devices.as_ref());
        // The per-account counts are bounded like the devices (an account
        // counted has at least one device).
        // Both are persisted, so their maps keep change lists.
        let known_devices = KnownDevices {
            ttl_us: known.ttl_us,
            shards: expiring_table_tracked(old.map(|o| &o.shards), known.entries_max),
            per_account_max: known.per_account_max,
            per_account: expiring_table_tracked(old.map(|o| &o.per_account), known.entries_max),
        };
        if old.is_some_and(|o| o.ttl_us > known.ttl_us) {
            // A shortened TTL applies to devices already known, as it does
            // to rows restored at start: whether a device is known must not
            // depend on whether a restart happened since.
            let latest_us = now_us.saturating_add(known.ttl_us);
            known_devices.shards.each().for_each(|mut map| map.cap_expiry(latest_us));
            known_devices.per_account.each().for_each(|mut map| map.cap_expiry(latest_us));
        }
        known_devices
    });
    let longest_window = config
        .rules
        .iter()
        .map(|r| match r.kind {
            RuleKind::Failures { window_us, .. } => window_us,
            RuleKind::Rate { .. } | RuleKind::Signal { .. } => 0,
        })
        .max()
        .unwrap_or(0)
        .max(1_000_000);
    let recent_passwords = config.recent_passwords.map(|(remembered, entries_max)| {
        let shards =
            expiring_table(old_route.and_then(|r| r.recent_passwords.as_ref()).map(|o| &o.shards), entries_max);
        RecentPasswords { remembered: remembered as usize, ttl_us: longest_window, shards }
    });
    Route {
        name: config.name.clone(),
        fail_policy: config.fail_policy,
        rules,
        known_devices,
        recent_passwords,
        known_lockouts,
        spent_keys,
        store_counted,
        feeds_signals: config.rules.iter().any(|r| matches!(r.kind, RuleKind::Signal { .. })),
        pseudo_tenant: 0,
        // Kept across a reload, so `top`'s rates do not drop to zero.
        activity: old_route.map(|r| r.activity.clone()).unwrap_or_default(),
    }
}

/// A rule's 16-bit tag (see `Rule::tag`): SipHash-1-3 with fixed keys, so
/// it is the same in every build and on every host.
pub(super) fn rule_tag(route: &str, rule: &str) -> u16 {
    use std::hash::Hasher;
    let mut hash = siphasher::sip::SipHasher13::new();
    hash.write(route.as_bytes());
    hash.write(b"/");
    hash.write(rule.as_bytes());
    hash.finish() as u16
}

/// This host's share of a limit among `hosts`: rounded up, so a limit
/// below the host count still lets one through per host.
fn share(limit: u32, hosts: u32) -> u32 {
    limit.div_ceil(hosts.max(1)).max(1)
}

fn rate_share(rate: RateLimit, hosts: u32) -> RateLimit {
    RateLimit { limit: share(rate.limit, hosts), period_us: rate.period_us, burst: share(rate.burst, hosts) }
}

pub(super) fn build_rule(
    route: &RouteConfig,
    rule: &RuleConfig,
    old_route: Option<&Route>,
    now_us: u64,
    hosts_sharing: Option<u32>,
    signal_cool_down_us: u64,
) -> Rule {
    let old = old_route.and_then(|r| r.rules.iter().find(|o| o.name == rule.name));
    let global = match (hosts_sharing, rule.scope) {
        (Some(hosts), Scope::Global) => Some(hosts),
        _ => None,
    };
    let full = match (global, &rule.kind) {
        (Some(_), RuleKind::Rate { rate, by_class, .. }) => Some(Full::Rate { rate: *rate, by_class: *by_class }),
        (Some(_), RuleKind::Failures { threshold, window_us, .. }) => {
            Some(Full::Failures(WindowSpec { window_us: *window_us, threshold: *threshold }))
        }
        // Validation refuses a global signal rule; flags are this host's.
        (Some(_), RuleKind::Signal { .. }) | (None, _) => None,
    };
    // A global rule's own table holds this host's degraded share.
    let kind = match (global, rule.kind.clone()) {
        (Some(hosts), RuleKind::Rate { rate, mut by_class, entries_max }) => {
            for class in SourceClass::ALL {
                by_class[class] = by_class[class].map(|r| rate_share(r, hosts));
            }
            RuleKind::Rate { rate: rate_share(rate, hosts), by_class, entries_max }
        }
        (Some(hosts), RuleKind::Failures { threshold, window_us, cleared_by_success, entries_max }) => {
            RuleKind::Failures { threshold: share(threshold, hosts), window_us, cleared_by_success, entries_max }
        }
        (_, kind) => kind,
    };
    let table = match kind {
        RuleKind::Rate { rate, by_class, entries_max } => {
            let shards = match old.map(|o| &o.table) {
                Some(Table::Rate { shards, .. }) => reuse(shards, entries_max, |t, cap| t.set_entries_max(cap)),
                _ => Arc::new(Shards::new(entries_max, GcraTable::new)),
            };
            Table::Rate { rate, by_class, shards }
        }
        RuleKind::Failures { threshold, window_us, cleared_by_success, entries_max } => {
            let spec = WindowSpec { window_us, threshold };
            let shards = match old.map(|o| &o.table) {
                Some(Table::Failures { shards, .. }) => {
                    reuse(shards, entries_max, |t, cap| t.reconfigure(spec, cap, now_us))
                }
                _ => Arc::new(Shards::new(entries_max, |cap| FailureWindowTable::new(spec, cap))),
            };
            if global.is_some() {
                // The degraded share's write-back is aged from its starts.
                shards.each().for_each(|mut table| table.track_starts());
            }
            Table::Failures { spec, cleared_by_success, shards }
        }
        RuleKind::Signal { detectors, .. } => Table::Signal { detectors, window_us: signal_cool_down_us },
    };
    let entries_max = match rule.kind {
        RuleKind::Rate { entries_max, .. }
        | RuleKind::Failures { entries_max, .. }
        | RuleKind::Signal { entries_max, .. } => entries_max,
    };
    Rule {
        name: rule.name.clone(),
        id: format!("{}/{}", route.name, rule.name).into(),
        tag: rule_tag(&route.name, &rule.name),
        key: rule.key.clone(),
        monitor: rule.monitor,
        responses: rule.responses.clone(),
        required: rule.required,
        devices: rule.devices,
        // A rule keyed on the prefix without the account is shared by
        // everyone behind it: those are what an egress of many people is
        // exempt from. One keyed on (account, prefix) is one person's, and
        // stays: an office's guesser meets it as anyone does.
        exemptible: !matches!(rule.kind, RuleKind::Signal { .. })
            && rule.key.contains(&Component::Prefix)
            && !rule.key.contains(&Component::Account),
        table,
        escalation: expiring_table(old.map(|o| &o.escalation), entries_max),
        counters: old.map(|o| o.counters.clone()).unwrap_or_default(),
        global: full,
    }
}
