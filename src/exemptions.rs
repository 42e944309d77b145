//! Source exemptions: network prefixes (`[[source.exemptions]]`) whose
//! clients skip the rules keyed on their source (a rate or failure rule
//! whose key holds `prefix`), and whose source flags from spray detection
//! do not refuse them. A known egress (an office's NAT, a monitoring probe)
//! is many people behind one address: per-source limits would lock them
//! all out together, while the rules keyed on the account alone (the
//! account ceiling) and spray detection's account and password axes still
//! protect each account, so those are never exempt.
//!
//! An exemption applies to the address the daemon picked (the peer, or the
//! right-most untrusted X-Forwarded-For hop), never to a header's claim:
//! a client behind no trusted proxy cannot name an exempt address.
//!
//! Validation (`validate`) and the table the limiter looks addresses up in
//! (`ExemptionTable`). No I/O, no clock, no panics on any input.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::PrefixMap;

use crate::source::canonical;

/// Exemptions one file may list. Each is an operator's decision with a
/// reason, listed in `status` and audited on every change: a few dozen is a
/// large site; hundreds means a list generated from somewhere else, which
/// belongs in a class file instead.
pub const EXEMPTIONS_MAX: usize = 256;
/// The widest exempt IPv4 prefix: a /8 is already 16 million addresses; a
/// typo (`/0`, `/1`) must not exempt the Internet.
pub const EXEMPTION_IPV4_PREFIX_LEN_MIN: u8 = 8;
/// The widest exempt IPv6 prefix: a /32 is a whole provider's allocation.
pub const EXEMPTION_IPV6_PREFIX_LEN_MIN: u8 = 32;
/// Bytes of a reason: a sentence for `status` and the audit lines, not a
/// document.
pub const EXEMPTION_REASON_BYTES_MAX: usize = 200;

/// The prefix of the name `status` lists an exemption under among its named
/// values, followed by `<prefix> <reason>`; the value is the checks it has
/// exempted. The space tells it from a route's limit (`<route>.<name>`,
/// where neither part holds a space).
pub const STATUS_NAME_PREFIX: &str = "source.exemption ";

/// One exemption as validated: the network, and why it is exempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exemption {
    pub prefix: IpNet,
    pub reason: String,
}

impl Exemption {
    /// Its name among `status`'s named values.
    pub fn status_name(&self) -> String {
        format!("{STATUS_NAME_PREFIX}{} {}", self.prefix, self.reason)
    }
}

/// (prefix, reason) from a `status` name made by `Exemption::status_name`.
pub fn parse_status_name(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(STATUS_NAME_PREFIX)?.split_once(' ')
}

/// Checks `[[source.exemptions]]` (each entry's `prefix` and `reason`),
/// pushing every problem, each named by its key path. `trusted` are the
/// trusted proxies: an exemption may not overlap them, because a request
/// whose header is missing or malformed is keyed on its peer, the proxy,
/// and any client could then claim the exemption by sending a bad header.
pub fn validate(
    entries: &[(Option<String>, Option<String>)],
    trusted: &[IpNet],
    errors: &mut Vec<String>,
) -> Vec<Exemption> {
    if entries.len() > EXEMPTIONS_MAX {
        errors.push(format!("source.exemptions: at most {EXEMPTIONS_MAX} entries ({} listed)", entries.len()));
    }
    let mut valid: Vec<(usize, Exemption)> = Vec::new();
    for (i, (prefix, reason)) in entries.iter().enumerate() {
        let path = format!("source.exemptions[{i}]");
        let prefix = match prefix.as_deref() {
            None => {
                errors.push(format!("{path}.prefix: required (a CIDR such as 203.0.113.0/24, or an address)"));
                None
            }
            Some(text) => parse_prefix(text).map_err(|e| errors.push(format!("{path}.prefix: {e}"))).ok(),
        };
        let reason = match reason.as_deref().map(str::trim) {
            None | Some("") => {
                errors.push(format!(
                    "{path}.reason: required and not empty: `status` and the audit lines say why it is exempt"
                ));
                None
            }
            Some(text) if text.len() > EXEMPTION_REASON_BYTES_MAX => {
                errors.push(format!("{path}.reason: at most {EXEMPTION_REASON_BYTES_MAX} bytes"));
                None
            }
            Some(text) if text.chars().any(char::is_control) => {
                errors.push(format!("{path}.reason: no control characters (it is printed in logs and `status`)"));
                None
            }
            Some(text) => Some(text.to_string()),
        };
        let Some(prefix) = prefix else { continue };
        if let Some(proxy) = trusted.iter().find(|p| overlaps(**p, prefix)) {
            errors.push(format!(
                "{path}.prefix: {prefix} overlaps source.trusted_proxies' {proxy}: a request with a missing or \
                 malformed X-Forwarded-For is keyed on its proxy, so any client could claim the exemption"
            ));
            continue;
        }
        // Overlapping entries are refused: each address has one reason, and
        // each exempted check is counted on one entry.
        if let Some((j, earlier)) = valid.iter().find(|(_, e)| overlaps(e.prefix, prefix)) {
            errors.push(format!(
                "{path}.prefix: {prefix} overlaps source.exemptions[{j}] ({}); list each network once",
                earlier.prefix
            ));
            continue;
        }
        if let Some(reason) = reason {
            valid.push((i, Exemption { prefix, reason }));
        }
    }
    valid.into_iter().map(|(_, e)| e).collect()
}

/// A network (`203.0.113.0/24`) or one address (a /32 or /128), no wider
/// than the bounds; host bits set are refused, not cleared (as in a class
/// file: `10.0.0.1/8` is as likely a typo for /32 as for 10.0.0.0/8).
fn parse_prefix(text: &str) -> Result<IpNet, String> {
    parse_network(text, "exemption")
}

/// `parse_prefix` for a `what` (an exemption, a ban), named in the errors.
pub fn parse_network(text: &str, what: &str) -> Result<IpNet, String> {
    let parsed =
        if text.contains('/') { crate::source::parse_cidr(text) } else { text.parse::<IpAddr>().ok().map(IpNet::from) };
    let Some(net) = parsed else {
        return Err(format!("`{text}` is not a CIDR or an address (expected e.g. 203.0.113.0/24 or 2001:db8::/48)"));
    };
    if let IpNet::V6(v6) = net {
        if v6.addr().to_ipv4_mapped().is_some() && v6.prefix_len() >= 96 {
            return Err(format!(
                "`{text}` is IPv4-mapped IPv6; write it as IPv4: clients are matched by their IPv4 address"
            ));
        }
    }
    // Width first: suggesting the network of a too-wide typo would only
    // lead to the next error.
    let (len, min, family) = match net {
        IpNet::V4(v4) => (v4.prefix_len(), EXEMPTION_IPV4_PREFIX_LEN_MIN, "IPv4"),
        IpNet::V6(v6) => (v6.prefix_len(), EXEMPTION_IPV6_PREFIX_LEN_MIN, "IPv6"),
    };
    if len < min {
        return Err(format!("{net} is wider than /{min}, the widest {family} {what}: is it a typo?"));
    }
    let network = net.trunc();
    if network != net {
        return Err(format!("`{text}` has host bits set (did you mean {network}?)"));
    }
    Ok(net)
}

fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b) || b.contains(&a)
}

/// What a reload changes: exemptions removed, added, and kept with a new
/// reason (old, new). Each becomes one audit line.
pub struct Changes<'a> {
    pub removed: Vec<&'a Exemption>,
    pub added: Vec<&'a Exemption>,
    pub reasons: Vec<(&'a Exemption, &'a Exemption)>,
}

pub fn changes<'a>(before: &'a [Exemption], after: &'a [Exemption]) -> Changes<'a> {
    let find = |list: &'a [Exemption], prefix: IpNet| list.iter().find(|e| e.prefix == prefix);
    Changes {
        removed: before.iter().filter(|e| find(after, e.prefix).is_none()).collect(),
        added: after.iter().filter(|e| find(before, e.prefix).is_none()).collect(),
        reasons: before
            .iter()
            .filter_map(|old| find(after, old.prefix).filter(|new| new.reason != old.reason).map(|new| (old, new)))
            .collect(),
    }
}

/// One exemption in force and the checks it has exempted (kept across a
/// reload that keeps its prefix).
struct Listed {
    exemption: Exemption,
    checks: Arc<AtomicU64>,
}

/// The exemptions in force: a trie per family, to the entry's index.
#[derive(Default)]
pub struct ExemptionTable {
    ipv4: PrefixMap<Ipv4Net, u16>,
    ipv6: PrefixMap<Ipv6Net, u16>,
    listed: Vec<Listed>,
}

impl ExemptionTable {
    /// The table for `exemptions` (validated: no overlaps, at most
    /// `EXEMPTIONS_MAX`), keeping the counts of `previous`'s entries with
    /// the same prefix.
    pub fn new(exemptions: &[Exemption], previous: Option<&ExemptionTable>) -> ExemptionTable {
        let mut table = ExemptionTable::default();
        for (i, exemption) in exemptions.iter().enumerate().take(EXEMPTIONS_MAX) {
            let kept = previous.and_then(|p| p.listed.iter().find(|l| l.exemption.prefix == exemption.prefix));
            let checks = kept.map(|l| l.checks.clone()).unwrap_or_default();
            table.listed.push(Listed { exemption: exemption.clone(), checks });
            match exemption.prefix {
                IpNet::V4(v4) => table.ipv4.insert(v4, i as u16),
                IpNet::V6(v6) => table.ipv6.insert(v6, i as u16),
            };
        }
        table
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty()
    }

    /// The entry exempting `address`, if one does. IPv4-mapped IPv6 is
    /// looked up as the IPv4 address.
    pub fn lookup(&self, address: IpAddr) -> Option<u16> {
        // Without exemptions (the default) a check walks no trie.
        if self.is_empty() {
            return None;
        }
        match canonical(address) {
            IpAddr::V4(v4) => self.ipv4.get_lpm(&Ipv4Net::from(v4)).map(|(_, i)| *i),
            IpAddr::V6(v6) => self.ipv6.get_lpm(&Ipv6Net::from(v6)).map(|(_, i)| *i),
        }
    }

    pub fn get(&self, index: u16) -> Option<&Exemption> {
        self.listed.get(index as usize).map(|l| &l.exemption)
    }

    /// Counts a check entry `index` exempted.
    pub fn count_check(&self, index: u16) {
        if let Some(listed) = self.listed.get(index as usize) {
            listed.checks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Each exemption with the checks it has exempted, in the file's order.
    pub fn entries(&self) -> impl Iterator<Item = (&Exemption, u64)> {
        self.listed.iter().map(|l| (&l.exemption, l.checks.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(prefix: &str, reason: &str) -> (Option<String>, Option<String>) {
        (Some(prefix.into()), Some(reason.into()))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_problem_is_reported_with_its_entry() {
        let mut errors = Vec::new();
        let entries = vec![
            entry("0.0.0.0/0", "typo"),
            entry("203.0.113.0/24", " "),
            (None, None),
            entry("203.0.113.1/24", "host bits"),
            entry("2001:db8::/16", "too wide"),
            entry("::ffff:203.0.113.0/120", "mapped"),
            entry("203.0.113.128/25", "inside entry 1, which is refused"),
            entry("198.51.100.0/24", "office"),
            entry("198.51.100.7", "probe inside the office"),
            entry("10.1.0.0/16", "behind the proxy"),
            entry("192.0.2.0/24", "bell\u{7}"),
        ];
        let kept = validate(&entries, &["10.0.0.0/8".parse().unwrap()], &mut errors);
        let has = |needle: &str| errors.iter().any(|e| e.contains(needle));
        assert!(has("source.exemptions[0].prefix: 0.0.0.0/0 is wider than /8"), "{errors:#?}");
        assert!(has("source.exemptions[1].reason: required and not empty"), "{errors:#?}");
        assert!(has("source.exemptions[2].prefix: required") && has("source.exemptions[2].reason"), "{errors:#?}");
        assert!(has("source.exemptions[3].prefix: `203.0.113.1/24` has host bits set"), "{errors:#?}");
        assert!(has("source.exemptions[4].prefix: 2001:db8::/16 is wider than /32"), "{errors:#?}");
        assert!(has("source.exemptions[5].prefix: `::ffff:203.0.113.0/120` is IPv4-mapped"), "{errors:#?}");
        assert!(has("source.exemptions[8].prefix: 198.51.100.7/32 overlaps source.exemptions[7]"), "{errors:#?}");
        assert!(has("source.exemptions[9].prefix: 10.1.0.0/16 overlaps source.trusted_proxies' 10.0.0.0/8"));
        assert!(has("source.exemptions[10].reason: no control characters"), "{errors:#?}");
        assert_eq!(errors.len(), 10, "{errors:#?}");
        // An entry refused for its reason holds no network: the file is
        // refused anyway, and one error per entry is enough to fix it.
        assert_eq!(kept.len(), 2, "{kept:?}");
    }

    #[test]
    fn too_many_entries_are_refused() {
        let entries: Vec<_> =
            (0..=EXEMPTIONS_MAX).map(|i| entry(&format!("10.{}.{}.0/24", i / 256, i % 256), "x")).collect();
        let mut errors = Vec::new();
        validate(&entries, &[], &mut errors);
        assert_eq!(errors, vec![format!("source.exemptions: at most {EXEMPTIONS_MAX} entries (257 listed)")]);
    }

    #[test]
    fn lookups_find_the_entry_and_count_across_a_reload_that_keeps_it() {
        let mut errors = Vec::new();
        let list = validate(
            &[entry("203.0.113.0/24", "office"), entry("2001:db8:1::/48", "v6 office"), entry("192.0.2.9", "probe")],
            &[],
            &mut errors,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let table = ExemptionTable::new(&list, None);
        assert_eq!(table.lookup(ip("203.0.113.77")), Some(0));
        assert_eq!(table.lookup(ip("::ffff:203.0.113.77")), Some(0));
        assert_eq!(table.lookup(ip("203.0.114.1")), None);
        assert_eq!(table.lookup(ip("2001:db8:1:ffff::1")), Some(1));
        assert_eq!(table.lookup(ip("2001:db8:2::1")), None);
        assert_eq!(table.lookup(ip("192.0.2.9")), Some(2));
        assert_eq!(table.lookup(ip("192.0.2.10")), None);
        table.count_check(0);
        table.count_check(0);
        table.count_check(2);
        let reloaded = ExemptionTable::new(&list[..2], Some(&table));
        let counts: Vec<u64> = reloaded.entries().map(|(_, n)| n).collect();
        assert_eq!(counts, vec![2, 0]);
        assert!(ExemptionTable::default().lookup(ip("203.0.113.77")).is_none());
    }

    #[test]
    fn status_names_round_trip() {
        let e = Exemption { prefix: "2001:db8::/48".parse().unwrap(), reason: "office egress, floor 2".into() };
        assert_eq!(parse_status_name(&e.status_name()), Some(("2001:db8::/48", "office egress, floor 2")));
        assert_eq!(parse_status_name("login.known_devices_per_account_max"), None);
    }

    #[test]
    fn changes_name_each_added_removed_and_re_reasoned_entry() {
        let e = |p: &str, r: &str| Exemption { prefix: p.parse().unwrap(), reason: r.into() };
        let before = vec![e("203.0.113.0/24", "office"), e("192.0.2.9/32", "probe")];
        let after = vec![e("203.0.113.0/24", "office, new floor"), e("198.51.100.0/24", "branch")];
        let c = changes(&before, &after);
        assert_eq!(c.removed, vec![&before[1]]);
        assert_eq!(c.added, vec![&after[1]]);
        assert_eq!(c.reasons, vec![(&before[0], &after[0])]);
    }
}
