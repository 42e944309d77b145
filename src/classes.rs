//! Source classes: an optional CIDR file maps network prefixes to the kind
//! of network a client comes from, so rules can set per-class limits. A
//! client takes the class of the longest listed prefix containing its
//! address; an address in no listed prefix has no class.
//!
//! The file has one `cidr,class` per line (`203.0.113.0/24,business`,
//! `2001:db8::/32,mobile`, or a bare address for a host route); blank lines
//! and lines starting with `#` are ignored. Every problem is reported at
//! once, each naming its line.
//!
//! No I/O except `ClassTable::load`, which reads the file. No panics on any
//! input.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::PrefixMap;

use crate::source::canonical;
pub use crate::source::SourceClass;

/// Prefixes one file may list. A class for every routed prefix on the
/// Internet is about 1.2 million (IPv4 passed one million in 2024, IPv6 is
/// near 200,000); two million leaves room for data sets that split ranges
/// further. The trie costs about 20 bytes a prefix (measured: 19 MB for a
/// million), so the cap bounds a table near 40 MB while a wrong file (an
/// address dump, a log) is refused instead of filling memory.
pub const CLASS_FILE_ENTRIES_MAX: usize = 2_000_000;
/// Bytes per line, comments included. The longest entry, a fully written
/// IPv6 CIDR and a class, is under 70 bytes; a longer line means the wrong
/// file, and the cap keeps each error message (which quotes the line) short.
pub const CLASS_FILE_LINE_BYTES_MAX: usize = 256;
/// Bytes `load` reads: the entry cap at 128 bytes a line. Stops a path such
/// as /dev/zero or a huge log from being read into memory whole.
pub const CLASS_FILE_BYTES_MAX: usize = CLASS_FILE_ENTRIES_MAX * 128;
/// Problems reported in detail; the rest are only counted. A file in the
/// wrong format fails on every line, and a million messages help nobody.
pub const CLASS_FILE_ERRORS_MAX: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum ClassFileError {
    #[error("cannot read source class file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("source class file {path} is invalid:\n{}", .errors.join("\n"))]
    Invalid { path: PathBuf, errors: Vec<String> },
}

/// Prefix to class, one trie per family. `Debug` prints only the counts: a
/// table may hold millions of prefixes.
#[derive(Clone, Default)]
pub struct ClassTable {
    ipv4: PrefixMap<Ipv4Net, SourceClass>,
    ipv6: PrefixMap<Ipv6Net, SourceClass>,
}

impl fmt::Debug for ClassTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassTable").field("ipv4", &self.ipv4.len()).field("ipv6", &self.ipv6.len()).finish()
    }
}

impl ClassTable {
    /// Parses the file's text, reporting every problem at once (each
    /// `line N: ...`, at most `CLASS_FILE_ERRORS_MAX` of them in detail).
    pub fn parse(text: &str) -> Result<ClassTable, Vec<String>> {
        parse_bytes(text.as_bytes(), CLASS_FILE_ENTRIES_MAX)
    }

    /// Reads and parses a class file. Lines that are not UTF-8 are reported
    /// like any other invalid line.
    pub fn load(path: &Path) -> Result<ClassTable, ClassFileError> {
        let read_error = |source| ClassFileError::Read { path: path.into(), source };
        let file = File::open(path).map_err(read_error)?;
        let mut bytes = Vec::new();
        file.take(CLASS_FILE_BYTES_MAX as u64 + 1).read_to_end(&mut bytes).map_err(read_error)?;
        if bytes.len() > CLASS_FILE_BYTES_MAX {
            let errors = vec![format!("larger than {CLASS_FILE_BYTES_MAX} bytes; is this the right file?")];
            return Err(ClassFileError::Invalid { path: path.into(), errors });
        }
        parse_bytes(&bytes, CLASS_FILE_ENTRIES_MAX)
            .map_err(|errors| ClassFileError::Invalid { path: path.into(), errors })
    }

    /// The class of the longest listed prefix containing `address`.
    /// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is looked up as the IPv4 address.
    pub fn lookup(&self, address: IpAddr) -> Option<SourceClass> {
        // Without a class file (the default) every check would walk two
        // empty tries: a fifth of the cost of deriving its source key.
        if self.is_empty() {
            return None;
        }
        match canonical(address) {
            IpAddr::V4(v4) => self.ipv4.get_lpm(&Ipv4Net::from(v4)).map(|(_, class)| *class),
            IpAddr::V6(v6) => self.ipv6.get_lpm(&Ipv6Net::from(v6)).map(|(_, class)| *class),
        }
    }

    /// Number of listed prefixes.
    pub fn len(&self) -> usize {
        self.ipv4.len() + self.ipv6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ipv4.is_empty() && self.ipv6.is_empty()
    }
}

/// A prefix while parsing: its class and the line that listed it, so a
/// duplicate can name the earlier line.
#[derive(Clone, Copy)]
struct Listed {
    class: SourceClass,
    line: usize,
}

/// Error messages, the first `CLASS_FILE_ERRORS_MAX` kept and the rest counted.
#[derive(Default)]
struct Errors {
    messages: Vec<String>,
    suppressed: usize,
}

impl Errors {
    fn push(&mut self, line: usize, message: impl fmt::Display) {
        if self.messages.len() < CLASS_FILE_ERRORS_MAX {
            self.messages.push(format!("line {line}: {message}"));
        } else {
            self.suppressed += 1;
        }
    }

    fn into_vec(mut self) -> Vec<String> {
        if self.suppressed > 0 {
            let s = if self.suppressed == 1 { "" } else { "s" };
            self.messages.push(format!("... and {} more error{s}", self.suppressed));
        }
        self.messages
    }
}

/// The parser behind `parse` and `load`. `entries_max` is a parameter so
/// tests can reach the cap without writing millions of lines.
fn parse_bytes(bytes: &[u8], entries_max: usize) -> Result<ClassTable, Vec<String>> {
    // Editors on some systems start UTF-8 files with a byte order mark.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut ipv4: PrefixMap<Ipv4Net, Listed> = PrefixMap::new();
    let mut ipv6: PrefixMap<Ipv6Net, Listed> = PrefixMap::new();
    let mut errors = Errors::default();
    let mut over_limit = false;

    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let Some((net, class)) = parse_line(raw, line, &mut errors) else { continue };
        let earlier = match net {
            IpNet::V4(v4) => ipv4.get(&v4).copied(),
            IpNet::V6(v6) => ipv6.get(&v6).copied(),
        };
        if let Some(earlier) = earlier {
            errors.push(line, format_args!("{net} is already listed on line {}", earlier.line));
            continue;
        }
        if ipv4.len() + ipv6.len() >= entries_max {
            if !over_limit {
                errors.push(line, format_args!("more than {entries_max} entries; the file is too large"));
                over_limit = true;
            }
            continue;
        }
        let listed = Listed { class, line };
        match net {
            IpNet::V4(v4) => ipv4.insert(v4, listed),
            IpNet::V6(v6) => ipv6.insert(v6, listed),
        };
    }

    if !errors.messages.is_empty() {
        return Err(errors.into_vec());
    }
    Ok(ClassTable {
        ipv4: ipv4.into_iter().map(|(net, listed)| (net, listed.class)).collect(),
        ipv6: ipv6.into_iter().map(|(net, listed)| (net, listed.class)).collect(),
    })
}

/// One line: `None` for blank lines, comments and invalid lines (whose
/// problems go to `errors`).
fn parse_line(raw: &[u8], line: usize, errors: &mut Errors) -> Option<(IpNet, SourceClass)> {
    if raw.len() > CLASS_FILE_LINE_BYTES_MAX {
        errors.push(line, format_args!("longer than {CLASS_FILE_LINE_BYTES_MAX} bytes ({} bytes)", raw.len()));
        return None;
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        errors.push(line, "not valid UTF-8");
        return None;
    };
    let text = text.trim();
    if text.is_empty() || text.starts_with('#') {
        return None;
    }
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    let [cidr, class] = fields[..] else {
        if fields.len() == 1 {
            errors.push(line, format_args!("expected `cidr,class`, found no comma in `{text}`"));
        } else {
            errors.push(line, format_args!("expected `cidr,class`, found {} fields in `{text}`", fields.len()));
        }
        return None;
    };
    let net = parse_cidr(cidr).map_err(|message| errors.push(line, message)).ok();
    let class = parse_class(class).map_err(|message| errors.push(line, message)).ok();
    Some((net?, class?))
}

fn parse_class(name: &str) -> Result<SourceClass, String> {
    SourceClass::parse(name).ok_or_else(|| {
        let names: Vec<&str> = SourceClass::ALL.iter().map(|c| c.name()).collect();
        if name.is_empty() {
            format!("missing the class after the comma (one of {})", names.join(", "))
        } else {
            format!("unknown class `{name}` (expected one of {})", names.join(", "))
        }
    })
}

/// A network (`10.0.0.0/8`) or a host route (`10.0.0.1`). Host bits set
/// are refused rather than cleared: `10.0.0.1/8` is as likely a typo for
/// `10.0.0.1/32` as for `10.0.0.0/8`, and guessing would misclass clients.
fn parse_cidr(text: &str) -> Result<IpNet, String> {
    if text.is_empty() {
        return Err("missing the CIDR before the comma".into());
    }
    let parsed =
        if text.contains('/') { crate::source::parse_cidr(text) } else { text.parse::<IpAddr>().ok().map(IpNet::from) };
    let Some(net) = parsed else {
        return Err(format!("`{text}` is not a CIDR or an address (expected e.g. 203.0.113.0/24 or 2001:db8::/32)"));
    };
    if let IpNet::V6(v6) = net {
        if let Some(v4) = ipv4_mapped_form(v6) {
            return Err(format!(
                "`{text}` is IPv4-mapped IPv6; write it as IPv4 ({v4}): clients are looked up by their IPv4 address"
            ));
        }
    }
    let network = net.trunc();
    if network != net {
        return Err(format!("`{text}` has host bits set (did you mean {network}?)"));
    }
    Ok(net)
}

/// The IPv4 network that an IPv6 prefix inside ::ffff:0:0/96 stands for.
/// Such a prefix could never match: lookups turn IPv4-mapped addresses into
/// IPv4 first. (Shorter prefixes that merely contain ::ffff:0:0/96, like
/// ::/0, are fine: they simply never see those addresses.)
fn ipv4_mapped_form(net: Ipv6Net) -> Option<Ipv4Net> {
    const MAPPED_PREFIX_LEN: u8 = 96;
    let bits = u128::from(net.addr());
    if net.prefix_len() < MAPPED_PREFIX_LEN || bits >> 32 != 0xffff {
        return None;
    }
    let v4 = Ipv4Addr::from((bits & u128::from(u32::MAX)) as u32);
    Ipv4Net::new(v4, net.prefix_len() - MAPPED_PREFIX_LEN).ok().map(|n| n.trunc())
}

/// Fuzz entry point: parses arbitrary bytes (as `load` would, and lossily
/// decoded as `parse` would) and, when they parse, checks that each listed
/// network's own address looks up to that entry's class or to a longer
/// prefix's. Panics only if that check fails.
pub fn fuzz_class_file(data: &[u8]) {
    if let Ok(table) = parse_bytes(data, CLASS_FILE_ENTRIES_MAX) {
        check_lookups(&table);
    }
    if let Ok(table) = ClassTable::parse(&String::from_utf8_lossy(data)) {
        check_lookups(&table);
    }
}

fn check_lookups(table: &ClassTable) {
    let mut count = 0;
    for (net, class) in &table.ipv4 {
        count += 1;
        let (found, found_class) = table.ipv4.get_lpm(&Ipv4Net::from(net.network())).expect("own prefix matches");
        assert!(found.prefix_len() >= net.prefix_len() && found.contains(&net.network()), "{net} found {found}");
        assert!(found != net || found_class == class, "{net} has two classes");
        let mapped = IpAddr::V6(net.network().to_ipv6_mapped());
        assert_eq!(table.lookup(IpAddr::V4(net.network())), Some(*found_class));
        assert_eq!(table.lookup(mapped), Some(*found_class));
    }
    for (net, class) in &table.ipv6 {
        count += 1;
        let (found, found_class) = table.ipv6.get_lpm(&Ipv6Net::from(net.network())).expect("own prefix matches");
        assert!(found.prefix_len() >= net.prefix_len() && found.contains(&net.network()), "{net} found {found}");
        assert!(found != net || found_class == class, "{net} has two classes");
        assert!(ipv4_mapped_form(net).is_none(), "{net} is IPv4-mapped");
        let address: Ipv6Addr = net.network();
        if address.to_ipv4_mapped().is_none() {
            assert_eq!(table.lookup(IpAddr::V6(address)), Some(*found_class));
        }
    }
    assert_eq!(count, table.len());
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;
    use SourceClass::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn table(text: &str) -> ClassTable {
        ClassTable::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e:?}"))
    }

    fn errors(text: &str) -> Vec<String> {
        ClassTable::parse(text).expect_err(text)
    }

    #[test]
    fn class_names_round_trip() {
        for class in SourceClass::ALL {
            assert_eq!(SourceClass::parse(class.name()), Some(class));
            assert_eq!(class.to_string(), class.name());
        }
        assert_eq!(SourceClass::parse("Hosting"), None);
        assert_eq!(SourceClass::parse(""), None);
    }

    #[test]
    fn longest_prefix_wins() {
        let t = table(
            "0.0.0.0/0,residential\n198.51.0.0/16,mobile\n198.51.100.0/24,business\n198.51.100.128/25,hosting\n\
             2001:db8::/32,mobile\n2001:db8:1::/48,hosting\n2001:db8:1:2::/64,business\n",
        );
        assert_eq!(t.len(), 7);
        assert_eq!(t.lookup(ip("198.51.100.7")), Some(Business));
        assert_eq!(t.lookup(ip("198.51.100.200")), Some(Hosting));
        assert_eq!(t.lookup(ip("198.51.7.1")), Some(Mobile));
        assert_eq!(t.lookup(ip("192.0.2.1")), Some(Residential));
        assert_eq!(t.lookup(ip("2001:db8:1:2::9")), Some(Business));
        assert_eq!(t.lookup(ip("2001:db8:1:3::9")), Some(Hosting));
        assert_eq!(t.lookup(ip("2001:db8:2::9")), Some(Mobile));
        assert_eq!(t.lookup(ip("2001:db9::1")), None);
    }

    #[test]
    fn order_of_lines_does_not_matter() {
        let a = table("198.51.100.0/24,business\n198.51.0.0/16,mobile\n");
        let b = table("198.51.0.0/16,mobile\n198.51.100.0/24,business\n");
        for address in ["198.51.100.1", "198.51.1.1", "10.0.0.1"] {
            assert_eq!(a.lookup(ip(address)), b.lookup(ip(address)));
        }
    }

    #[test]
    fn ipv4_mapped_addresses_are_looked_up_as_ipv4() {
        let t = table("198.51.100.0/24,business\n::/0,hosting\n");
        assert_eq!(t.lookup(ip("::ffff:198.51.100.7")), Some(Business));
        // ::/0 contains ::ffff:0:0/96 but never sees mapped clients
        assert_eq!(t.lookup(ip("::ffff:192.0.2.1")), None);
        assert_eq!(t.lookup(ip("2001:db8::1")), Some(Hosting));
    }

    #[test]
    fn bare_addresses_are_host_routes() {
        let t = table("192.0.2.1,hosting\n2001:db8::1,mobile\n192.0.2.0/24,residential\n");
        assert_eq!(t.lookup(ip("192.0.2.1")), Some(Hosting));
        assert_eq!(t.lookup(ip("192.0.2.2")), Some(Residential));
        assert_eq!(t.lookup(ip("2001:db8::1")), Some(Mobile));
        assert_eq!(t.lookup(ip("2001:db8::2")), None);
        // the same host route written both ways is a duplicate
        assert_eq!(
            errors("192.0.2.1,hosting\n192.0.2.1/32,hosting\n"),
            ["line 2: 192.0.2.1/32 is already listed on line 1"]
        );
    }

    #[test]
    fn comments_blank_lines_and_whitespace_are_ignored() {
        let t = table(
            "\u{feff}# source classes\n\n   # indented comment\n  10.0.0.0/8 ,\thosting  \r\n\t\n2001:db8::/32, mobile\n",
        );
        assert_eq!(t.len(), 2);
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(Hosting));
        assert_eq!(t.lookup(ip("2001:db8::1")), Some(Mobile));
        for empty in ["", "\n\n", "# nothing\n", "  \r\n"] {
            assert!(table(empty).is_empty(), "{empty:?}");
        }
    }

    #[test]
    fn debug_prints_only_counts() {
        let t = table("10.0.0.0/8,hosting\n192.0.2.1,mobile\n2001:db8::/32,mobile\n");
        assert_eq!(format!("{t:?}"), "ClassTable { ipv4: 2, ipv6: 1 }");
        assert_eq!(format!("{:?}", ClassTable::default()), "ClassTable { ipv4: 0, ipv6: 0 }");
    }

    #[test]
    fn each_error_names_its_line() {
        let long = format!("# {}", "x".repeat(CLASS_FILE_LINE_BYTES_MAX));
        let cases: &[(&str, &str)] = &[
            ("10.0.0.0/8 hosting", "line 1: expected `cidr,class`, found no comma in `10.0.0.0/8 hosting`"),
            ("\n10.0.0.0/8,hosting,extra", "line 2: expected `cidr,class`, found 3 fields"),
            ("\n\n10.0.0.0/33,hosting", "line 3: `10.0.0.0/33` is not a CIDR or an address"),
            ("banana,hosting", "line 1: `banana` is not a CIDR or an address"),
            ("10.0.0.0/,hosting", "line 1: `10.0.0.0/` is not a CIDR"),
            (",hosting", "line 1: missing the CIDR before the comma"),
            (
                "10.0.0.0/8,",
                "line 1: missing the class after the comma (one of hosting, mobile, business, residential)",
            ),
            (
                "# c\n10.0.0.0/8,cloud",
                "line 2: unknown class `cloud` (expected one of hosting, mobile, business, residential)",
            ),
            ("10.0.0.1/8,hosting", "line 1: `10.0.0.1/8` has host bits set (did you mean 10.0.0.0/8?)"),
            ("2001:db8::1/32,hosting", "line 1: `2001:db8::1/32` has host bits set (did you mean 2001:db8::/32?)"),
            ("10.0.0.0/8,hosting\n10.0.0.0/8,mobile", "line 2: 10.0.0.0/8 is already listed on line 1"),
            ("2001:db8::/32,mobile\n\n 2001:db8::/32 ,mobile", "line 3: 2001:db8::/32 is already listed on line 1"),
            (
                "::ffff:10.0.0.0/104,hosting",
                "line 1: `::ffff:10.0.0.0/104` is IPv4-mapped IPv6; write it as IPv4 (10.0.0.0/8)",
            ),
            ("::ffff:0:0/96,hosting", "line 1: `::ffff:0:0/96` is IPv4-mapped IPv6; write it as IPv4 (0.0.0.0/0)"),
            ("::ffff:192.0.2.1,hosting", "is IPv4-mapped IPv6; write it as IPv4 (192.0.2.1/32)"),
            (&long, "line 1: longer than 256 bytes (258 bytes)"),
        ];
        for (text, expected) in cases {
            let errors = errors(text);
            assert_eq!(errors.len(), 1, "{text:?}: {errors:?}");
            assert!(errors[0].contains(expected), "{text:?}: {errors:?} lacks {expected:?}");
        }
        // exactly at the limit is fine
        assert!(table(&format!("#{}", "x".repeat(CLASS_FILE_LINE_BYTES_MAX - 1))).is_empty());
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let bytes = b"10.0.0.0/8,hosting\n10.1.0.0/16,\xffmobile\n";
        assert_eq!(parse_bytes(bytes, CLASS_FILE_ENTRIES_MAX).unwrap_err(), ["line 2: not valid UTF-8"]);
    }

    #[test]
    fn too_many_entries() {
        let text = "10.0.0.0/8,hosting\n# c\n10.1.0.0/16,mobile\n10.2.0.0/16,mobile\n10.3.0.0/16,mobile\n";
        assert_eq!(
            parse_bytes(text.as_bytes(), 2).unwrap_err(),
            ["line 4: more than 2 entries; the file is too large"]
        );
        assert_eq!(parse_bytes(text.as_bytes(), 4).unwrap().len(), 4);
    }

    #[test]
    fn all_errors_are_reported_at_once() {
        let errors = errors(
            "10.0.0.0/8,hosting\nnonsense\n10.0.0.1/8,hosting\n# fine\n10.0.0.0/8,mobile\nfoo,bar\n192.0.2.0/24,business\n",
        );
        let lines: Vec<&str> = errors.iter().map(|e| e.split(':').next().unwrap()).collect();
        assert_eq!(lines, ["line 2", "line 3", "line 5", "line 6", "line 6"], "{errors:?}");
        assert!(errors[3].contains("`foo` is not a CIDR") && errors[4].contains("unknown class `bar`"));
    }

    #[test]
    fn error_count_is_capped() {
        let text = "x\n".repeat(CLASS_FILE_ERRORS_MAX + 50);
        let errors = errors(&text);
        assert_eq!(errors.len(), CLASS_FILE_ERRORS_MAX + 1);
        assert_eq!(
            errors[CLASS_FILE_ERRORS_MAX - 1],
            format!("line {CLASS_FILE_ERRORS_MAX}: expected `cidr,class`, found no comma in `x`")
        );
        assert_eq!(errors[CLASS_FILE_ERRORS_MAX], "... and 50 more errors");
    }

    #[test]
    fn load_reads_reports_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.csv");
        std::fs::write(&good, "198.51.100.0/24,business\n").unwrap();
        assert_eq!(ClassTable::load(&good).unwrap().lookup(ip("198.51.100.1")), Some(Business));

        let bad = dir.path().join("bad.csv");
        let mut file = File::create(&bad).unwrap();
        file.write_all(b"# classes\n\xc3\x28,hosting\n10.0.0.1/8,hosting\n").unwrap();
        drop(file);
        let error = ClassTable::load(&bad).unwrap_err();
        assert!(matches!(error, ClassFileError::Invalid { .. }));
        let message = error.to_string();
        assert_eq!(
            message,
            format!(
                "source class file {} is invalid:\nline 2: not valid UTF-8\n\
                 line 3: `10.0.0.1/8` has host bits set (did you mean 10.0.0.0/8?)",
                bad.display()
            )
        );

        let missing = dir.path().join("missing.csv");
        let error = ClassTable::load(&missing).unwrap_err();
        assert!(matches!(error, ClassFileError::Read { .. }));
        assert!(error.to_string().starts_with(&format!("cannot read source class file {}: ", missing.display())));
        assert!(matches!(ClassTable::load(dir.path()), Err(ClassFileError::Read { .. })));
    }

    #[test]
    fn fuzz_entry_point_accepts_anything() {
        for data in [
            &b""[..],
            b"\xff\xfe",
            b"10.0.0.0/8,hosting\n10.0.0.0/16,mobile\n0.0.0.0/0,business\n::/0,mobile\n::1,hosting",
            b"\xEF\xBB\xBF10.0.0.0/8,hosting\r\n",
            b",,,,\n/\n#\n,\n",
        ] {
            fuzz_class_file(data);
        }
    }

    // ---- properties ----

    /// Networks from a small space, so random tables nest and overlap.
    fn net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (prop::sample::select(vec![10u8, 11]), 0u8..2, any::<u16>(), 0u8..=32).prop_map(|(a, b, low, len)| {
                let address = Ipv4Addr::new(a, b, (low >> 8) as u8, low as u8);
                IpNet::V4(Ipv4Net::new(address, len).unwrap().trunc())
            }),
            (0u16..2, any::<u128>(), 0u8..=128).prop_map(|(b, low, len)| {
                let bits = (0x2001u128 << 112) | ((0xdb8 + b as u128) << 96) | (low >> 32);
                IpNet::V6(Ipv6Net::new(Ipv6Addr::from(bits), len).unwrap().trunc())
            }),
        ]
    }

    fn class() -> impl Strategy<Value = SourceClass> {
        prop::sample::select(SourceClass::ALL.to_vec())
    }

    /// Addresses near the networks: inside one (by index), or anywhere in
    /// the small space, as IPv4, IPv4-mapped IPv6 or IPv6.
    fn address(entries: &[(IpNet, SourceClass)]) -> impl Strategy<Value = IpAddr> {
        let networks: Vec<IpNet> = entries.iter().map(|(n, _)| *n).collect();
        let inside = (any::<prop::sample::Index>(), any::<u128>()).prop_map(move |(i, r)| {
            if networks.is_empty() {
                return ip("10.0.0.1");
            }
            match networks[i.index(networks.len())] {
                IpNet::V4(n) => {
                    let host = u32::from(n.hostmask()) & r as u32;
                    IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) | host))
                }
                IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | (u128::from(n.hostmask()) & r))),
            }
        });
        let nearby = net().prop_map(|n| n.addr());
        (prop_oneof![inside, nearby], any::<bool>()).prop_map(|(address, map)| match address {
            IpAddr::V4(v4) if map => IpAddr::V6(v4.to_ipv6_mapped()),
            other => other,
        })
    }

    fn reference(entries: &[(IpNet, SourceClass)], address: IpAddr) -> Option<SourceClass> {
        let address = canonical(address);
        entries.iter().filter(|(n, _)| n.contains(&address)).max_by_key(|(n, _)| n.prefix_len()).map(|(_, c)| *c)
    }

    /// A file listing `entries`, host routes sometimes written bare, with
    /// stray whitespace and comments.
    fn render(entries: &[(IpNet, SourceClass)], style: &[bool]) -> String {
        let mut text = String::from("# generated\n");
        for (i, (net, class)) in entries.iter().enumerate() {
            let fancy = style.get(i).copied().unwrap_or(false);
            let cidr = if fancy && net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.to_string()
            };
            if fancy {
                text.push_str(&format!("  {cidr} ,\t{class} \r\n\n"));
            } else {
                text.push_str(&format!("{cidr},{class}\n"));
            }
        }
        text
    }

    fn table_and_addresses() -> impl Strategy<Value = (Vec<(IpNet, SourceClass)>, Vec<bool>, Vec<IpAddr>)> {
        (prop::collection::btree_map(net(), class(), 0..24), prop::collection::vec(any::<bool>(), 24)).prop_flat_map(
            |(entries, style): (BTreeMap<IpNet, SourceClass>, Vec<bool>)| {
                let entries: Vec<(IpNet, SourceClass)> = entries.into_iter().collect();
                let addresses = prop::collection::vec(address(&entries), 1..32);
                (Just(entries), Just(style), addresses)
            },
        )
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in any::<String>()) {
            let _ = ClassTable::parse(&text);
        }

        #[test]
        fn parse_never_panics_on_near_misses(
            lines in prop::collection::vec("[0-9a-f:./,# \t\r]{0,40}|[ \t]*[0-9a-f:.]{1,30}(/[0-9]{1,3})?[ \t]*,[ \t]*(hosting|mobile|business|residential|x)", 0..20)
        ) {
            let text = lines.join("\n");
            let _ = ClassTable::parse(&text);
            fuzz_class_file(text.as_bytes());
        }

        #[test]
        fn fuzz_entry_point_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
            fuzz_class_file(&data);
        }

        #[test]
        fn lookup_agrees_with_brute_force((entries, style, addresses) in table_and_addresses()) {
            let text = render(&entries, &style);
            let table = ClassTable::parse(&text).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(table.len(), entries.len());
            for address in addresses {
                prop_assert_eq!(table.lookup(address), reference(&entries, address), "{}", address);
            }
            for (net, class) in &entries {
                // each network's own address finds its class or a longer prefix's
                let found = table.lookup(net.network()).unwrap();
                prop_assert!(found == *class || entries.iter().any(|(n, c)| n.prefix_len() > net.prefix_len() && n.contains(&net.network()) && *c == found));
            }
            fuzz_class_file(text.as_bytes());
        }
    }
}
