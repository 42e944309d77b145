//! The limiter: routes, their rules, and the tables behind them. Given a
//! request and the time, it answers with a verdict. It reads no clock and
//! does no I/O; changes to persist go to the `Journal` it is given.
//!
//! Tables are sharded, each shard behind a `std::sync::Mutex` held for one
//! table step and never across an `.await`: a step is a few hundred
//! nanoseconds, so a blocking mutex beats an async one, and sharding keeps
//! two cores from queueing on one lock.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::ceil_ms;
use crate::config::{Config, FailPolicy, RouteConfig, RuleKind, RULES_PER_ROUTE_MAX};
use crate::failure_window::{Counts, FailureWindowTable, WindowSpec};
use crate::gcra::{GcraSpec, GcraTable};
use crate::keys::{Component, Key, KeyDeriver};
use crate::protocol::{Decision, Lockout, Outcome, Reason, RouteStatus, RuleStatus, Subject, Verdict};
use crate::source::SourcePolicy;
use crate::store::{Durable, Journal, PersistedEntry};

/// Shards per table: a power of two a little above the core count times a
/// few, so that concurrent requests rarely meet on one lock.
pub const SHARDS: usize = 16;
const _: () = assert!(SHARDS.is_power_of_two());

/// Longest account, device, tenant or client id accepted. Longer input is
/// refused rather than truncated, so two long names cannot share a key.
pub const IDENTIFIER_BYTES_MAX: usize = 512;
/// Longest X-Forwarded-For header considered; a longer one is ignored (the
/// peer address is used), so it can neither fail a request nor pick a bucket.
pub const FORWARDED_FOR_BYTES_MAX: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("unknown route `{0}`")]
    UnknownRoute(String),
    #[error("route `{route}` needs `{field}` in the subject")]
    MissingField { route: String, field: &'static str },
    #[error("`{field}` is {len} bytes; the maximum is {max}")]
    FieldTooLong { field: &'static str, len: usize, max: usize },
}

struct Shards<T>(Box<[Mutex<T>]>);

impl<T> Shards<T> {
    fn new(total_entries_max: usize, make: impl Fn(usize) -> T) -> Shards<T> {
        let per_shard = total_entries_max.div_ceil(SHARDS);
        Shards((0..SHARDS).map(|_| Mutex::new(make(per_shard))).collect())
    }

    fn of(&self, key: Key) -> MutexGuard<'_, T> {
        // Middle bits: the tables hash with the low (bucket) and top (tag) bits.
        let shard = (key.tuple >> 32) as usize & (SHARDS - 1);
        lock(&self.0[shard])
    }

    fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.0.iter().map(lock)
    }
}

/// A poisoned shard means a panic mid-step, a bug; the table itself is still
/// consistent at every await-free step boundary, so keep serving.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Table {
    Rate { limit: u32, period_us: u64, spec: GcraSpec, shards: Shards<GcraTable> },
    Failures { spec: WindowSpec, cleared_by_success: bool, shards: Shards<FailureWindowTable> },
}

struct Rule {
    name: String,
    /// `route/rule`: how the state file names this rule's entries.
    id: Arc<str>,
    key: Vec<Component>,
    table: Table,
}

struct Route {
    name: String,
    fail_policy: FailPolicy,
    rules: Vec<Rule>,
}

/// One rule's view of a request, before rules are combined.
struct RuleAnswer<'r> {
    refused: bool,
    reason: Reason,
    retry_after_us: u64,
    limit: u32,
    remaining: u32,
    reset_us: u64,
    rule: &'r str,
}

/// Per-request digests, computed at most once each.
struct SubjectKeys<'s, 'k> {
    subject: &'s Subject<'s>,
    route: &'s str,
    source: &'k SourcePolicy,
    keys: &'k KeyDeriver,
    digests: [Option<[u8; 16]>; 5],
}

impl SubjectKeys<'_, '_> {
    fn component(&mut self, component: Component) -> Result<[u8; 16], RequestError> {
        let slot = component as usize - 1;
        if let Some(d) = self.digests[slot] {
            return Ok(d);
        }
        let missing = || RequestError::MissingField { route: self.route.to_string(), field: component.name() };
        let digest = match component {
            Component::Prefix => {
                let peer = self.subject.peer.ok_or_else(missing)?;
                let forwarded = self.subject.forwarded_for.filter(|h| h.len() <= FORWARDED_FOR_BYTES_MAX);
                let prefix = self.source.prefix(self.source.client_address(peer, forwarded));
                self.keys.component(Component::Prefix, &prefix.to_bytes())
            }
            other => {
                let value = match other {
                    Component::Account => self.subject.account,
                    Component::Device => self.subject.device,
                    Component::Tenant => self.subject.tenant,
                    _ => self.subject.client_id,
                };
                self.keys.component(other, value.ok_or_else(missing)?.as_bytes())
            }
        };
        self.digests[slot] = Some(digest);
        Ok(digest)
    }

    fn key(&mut self, components: &[Component]) -> Result<Key, RequestError> {
        let mut parts = [(Component::Prefix, [0u8; 16]); 5];
        for (i, c) in components.iter().enumerate() {
            parts[i] = (*c, self.component(*c)?);
        }
        Ok(self.keys.tuple(&parts[..components.len()]))
    }
}

fn check_lengths(subject: &Subject<'_>) -> Result<(), RequestError> {
    for (field, value) in [
        ("account", subject.account),
        ("device", subject.device),
        ("tenant", subject.tenant),
        ("client_id", subject.client_id),
    ] {
        if let Some(v) = value {
            if v.len() > IDENTIFIER_BYTES_MAX {
                return Err(RequestError::FieldTooLong { field, len: v.len(), max: IDENTIFIER_BYTES_MAX });
            }
        }
    }
    Ok(())
}

/// The routes and tables; shared by every connection.
pub struct Limiter {
    routes: Vec<Route>,
    source: SourcePolicy,
    keys: KeyDeriver,
    journal: Journal,
}

impl Limiter {
    pub fn new(config: &Config, keys: KeyDeriver, journal: Journal) -> Limiter {
        Limiter {
            routes: config.routes.iter().map(build_route).collect(),
            source: config.source.clone(),
            keys,
            journal,
        }
    }

    fn route(&self, name: &str) -> Result<&Route, RequestError> {
        self.routes
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| RequestError::UnknownRoute(name.chars().take(64).collect()))
    }

    pub fn fail_policy(&self, route: &str) -> Option<FailPolicy> {
        self.route(route).ok().map(|r| r.fail_policy)
    }

    /// `check`: may this attempt proceed? Failure rules are read first; a
    /// refused attempt spends nothing. Then every rate rule spends one.
    pub fn check<'a>(&'a self, route: &str, subject: &Subject<'_>, now_us: u64) -> Result<Verdict<'a>, RequestError> {
        let route = self.route(route)?;
        check_lengths(subject)?;
        let mut keys = self.subject_keys(&route.name, subject);
        let mut answers = Vec::with_capacity(route.rules.len());
        for rule in &route.rules {
            if let Table::Failures { spec, shards, .. } = &rule.table {
                let key = keys.key(&rule.key)?;
                let counts = shards.of(key).get(key, now_us);
                answers.push(failure_answer(rule, *spec, counts, now_us));
            }
        }
        if !answers.iter().any(|a| a.refused) {
            for rule in &route.rules {
                if let Table::Rate { spec, shards, .. } = &rule.table {
                    let key = keys.key(&rule.key)?;
                    let decision = shards.of(key).check(key, now_us, true);
                    answers.push(rate_answer(rule, *spec, decision));
                    if !decision.allowed {
                        break;
                    }
                }
            }
        }
        Ok(combine(&answers))
    }

    /// `report`: counts a failure on every failure rule of the route, or
    /// clears the (own-key) entries of rules cleared by success. Returns the
    /// verdict a check would now give (without spending), and, when this
    /// report locked a key, the durable write the reply must wait for.
    pub fn report<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        now_us: u64,
    ) -> Result<(Verdict<'a>, Option<Durable>), RequestError> {
        let route = self.route(route)?;
        check_lengths(subject)?;
        let mut keys = self.subject_keys(&route.name, subject);
        // Derive every key before touching any table, so a missing field
        // cannot leave a report counted on some rules and not others.
        let mut rule_keys = [Key::default(); RULES_PER_ROUTE_MAX];
        assert!(route.rules.len() <= RULES_PER_ROUTE_MAX, "validated by config");
        for (i, rule) in route.rules.iter().enumerate() {
            rule_keys[i] = keys.key(&rule.key)?;
        }
        let mut answers = Vec::with_capacity(route.rules.len());
        let mut durable = None;
        for (rule, &key) in route.rules.iter().zip(rule_keys.iter()) {
            match &rule.table {
                Table::Failures { spec, cleared_by_success, shards } => {
                    let mut table = shards.of(key);
                    let counts = match outcome {
                        Outcome::Failure => match table.record_failure(key, now_us) {
                            Ok(recorded) => {
                                if recorded.now_locked && !recorded.was_locked {
                                    // Written while the shard is locked, so it is
                                    // queued before any later change of this key.
                                    durable =
                                        Some(self.journal.write_durably(&rule.id, vec![(key, Some(recorded.counts))]));
                                    table.mark_persisted(key);
                                }
                                recorded.counts
                            }
                            Err(_) => table.get(key, now_us),
                        },
                        Outcome::Success if *cleared_by_success => {
                            table.clear(key);
                            table.get(key, now_us)
                        }
                        Outcome::Success => table.get(key, now_us),
                    };
                    answers.push(failure_answer(rule, *spec, counts, now_us));
                }
                Table::Rate { spec, shards, .. } => {
                    let decision = shards.of(key).peek(key, now_us);
                    answers.push(rate_answer(rule, *spec, decision));
                }
            }
        }
        Ok((combine(&answers), durable))
    }

    fn subject_keys<'s>(&'s self, route: &'s str, subject: &'s Subject<'s>) -> SubjectKeys<'s, 's> {
        SubjectKeys { subject, route, source: &self.source, keys: &self.keys, digests: [None; 5] }
    }

    /// Clears an account's entries on a route's failure rules: with a
    /// source, its (account, source) entries and the account-wide ones;
    /// without, every entry of the account. Durable before it returns Ok.
    pub fn unlock(
        &self,
        route: &str,
        account: &str,
        source: Option<std::net::IpAddr>,
    ) -> Result<(u32, Vec<Durable>), RequestError> {
        let route = self.route(route)?;
        if account.len() > IDENTIFIER_BYTES_MAX {
            return Err(RequestError::FieldTooLong { field: "account", len: account.len(), max: IDENTIFIER_BYTES_MAX });
        }
        let tag = self.keys.account_tag(account);
        let subject = Subject { peer: source, account: Some(account), ..Subject::default() };
        let mut keys = self.subject_keys(&route.name, &subject);
        let mut cleared = 0;
        let mut writes = Vec::new();
        for rule in &route.rules {
            let Table::Failures { shards, .. } = &rule.table else { continue };
            if !rule.key.contains(&Component::Account) {
                continue;
            }
            let exact =
                rule.key.iter().all(|c| *c == Component::Account || (*c == Component::Prefix && source.is_some()));
            if exact {
                let key = keys.key(&rule.key)?;
                let mut table = shards.of(key);
                if table.clear(key).is_some() {
                    cleared += 1;
                    writes.push(self.journal.write_durably(&rule.id, vec![(key, None)]));
                }
                continue;
            }
            if source.is_some() {
                continue; // e.g. (account, device): not this source's entry
            }
            for mut table in shards.each() {
                let doomed: Vec<Key> = table.entries().filter(|(k, _)| k.account_tag == tag).map(|(k, _)| k).collect();
                if doomed.is_empty() {
                    continue;
                }
                for key in &doomed {
                    table.clear(*key);
                }
                cleared += doomed.len() as u32;
                writes.push(self.journal.write_durably(&rule.id, doomed.into_iter().map(|k| (k, None)).collect()));
            }
        }
        Ok((cleared, writes))
    }

    /// Keys refused by failure rules now, at most `limit`, and how many in all.
    pub fn lockouts(&self, limit: usize, now_us: u64) -> (Vec<Lockout>, u64) {
        let mut out = Vec::new();
        let mut total = 0u64;
        for route in &self.routes {
            for rule in &route.rules {
                let Table::Failures { spec, shards, .. } = &rule.table else { continue };
                for table in shards.each() {
                    for (key, counts) in table.locked(now_us) {
                        total += 1;
                        if out.len() < limit {
                            let until_us = spec.unlocks_at(counts, now_us);
                            out.push(Lockout {
                                route: route.name.clone(),
                                rule: rule.name.clone(),
                                key: key.to_string(),
                                count: spec.estimate(counts, now_us),
                                until_ms: ceil_ms(until_us),
                                retry_after_ms: ceil_ms(until_us - now_us),
                            });
                        }
                    }
                }
            }
        }
        (out, total)
    }

    pub fn route_status(&self) -> Vec<RouteStatus> {
        self.routes
            .iter()
            .map(|route| RouteStatus {
                name: route.name.clone(),
                fail_policy: route.fail_policy.name().to_string(),
                rules: route.rules.iter().map(rule_status).collect(),
            })
            .collect()
    }

    /// Maintenance, off the request path: expires failure entries and sends
    /// every change since the last call to the journal. With `durable`, the
    /// returned writes complete when the changes are on disk (graceful stop).
    pub fn snapshot(&self, now_us: u64, durable: bool) -> Vec<Durable> {
        let mut writes = Vec::new();
        for route in &self.routes {
            for rule in &route.rules {
                let Table::Failures { shards, .. } = &rule.table else { continue };
                for mut table in shards.each() {
                    table.expire(now_us);
                    let changes = table.take_changes();
                    // Sent while the shard is locked: see `report`.
                    if changes.is_empty() {
                        continue;
                    }
                    if durable {
                        writes.push(self.journal.write_durably(&rule.id, changes));
                    } else {
                        self.journal.write(&rule.id, changes);
                    }
                }
            }
        }
        writes
    }

    /// Sweeps expired rate entries of one shard per call (round robin by
    /// `tick`), so no single call holds a lock for a whole table.
    pub fn sweep_rate_tables(&self, tick: u64, now_us: u64) {
        let shard = tick as usize % SHARDS;
        for route in &self.routes {
            for rule in &route.rules {
                if let Table::Rate { shards, .. } = &rule.table {
                    lock(&shards.0[shard]).sweep(now_us);
                }
            }
        }
    }

    /// Puts persisted entries back at start. Returns how many were restored
    /// and how many named a rule that no longer exists.
    pub fn restore(&self, mut entries: Vec<PersistedEntry>, now_us: u64) -> (usize, usize) {
        entries.sort_by_key(|e| e.counts.window);
        let (mut restored, mut orphaned) = (0, 0);
        for entry in entries {
            let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| *r.id == *entry.rule);
            match rule.map(|r| &r.table) {
                Some(Table::Failures { shards, .. }) => {
                    let key = Key::from_u128(entry.key);
                    if shards.of(key).restore(key, entry.counts, now_us).is_ok() {
                        restored += 1;
                    }
                }
                _ => orphaned += 1,
            }
        }
        (restored, orphaned)
    }
}

fn build_route(config: &RouteConfig) -> Route {
    let rules = config
        .rules
        .iter()
        .map(|rule| {
            let table = match rule.kind {
                RuleKind::Rate { limit, period_us, burst, entries_max } => {
                    let spec = GcraSpec::new(limit, period_us, burst);
                    Table::Rate {
                        limit,
                        period_us,
                        spec,
                        shards: Shards::new(entries_max, |cap| GcraTable::new(spec, cap)),
                    }
                }
                RuleKind::Failures { threshold, window_us, cleared_by_success, entries_max } => {
                    let spec = WindowSpec { window_us, threshold };
                    Table::Failures {
                        spec,
                        cleared_by_success,
                        shards: Shards::new(entries_max, |cap| FailureWindowTable::new(spec, cap)),
                    }
                }
            };
            Rule {
                name: rule.name.clone(),
                id: format!("{}/{}", config.name, rule.name).into(),
                key: rule.key.clone(),
                table,
            }
        })
        .collect();
    Route { name: config.name.clone(), fail_policy: config.fail_policy, rules }
}

fn rule_status(rule: &Rule) -> RuleStatus {
    let key = rule.key.iter().map(|c| c.name().to_string()).collect();
    match &rule.table {
        Table::Rate { limit, period_us, spec, shards } => {
            let (mut entries, mut entries_max) = (0, 0);
            for t in shards.each() {
                entries += t.len() as u64;
                entries_max += t.entries_max() as u64;
            }
            RuleStatus {
                name: rule.name.clone(),
                kind: "rate".into(),
                key,
                limit: *limit,
                burst: spec.burst,
                period_ms: period_us / 1000,
                cleared_by_success: false,
                entries,
                entries_max,
                refused_full: 0,
            }
        }
        Table::Failures { spec, cleared_by_success, shards } => {
            let (mut entries, mut entries_max, mut refused_full) = (0, 0, 0);
            for t in shards.each() {
                entries += t.len() as u64;
                entries_max += t.entries_max() as u64;
                refused_full += t.refused_full();
            }
            RuleStatus {
                name: rule.name.clone(),
                kind: "failures".into(),
                key,
                limit: spec.threshold,
                burst: 0,
                period_ms: spec.window_us / 1000,
                cleared_by_success: *cleared_by_success,
                entries,
                entries_max,
                refused_full,
            }
        }
    }
}

fn failure_answer(rule: &Rule, spec: WindowSpec, counts: Counts, now_us: u64) -> RuleAnswer<'_> {
    let refused = spec.is_locked(counts, now_us);
    let c = spec.rolled(counts, now_us);
    let reset_us = if c.current > 0 {
        spec.expires_at(c) - now_us
    } else if c.previous > 0 {
        spec.expires_at(c) - spec.window_us - now_us
    } else {
        0
    };
    RuleAnswer {
        refused,
        reason: if refused { Reason::TooManyFailures } else { Reason::Allowed },
        retry_after_us: if refused { spec.unlocks_at(counts, now_us) - now_us } else { 0 },
        limit: spec.threshold,
        remaining: spec.remaining(counts, now_us),
        reset_us,
        rule: &rule.name,
    }
}

fn rate_answer(rule: &Rule, spec: GcraSpec, decision: crate::gcra::GcraDecision) -> RuleAnswer<'_> {
    RuleAnswer {
        refused: !decision.allowed,
        reason: if decision.allowed { Reason::Allowed } else { Reason::RateLimited },
        retry_after_us: decision.retry_after_us,
        limit: spec.burst,
        remaining: decision.remaining,
        reset_us: decision.reset_us,
        rule: &rule.name,
    }
}

/// One verdict from the rules' answers: refused if any refuses (waiting for
/// the longest of them), else allowed with the tightest rule's figures.
fn combine<'r>(answers: &[RuleAnswer<'r>]) -> Verdict<'r> {
    let refusing = answers.iter().filter(|a| a.refused).max_by_key(|a| a.retry_after_us);
    let chosen = refusing.or_else(|| answers.iter().min_by_key(|a| a.remaining));
    match chosen {
        None => Verdict {
            decision: Decision::Allow,
            retry_after_ms: 0,
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: 0,
            reason: Reason::Allowed,
            rule: Cow::Borrowed(""),
        },
        Some(a) => Verdict {
            decision: if a.refused { Decision::Deny } else { Decision::Allow },
            retry_after_ms: ceil_ms(a.retry_after_us),
            delay_ms: 0,
            limit: a.limit,
            remaining: a.remaining,
            reset_ms: ceil_ms(a.reset_us),
            reason: a.reason,
            rule: Cow::Borrowed(a.rule),
        },
    }
}
