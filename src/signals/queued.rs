//! A report as the request path queues it for spray detection: one 64-byte
//! cache line. The engine's `SignalEvent` names the wide prefix, the IPv6
//! blocks and their digests, 160 bytes, three lines for the request
//! path to write and the thread to read back through the queue, and four
//! SipHash digests for the request path to derive though no flag may need
//! them. This carries the address instead; the thread derives the rest
//! (`expand`). The request path derives the wide prefix only while a flag
//! is raised, to probe it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::flags::digest64;
use super::{ReportEvent, SignalEvent, V6Blocks};
use crate::classes::SourceClass;
use crate::keys::KeyDeriver;
use crate::protocol::Outcome;
use crate::source::{canonical, prefix_of, Prefix};

/// The wide prefix of the spray signals: an IPv4 /24, an IPv6 /48 (a
/// site's usual allocation).
pub const WIDE_V4_LEN: u8 = 24;
pub const WIDE_V6_LEN: u8 = 48;
/// The IPv6 blocks between the /48 and a /64: a customer's usual /56.
const BLOCK_LEN: u8 = 56;
const NET_LEN: u8 = 64;

/// The wide prefix (IPv4 /24, IPv6 /48) around `address`.
pub fn wide_prefix(address: IpAddr) -> Prefix {
    prefix_of(address, WIDE_V4_LEN, WIDE_V6_LEN)
}

/// A prefix's digest as the signals and their flags name it.
pub fn prefix_digest(keys: &KeyDeriver, prefix: &Prefix) -> u64 {
    digest64(&keys.prefix(&prefix.to_bytes()))
}

const FAILURE: u8 = 1;
const REPEATED: u8 = 1 << 1;
const KNOWN_DEVICE: u8 = 1 << 2;
const HAS_ACCOUNT: u8 = 1 << 3;
const HAS_PASSWORD: u8 = 1 << 4;
const IPV6: u8 = 1 << 5;
/// A success that only its tenant's ratio counts (`SignalEvent::TenantSuccess`).
const TENANT_ONLY: u8 = 1 << 6;

/// One report, queued. Fields a kind does not use are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueuedEvent {
    now_us: u64,
    account: u64,
    /// The digest of the prefix rules key on without widening.
    narrow: u64,
    tenant: u64,
    password: u64,
    /// The client's address, canonical (an IPv4-mapped address as IPv4),
    /// IPv4 in the first four bytes.
    address: [u8; 16],
    /// At most `SIGNALS_SUCCESS_SAMPLE_LIMIT`.
    tenant_weight: u16,
    narrow_len: u8,
    /// 0 for none, else the class's index in `SourceClass::ALL` plus one.
    class: u8,
    bits: u8,
}

const _: () = assert!(std::mem::size_of::<QueuedEvent>() == 64);
const _: () = assert!(crate::config::SIGNALS_SUCCESS_SAMPLE_LIMIT <= u16::MAX as u32);

/// What a report tells the source, account and password axes: the
/// fields of `ReportEvent` the request path knows, with the address in
/// place of the prefixes and digests the thread derives from it.
#[derive(Clone, Copy, Debug)]
pub struct Reported {
    pub now_us: u64,
    pub outcome: Outcome,
    pub repeated: bool,
    pub known_device: bool,
    pub class: Option<SourceClass>,
    pub account: Option<u64>,
    /// The unwidened prefix and its digest.
    pub narrow: (Prefix, u64),
    /// The client's address.
    pub address: IpAddr,
    pub tenant: u64,
    pub tenant_weight: u32,
    pub password: Option<u64>,
}

/// A tenant weight (`success_sample` at most, validated up to
/// `SIGNALS_SUCCESS_SAMPLE_LIMIT`), saturating rather than wrapping should
/// a caller ever pass more.
fn weight_u16(weight: u32) -> u16 {
    debug_assert!(weight <= crate::config::SIGNALS_SUCCESS_SAMPLE_LIMIT, "weight {weight}");
    u16::try_from(weight).unwrap_or(u16::MAX)
}

impl QueuedEvent {
    /// A success only its tenant's ratio counts, as `weight` successes.
    pub fn tenant_success(now_us: u64, tenant: u64, weight: u32) -> QueuedEvent {
        QueuedEvent { now_us, tenant, tenant_weight: weight_u16(weight), bits: TENANT_ONLY, ..QueuedEvent::default() }
    }

    pub fn report(r: Reported) -> QueuedEvent {
        let mut bits = 0;
        let mut set = |bit: u8, on: bool| {
            if on {
                bits |= bit;
            }
        };
        set(FAILURE, r.outcome == Outcome::Failure);
        set(REPEATED, r.repeated);
        set(KNOWN_DEVICE, r.known_device);
        set(HAS_ACCOUNT, r.account.is_some());
        set(HAS_PASSWORD, r.password.is_some());
        let address = match canonical(r.address) {
            IpAddr::V4(v4) => {
                let mut bytes = [0u8; 16];
                bytes[..4].copy_from_slice(&v4.octets());
                bytes
            }
            IpAddr::V6(v6) => {
                set(IPV6, true);
                v6.octets()
            }
        };
        QueuedEvent {
            now_us: r.now_us,
            account: r.account.unwrap_or(0),
            narrow: r.narrow.1,
            tenant: r.tenant,
            password: r.password.unwrap_or(0),
            address,
            tenant_weight: weight_u16(r.tenant_weight),
            narrow_len: r.narrow.0.len,
            class: r.class.map_or(0, |c| c as u8 + 1),
            bits,
        }
    }

    fn address(&self) -> IpAddr {
        if self.bits & IPV6 != 0 {
            IpAddr::V6(Ipv6Addr::from(self.address))
        } else {
            let v4: [u8; 4] = self.address[..4].try_into().expect("4 of 16 bytes");
            IpAddr::V4(Ipv4Addr::from(v4))
        }
    }

    /// The event the engine counts, with the prefixes and digests the
    /// request path left to the thread.
    pub fn expand(&self, keys: &KeyDeriver) -> SignalEvent {
        let weight = u32::from(self.tenant_weight);
        if self.bits & TENANT_ONLY != 0 {
            return SignalEvent::TenantSuccess { now_us: self.now_us, tenant: self.tenant, weight };
        }
        let address = self.address();
        let narrow = prefix_of(address, self.narrow_len, self.narrow_len);
        let wide = wide_prefix(address);
        let v6 = (self.bits & IPV6 != 0).then(|| {
            let block56 = prefix_of(address, 32, BLOCK_LEN);
            let net64 = prefix_of(address, 32, NET_LEN);
            V6Blocks { block56: (prefix_digest(keys, &block56), block56), net64: prefix_digest(keys, &net64) }
        });
        let has = |bit: u8| self.bits & bit != 0;
        SignalEvent::Report(ReportEvent {
            now_us: self.now_us,
            outcome: if has(FAILURE) { Outcome::Failure } else { Outcome::Success },
            repeated: has(REPEATED),
            known_device: has(KNOWN_DEVICE),
            class: self.class.checked_sub(1).map(|i| SourceClass::ALL[usize::from(i)]),
            account: has(HAS_ACCOUNT).then_some(self.account),
            narrow: (self.narrow, narrow),
            wide: (prefix_digest(keys, &wide), wide),
            v6,
            tenant: self.tenant,
            tenant_weight: weight,
            password: has(HAS_PASSWORD).then_some(self.password),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Secret, SECRET_BYTES};

    fn keys() -> KeyDeriver {
        KeyDeriver::new(&Secret::from_bytes([3; SECRET_BYTES]))
    }

    fn reported(address: IpAddr, narrow_len: u8, outcome: Outcome) -> Reported {
        let narrow = prefix_of(address, narrow_len, narrow_len);
        Reported {
            now_us: 1_900_000_000_000_000,
            outcome,
            repeated: true,
            known_device: false,
            class: Some(SourceClass::Residential),
            account: Some(0xdead_beef),
            narrow: (narrow, prefix_digest(&keys(), &narrow)),
            address,
            tenant: 77,
            tenant_weight: 1_024,
            password: Some(42),
        }
    }

    /// The event as the request path built it before it was queued in 64
    /// bytes: every prefix and digest derived from the address.
    fn built(r: &Reported, keys: &KeyDeriver) -> SignalEvent {
        let address = canonical(r.address);
        let wide = wide_prefix(address);
        let v6 = address.is_ipv6().then(|| {
            let block56 = prefix_of(address, 32, 56);
            let net64 = prefix_of(address, 32, 64);
            V6Blocks { block56: (prefix_digest(keys, &block56), block56), net64: prefix_digest(keys, &net64) }
        });
        SignalEvent::Report(ReportEvent {
            now_us: r.now_us,
            outcome: r.outcome,
            repeated: r.repeated,
            known_device: r.known_device,
            class: r.class,
            account: r.account,
            narrow: (r.narrow.1, r.narrow.0),
            wide: (prefix_digest(keys, &wide), wide),
            v6,
            tenant: r.tenant,
            tenant_weight: r.tenant_weight,
            password: r.password,
        })
    }

    #[test]
    fn a_queued_report_expands_to_the_event_the_request_path_would_have_built() {
        let keys = keys();
        for (address, narrow_len) in [
            ("198.51.100.7", 32),
            ("198.51.100.7", 20),
            ("2001:db8:1:2:3:4:5:6", 64),
            ("2001:db8:1:2:3:4:5:6", 40),
            ("::ffff:203.0.113.9", 32),
        ] {
            for outcome in [Outcome::Failure, Outcome::Success] {
                let mut r = reported(address.parse().expect("an address"), narrow_len, outcome);
                let expected = format!("{:?}", built(&r, &keys));
                assert_eq!(format!("{:?}", QueuedEvent::report(r).expand(&keys)), expected);
                // And with every optional field absent.
                (r.class, r.account, r.password, r.repeated, r.known_device) = (None, None, None, false, true);
                let expected = format!("{:?}", built(&r, &keys));
                assert_eq!(format!("{:?}", QueuedEvent::report(r).expand(&keys)), expected);
            }
        }
    }

    #[test]
    fn every_class_survives_the_queue() {
        let keys = keys();
        for class in SourceClass::ALL {
            let mut r = reported("192.0.2.1".parse().expect("an address"), 32, Outcome::Failure);
            r.class = Some(class);
            let SignalEvent::Report(e) = QueuedEvent::report(r).expand(&keys) else { panic!("a report") };
            assert_eq!(e.class, Some(class));
        }
    }

    #[test]
    fn a_tenant_success_expands_to_itself() {
        let e = QueuedEvent::tenant_success(5, 6, 1_024).expand(&keys());
        assert!(matches!(e, SignalEvent::TenantSuccess { now_us: 5, tenant: 6, weight: 1_024 }), "{e:?}");
    }
}
