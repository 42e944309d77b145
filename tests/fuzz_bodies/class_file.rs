//! Body of the `class_file` fuzz target, shared with `tests/fuzz_replay.rs`
//! (which replays `fuzz/corpus/class_file/` on stable). Uses only `tollgate`
//! and std.
//!
//! Runs the crate's own entry point (`tollgate::fuzz_class_file`:
//! no panics, each listed network finds its class), then, when the text
//! parses, compares `ClassTable::lookup` with a brute-force longest-prefix
//! match over the lines read independently, at each listed network's first
//! and last address and at addresses taken from the input bytes, each also
//! written IPv4-mapped. Addresses are read with std, which refuses IPv4
//! octets with leading zeros (`fuzz/regressions/class_file/` holds why).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tollgate::canonical;
use tollgate::{ClassTable, SourceClass};

/// Addresses taken from the input bytes, per family.
const INPUT_ADDRESSES_MAX: usize = 32;

/// A listed network by hand: address with host bits clear, and length.
#[derive(Clone, Copy, Debug)]
struct Net {
    address: IpAddr,
    len: u8,
}

impl Net {
    fn contains(self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => u32::from(n) == u32::from(a) & mask32(self.len),
            (IpAddr::V6(n), IpAddr::V6(a)) => u128::from(n) == u128::from(a) & mask128(self.len),
            _ => false,
        }
    }

    fn last(self) -> IpAddr {
        match self.address {
            IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n) | !mask32(self.len))),
            IpAddr::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n) | !mask128(self.len))),
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - len.min(32) as u32).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - len.min(128) as u32).unwrap_or(0)
}

/// One `cidr,class` line of a file that parsed, read without `ipnet`.
fn reference_line(line: &str) -> Option<(Net, SourceClass)> {
    let line = line.strip_suffix('\r').unwrap_or(line).trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (cidr, class) = line.split_once(',').unwrap_or_else(|| panic!("accepted line without a comma: {line:?}"));
    let class = SourceClass::parse(class.trim()).unwrap_or_else(|| panic!("accepted unknown class: {line:?}"));
    let cidr = cidr.trim();
    let (address, len) = match cidr.split_once('/') {
        Some((address, len)) => (address, Some(len)),
        None => (cidr, None),
    };
    let address: IpAddr = address.parse().unwrap_or_else(|_| panic!("accepted bad address: {line:?}"));
    let max = if address.is_ipv4() { 32 } else { 128 };
    let len = len.map_or(max, |l| l.parse::<u8>().unwrap_or_else(|_| panic!("accepted bad length: {line:?}")));
    assert!(len <= max, "accepted /{len}: {line:?}");
    let net = Net { address, len };
    assert!(net.contains(address), "accepted host bits: {line:?}");
    if let IpAddr::V6(v6) = address {
        assert!(len < 96 || v6.to_ipv4_mapped().is_none(), "accepted an IPv4-mapped network: {line:?}");
    }
    Some((net, class))
}

fn reference_lookup(entries: &[(Net, SourceClass)], address: IpAddr) -> Option<SourceClass> {
    let address = canonical(address);
    entries.iter().filter(|(net, _)| net.contains(address)).max_by_key(|(net, _)| net.len).map(|&(_, class)| class)
}

pub fn run(data: &[u8]) {
    tollgate::fuzz_class_file(data);

    let text = String::from_utf8_lossy(data);
    let Ok(table) = ClassTable::parse(&text) else { return };
    let body = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let entries: Vec<(Net, SourceClass)> = body.split('\n').filter_map(reference_line).collect();
    assert_eq!(table.len(), entries.len(), "entries counted");
    assert_eq!(table.is_empty(), entries.is_empty());

    let mut addresses: Vec<IpAddr> = entries.iter().flat_map(|(net, _)| [net.address, net.last()]).collect();
    addresses.extend(
        data.chunks_exact(4)
            .take(INPUT_ADDRESSES_MAX)
            .map(|c| IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(c).expect("chunks of 4")))),
    );
    addresses.extend(
        data.chunks_exact(16)
            .take(INPUT_ADDRESSES_MAX)
            .map(|c| IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(c).expect("chunks of 16")))),
    );
    for address in addresses {
        let expected = reference_lookup(&entries, address);
        assert_eq!(table.lookup(address), expected, "lookup of {address}");
        if let IpAddr::V4(v4) = address {
            assert_eq!(table.lookup(IpAddr::V6(v4.to_ipv6_mapped())), expected, "lookup of mapped {address}");
        }
    }
}
