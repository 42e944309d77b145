//! Body of the `source_parse` fuzz target, shared with `tests/fuzz_replay.rs`
//! (which replays `fuzz/corpus/source_parse/` on stable). Uses only `tollgate`
//! and std.
//!
//! Input layout (missing bytes read as zero):
//! - byte 0, flags: bits 0..=4 pick trusted proxies from `TRUSTED_NETS`;
//!   bit 5 set means no X-Forwarded-For header at all.
//! - byte 1: `trusted_hops` = byte % 5 (0..=4).
//! - byte 2: `ipv4_prefix_len` = 16 + byte % 17; byte 3: `ipv6_prefix_len` =
//!   32 + byte % 33.
//! - byte 4: bits 0..=3 give the classes with their own prefix lengths (two
//!   bytes each follow, in class order); bits 4..=6 pick the class passed to
//!   `prefix_in_class` (0..=3 a class, otherwise none).
//! - the peer: a kind byte (`PeerKind`), then its address bytes.
//! - the rest: the header, decoded as lossy UTF-8.
//!
//! Beyond "no panic" it checks: the client is the canonical peer or an
//! address written in the header; it equals a reference reading of the
//! README's rule; no trusted proxies and no hop count (or an untrusted peer)
//! mean the peer; a spoofed left-hand entry, or padding the header past
//! the bytes the daemon reads, never changes an untrusted result; prefixes have the policy's length for the family, no host bits,
//! contain the address, and never come out IPv4-mapped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tollgate::SourceClass;
use tollgate::{canonical, forwarded_tail, Prefix, SourcePolicy, FORWARDED_FOR_BYTES_MAX, FORWARDED_HOPS_MAX};

// The including crate declares `bytes` (tests/fuzz_bodies/bytes.rs) once.
use crate::bytes::Bytes;

/// Networks a policy may trust, one flag bit each. `::/0` trusts every IPv6
/// hop (never an IPv4 or IPv4-mapped one: those are canonically IPv4).
const TRUSTED_NETS: [(&str, u8); 5] =
    [("10.0.0.0", 8), ("2001:db8::", 32), ("192.0.2.0", 24), ("203.0.113.7", 32), ("::", 0)];

/// An entry the spoofing check prepends to the header.
const SPOOFED: &str = "198.51.100.77";

/// How the peer address is made from the bytes that follow the kind byte.
fn peer(input: &mut Bytes<'_>) -> IpAddr {
    match input.byte() % 8 {
        0 => IpAddr::V4(Ipv4Addr::from(input.array::<4>())),
        1 => IpAddr::V6(Ipv6Addr::from(input.array::<16>())),
        // IPv4-mapped IPv6: must be treated as the IPv4 address
        2 => IpAddr::V6(Ipv4Addr::from(input.array::<4>()).to_ipv6_mapped()),
        // inside the trusted networks, so the header is honoured
        3 => {
            let [b, c, d] = input.array::<3>();
            IpAddr::V4(Ipv4Addr::new(10, b, c, d))
        }
        4 => {
            let low = u64::from_be_bytes(input.array::<8>());
            IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | low as u128))
        }
        5 => IpAddr::V6(Ipv4Addr::new(10, 0, 0, input.byte()).to_ipv6_mapped()),
        6 => IpAddr::V4(Ipv4Addr::new(192, 0, 2, input.byte())),
        _ => IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)),
    }
}

fn net_address(net: (&str, u8)) -> (IpAddr, u8) {
    (net.0.parse().expect("TRUSTED_NETS are addresses"), net.1)
}

/// Containment by hand (the reference does not trust `IpNet`).
fn contains(net: (IpAddr, u8), address: IpAddr) -> bool {
    match (net.0, address) {
        (IpAddr::V4(n), IpAddr::V4(a)) => u32::from(n) & mask32(net.1) == u32::from(a) & mask32(net.1),
        (IpAddr::V6(n), IpAddr::V6(a)) => u128::from(n) & mask128(net.1) == u128::from(a) & mask128(net.1),
        _ => false,
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - len.min(32) as u32).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - len.min(128) as u32).unwrap_or(0)
}

fn trusted(nets: &[(IpAddr, u8)], address: IpAddr) -> bool {
    nets.iter().any(|&net| contains(net, address))
}

/// One X-Forwarded-For entry as the README describes it: an address, with or
/// without a port, IPv6 optionally in brackets; canonical.
fn entry_address(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if entry.is_empty() || entry.len() > 64 {
        return None;
    }
    let address = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| entry.strip_prefix('[')?.strip_suffix(']')?.parse::<Ipv6Addr>().ok().map(IpAddr::V6))?;
    Some(canonical(address))
}

/// The client by the README's rule, written independently of `src/source.rs`
/// over the header split into a list.
fn reference_client(nets: &[(IpAddr, u8)], hops: u8, peer: IpAddr, header: Option<&str>) -> IpAddr {
    let Some(header) = header else { return peer };
    let entries: Vec<&str> = header.split(',').collect();
    let n = entries.len();
    if hops > 0 {
        // "client, p1, .., p(h-1)": the h right-most entries must all be
        // addresses, and the left-most of them is the client.
        let h = hops as usize;
        if n < h {
            return peer;
        }
        let tail: Option<Vec<IpAddr>> = entries[n - h..].iter().map(|e| entry_address(e)).collect();
        return tail.map_or(peer, |t| t[0]);
    }
    if !trusted(nets, peer) {
        return peer;
    }
    let examined = &entries[n.saturating_sub(FORWARDED_HOPS_MAX)..];
    for entry in examined.iter().rev() {
        match entry_address(entry) {
            None => return peer,
            Some(hop) if !trusted(nets, hop) => return hop,
            Some(_) => {}
        }
    }
    if n > FORWARDED_HOPS_MAX {
        return peer;
    }
    // every hop is a trusted proxy: the left-most is the best we know
    entry_address(entries[0]).unwrap_or(peer)
}

fn check_prefix(policy: &SourcePolicy, address: IpAddr, class: Option<SourceClass>) -> Prefix {
    let prefix = policy.prefix_in_class(address, class);
    let (v4_len, v6_len) = class
        .and_then(|c| policy.class_prefix_lens[c as usize])
        .unwrap_or((policy.ipv4_prefix_len, policy.ipv6_prefix_len));
    match (canonical(address), prefix.network) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            assert_eq!(prefix.len, v4_len, "{address} in {class:?}: IPv4 length");
            assert_eq!(u32::from(n) & !mask32(v4_len), 0, "{prefix} has host bits set");
            assert_eq!(u32::from(a) & mask32(v4_len), u32::from(n), "{prefix} does not contain {address}");
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            assert!(n.to_ipv4_mapped().is_none(), "{prefix} is IPv4-mapped");
            assert_eq!(prefix.len, v6_len, "{address} in {class:?}: IPv6 length");
            assert_eq!(u128::from(n) & !mask128(v6_len), 0, "{prefix} has host bits set");
            assert_eq!(u128::from(a) & mask128(v6_len), u128::from(n), "{prefix} does not contain {address}");
        }
        (a, _) => panic!("{address} (canonically {a}) grouped into {prefix} of another family"),
    }
    // grouping is idempotent, and an IPv4 client is one client however written
    assert_eq!(policy.prefix_in_class(prefix.network, class), prefix, "regrouping {prefix}");
    if let IpAddr::V4(v4) = canonical(address) {
        assert_eq!(policy.prefix_in_class(IpAddr::V6(v4.to_ipv6_mapped()), class), prefix, "mapped {address}");
    }
    if class.is_none() {
        assert_eq!(policy.prefix(address), prefix);
    }
    let bytes = prefix.to_bytes();
    assert_eq!((bytes[0], bytes[1]), (if prefix.network.is_ipv4() { 4 } else { 6 }, prefix.len));
    prefix
}

pub fn run(data: &[u8]) {
    let mut input = Bytes(data);
    let flags = input.byte();
    let nets: Vec<(IpAddr, u8)> =
        (0..TRUSTED_NETS.len()).filter(|i| flags & (1 << i) != 0).map(|i| net_address(TRUSTED_NETS[i])).collect();
    let mut policy = SourcePolicy {
        trusted_proxies: nets
            .iter()
            .map(|(a, len)| format!("{a}/{len}").parse().expect("TRUSTED_NETS are CIDRs"))
            .collect(),
        trusted_hops: input.byte() % 5,
        ipv4_prefix_len: 16 + input.byte() % 17,
        ipv6_prefix_len: 32 + input.byte() % 33,
        ..SourcePolicy::default()
    };
    let class_byte = input.byte();
    for (i, lens) in policy.class_prefix_lens.iter_mut().enumerate() {
        if class_byte & (1 << i) != 0 {
            let [v4, v6] = input.array::<2>();
            *lens = Some((16 + v4 % 17, 32 + v6 % 33));
        }
    }
    let class = SourceClass::ALL.get(((class_byte >> 4) & 7) as usize).copied();
    let peer = peer(&mut input);
    let text = String::from_utf8_lossy(input.0);
    let header = (flags & (1 << 5) == 0).then_some(&*text);

    let canonical_peer = canonical(peer);
    let client = policy.client_address(peer, header);

    assert_eq!(canonical(client), client, "client {client} is IPv4-mapped");
    let written: Vec<IpAddr> = header.map_or(Vec::new(), |h| h.split(',').filter_map(entry_address).collect());
    assert!(
        client == canonical_peer || written.contains(&client),
        "client {client} is neither the peer {peer} nor in the header {header:?}"
    );
    assert_eq!(
        client,
        reference_client(&nets, policy.trusted_hops, canonical_peer, header),
        "peer {peer}, header {header:?}, policy {policy:?}"
    );
    if policy.trusted_hops == 0 && (nets.is_empty() || !trusted(&nets, canonical_peer)) {
        assert_eq!(client, canonical_peer, "untrusted peer {peer} chose its client from {header:?}");
    }
    if header.is_none() {
        assert_eq!(client, canonical_peer);
    }
    // A client can write anything on the left of the header; it must never
    // move an untrusted answer (nor a hop-counted one once enough hops exist).
    if let Some(h) = header {
        let enough_hops = policy.trusted_hops > 0 && h.split(',').count() >= policy.trusted_hops as usize;
        if enough_hops || (policy.trusted_hops == 0 && !trusted(&nets, client)) {
            let spoofed = format!("{SPOOFED}, {h}");
            assert_eq!(policy.client_address(peer, Some(&spoofed)), client, "a left-hand entry moved the client");
            // Nor does padding the header past the bytes the daemon reads:
            // the right-hand end, where the header fits, is still read.
            if h.len() + 2 <= FORWARDED_FOR_BYTES_MAX {
                let padded = format!("{}{h}", format!("{SPOOFED}, ").repeat(FORWARDED_FOR_BYTES_MAX / 15 + 1));
                let tail = forwarded_tail(&padded);
                assert!(tail.len() <= FORWARDED_FOR_BYTES_MAX && padded.ends_with(tail));
                assert_eq!(policy.client_address(peer, Some(tail)), client, "padding moved the client");
            }
        }
    }

    let prefix = check_prefix(&policy, client, class);
    check_prefix(&policy, client, None);
    check_prefix(&policy, peer, class);
    let peer_prefix = check_prefix(&policy, canonical_peer, None);
    assert_eq!(policy.prefix(peer), peer_prefix, "peer {peer} and its canonical form group apart");
    if client == canonical_peer {
        assert_eq!(policy.prefix_in_class(peer, class), prefix);
    }
}
