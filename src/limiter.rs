//! The limiter: routes, their rules, and the tables behind them. Given a
//! request and the time, it answers with a verdict. It reads no clock and
//! does no I/O; changes to persist go to the `Journal` it is given.
//!
//! Tables are sharded, each shard behind a `std::sync::Mutex` held for one
//! table step and never across an `.await`: a step is a few hundred
//! nanoseconds, so a blocking mutex beats an async one, and sharding keeps
//! two cores from queueing on one lock. Tables live behind `Arc`s so that a
//! reloaded limiter keeps every counter and lockout of the rules it keeps.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::classes::{ClassTable, SourceClass};
use crate::clock::ceil_ms;
use crate::config::{
    ByClass, Config, DeviceScope, FailPolicy, RateLimit, ResponsePolicy, RouteConfig, RuleConfig, RuleKind, Rung,
    RULES_PER_ROUTE_MAX,
};
use crate::expiring::{Changes, ExpiringMap, Slot};
use crate::failure_window::{Counts, FailureWindowTable, Standing, WindowSpec};
use crate::gcra::{GcraDecision, GcraSpec, GcraTable};
use crate::keys::{Component, Key, KeyDeriver};
use crate::protocol::{ClassLimit, Decision, Lockout, Outcome, Reason, RouteStatus, RuleStatus, Subject, Verdict};
use crate::source::{forwarded_tail, SourcePolicy};
use crate::store::{DeviceChange, DeviceMap, DeviceRows, Durable, Journal, PersistedDevice, PersistedEntry};
use crate::tat_table::SlotHint;

/// Shards per table: a power of two a little above the core count times a
/// few, so that concurrent requests rarely meet on one lock.
pub const SHARDS: usize = 16;
const _: () = assert!(SHARDS.is_power_of_two());

/// Longest account, device, tenant or client id accepted. Longer input is
/// refused rather than truncated, so two long names cannot share a key.
pub const IDENTIFIER_BYTES_MAX: usize = 512;
pub use crate::source::FORWARDED_FOR_BYTES_MAX;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("unknown route `{0}`")]
    UnknownRoute(String),
    #[error("route `{route}` needs `{field}` in the subject")]
    MissingField { route: String, field: &'static str },
    #[error("`{field}` is {len} bytes; the maximum is {max}")]
    FieldTooLong { field: &'static str, len: usize, max: usize },
}

struct Shards<T>(Box<[Shard<T>]>);

/// A shard's lock on a cache line pair of its own: shards side by side
/// shared lines, and two cores locking neighbouring shards bounced them
/// (a tenth of a check's time in the lock's compare-and-swap).
///
/// A rate table's shard also publishes where its slots are, so a planned
/// check can prefetch its slot without the lock (a stale address after a
/// rebuild only wastes the hint).
#[repr(align(128))]
struct Shard<T>(Mutex<T>, SlotHint);

impl<T> Shards<T> {
    fn new(total_entries_max: usize, make: impl Fn(usize) -> T) -> Shards<T> {
        let per_shard = total_entries_max.div_ceil(SHARDS);
        Shards((0..SHARDS).map(|_| Shard(Mutex::new(make(per_shard)), SlotHint::default())).collect())
    }

    fn shard(&self, bits: u64) -> &Shard<T> {
        &self.0[shard_index(bits)]
    }

    fn of_bits(&self, bits: u64) -> MutexGuard<'_, T> {
        lock(self.shard(bits))
    }

    fn of(&self, key: Key) -> MutexGuard<'_, T> {
        self.of_bits(key.tuple)
    }

    fn each(&self) -> impl Iterator<Item = MutexGuard<'_, T>> {
        self.0.iter().map(lock)
    }
}

impl Shards<GcraTable> {
    /// One GCRA step for `key`, spending when allowed.
    fn check(&self, spec: GcraSpec, key: Key, now_us: u64) -> GcraDecision {
        let shard = self.shard(key.tuple);
        let mut table = lock(shard);
        let decision = table.check(spec, key, now_us, true);
        table.publish_slots(&shard.1);
        decision
    }

    fn prefetch(&self, key: Key) {
        self.shard(key.tuple).1.prefetch(key.hash_bits());
    }
}

/// A poisoned shard means a panic mid-step, a bug; the table itself is still
/// consistent at every await-free step boundary, so keep serving.
fn lock<T>(shard: &Shard<T>) -> MutexGuard<'_, T> {
    shard.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which shard holds `bits`: the middle bits, since the tables hash with
/// the low (bucket) and top (tag) bits.
fn shard_index(bits: u64) -> usize {
    (bits >> 32) as usize & (SHARDS - 1)
}

type SharedTable<T> = Arc<Shards<T>>;

enum Table {
    Rate { rate: RateLimit, by_class: ByClass<Option<RateLimit>>, shards: SharedTable<GcraTable> },
    Failures { spec: WindowSpec, cleared_by_success: bool, shards: SharedTable<FailureWindowTable> },
}

#[derive(Default)]
struct RuleCounters {
    refused: AtomicU64,
    would_refuse: AtomicU64,
}

struct Rule {
    name: String,
    /// `route/rule`: how the state file names this rule's entries.
    id: Arc<str>,
    key: Vec<Component>,
    monitor: bool,
    responses: Vec<Rung>,
    required: bool,
    devices: DeviceScope,
    table: Table,
    /// Refusals per key within a cool-down: the ladder's position.
    escalation: SharedTable<ExpiringMap<u16>>,
    counters: Arc<RuleCounters>,
}

impl Rule {
    /// How long a key's escalation lasts after its last refusal.
    fn cool_down_us(&self) -> u64 {
        match &self.table {
            Table::Rate { rate, .. } => rate.period_us,
            Table::Failures { spec, .. } => spec.window_us,
        }
    }
}

struct KnownDevices {
    ttl_us: u64,
    shards: SharedTable<ExpiringMap<()>>,
    per_account_max: u16,
    /// New devices made known per account (by account tag), expiring a TTL
    /// after the account's last one.
    per_account: SharedTable<ExpiringMap<u16>>,
}

impl KnownDevices {
    /// Remembers (account, device) after a success: refreshes a known one;
    /// makes a new one known only while the account is under its cap.
    fn remember(&self, key: Key, now_us: u64) {
        let slot = Slot { expires_us: now_us + self.ttl_us, value: () };
        {
            let mut devices = self.shards.of(key);
            if devices.get(key.tuple, now_us).is_some() {
                devices.set(key.tuple, slot, now_us);
                return;
            }
        }
        let admitted = self.per_account.of_bits(key.account_tag).update(key.account_tag, now_us, |count| {
            let made = count.map_or(0, |c| c.value);
            if made >= self.per_account_max {
                return (count, false);
            }
            (Some(Slot { expires_us: now_us + self.ttl_us, value: made + 1 }), true)
        });
        if admitted {
            self.shards.of(key).set(key.tuple, slot, now_us);
        }
    }
}

/// A known-device map's changes as state-file rows.
fn device_rows<V: Copy>(changes: Changes<V>, value: impl Fn(V) -> u16) -> (bool, Vec<DeviceChange>) {
    let row = |slot: Slot<V>| (slot.expires_us, value(slot.value));
    match changes {
        Changes::Some(list) => (false, list.into_iter().map(|(id, slot)| (id, slot.map(row))).collect()),
        Changes::Whole(all) => (true, all.into_iter().map(|(id, slot)| (id, Some(row(slot)))).collect()),
    }
}

/// Sends one known-device map to the journal, shard by shard, each while
/// its lock is held (so a later change of an entry is queued after it):
/// the changes since the last call, or with `full` every live entry (a
/// rewrite into a fresh file). Durable writes are pushed onto `writes`.
#[allow(clippy::too_many_arguments)]
fn save_device_map<V: Copy>(
    journal: &Journal,
    route: &Arc<str>,
    map: DeviceMap,
    shards: &Shards<ExpiringMap<V>>,
    value: impl Fn(V) -> u16,
    now_us: u64,
    full: bool,
    writes: &mut Vec<Durable>,
    durable: bool,
) {
    for (index, shard) in shards.0.iter().enumerate() {
        let mut table = lock(shard);
        let changes = if full {
            table.take_changes(now_us);
            Some(Changes::Whole(table.live(now_us)))
        } else {
            table.take_changes(now_us)
        };
        let Some(changes) = changes else { continue };
        let (whole, rows) = device_rows(changes, &value);
        if rows.is_empty() && (full || !whole) {
            continue;
        }
        let edit = DeviceRows { route: route.clone(), map, shard: index as u8, whole, rows };
        writes.extend(journal.write_devices(edit, durable));
    }
}

/// The last few wrong-password digests per (account, source prefix).
struct RecentPasswords {
    remembered: usize,
    ttl_us: u64,
    shards: SharedTable<ExpiringMap<[u32; 4]>>,
}

struct Route {
    name: String,
    fail_policy: FailPolicy,
    rules: Vec<Rule>,
    known_devices: Option<KnownDevices>,
    recent_passwords: Option<RecentPasswords>,
}

/// A check's answers, one per rule, on the stack: config caps a route's
/// rules, so this never allocates on the request path.
type Answers<'r> = SmallVec<[RuleAnswer<'r>; RULES_PER_ROUTE_MAX]>;
/// Keys ride in a check's plan, which the server moves around; four inline
/// (every preset's count) keeps it small, a longer route spills to the heap.
type RuleKeys = SmallVec<[Option<Key>; 4]>;

/// A check with its keys derived, not yet decided (see `plan_check`).
pub struct CheckPlan<'l> {
    route: &'l Route,
    rule_keys: RuleKeys,
    class: Option<SourceClass>,
}

/// One rule's view of a request, before rules are combined.
struct RuleAnswer<'r> {
    refused: bool,
    /// The refusal happened in monitor mode: counted, not enforced.
    monitored: bool,
    reason: Reason,
    rung: Rung,
    retry_after_us: u64,
    delay_us: u64,
    limit: u32,
    remaining: u32,
    reset_us: u64,
    rule: &'r str,
}

/// Per-request digests and source facts, computed at most once each.
struct SubjectKeys<'s, 'k> {
    subject: &'s Subject<'s>,
    route: &'s str,
    limiter: &'k Limiter,
    /// The client's address and source class, once looked up.
    client: Option<(std::net::IpAddr, Option<SourceClass>)>,
    digests: [Option<[u8; 16]>; 5],
}

impl SubjectKeys<'_, '_> {
    fn client(&mut self) -> Result<(std::net::IpAddr, Option<SourceClass>), RequestError> {
        if let Some(client) = self.client {
            return Ok(client);
        }
        let peer = self
            .subject
            .peer
            .ok_or_else(|| RequestError::MissingField { route: self.route.to_string(), field: "peer" })?;
        let forwarded = self.subject.forwarded_for.map(forwarded_tail);
        let address = self.limiter.source.client_address(peer, forwarded);
        let client = (address, self.limiter.classes.lookup(address));
        self.client = Some(client);
        Ok(client)
    }

    fn source_class(&mut self) -> Option<SourceClass> {
        self.client().ok().and_then(|(_, class)| class)
    }

    fn has(&self, component: Component) -> bool {
        match component {
            Component::Prefix => self.subject.peer.is_some(),
            Component::Account => self.subject.account.is_some(),
            Component::Device => self.subject.device.is_some(),
            Component::Tenant => self.subject.tenant.is_some(),
            Component::ClientId => self.subject.client_id.is_some(),
        }
    }

    fn component(&mut self, component: Component) -> Result<[u8; 16], RequestError> {
        let slot = component as usize - 1;
        if let Some(d) = self.digests[slot] {
            return Ok(d);
        }
        let missing = || RequestError::MissingField { route: self.route.to_string(), field: component.name() };
        let keys = &self.limiter.keys;
        let digest = match component {
            Component::Prefix => {
                let (address, class) = self.client()?;
                let prefix = self.limiter.source.prefix_in_class(address, class);
                keys.prefix(&prefix.to_bytes())
            }
            other => {
                let value = match other {
                    Component::Account => self.subject.account,
                    Component::Device => self.subject.device,
                    Component::Tenant => self.subject.tenant,
                    _ => self.subject.client_id,
                };
                keys.component(other, value.ok_or_else(missing)?.as_bytes())
            }
        };
        self.digests[slot] = Some(digest);
        Ok(digest)
    }

    fn key(&mut self, components: &[Component]) -> Result<Key, RequestError> {
        // Most rules key on one component: no tuple to assemble.
        if let [only] = components {
            let digest = self.component(*only)?;
            return Ok(self.limiter.keys.tuple(&[(*only, digest)]));
        }
        let mut parts = [(Component::Prefix, [0u8; 16]); 5];
        for (i, c) in components.iter().enumerate() {
            parts[i] = (*c, self.component(*c)?);
        }
        Ok(self.limiter.keys.tuple(&parts[..components.len()]))
    }

    /// Every rule's key, in rule order; an error if any key field is
    /// missing, before any table is touched.
    fn rule_keys(&mut self, rules: &[Rule], known_device: bool) -> Result<RuleKeys, RequestError> {
        // A plain loop: collecting the `Result`s cost more instructions than
        // deriving a one-rule route's key.
        let mut keys = RuleKeys::new();
        for rule in rules {
            keys.push(self.rule_key(rule, known_device)?);
        }
        Ok(keys)
    }

    /// The rule's key, or `None` when the rule does not apply to this
    /// request (a device scope that does not match, or an optional rule
    /// whose key field is absent).
    fn rule_key(&mut self, rule: &Rule, known_device: bool) -> Result<Option<Key>, RequestError> {
        let applies = match rule.devices {
            DeviceScope::All => true,
            DeviceScope::UnknownDevices => !known_device,
            DeviceScope::KnownDevices => known_device,
        };
        if !applies || (!rule.required && !rule.key.iter().all(|c| self.has(*c))) {
            return Ok(None);
        }
        self.key(&rule.key).map(Some)
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
    classes: Arc<ClassTable>,
    responses: ResponsePolicy,
    keys: KeyDeriver,
    journal: Journal,
    /// How long a checked attempt holds its place on failure rules without
    /// a report (`attempt_timeout_ms`).
    attempt_timeout_us: u64,
}

impl Limiter {
    pub fn new(config: &Config, classes: Arc<ClassTable>, keys: KeyDeriver, journal: Journal) -> Limiter {
        Limiter::build(config, classes, keys, journal, None, 0)
    }

    /// A limiter for a new configuration that keeps the tables (counters,
    /// lockouts, known devices) of every rule and route it shares with
    /// `self`, applying new limits to them. A failure rule the reload
    /// removes loses its state, and one it adds starts empty: their rows
    /// are deleted, queued before the new limiter can write any (see
    /// `Journal::drop_rule`).
    pub fn reconfigured(&self, config: &Config, classes: Arc<ClassTable>, now_us: u64) -> Limiter {
        let next = Limiter::build(config, classes, self.keys.clone(), self.journal.clone(), Some(self), now_us);
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
    ) -> Limiter {
        let routes = config.routes.iter().map(|r| build_route(r, previous, now_us)).collect();
        Limiter {
            routes,
            source: config.source.clone(),
            classes,
            responses: config.responses.clone(),
            keys,
            journal,
            attempt_timeout_us: config.attempt_timeout_ms * 1000,
        }
    }

    fn route(&self, name: &str) -> Result<&Route, RequestError> {
        self.routes
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| RequestError::UnknownRoute(name.chars().take(64).collect()))
    }

    /// The source prefix a subject is counted under (for log lines).
    pub fn client_prefix(&self, subject: &Subject<'_>) -> Option<crate::source::Prefix> {
        let peer = subject.peer?;
        let forwarded = subject.forwarded_for.map(forwarded_tail);
        let address = self.source.client_address(peer, forwarded);
        Some(self.source.prefix_in_class(address, self.classes.lookup(address)))
    }

    pub fn class_prefixes(&self) -> usize {
        self.classes.len()
    }

    fn subject_keys<'s>(&'s self, route: &'s str, subject: &'s Subject<'s>) -> SubjectKeys<'s, 's> {
        SubjectKeys { subject, route, limiter: self, client: None, digests: [None; 5] }
    }

    fn known_device(&self, route: &Route, keys: &mut SubjectKeys<'_, '_>, now_us: u64) -> Result<bool, RequestError> {
        let Some(known) = &route.known_devices else { return Ok(false) };
        if keys.subject.account.is_none() || keys.subject.device.is_none() {
            return Ok(false);
        }
        let key = keys.key(&[Component::Account, Component::Device])?;
        Ok(known.shards.of(key).get(key.tuple, now_us).is_some())
    }

    /// `check`: may this attempt proceed? Failure rules are read first; an
    /// attempt they refuse spends nothing. Then every rate rule spends one.
    /// A refusal moves the key one rung up its rule's ladder.
    pub fn check<'a>(&'a self, route: &str, subject: &Subject<'_>, now_us: u64) -> Result<Verdict<'a>, RequestError> {
        Ok(self.decide_check(self.plan_check(route, subject, now_us)?, now_us))
    }

    /// A check's first half: every key it needs, derived without taking a
    /// table lock. The server plans a batch of pipelined checks, prefetches
    /// their table slots, then decides them, so that the cache misses of a
    /// large table overlap instead of queueing one behind the other.
    pub fn plan_check<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        now_us: u64,
    ) -> Result<CheckPlan<'a>, RequestError> {
        let route = self.route(route)?;
        check_lengths(subject)?;
        let mut keys = self.subject_keys(&route.name, subject);
        let known = self.known_device(route, &mut keys, now_us)?;
        let rule_keys = keys.rule_keys(&route.rules, known)?;
        Ok(CheckPlan { route, rule_keys, class: keys.source_class() })
    }

    /// Asks the memory system for the rate-table slots a planned check will
    /// touch; a hint only, it changes nothing.
    pub fn prefetch(&self, plan: &CheckPlan<'_>) {
        for (rule, key) in plan.route.rules.iter().zip(plan.rule_keys.iter()) {
            if let (Table::Rate { shards, .. }, Some(key)) = (&rule.table, key) {
                shards.prefetch(*key);
            }
        }
    }

    /// A check's second half: the table steps, in rule order. Each failure
    /// rule admits the attempt into a place of its own (`admit`); if any
    /// rule then refuses, the places taken are given back, so a refused
    /// check holds nothing.
    pub fn decide_check<'a>(&'a self, plan: CheckPlan<'a>, now_us: u64) -> Verdict<'a> {
        let CheckPlan { route, rule_keys, class } = plan;
        let mut answers = Answers::new();
        // Bit i: rule i holds a place for this attempt.
        let mut held: u32 = 0;
        const _: () = assert!(RULES_PER_ROUTE_MAX <= 32);
        for (i, (rule, key)) in route.rules.iter().zip(rule_keys.iter().copied()).enumerate() {
            if let (Table::Failures { shards, .. }, Some(key)) = (&rule.table, key) {
                let (spec, admitted, standing) = {
                    let mut table = shards.of(key);
                    // A monitored rule's would-be refusal takes no place,
                    // exactly as an enforced one, so that switching it to
                    // enforcing finds the places enforcing would have.
                    let (admitted, standing) = table.admit(key, now_us, self.attempt_timeout_us);
                    (table.spec(), admitted, standing)
                };
                if admitted {
                    held |= 1 << i;
                }
                let answer = failure_answer(rule, spec, standing, !admitted, now_us);
                answers.push(self.escalate(rule, key, answer, now_us, true));
            }
        }
        let mut refused = answers.iter().any(|a| a.refused && !a.monitored);
        if !refused {
            for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
                if let (Table::Rate { shards, .. }, Some(key)) = (&rule.table, key) {
                    let spec = rate_spec(&rule.table, class);
                    let decision = shards.check(spec, key, now_us);
                    let answer = self.escalate(rule, key, rate_answer(rule, spec, decision), now_us, true);
                    refused = answer.refused && !answer.monitored;
                    answers.push(answer);
                    if refused {
                        break;
                    }
                }
            }
        }
        if refused {
            self.give_back(route, &rule_keys, held, now_us);
        }
        combine(&answers)
    }

    /// Gives back the places a refused check took (bit i: rule i).
    fn give_back(&self, route: &Route, rule_keys: &RuleKeys, held: u32, now_us: u64) {
        for (i, (rule, key)) in route.rules.iter().zip(rule_keys.iter().copied()).enumerate() {
            if let (Table::Failures { shards, .. }, Some(key), true) = (&rule.table, key, held & (1 << i) != 0) {
                shards.of(key).settle(key, now_us);
            }
        }
    }

    /// Places a refusal on the rule's ladder and phrases it: the rung, a
    /// Retry-After escalated per key (never shorter than the true wait, plus
    /// jitter), a progressive delay. With `climb`, the key moves up a rung.
    fn escalate<'r>(
        &self,
        rule: &'r Rule,
        key: Key,
        mut answer: RuleAnswer<'r>,
        now_us: u64,
        climb: bool,
    ) -> RuleAnswer<'r> {
        if !answer.refused {
            return answer;
        }
        if rule.monitor {
            answer.monitored = true;
            if climb {
                rule.counters.would_refuse.fetch_add(1, Ordering::Relaxed);
            }
            return answer;
        }
        let level = {
            let mut table = rule.escalation.of(key);
            let level = table.get(key.tuple, now_us).map_or(0, |s| s.value);
            if climb {
                let slot = Slot {
                    expires_us: now_us + answer.retry_after_us + rule.cool_down_us(),
                    value: level.saturating_add(1),
                };
                table.set(key.tuple, slot, now_us);
            }
            level as usize
        };
        if climb {
            rule.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        let policy = &self.responses;
        answer.rung = rule.responses[level.min(rule.responses.len() - 1)];
        let step = policy.retry_after_steps_us[level.min(policy.retry_after_steps_us.len() - 1)];
        // Jitter from the key and level: spread across clients, stable for a
        // client (no randomness source on the request path).
        let spread =
            (key.tuple ^ (level as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let jitter_max = step / 100 * policy.jitter_percent as u64;
        let jitter = (spread >> 11) % (jitter_max + 1);
        answer.retry_after_us = answer.retry_after_us.max(step + jitter);
        if answer.rung == Rung::Delay {
            let doubled = policy.delay_base_us.saturating_mul(1u64 << level.min(20));
            answer.delay_us = doubled.min(policy.delay_max_us);
        }
        answer
    }

    /// `report`: counts a failure on every failure rule that applies, or
    /// clears the (own-key) entries of rules cleared by success, and records
    /// a known device on success. Returns the verdict a check would now give
    /// (without spending or climbing), and, for each key this report
    /// locked, the durable write the reply must wait for.
    pub fn report<'a>(
        &'a self,
        route: &str,
        subject: &Subject<'_>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        now_us: u64,
    ) -> Result<(Verdict<'a>, Vec<Durable>), RequestError> {
        let route = self.route(route)?;
        check_lengths(subject)?;
        let mut keys = self.subject_keys(&route.name, subject);
        let known = self.known_device(route, &mut keys, now_us)?;
        // Derive every key before touching any table, so a missing field
        // cannot leave a report counted on some rules and not others.
        let rule_keys = keys.rule_keys(&route.rules, known)?;
        let repeated = match (outcome, password_digest, &route.recent_passwords) {
            (Outcome::Failure, Some(digest), Some(recent))
                if keys.has(Component::Prefix) && keys.has(Component::Account) =>
            {
                let key = keys.key(&[Component::Account, Component::Prefix])?;
                self.remember_password(recent, key, &digest, now_us)
            }
            _ => false,
        };
        if outcome == Outcome::Success {
            if let (Some(known_devices), true) =
                (&route.known_devices, keys.has(Component::Device) && keys.has(Component::Account))
            {
                let key = keys.key(&[Component::Account, Component::Device])?;
                known_devices.remember(key, now_us);
            }
        }
        let class = keys.source_class();
        let mut answers = Answers::new();
        // One per rule this report locked: the reply waits for each.
        let mut durable = Vec::new();
        for (rule, key) in route.rules.iter().zip(rule_keys.iter().copied()) {
            let Some(key) = key else { continue };
            match &rule.table {
                Table::Failures { cleared_by_success, shards, .. } => {
                    let mut table = shards.of(key);
                    // The report settles the place its check took, in the
                    // same step as it is counted: the place becomes a
                    // failure, or is released, never both nor neither.
                    table.settle(key, now_us);
                    match outcome {
                        Outcome::Failure if !repeated => match table.record_failure(key, now_us) {
                            Ok(recorded) if recorded.now_locked && !recorded.was_locked => {
                                // Written while the shard is locked, so it is
                                // queued before any later change of this key.
                                let window_us = table.spec().window_us;
                                let change = vec![(key, Some(recorded.counts))];
                                durable.push(self.journal.write_durably(&rule.id, window_us, change));
                                table.mark_persisted(key);
                            }
                            Ok(_) => {}
                            Err(_) => {
                                table.count_overflow(key, now_us);
                            }
                        },
                        Outcome::Success if *cleared_by_success => {
                            table.clear(key);
                        }
                        _ => {}
                    }
                    let spec = table.spec();
                    // The failures the table and its overflow sketch hold.
                    let standing = table.standing(key, now_us);
                    drop(table);
                    let refused = spec.refuses(standing.counts, standing.in_flight, now_us);
                    let answer = failure_answer(rule, spec, standing, refused, now_us);
                    answers.push(self.escalate(rule, key, answer, now_us, false));
                }
                Table::Rate { shards, .. } => {
                    let spec = rate_spec(&rule.table, class);
                    let decision = shards.of(key).peek(spec, key, now_us);
                    answers.push(self.escalate(rule, key, rate_answer(rule, spec, decision), now_us, false));
                }
            }
        }
        Ok((combine(&answers), durable))
    }

    /// Records a wrong-password digest for (account, prefix); true if it was
    /// one of the last few already (a repeat, not a new guess).
    fn remember_password(&self, recent: &RecentPasswords, key: Key, digest: &[u8; 16], now_us: u64) -> bool {
        // Re-keyed with the daemon's secret and cut to 32 bits: enough to
        // tell a few passwords apart, useless to anyone reading memory.
        let mine = self.keys.component(Component::Account, digest);
        let tag = u32::from_le_bytes([mine[0], mine[1], mine[2], mine[3]]) | 1; // 0 marks an empty slot
        let mut table = recent.shards.of(key);
        let mut seen = table.get(key.tuple, now_us).map_or([0; 4], |s| s.value);
        let repeated = seen[..recent.remembered].contains(&tag);
        if !repeated {
            seen.copy_within(0..recent.remembered - 1, 1);
            seen[0] = tag;
        }
        table.set(key.tuple, Slot { expires_us: now_us + recent.ttl_us, value: seen }, now_us);
        repeated
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
                    writes.push(self.journal.write_durably(&rule.id, table.spec().window_us, vec![(key, None)]));
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
                let removals = doomed.into_iter().map(|k| (k, None)).collect();
                writes.push(self.journal.write_durably(&rule.id, table.spec().window_us, removals));
            }
        }
        Ok((cleared, writes))
    }

    /// Keys refused by failure rules now, at most `limit`, and how many in all.
    ///
    /// A shard's lock is held only to copy its locked keys and counts (a
    /// few bytes each) and count the rest; the strings of a 10,000-entry
    /// reply are made after it is released, so checks on that shard do not
    /// wait for them.
    pub fn lockouts(&self, limit: usize, now_us: u64) -> (Vec<Lockout>, u64) {
        let mut out = Vec::new();
        let mut total = 0u64;
        let mut found = Vec::new();
        for route in &self.routes {
            for rule in &route.rules {
                let Table::Failures { shards, .. } = &rule.table else { continue };
                for table in shards.each() {
                    found.clear();
                    let spec = table.spec();
                    for (key, counts) in table.locked(now_us) {
                        total += 1;
                        if out.len() + found.len() < limit {
                            found.push((key, counts));
                        }
                    }
                    drop(table);
                    out.extend(found.iter().map(|&(key, counts)| {
                        let until_us = spec.unlocks_at(counts, now_us);
                        Lockout {
                            route: route.name.clone(),
                            rule: rule.name.clone(),
                            key: key.to_string(),
                            count: spec.estimate(counts, now_us),
                            until_ms: ceil_ms(until_us),
                            retry_after_ms: ceil_ms(until_us - now_us),
                        }
                    }));
                }
            }
        }
        (out, total)
    }

    /// Route-scoped bounds for `status`'s named limits, as `route.name`.
    pub fn route_limits(&self) -> Vec<(String, u64)> {
        let known = self.routes.iter().filter_map(|r| Some((&r.name, r.known_devices.as_ref()?)));
        known.map(|(name, k)| (format!("{name}.known_devices_per_account_max"), u64::from(k.per_account_max))).collect()
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

    /// Maintenance, off the request path: expires failure entries and sends
    /// every change since the last call to the journal. With `durable`, the
    /// returned writes complete when the changes are on disk.
    pub fn snapshot(&self, now_us: u64, durable: bool) -> Vec<Durable> {
        let mut writes = Vec::new();
        for route in &self.routes {
            for rule in &route.rules {
                let Table::Failures { shards, .. } = &rule.table else { continue };
                for mut table in shards.each() {
                    table.expire(now_us);
                    let changes = table.take_changes();
                    if changes.is_empty() {
                        continue;
                    }
                    // Sent while the shard is locked: see `report`.
                    let window_us = table.spec().window_us;
                    if durable {
                        writes.push(self.journal.write_durably(&rule.id, window_us, changes));
                    } else {
                        self.journal.write(&rule.id, window_us, changes);
                    }
                }
            }
        }
        self.save_known_devices(now_us, false, &mut writes, durable);
        writes
    }

    /// Every route's known devices to the journal: the changes since the
    /// last call, or with `full` everything (see `save_device_map`).
    fn save_known_devices(&self, now_us: u64, full: bool, writes: &mut Vec<Durable>, durable: bool) {
        for route in &self.routes {
            let Some(known) = &route.known_devices else { continue };
            let name: Arc<str> = route.name.as_str().into();
            let (journal, devices, accounts) = (&self.journal, &known.shards, &known.per_account);
            save_device_map(journal, &name, DeviceMap::Devices, devices, |()| 0, now_us, full, writes, durable);
            save_device_map(journal, &name, DeviceMap::PerAccount, accounts, |n| n, now_us, full, writes, durable);
        }
    }

    /// Puts persisted known devices back at start. Rows already expired, or
    /// of a route that keeps no known devices, are deleted; an expiry past
    /// the route's TTL now (shortened while the daemon was down) is cut to
    /// it. Returns how many were restored.
    pub fn restore_known_devices(&self, rows: Vec<PersistedDevice>, now_us: u64) -> usize {
        let mut restored = 0;
        let mut orphans = std::collections::BTreeSet::new();
        let mut stale: Vec<DeviceRows> = Vec::new();
        for row in rows {
            let known = self.routes.iter().find(|r| r.name == row.route).and_then(|r| r.known_devices.as_ref());
            let Some(known) = known else {
                orphans.insert(row.route);
                continue;
            };
            let slot_expires_us = row.expires_us.min(now_us.saturating_add(known.ttl_us));
            let index = shard_index(row.id);
            let live = slot_expires_us > now_us;
            // An expired row, or one filed under another shard (a build
            // with another shard count), is deleted where it is.
            if !live || usize::from(row.shard) != index {
                let route: Arc<str> = row.route.as_str().into();
                let rows = vec![(row.id, None)];
                stale.push(DeviceRows { route, map: row.map, shard: row.shard, whole: false, rows });
            }
            if !live {
                continue;
            }
            let moved = usize::from(row.shard) != index || slot_expires_us != row.expires_us;
            match row.map {
                DeviceMap::Devices => {
                    let mut table = lock(&known.shards.0[index]);
                    table.restore(row.id, Slot { expires_us: slot_expires_us, value: () }, now_us);
                    if moved {
                        table.mark_changed(row.id);
                    }
                }
                DeviceMap::PerAccount => {
                    let mut table = lock(&known.per_account.0[index]);
                    table.restore(row.id, Slot { expires_us: slot_expires_us, value: row.value }, now_us);
                    if moved {
                        table.mark_changed(row.id);
                    }
                }
            }
            restored += 1;
        }
        for edit in stale {
            self.journal.write_devices(edit, false);
        }
        for route in orphans {
            self.journal.drop_devices(&route);
        }
        restored
    }

    /// Rewrites the whole state file from memory (after a failed write left
    /// it behind). Each shard's entries are sent while its lock is held, so
    /// a change made after a shard was collected reaches the writer after
    /// it; the returned write resolves when the fresh file is in place.
    pub fn rewrite(&self, now_us: u64) -> Durable {
        self.journal.rewrite_begin();
        for route in &self.routes {
            for rule in &route.rules {
                let Table::Failures { shards, .. } = &rule.table else { continue };
                for mut table in shards.each() {
                    table.expire(now_us);
                    let entries = table.full_snapshot();
                    if !entries.is_empty() {
                        self.journal.write(&rule.id, table.spec().window_us, entries);
                    }
                }
            }
        }
        self.save_known_devices(now_us, true, &mut Vec::new(), false);
        self.journal.rewrite_end()
    }

    /// Sweeps expired entries of the rate, escalation, known-device and
    /// password tables and lapsed places of failure rules, one shard per call (round robin by `tick`), so no
    /// call holds a lock for a whole table.
    pub fn sweep(&self, tick: u64, now_us: u64) {
        let shard = tick as usize % SHARDS;
        for route in &self.routes {
            for rule in &route.rules {
                match &rule.table {
                    Table::Rate { shards, .. } => lock(&shards.0[shard]).sweep(now_us),
                    Table::Failures { shards, .. } => lock(&shards.0[shard]).sweep_places(now_us),
                }
                lock(&rule.escalation.0[shard]).sweep(now_us);
            }
            if let Some(k) = &route.known_devices {
                lock(&k.shards.0[shard]).sweep(now_us);
                lock(&k.per_account.0[shard]).sweep(now_us);
            }
            if let Some(r) = &route.recent_passwords {
                lock(&r.shards.0[shard]).sweep(now_us);
            }
        }
    }

    /// Puts persisted entries back at start. Rows already expired are
    /// deleted by the first snapshot; rows of rules not configured are
    /// deleted (see `Journal::drop_rule`). A row written under another
    /// window length is re-dated the way a reload re-dates entries (its
    /// estimate, rounded down, becomes the current window's count) and
    /// written again in the rule's length now.
    pub fn restore(&self, entries: Vec<PersistedEntry>, now_us: u64) -> Restored {
        let mut counts = Restored::default();
        let mut placed = Vec::with_capacity(entries.len());
        let mut orphans = std::collections::BTreeSet::new();
        for entry in entries {
            let rule = self.routes.iter().flat_map(|r| &r.rules).find(|r| *r.id == *entry.rule);
            let Some(Table::Failures { spec, shards, .. }) = rule.map(|r| &r.table) else {
                counts.orphaned += 1;
                orphans.insert(entry.rule);
                continue;
            };
            let redated = entry.window_us != 0 && entry.window_us != spec.window_us;
            let restored = if redated {
                let then = WindowSpec { window_us: entry.window_us, threshold: spec.threshold };
                Counts {
                    window: spec.window_index(now_us),
                    previous: 0,
                    current: then.whole_failures(entry.counts, now_us),
                }
            } else {
                entry.counts
            };
            placed.push((shards, Key::from_u128(entry.key), restored, redated));
        }
        // In window order, so each table's lists stay ordered.
        placed.sort_by_key(|(_, _, c, _)| c.window);
        for (shards, key, restored, redated) in placed {
            let mut table = shards.of(key);
            match table.restore(key, restored, now_us) {
                Ok(true) => {
                    counts.restored += 1;
                    if redated {
                        counts.redated += 1;
                        table.mark_unwritten(key);
                    }
                }
                Ok(false) => counts.expired += 1,
                Err(_) => counts.refused += 1,
            }
        }
        for rule in orphans {
            self.journal.drop_rule(&rule);
        }
        counts
    }
}

/// What `Limiter::restore` did with the state file's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Live again in their tables.
    pub restored: usize,
    /// Both windows over while the daemon was down; their rows are deleted.
    pub expired: usize,
    /// Restored from rows written under another window length (counted in
    /// `restored` too).
    pub redated: usize,
    /// Naming a rule that is not configured (or is no longer a failure
    /// rule); deleted.
    pub orphaned: usize,
    /// Not placed: the table was full of lockouts.
    pub refused: usize,
}

fn gcra_spec(rate: RateLimit) -> GcraSpec {
    GcraSpec::new(rate.limit, rate.period_us, rate.burst)
}

fn rate_spec(table: &Table, class: Option<SourceClass>) -> GcraSpec {
    match table {
        Table::Rate { rate, by_class, .. } => gcra_spec(class.and_then(|c| by_class[c]).unwrap_or(*rate)),
        Table::Failures { .. } => unreachable!("rate_spec of a failure rule"),
    }
}

fn build_route(config: &RouteConfig, previous: Option<&Limiter>, now_us: u64) -> Route {
    let old_route = previous.and_then(|p| p.routes.iter().find(|r| r.name == config.name));
    let rules = config.rules.iter().map(|rule| build_rule(config, rule, old_route, now_us)).collect();
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
            RuleKind::Rate { .. } => 0,
        })
        .max()
        .unwrap_or(0)
        .max(1_000_000);
    let recent_passwords = config.recent_passwords.map(|(remembered, entries_max)| {
        let shards =
            expiring_table(old_route.and_then(|r| r.recent_passwords.as_ref()).map(|o| &o.shards), entries_max);
        RecentPasswords { remembered: remembered as usize, ttl_us: longest_window, shards }
    });
    Route { name: config.name.clone(), fail_policy: config.fail_policy, rules, known_devices, recent_passwords }
}

/// A route's bounded map: the running one with the new cap, or a new one.
fn expiring_table<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
) -> SharedTable<ExpiringMap<V>> {
    expiring_table_made(old, entries_max, ExpiringMap::new)
}

/// A persisted map: like `expiring_table`, with a change list.
fn expiring_table_tracked<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
) -> SharedTable<ExpiringMap<V>> {
    expiring_table_made(old, entries_max, ExpiringMap::tracked)
}

fn expiring_table_made<V: Copy>(
    old: Option<&SharedTable<ExpiringMap<V>>>,
    entries_max: usize,
    make: fn(usize) -> ExpiringMap<V>,
) -> SharedTable<ExpiringMap<V>> {
    match old {
        Some(old) => reuse(old, entries_max, |t, cap| t.set_entries_max(cap)),
        None => Arc::new(Shards::new(entries_max, make)),
    }
}

/// Keeps an existing sharded table, applying a new total cap to each shard.
fn reuse<T>(shards: &SharedTable<T>, total_entries_max: usize, apply: impl Fn(&mut T, usize)) -> SharedTable<T> {
    let per_shard = total_entries_max.div_ceil(SHARDS);
    for mut t in shards.each() {
        apply(&mut t, per_shard);
    }
    shards.clone()
}

fn build_rule(route: &RouteConfig, rule: &RuleConfig, old_route: Option<&Route>, now_us: u64) -> Rule {
    let old = old_route.and_then(|r| r.rules.iter().find(|o| o.name == rule.name));
    let table = match rule.kind {
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
            Table::Failures { spec, cleared_by_success, shards }
        }
    };
    let entries_max = match rule.kind {
        RuleKind::Rate { entries_max, .. } | RuleKind::Failures { entries_max, .. } => entries_max,
    };
    Rule {
        name: rule.name.clone(),
        id: format!("{}/{}", route.name, rule.name).into(),
        key: rule.key.clone(),
        monitor: rule.monitor,
        responses: rule.responses.clone(),
        required: rule.required,
        devices: rule.devices,
        table,
        escalation: match old {
            Some(o) => reuse(&o.escalation, entries_max, |t, cap| t.set_entries_max(cap)),
            None => Arc::new(Shards::new(entries_max, ExpiringMap::new)),
        },
        counters: old.map(|o| o.counters.clone()).unwrap_or_default(),
    }
}

fn rule_status(rule: &Rule) -> RuleStatus {
    let key = rule.key.iter().map(|c| c.name().to_string()).collect();
    let (kind, limit, burst, period_ms, cleared_by_success, class_limits, (entries, entries_max, refused_full)) =
        match &rule.table {
            Table::Rate { rate, by_class, shards } => {
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
                let fill = shards.each().fold((0, 0, 0), |(n, m, f), t| {
                    (n + t.len() as u64, m + t.entries_max() as u64, f + t.refused_full() + t.presumed_failures())
                });
                ("failures", spec.threshold, 0, spec.window_us / 1000, *cleared_by_success, Vec::new(), fill)
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

/// A failure rule's answer for a key's standing. `refused` is decided by
/// the caller: a check that was not admitted, or a report after which a
/// check would not be.
fn failure_answer(rule: &Rule, spec: WindowSpec, standing: Standing, refused: bool, now_us: u64) -> RuleAnswer<'_> {
    let Standing { counts, in_flight, in_flight_until_us } = standing;
    let c = spec.rolled(counts, now_us);
    let reset_us = if c.current > 0 {
        spec.expires_at(c) - now_us
    } else if c.previous > 0 {
        spec.expires_at(c) - spec.window_us - now_us
    } else {
        0
    };
    // Locked by failures: until the count drains. Full of attempts in
    // flight: until they lapse, at the latest (a report may free a place
    // sooner, or lock the key).
    let retry_after_us = match (refused, spec.is_locked(counts, now_us)) {
        (false, _) => 0,
        (true, true) => spec.unlocks_at(counts, now_us) - now_us,
        (true, false) => in_flight_until_us.saturating_sub(now_us).max(1),
    };
    RuleAnswer {
        refused,
        monitored: false,
        reason: if refused { Reason::TooManyFailures } else { Reason::Allowed },
        rung: Rung::Deny,
        retry_after_us,
        delay_us: 0,
        limit: spec.threshold,
        remaining: spec.admits_remaining(counts, in_flight, now_us),
        reset_us,
        rule: &rule.name,
    }
}

fn rate_answer(rule: &Rule, spec: GcraSpec, decision: GcraDecision) -> RuleAnswer<'_> {
    RuleAnswer {
        refused: !decision.allowed,
        monitored: false,
        reason: if decision.allowed { Reason::Allowed } else { Reason::RateLimited },
        rung: Rung::Deny,
        retry_after_us: decision.retry_after_us,
        delay_us: 0,
        limit: spec.burst,
        remaining: decision.remaining,
        reset_us: decision.reset_us,
        rule: &rule.name,
    }
}

/// One verdict from the rules' answers: if any enforcing rule refuses, its
/// severest rung (then longest wait) decides; else allowed with the tightest
/// rule's figures, or, when a monitored rule would have refused, allowed
/// with that would-be refusal as the reason.
fn combine<'r>(answers: &[RuleAnswer<'r>]) -> Verdict<'r> {
    let enforced = answers.iter().filter(|a| a.refused && !a.monitored).max_by_key(|a| (a.rung, a.retry_after_us));
    if let Some(a) = enforced {
        let delay_us = answers.iter().filter(|a| a.refused && !a.monitored).map(|a| a.delay_us).max().unwrap_or(0);
        return Verdict {
            decision: match a.rung {
                Rung::Delay => Decision::Delay,
                Rung::Challenge => Decision::Challenge,
                Rung::Deny => Decision::Deny,
            },
            retry_after_ms: ceil_ms(a.retry_after_us),
            delay_ms: if a.rung == Rung::Delay { ceil_ms(delay_us) } else { 0 },
            limit: a.limit,
            remaining: a.remaining,
            reset_ms: ceil_ms(a.reset_us),
            reason: a.reason,
            rule: Cow::Borrowed(a.rule),
        };
    }
    // A would-be refusal names its rule and shows that rule's figures.
    let monitored = answers.iter().filter(|a| a.monitored).max_by_key(|a| a.retry_after_us);
    let tightest = monitored.or_else(|| answers.iter().min_by_key(|a| a.remaining));
    let Some(t) = tightest else {
        return Verdict {
            decision: Decision::Allow,
            retry_after_ms: 0,
            delay_ms: 0,
            limit: 0,
            remaining: 0,
            reset_ms: 0,
            reason: Reason::Allowed,
            rule: Cow::Borrowed(""),
        };
    };
    let reason = match monitored {
        Some(m) if m.reason == Reason::RateLimited => Reason::MonitorRateLimited,
        Some(_) => Reason::MonitorTooManyFailures,
        None => Reason::Allowed,
    };
    Verdict {
        decision: Decision::Allow,
        retry_after_ms: 0,
        delay_ms: 0,
        limit: t.limit,
        remaining: t.remaining,
        reset_ms: ceil_ms(t.reset_us),
        reason,
        rule: Cow::Borrowed(t.rule),
    }
}
