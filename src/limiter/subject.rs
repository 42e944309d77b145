//! Key derivation for one request: each identifier digested at most once,
//! the client's address and source class looked up at most once.

use super::route::Rule;
use super::{Limiter, RequestError, IDENTIFIER_BYTES_MAX};
use crate::classes::SourceClass;
use crate::config::DeviceScope;
use crate::keys::{Component, Key};
use crate::protocol::Subject;
use crate::source::forwarded_tail;
use smallvec::SmallVec;

/// Keys ride in a check's plan, which the server moves around; four inline
/// (every preset's count) keeps it small, a longer route spills to the heap.
pub(super) type RuleKeys = SmallVec<[Option<Key>; 4]>;

/// Per-request digests and source facts, computed at most once each.
pub(super) struct SubjectKeys<'s, 'k> {
    pub(super) subject: &'s Subject<'s>,
    route: &'s str,
    limiter: &'k Limiter,
    /// The client's address and source class, once looked up.
    client: Option<(std::net::IpAddr, Option<SourceClass>)>,
    digests: [Option<[u8; 16]>; 5],
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

    pub(super) fn key(&mut self, components: &[Component]) -> Result<Key, RequestError> {
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
                let applies = rule.required || rule.key.iter().all(|c| self.has(*c));
                keys.push(if applies { Some(self.key(&rule.key)?) } else { None });
            } else {
                keys.push(self.rule_key(rule, known_device)?);
            }
        }
        Ok(keys)
    }

    /// The rule's key, or `None` when the rule does not apply to this
    /// request (a device scope that does not match, or an optional rule
    /// whose key field is absent).
    pub(super) fn rule_key(&mut self, rule: &Rule, known_device: bool) -> Result<Option<Key>, RequestError> {
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
    pub(super) fn subject_keys<'s>(&'s self, route: &'s str, subject: &'s Subject<'s>) -> SubjectKeys<'s, 's> {
        SubjectKeys { subject, route, limiter: self, client: None, digests: [None; 5] }
    }
}
