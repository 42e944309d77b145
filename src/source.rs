//! Which client a request comes from: the peer address, or the right-most
//! untrusted hop of X-Forwarded-For, grouped into the prefix rules key on.
//!
//! Pure functions of their inputs: no I/O, no clock, no panics on any header.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// Hops of X-Forwarded-For examined from the right before giving up. A real
/// chain through a CDN, a load balancer and an ingress is a handful of hops;
/// anything longer is treated as malformed, which means "use the peer".
pub const FORWARDED_HOPS_MAX: usize = 16;

// The client sends only the part of the header the daemon reads, so both
// take it from one place: the client crate.
pub use tollgate_client::{forwarded_tail, FORWARDED_FOR_BYTES_MAX};

/// Default grouping of IPv6 sources: one /64 is one subscriber line (a single
/// line holds ~1.8e19 addresses, so /128 keys would limit nothing).
pub const IPV6_PREFIX_LEN_DEFAULT: u8 = 64;
/// Default grouping of IPv4 sources: one address.
pub const IPV4_PREFIX_LEN_DEFAULT: u8 = 32;
/// IPv6 prefixes may be configured between these lengths; longer than /64
/// would let one line mint unlimited keys, shorter than /32 lumps providers.
pub const IPV6_PREFIX_LEN_MIN: u8 = 32;
pub const IPV6_PREFIX_LEN_MAX: u8 = 64;
/// IPv4 prefixes may be configured between /16 and /32.
pub const IPV4_PREFIX_LEN_MIN: u8 = 16;

/// How the daemon finds the client behind proxies, and how it groups clients.
#[derive(Clone, Debug, PartialEq)]
pub struct SourcePolicy {
    /// Peers and hops in these networks are our own proxies.
    pub trusted_proxies: Vec<IpNet>,
    /// Alternatively, the number of proxies in front of the auth server
    /// (the peer being the last). 0 means "use `trusted_proxies`".
    pub trusted_hops: u8,
    pub ipv4_prefix_len: u8,
    pub ipv6_prefix_len: u8,
    /// Per source class (indexed by `SourceClass as usize`): prefix lengths
    /// that replace the two above for addresses of that class.
    pub class_prefix_lens: [Option<(u8, u8)>; 4],
}

impl Default for SourcePolicy {
    fn default() -> Self {
        SourcePolicy {
            trusted_proxies: Vec::new(),
            trusted_hops: 0,
            ipv4_prefix_len: IPV4_PREFIX_LEN_DEFAULT,
            ipv6_prefix_len: IPV6_PREFIX_LEN_DEFAULT,
            class_prefix_lens: [None; 4],
        }
    }
}

/// A client network: the address with host bits cleared, and the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub network: IpAddr,
    pub len: u8,
}

/// Bytes of a prefix's digest input: family, length, 16 address bytes.
pub const PREFIX_BYTES: usize = 18;

impl Prefix {
    /// Fixed-width bytes for digesting.
    pub fn to_bytes(self) -> [u8; PREFIX_BYTES] {
        let mut out = [0u8; PREFIX_BYTES];
        match self.network {
            IpAddr::V4(v4) => {
                out[0] = 4;
                out[2..6].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out[0] = 6;
                out[2..].copy_from_slice(&v6.octets());
            }
        }
        out[1] = self.len;
        out
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

impl SourcePolicy {
    fn is_trusted(&self, address: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&address))
    }

    /// The client address: counted from the right of X-Forwarded-For,
    /// skipping only trusted hops. Any doubt (untrusted peer, malformed or
    /// overlong chain, too few hops) answers with the peer address, which the
    /// client cannot choose.
    pub fn client_address(&self, peer: IpAddr, forwarded_for: Option<&str>) -> IpAddr {
        let peer = canonical(peer);
        let Some(header) = forwarded_for else { return peer };
        if self.trusted_hops > 0 {
            return self.by_hop_count(header).unwrap_or(peer);
        }
        if !self.is_trusted(peer) {
            return peer;
        }
        self.by_trusted_networks(header).unwrap_or(peer)
    }

    fn by_hop_count(&self, header: &str) -> Option<IpAddr> {
        // With h trusted proxies the header reads "client, p1, .., p(h-1)":
        // the client is the h-th entry from the right.
        let wanted = self.trusted_hops as usize;
        let mut entries = header.rsplit(',');
        let mut client = None;
        for _ in 0..wanted {
            client = Some(parse_hop(entries.next()?)?);
        }
        client
    }

    fn by_trusted_networks(&self, header: &str) -> Option<IpAddr> {
        let mut last = None;
        for entry in header.rsplit(',').take(FORWARDED_HOPS_MAX) {
            let hop = parse_hop(entry)?;
            if !self.is_trusted(hop) {
                return Some(hop);
            }
            last = Some(hop);
        }
        // Every hop we looked at is ours: either the chain is all proxies (the
        // left-most is the best we know) or it is too long to trust at all.
        if header.split(',').count() > FORWARDED_HOPS_MAX {
            return None;
        }
        last
    }

    /// Groups an address into the prefix that rules key on.
    pub fn prefix(&self, address: IpAddr) -> Prefix {
        self.prefix_in_class(address, None)
    }

    /// Groups an address of a known source class (its lengths may differ).
    pub fn prefix_in_class(&self, address: IpAddr, class: Option<SourceClass>) -> Prefix {
        let (v4_len, v6_len) = class
            .and_then(|c| self.class_prefix_lens[c as usize])
            .unwrap_or((self.ipv4_prefix_len, self.ipv6_prefix_len));
        prefix_of(address, v4_len, v6_len)
    }
}

/// The prefix of `address` at `v4_len` or `v6_len` bits, by its family.
pub fn prefix_of(address: IpAddr, v4_len: u8, v6_len: u8) -> Prefix {
    match canonical(address) {
        IpAddr::V4(v4) => {
            let len = v4_len.min(32);
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            Prefix { network: IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask)), len }
        }
        IpAddr::V6(v6) => {
            let len = v6_len.min(128);
            let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
            Prefix { network: IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask)), len }
        }
    }
}

/// A CIDR (`203.0.113.0/24`, `2001:db8::/32`), with the address parsed by
/// the standard library, which refuses IPv4 octets with leading zeros
/// (`010.0.0.0` is octal 8 to inet_aton and decimal 10 to some parsers, so
/// it means nothing certain).
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, len) = text.split_once('/')?;
    let address: IpAddr = address.parse().ok()?;
    if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNet::new(address, len.parse().ok()?).ok()
}

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 client it names: otherwise
/// one client would have two buckets, and a /64 grouping would lump every
/// IPv4 client into one.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// One X-Forwarded-For entry: an address, optionally with a port
/// (`1.2.3.4:5`, `[2001:db8::1]:5`). Anything else is malformed.
fn parse_hop(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if entry.is_empty() || entry.len() > 64 {
        return None;
    }
    if let Ok(address) = entry.parse::<IpAddr>() {
        return Some(canonical(address));
    }
    if let Ok(socket) = entry.parse::<SocketAddr>() {
        return Some(canonical(socket.ip()));
    }
    let unbracketed = entry.strip_prefix('[')?.strip_suffix(']')?;
    unbracketed.parse::<Ipv6Addr>().ok().map(|v6| canonical(IpAddr::V6(v6)))
}

/// Kinds of networks clients come from; rules may set per-class limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceClass {
    /// Data centres and cloud providers: where automated guessing runs.
    Hosting,
    /// Carrier networks, often behind carrier-grade NAT (many users per address).
    Mobile,
    /// Offices and institutions, often many users behind a few addresses.
    Business,
    /// Home lines: one household per address or prefix.
    Residential,
}

impl SourceClass {
    pub const ALL: [SourceClass; 4] =
        [SourceClass::Hosting, SourceClass::Mobile, SourceClass::Business, SourceClass::Residential];

    pub fn name(self) -> &'static str {
        match self {
            SourceClass::Hosting => "hosting",
            SourceClass::Mobile => "mobile",
            SourceClass::Business => "business",
            SourceClass::Residential => "residential",
        }
    }

    pub fn parse(name: &str) -> Option<SourceClass> {
        SourceClass::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl fmt::Display for SourceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn behind_proxy() -> SourcePolicy {
        SourcePolicy { trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()], ..Default::default() }
    }

    #[test]
    fn only_the_whole_entries_of_the_last_window_of_a_long_header_are_read() {
        let short = "198.51.100.1, 203.0.113.9";
        assert_eq!(forwarded_tail(short), short);
        let padding = "192.0.2.77, ".repeat(1000); // 12,000 bytes the end user chose
        let long = format!("{padding}203.0.113.9, 10.0.0.3");
        let tail = forwarded_tail(&long);
        assert!(tail.len() <= FORWARDED_FOR_BYTES_MAX && long.ends_with(tail));
        assert!(tail.starts_with("192.0.2.77") || tail.starts_with(" 192.0.2.77"), "a whole entry first: {tail:.20}");
        assert!(tail.ends_with("203.0.113.9, 10.0.0.3"));
        // Padding cannot push the request into the proxy's bucket: the
        // proxy-added hops on the right are still read.
        assert_eq!(behind_proxy().client_address(ip("10.0.0.2"), Some(tail)), ip("203.0.113.9"));
        // A window that starts exactly at an entry keeps that entry; one
        // that starts inside an entry drops it.
        let aligned = format!("{},{}", "9".repeat(10), "1".repeat(FORWARDED_FOR_BYTES_MAX));
        assert_eq!(forwarded_tail(&aligned), &aligned[11..]);
        let inside = format!("{},{},{}", "9".repeat(10), "8".repeat(10), "1".repeat(FORWARDED_FOR_BYTES_MAX - 5));
        assert_eq!(forwarded_tail(&inside), &inside[22..]);
        // One giant entry is malformed: nothing is read, the peer is used.
        let giant = "1".repeat(FORWARDED_FOR_BYTES_MAX + 1);
        assert_eq!(forwarded_tail(&giant), "");
        assert_eq!(behind_proxy().client_address(ip("10.0.0.2"), Some("")), ip("10.0.0.2"));
        // Multi-byte characters: the cut is always after a comma.
        let wide = format!("{}, 203.0.113.9", "é,".repeat(3000));
        assert!(forwarded_tail(&wide).ends_with("203.0.113.9"));
    }

    #[test]
    fn header_is_ignored_without_trusted_proxies() {
        let policy = SourcePolicy::default();
        assert_eq!(policy.client_address(ip("192.0.2.1"), Some("203.0.113.5")), ip("192.0.2.1"));
    }

    #[test]
    fn right_most_untrusted_hop_wins_and_spoofed_left_entries_do_not() {
        let policy = behind_proxy();
        let peer = ip("10.0.0.2");
        assert_eq!(policy.client_address(peer, Some("203.0.113.5")), ip("203.0.113.5"));
        assert_eq!(policy.client_address(peer, Some("198.51.100.99, 203.0.113.5, 10.1.1.1")), ip("203.0.113.5"));
        // an untrusted peer cannot use the header at all
        assert_eq!(policy.client_address(ip("192.0.2.1"), Some("203.0.113.5")), ip("192.0.2.1"));
    }

    #[test]
    fn malformed_headers_fall_back_to_the_peer() {
        let policy = behind_proxy();
        let peer = ip("10.0.0.2");
        for header in ["", "garbage", "1.2.3.4, nonsense", "999.1.1.1", " , ", "[::1", &"1.1.1.1,".repeat(40)] {
            assert_eq!(policy.client_address(peer, Some(header)), peer, "header {header:?}");
        }
        assert_eq!(policy.client_address(peer, Some("[2001:db8::1]:443")), ip("2001:db8::1"));
        assert_eq!(policy.client_address(peer, Some("203.0.113.5:1234")), ip("203.0.113.5"));
    }

    #[test]
    fn hop_count_picks_the_hth_entry_from_the_right() {
        let policy = SourcePolicy { trusted_hops: 2, ..Default::default() };
        let peer = ip("192.0.2.1");
        assert_eq!(policy.client_address(peer, Some("1.1.1.1, 203.0.113.5, 10.0.0.9")), ip("203.0.113.5"));
        assert_eq!(policy.client_address(peer, Some("10.0.0.9")), peer);
    }

    #[test]
    fn cidrs_with_leading_zero_octets_are_refused() {
        assert_eq!(parse_cidr("10.0.0.0/8"), Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(parse_cidr("2001:db8::/32"), Some("2001:db8::/32".parse().unwrap()));
        for bad in ["010.0.0.0/8", "203.0.056.0/24", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0", "10.0.0.0/+8"] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        let policy = SourcePolicy::default();
        let mapped = ip("::ffff:198.51.100.7");
        assert_eq!(policy.client_address(mapped, None), ip("198.51.100.7"));
        assert_eq!(policy.prefix(mapped), policy.prefix(ip("198.51.100.7")));
    }

    #[test]
    fn prefixes_group_ipv6_by_64_and_ipv4_by_32() {
        let policy = SourcePolicy::default();
        let a = policy.prefix(ip("2001:db8:1:2:aaaa::1"));
        let b = policy.prefix(ip("2001:db8:1:2:bbbb::2"));
        let c = policy.prefix(ip("2001:db8:1:3::1"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_ne!(policy.prefix(ip("198.51.100.7")), policy.prefix(ip("198.51.100.8")));
        let wide = SourcePolicy { ipv6_prefix_len: 56, ..Default::default() };
        assert_eq!(wide.prefix(ip("2001:db8:1:2ff::1")), wide.prefix(ip("2001:db8:1:200::1")));
    }
}
