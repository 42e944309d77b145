//! Key derivation for one request: each identifier digested at most once,
//! the client's address and source class looked up at most once.

use std::net::IpAddr;

use super::route::{Route, Rule};
use super::{Limiter, RequestError, IDENTIFIER_BYTES_MAX};
use crate::classes::SourceClass;
use crate::config::{Detector, DeviceScope};
use crate::keys::{Component, Key};
use crate::protocol::{Outcome, Subject};
use crate::signals::flags::{digest64, Hits, Space, WIDEN_48, WIDEN_56};
use crate::signals::pump::FlagsGuard;
use crate::signals::queued::{prefix_digest, wide_prefix, QueuedEvent, Reported};
use crate::signals::{in_success_sample, tenant_draw};
use crate::source::{forwarded_tail, prefix_of, Prefix};
use smallvec::SmallVec;

/// Keys ride in a check's plan, which the server moves around: room for
/// the shipped routes' rules (login has 5) keeps it small and off the
/// heap on every request; a longer route spills. At 4, every login check
/// and report allocated its keys (5% of the daemon's CPU a login).
pub(super) type RuleKeys = SmallVec<[Option<Key>; RULE_KEYS_INLINE]>;
pub(super) const RULE_KEYS_INLINE: usize = 5;

/// Per-request digests and source facts, computed at most once each.
pub(super) struct SubjectKeys<'s, 'k> {
    pub(super) subject: &'s Subject<'s>,
    route: &'s str,
    limiter: &'k Limiter,
    /// The client's address and source class, once looked up.
    client: Option<(std::net::IpAddr, Option<SourceClass>)>,
    digests: [Option<[u8; 16]>; 5],
    /// Spray detection's flags, when any are raised: the prefix may be
    /// widened, and the signal rules look the subject up.
    pub(super) flags: Option<FlagsGuard>,
    now_us: u64,
    /// The prefix rules would key on without widening, and its digest.
    natural: Option<(Prefix, u64)>,
    /// The wide prefix (IPv4 /24, IPv6 /48) and its digest.
    wide: Option<(Prefix, u64)>,
    /// An IPv6 client's /56's digest.
    block56: Option<u64>,
    /// Whether a widened block replaces the prefix: not for a device the
    /// account knows (see `known_device_keeps_its_prefix`).
    widen: bool,
    /// Tuple keys already derived, by `tuple_code`: several rules (and the
    /// wrong-password memory) key on the same tuple, and each derivation
    /// is a BLAKE2b MAC, the request path's largest cost.
    tuples: SmallVec<[(u32, Key); TUPLES_REMEMBERED]>,
    /// The source exemption covering the client, once looked up.
    exemption: Option<Option<u16>>,
    /// A rule was skipped because the source is exempt.
    pub(super) exempted: bool,
}

/// Distinct multi-component tuples a request remembers; a route keying on
/// more derives the rest again (correct, only slower).
const TUPLES_REMEMBERED: usize = 4;

/// A tuple's components, in order, as one number (3 bits each, at most 5).
fn tuple_code(components: &[Component]) -> u32 {
    components.iter().fold(0, |code, c| code << 3 | *c as u32)
}

impl SubjectKeys<'_, '_> {
    pub(super) fn client(&mut self) -> Result<(std::net::IpAddr, Option<SourceClass>), RequestError> {
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

    /// A component's digest, if a key needed it.
    pub(super) fn derived(&self, component: Component) -> Option<[u8; 16]> {
        self.digests[component as usize - 1]
    }

    pub(super) fn limiter(&self) -> &Limiter {
        self.limiter
    }

    /// The `[[source.exemptions]]` entry covering the client's address (the
    /// one `client` picked: a header counts only through trusted proxies),
    /// looked up once. Without exemptions, the default, nothing is looked up.
    pub(super) fn exemption(&mut self) -> Option<u16> {
        if self.limiter.exemptions.is_empty() {
            return None;
        }
        if let Some(exemption) = self.exemption {
            return exemption;
        }
        let exemption = self.client().ok().and_then(|(address, _)| self.limiter.exemptions.lookup(address));
        self.exemption = Some(exemption);
        exemption
    }

    /// Whether an exemption skips `rule` for this request (and notes it).
    fn exempts(&mut self, rule: &Rule) -> bool {
        let skip = rule.exemptible && self.exemption().is_some();
        self.exempted |= skip;
        skip
    }

    pub(super) fn source_class(&mut self) -> Option<SourceClass> {
        self.client().ok().and_then(|(_, class)| class)
    }

    pub(super) fn has(&self, component: Component) -> bool {
        match component {
            Component::Prefix => self.subject.peer.is_some(),
            Component::Account => self.subject.account.is_some(),
            Component::Device => self.subject.device.is_some(),
            Component::Tenant => self.subject.tenant.is_some(),
            Component::ClientId => self.subject.client_id.is_some(),
        }
    }

    pub(super) fn component(&mut self, component: Component) -> Result<[u8; 16], RequestError> {
        let slot = component as usize - 1;
        if let Some(d) = self.digests[slot] {
            return Ok(d);
        }
        let missing = || RequestError::MissingField { route: self.route.to_string(), field: component.name() };
        let keys = &self.limiter.keys;
        let digest = match component {
            Component::Prefix => {
                let (address, class) = self.client()?;
                let prefix = self.widened(address, class);
                let digest = keys.prefix(&prefix.to_bytes());
                // Not widened: it is also the prefix spray detection's event
                // names, which then needs no second digest.
                if self.natural.is_none() && prefix == self.limiter.source.prefix_in_class(address, class) {
                    self.natural = Some((prefix, digest64(&digest)));
                }
                digest
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

    /// The prefix rules key on: the class's prefix, or, when spray
    /// detection has widened the IPv6 block around it (many of its /64s
    /// failing), that /48 or /56, so the block is one source.
    fn widened(&mut self, address: IpAddr, class: Option<SourceClass>) -> Prefix {
        let prefix = self.limiter.source.prefix_in_class(address, class);
        let Some(flags) = &self.flags else { return prefix };
        if !self.widen
            || !prefix.network.is_ipv6()
            || flags.enforced & (WIDEN_48 | WIDEN_56) == 0
            || !flags.widens(class)
        {
            return prefix;
        }
        let (wide, digest48) = self.wide();
        let probe = |keys: &Self, digest: u64| {
            keys.flags.as_ref().map_or(0, |flags| flags.probe(Space::Prefix, digest, keys.now_us))
        };
        if prefix.len > 48 && probe(self, digest48) & WIDEN_48 != 0 {
            return wide;
        }
        if prefix.len > 56 {
            let digest56 = self.block56();
            if probe(self, digest56) & WIDEN_56 != 0 {
                return prefix_of(address, 32, 56);
            }
        }
        prefix
    }

    /// A request from a device its account knows keeps its own prefix
    /// whatever is widened: widening exists to give a rotating stranger
    /// one budget, and applied to the owner it would let anyone in the
    /// block (one customer's /56 is 16 /64s of an ISP's /48) spend the
    /// owner's source budgets and lock (owner, block). Called before any
    /// prefix key is derived.
    pub(super) fn known_device_keeps_its_prefix(&mut self, known: bool) {
        debug_assert!(self.digests[Component::Prefix as usize - 1].is_none(), "set before the prefix is keyed");
        self.widen = !known;
    }

    /// The prefix rules would key on without widening, and its digest.
    pub(super) fn natural(&mut self) -> Result<(Prefix, u64), RequestError> {
        if let Some(natural) = self.natural {
            return Ok(natural);
        }
        let (address, class) = self.client()?;
        let prefix = self.limiter.source.prefix_in_class(address, class);
        let natural = (prefix, digest64(&self.limiter.keys.prefix(&prefix.to_bytes())));
        self.natural = Some(natural);
        Ok(natural)
    }

    /// The wide prefix (IPv4 /24, IPv6 /48) of the client, and its digest.
    /// Called only after `client` succeeded.
    fn wide(&mut self) -> (Prefix, u64) {
        if let Some(wide) = self.wide {
            return wide;
        }
        let (address, _) = self.client.expect("the client is looked up first");
        let prefix = wide_prefix(address);
        let wide = (prefix, prefix_digest(&self.limiter.keys, &prefix));
        self.wide = Some(wide);
        wide
    }

    /// The digest of the client's /56. Called only after `client`
    /// succeeded, for an IPv6 client.
    fn block56(&mut self) -> u64 {
        if let Some(digest) = self.block56 {
            return digest;
        }
        let (address, _) = self.client.expect("the client is looked up first");
        let digest = digest64(&self.limiter.keys.prefix(&prefix_of(address, 32, 56).to_bytes()));
        self.block56 = Some(digest);
        digest
    }

    fn tenant64(&mut self, route: &Route) -> u64 {
        match self.subject.tenant {
            Some(_) => self.component(Component::Tenant).map(|d| digest64(&d)).unwrap_or(route.pseudo_tenant),
            None => route.pseudo_tenant,
        }
    }

    /// What the flags say of this subject (all but its password tag).
    pub(super) fn hits(&mut self, route: &Route) -> Hits {
        if self.flags.is_none() {
            return Hits::default();
        }
        // An exempt source's own flags (narrow and wide spray: the source
        // axes) do not refuse it; its account's and password's still do.
        let exempt = self.exemption().is_some();
        // Digests first (they need `self` mutably), then the flags.
        let source = self.client().ok().filter(|_| !exempt).map(|(address, class)| {
            let natural = self.natural().expect("the client is known");
            // Spray detection also judges an IPv6 source as its /56.
            let v6 = address.is_ipv6() && natural.0.len > 56 && class != Some(SourceClass::Mobile);
            (natural.1, self.wide().1, v6.then(|| self.block56()))
        });
        let account = self.component(Component::Account).ok().map(|a| digest64(&a));
        let tenant = self.tenant64(route);
        let (Some(flags), now_us) = (&self.flags, self.now_us) else { return Hits::default() };
        let mut hits = Hits::default();
        if let Some((narrow, wide, block56)) = source {
            hits.add(flags, flags.probe(Space::Prefix, narrow, now_us), Detector::NarrowSpray.bit());
            if let Some(block56) = block56 {
                hits.add(flags, flags.probe(Space::Prefix, block56, now_us), Detector::NarrowSpray.bit());
            }
            hits.add(flags, flags.probe(Space::Prefix, wide, now_us), Detector::WideSpray.bit());
        }
        if let Some(account) = account {
            hits.add(flags, flags.probe(Space::Account, account, now_us), Detector::AccountDistributed.bit());
        }
        hits.add(flags, flags.probe(Space::Tenant, tenant, now_us), Detector::TenantAnomaly.bit());
        hits
    }

    /// The report as spray detection's queue takes it; `None` without a
    /// source.
    pub(super) fn signal_event(
        &mut self,
        route: &Route,
        outcome: Outcome,
        repeated: bool,
        known_device: bool,
        password: Option<u64>,
        success_sample: u32,
    ) -> Option<QueuedEvent> {
        let (address, class) = self.client().ok()?;
        let narrow = self.natural().ok()?;
        let account = self.subject.account.and_then(|_| self.component(Component::Account).ok()).map(|d| digest64(&d));
        let tenant_weight = match outcome {
            Outcome::Failure => 1,
            Outcome::Success if tenant_draw(narrow.1 ^ account.unwrap_or(0), self.now_us, success_sample) => {
                success_sample
            }
            Outcome::Success => 0,
        };
        let in_sample = account.is_some_and(|a| in_success_sample(a, success_sample));
        if outcome == Outcome::Success && !narrow.0.network.is_ipv6() && !in_sample {
            // For its tenant at most; most such successes are not drawn,
            // and need not pay for the tenant's digest.
            if tenant_weight == 0 {
                return None;
            }
            return Some(QueuedEvent::tenant_success(self.now_us, self.tenant64(route), tenant_weight));
        }
        let tenant = self.tenant64(route);
        Some(QueuedEvent::report(Reported {
            now_us: self.now_us,
            outcome,
            repeated,
            known_device,
            class,
            account,
            narrow,
            address,
            tenant,
            tenant_weight,
            password: if outcome == Outcome::Failure { password } else { None },
        }))
    }

    pub(super) fn key(&mut self, components: &[Component]) -> Result<Key, RequestError> {
        // Most rules key on one component: no tuple to assemble.
        if let [only] = components {
            let digest = self.component(*only)?;
            return Ok(self.limiter.keys.tuple(&[(*only, digest)]));
        }
        let code = tuple_code(components);
        if let Some(&(_, key)) = self.tuples.iter().find(|(c, _)| *c == code) {
            return Ok(key);
        }
        let mut parts = [(Component::Prefix, [0u8; 16]); 5];
        for (i, c) in components.iter().enumerate() {
            parts[i] = (*c, self.component(*c)?);
        }
        let key = self.limiter.keys.tuple(&parts[..components.len()]);
        if self.tuples.len() < TUPLES_REMEMBERED {
            self.tuples.push((code, key));
        }
        Ok(key)
    }

    /// Every rule's key, in rule order; an error if any key field is
    /// missing, before any table is touched.
    /// Every rule's key, in rule order; an error if any key field is
    /// missing, before any table is touched. With `store_decides_devices` (shared mode, a device in
    /// the request), a global rule scoped to known or unknown devices gets
    /// its key whatever this host knows of the device: the store, which
    /// knows the devices every host has seen, decides whether it applies.
    pub(super) fn rule_keys(
        &mut self,
        rules: &[Rule],
        known_device: bool,
        store_decides_devices: bool,
    ) -> Result<RuleKeys, RequestError> {
        // A plain loop: collecting the `Result`s cost more instructions than
        // deriving a one-rule route's key.
        let mut keys = RuleKeys::new();
        for rule in rules {
            let scoped = rule.devices != DeviceScope::All && rule.global.is_some();
            if store_decides_devices && scoped {
                let applies = (rule.required || rule.key.iter().all(|c| self.has(*c))) && !self.exempts(rule);
                keys.push(if applies { Some(self.key(&rule.key)?) } else { None });
            } else {
                keys.push(self.rule_key(rule, known_device)?);
            }
        }
        Ok(keys)
    }

    /// The rule's key, or `None` when the rule does not apply to this
    /// request (a device scope that does not match, an optional rule whose
    /// key field is absent, or a per-source rule and an exempt source).
    pub(super) fn rule_key(&mut self, rule: &Rule, known_device: bool) -> Result<Option<Key>, RequestError> {
        let applies = match rule.devices {
            DeviceScope::All => true,
            DeviceScope::UnknownDevices => !known_device,
            DeviceScope::KnownDevices => known_device,
        };
        if !applies || (!rule.required && !rule.key.iter().all(|c| self.has(*c))) || self.exempts(rule) {
            return Ok(None);
        }
        self.key(&rule.key).map(Some)
    }
}

pub(super) fn check_lengths(subject: &Subject<'_>) -> Result<(), RequestError> {
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

impl Limiter {
    /// Keys as the rules define them, without spray detection's widening
    /// (an operator's unlock names the source as it is).
    pub(super) fn subject_keys<'s>(&'s self, route: &'s str, subject: &'s Subject<'s>) -> SubjectKeys<'s, 's> {
        SubjectKeys {
            subject,
            route,
            limiter: self,
            client: None,
            digests: [None; 5],
            flags: None,
            now_us: 0,
            natural: None,
            wide: None,
            block56: None,
            widen: true,
            tuples: SmallVec::new(),
            exemption: None,
            exempted: false,
        }
    }

    /// Keys for a request at `now_us`, under the flags spray detection
    /// has raised.
    pub(super) fn subject_keys_at<'s>(
        &'s self,
        route: &'s str,
        subject: &'s Subject<'s>,
        now_us: u64,
    ) -> SubjectKeys<'s, 's> {
        SubjectKeys { flags: self.flags_raised(), now_us, ..self.subject_keys(route, subject) }
    }

    /// Spray detection's flags, when it is on and any are raised. The
    /// common case, nothing flagged, is one plain atomic load. Held as the
    /// load's guard, not a clone of the `Arc`: every request cloning it
    /// bounced its count between the cores' caches.
    pub(super) fn flags_raised(&self) -> Option<FlagsGuard> {
        self.signals.as_ref().filter(|_| self.signals_on).and_then(|link| link.flags_raised())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::classes::ClassTable;
    use crate::config::Config;
    use crate::keys::{KeyDeriver, Secret, SECRET_BYTES};
    use crate::store::Journal;

    /// Every ordered tuple of two to five distinct components has its own
    /// code, and a request that remembers tuple keys (four of them, then
    /// derives the rest afresh) answers each as a fresh derivation does.
    #[test]
    fn a_remembered_tuple_key_is_the_one_a_fresh_derivation_gives() {
        let keys = KeyDeriver::new(&Secret::from_bytes([9; SECRET_BYTES]));
        let l = Limiter::new(&Config::default(), Arc::new(ClassTable::default()), keys, Journal::discard());
        let s = Subject {
            peer: Some("2001:db8::1".parse().expect("an address")),
            account: Some("a"),
            device: Some("d"),
            tenant: Some("t"),
            client_id: Some("c"),
            ..Subject::default()
        };
        let mut tuples: Vec<Vec<Component>> = vec![vec![]];
        for _ in 0..Component::ALL.len() {
            let longer: Vec<Vec<Component>> = tuples
                .iter()
                .flat_map(|t| {
                    Component::ALL.into_iter().filter(|c| !t.contains(c)).map(|c| [t.as_slice(), &[c]].concat())
                })
                .collect();
            tuples.extend(longer);
            tuples.sort();
            tuples.dedup();
        }
        tuples.retain(|t| t.len() >= 2);
        assert_eq!(tuples.len(), 320);
        let codes: std::collections::HashSet<u32> = tuples.iter().map(|t| tuple_code(t)).collect();
        assert_eq!(codes.len(), tuples.len(), "tuple codes collide");
        let mut remembering = l.subject_keys("login", &s);
        for t in tuples.iter().chain(tuples.iter().rev()) {
            let mut fresh = l.subject_keys("login", &s);
            assert_eq!(remembering.key(t).expect("a key"), fresh.key(t).expect("a key"), "{t:?}");
        }
    }
}
