//! The decision log's bytes: a file header, then length-prefixed,
//! checksummed records. Pure: no I/O, no clock.
//!
//! Hand-rolled little-endian rather than bincode: the layout is the file
//! format, so it is written out here byte by byte (and in
//! docs/operations.md) where a reader can check it, it cannot change with a
//! dependency's encoding, and the decoder is one small function the fuzz
//! target calls directly.
//!
//! ```text
//! header  magic "TGDECLOG" (8) | format version u32 | start_us u64 | secret fingerprint u64
//! record  marker 0xD5 | body_len u16 | body | crc32(body_len ‖ body) u32
//! body    time_us u64 | op u8 | decision u8 | reason u8 | present u8 | family u8
//!         | route_len u8 | route | rule_len u8 | rule
//!         | address (0, 4 or 16 bytes: IPv6 masked to its /64)
//!         | one 16-byte digest per bit of `present`, in bit order:
//!           account, device, tenant, client_id, password digest, password tag
//! ```
//!
//! The marker and checksum let a reader tell a torn tail (the file ends
//! inside a record: a crash) from a damaged record (checksum or field
//! wrong), and find the next record after damage, so one bad byte loses
//! one record, not the rest of the file.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use smallvec::SmallVec;

use crate::config::NAME_BYTES_MAX;
use crate::protocol::{Decision, Outcome, Reason};

pub const MAGIC: [u8; 8] = *b"TGDECLOG";
/// Bumped whenever the layout above changes; a reader refuses others.
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 8 + 4 + 8 + 8;
pub const RECORD_MARKER: u8 = 0xD5;
/// Marker, length, checksum.
const FRAMING_BYTES: usize = 1 + 2 + 4;
/// Digests a record can carry (bits of `present`).
const DIGESTS_MAX: usize = 6;
/// The largest body: every field present, both names at their longest.
pub const BODY_BYTES_MAX: usize = 8 + 5 + 1 + NAME_BYTES_MAX + 1 + NAME_BYTES_MAX + 16 + DIGESTS_MAX * 16;
pub const RECORD_BYTES_MAX: usize = FRAMING_BYTES + BODY_BYTES_MAX;
const _: () = assert!(BODY_BYTES_MAX <= u16::MAX as usize);
/// The smallest body: no names, no address, no digest.
const BODY_BYTES_MIN: usize = 8 + 5 + 1 + 1;

/// A route or rule name, inline when short (every built-in one is).
pub type Name = SmallVec<[u8; 24]>;

/// Check, or report with its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Check,
    Report(Outcome),
}

/// One decision, as the daemon made it: what replay needs, digests only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// On the daemon's clock (the manual clock in tests).
    pub time_us: u64,
    pub op: Op,
    /// The verdict the running configuration gave.
    pub decision: Decision,
    pub reason: Reason,
    pub route: Name,
    /// The rule that decided (or the tightest); empty if none.
    pub rule: Name,
    /// The client's address after X-Forwarded-For, IPv6 masked to its /64.
    pub address: Option<IpAddr>,
    /// Keyed digests (`KeyDeriver::component`) of the subject's fields.
    pub account: Option<[u8; 16]>,
    pub device: Option<[u8; 16]>,
    pub tenant: Option<[u8; 16]>,
    pub client_id: Option<[u8; 16]>,
    /// A report's password digest and the attempt's password tag, each
    /// re-keyed with the daemon's secret (`KeyDeriver::logged`).
    pub password_digest: Option<[u8; 16]>,
    pub password_tag: Option<[u8; 16]>,
}

/// The file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub start_us: u64,
    /// `Secret::fingerprint` of the secret the digests were made with:
    /// files made with different secrets cannot be replayed together.
    pub fingerprint: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("shorter than the {HEADER_BYTES}-byte header")]
    Short,
    #[error("not a tollgate decision log (no TGDECLOG magic)")]
    Foreign,
    #[error("format version {0}; this tollgate reads version {FORMAT_VERSION}")]
    Version(u32),
}

/// Why no record could be read at an offset.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// The bytes end inside a record (a torn tail): need more.
    #[error("the file ends inside a record (torn tail)")]
    Incomplete,
    #[error("damaged record: {0}")]
    Malformed(&'static str),
}

pub fn encode_header(header: &Header, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.start_us.to_le_bytes());
    out.extend_from_slice(&header.fingerprint.to_le_bytes());
}

pub fn decode_header(bytes: &[u8]) -> Result<Header, HeaderError> {
    if bytes.len() >= MAGIC.len() && bytes[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::Foreign);
    }
    if bytes.len() < HEADER_BYTES {
        return Err(HeaderError::Short);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    Ok(Header {
        start_us: u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes")),
        fingerprint: u64::from_le_bytes(bytes[20..28].try_into().expect("8 bytes")),
    })
}

/// A reason's byte in a record is its place here: the wire's order.
const REASONS: [Reason; Reason::ALL.len()] = Reason::ALL;
/// The reasons a record holds: version 4's nine (`encode_record` writes a
/// later one as version 4 receives it), so a log stays readable by every
/// replay that reads this format.
const REASONS_KNOWN: usize = 9;
const _: () = assert!(REASONS_KNOWN <= REASONS.len());
const DECISIONS: [Decision; 4] = [Decision::Allow, Decision::Delay, Decision::Challenge, Decision::Deny];

fn reason_byte(reason: Reason) -> u8 {
    REASONS[..REASONS_KNOWN].iter().position(|r| *r == reason).expect("every reason is in the table") as u8
}

/// Appends one record. Names longer than `NAME_BYTES_MAX` (never, after
/// config validation) are cut, so a record never exceeds its maximum.
pub fn encode_record(record: &Record, out: &mut Vec<u8>) {
    let start = out.len();
    out.push(RECORD_MARKER);
    out.extend_from_slice(&[0, 0]); // body length, filled in below
    out.extend_from_slice(&record.time_us.to_le_bytes());
    out.push(match record.op {
        Op::Check => 0,
        Op::Report(Outcome::Success) => 1,
        Op::Report(Outcome::Failure) => 2,
    });
    out.push(record.decision as u8);
    // The log keeps version 4's reasons, so a replay built before version 5
    // reads every record: a refusal by places is logged as one by failures.
    out.push(reason_byte(record.reason.for_version(crate::protocol::ACTIVITY_VERSION)));
    let digests =
        [record.account, record.device, record.tenant, record.client_id, record.password_digest, record.password_tag];
    let present = digests.iter().enumerate().fold(0u8, |bits, (i, d)| bits | (u8::from(d.is_some()) << i));
    out.push(present);
    out.push(match record.address {
        None => 0,
        Some(IpAddr::V4(_)) => 4,
        Some(IpAddr::V6(_)) => 6,
    });
    for name in [&record.route, &record.rule] {
        let name = &name[..name.len().min(NAME_BYTES_MAX)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
    }
    match record.address {
        None => {}
        Some(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
        Some(IpAddr::V6(a)) => out.extend_from_slice(&mask_64(a).octets()),
    }
    for digest in digests.iter().flatten() {
        out.extend_from_slice(digest);
    }
    let body_len = (out.len() - start - 3) as u16;
    out[start + 1..start + 3].copy_from_slice(&body_len.to_le_bytes());
    let crc = crc32fast::hash(&out[start + 1..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// An IPv6 address's /64: rules never key on anything longer.
pub fn mask_64(address: Ipv6Addr) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(address) & !((1u128 << 64) - 1))
}

/// Decodes the record at the start of `bytes`; returns it and its length.
/// A length over the maximum is refused before anything is read past it.
pub fn decode_record(bytes: &[u8]) -> Result<(Record, usize), RecordError> {
    let Some(&marker) = bytes.first() else { return Err(RecordError::Incomplete) };
    if marker != RECORD_MARKER {
        return Err(RecordError::Malformed("no record marker"));
    }
    if bytes.len() < 3 {
        return Err(RecordError::Incomplete);
    }
    let body_len = usize::from(u16::from_le_bytes([bytes[1], bytes[2]]));
    if !(BODY_BYTES_MIN..=BODY_BYTES_MAX).contains(&body_len) {
        return Err(RecordError::Malformed("record length out of range"));
    }
    let total = FRAMING_BYTES + body_len;
    if bytes.len() < total {
        return Err(RecordError::Incomplete);
    }
    let crc = u32::from_le_bytes(bytes[3 + body_len..total].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[1..3 + body_len]) != crc {
        return Err(RecordError::Malformed("checksum mismatch"));
    }
    let record = decode_body(&bytes[3..3 + body_len])?;
    Ok((record, total))
}

/// The body, its checksum already verified.
fn decode_body(body: &[u8]) -> Result<Record, RecordError> {
    let mut at = Cursor { bytes: body, at: 0 };
    let time_us = u64::from_le_bytes(at.take(8)?.try_into().expect("8 bytes"));
    let op = match at.byte()? {
        0 => Op::Check,
        1 => Op::Report(Outcome::Success),
        2 => Op::Report(Outcome::Failure),
        _ => return Err(RecordError::Malformed("unknown operation")),
    };
    let decision = *DECISIONS.get(usize::from(at.byte()?)).ok_or(RecordError::Malformed("unknown decision"))?;
    let reason =
        *REASONS[..REASONS_KNOWN].get(usize::from(at.byte()?)).ok_or(RecordError::Malformed("unknown reason"))?;
    let present = at.byte()?;
    if present >> DIGESTS_MAX != 0 {
        return Err(RecordError::Malformed("unknown field bits"));
    }
    let family = at.byte()?;
    let mut name = || -> Result<Name, RecordError> {
        let len = usize::from(at.byte()?);
        if len > NAME_BYTES_MAX {
            return Err(RecordError::Malformed("name too long"));
        }
        let bytes = at.take(len)?;
        if std::str::from_utf8(bytes).is_err() {
            return Err(RecordError::Malformed("name not UTF-8"));
        }
        Ok(Name::from_slice(bytes))
    };
    let route = name()?;
    let rule = name()?;
    let address = match family {
        0 => None,
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(at.take(4)?).expect("4 bytes")))),
        // Masked again: what the encoder writes, whoever wrote the bytes.
        6 => Some(IpAddr::V6(mask_64(Ipv6Addr::from(<[u8; 16]>::try_from(at.take(16)?).expect("16 bytes"))))),
        _ => return Err(RecordError::Malformed("unknown address family")),
    };
    let mut digests = [None; DIGESTS_MAX];
    for (i, digest) in digests.iter_mut().enumerate() {
        if present & (1 << i) != 0 {
            *digest = Some(<[u8; 16]>::try_from(at.take(16)?).expect("16 bytes"));
        }
    }
    if at.at != body.len() {
        return Err(RecordError::Malformed("bytes after the last field"));
    }
    let [account, device, tenant, client_id, password_digest, password_tag] = digests;
    Ok(Record {
        time_us,
        op,
        decision,
        reason,
        route,
        rule,
        address,
        account,
        device,
        tenant,
        client_id,
        password_digest,
        password_tag,
    })
}

struct Cursor<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Cursor<'b> {
    /// Inside a checksummed body, running short is damage, not a torn tail.
    fn take(&mut self, n: usize) -> Result<&'b [u8], RecordError> {
        let end = self.at.checked_add(n).filter(|end| *end <= self.bytes.len());
        let end = end.ok_or(RecordError::Malformed("a field runs past the record"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }
}

/// What went wrong at one offset of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub offset: u64,
    pub what: String,
    /// A torn tail is what a crash leaves; anything else is damage.
    pub torn_tail: bool,
}

/// Every record of one file's bytes that can be read, and what could not.
/// After damage the reader looks for the next marker whose record passes
/// its checksum, so one bad byte costs one record.
#[derive(Debug, Default)]
pub struct FileContents {
    pub header: Option<Header>,
    pub records: Vec<Record>,
    pub problems: Vec<Problem>,
    /// Bytes skipped over damage.
    pub skipped_bytes: u64,
}

pub fn read_file_bytes(bytes: &[u8]) -> FileContents {
    let mut contents = FileContents::default();
    match decode_header(bytes) {
        Ok(header) => contents.header = Some(header),
        Err(e) => {
            contents.problems.push(Problem { offset: 0, what: e.to_string(), torn_tail: false });
            return contents;
        }
    }
    let mut at = HEADER_BYTES;
    // The next offset where a whole record reads back, if any.
    let next_record = |from: usize| {
        (from + 1..bytes.len()).find(|&i| bytes[i] == RECORD_MARKER && decode_record(&bytes[i..]).is_ok())
    };
    while at < bytes.len() {
        let why = match decode_record(&bytes[at..]) {
            Ok((record, len)) => {
                contents.records.push(record);
                at += len;
                continue;
            }
            Err(RecordError::Malformed(why)) => why,
            // Cut short, but whole records follow: a damaged length.
            Err(RecordError::Incomplete) if next_record(at).is_some() => "record length runs past the next record",
            Err(RecordError::Incomplete) => {
                let what = format!("{} bytes of a record cut short (torn tail)", bytes.len() - at);
                contents.problems.push(Problem { offset: at as u64, what, torn_tail: true });
                break;
            }
        };
        contents.problems.push(Problem { offset: at as u64, what: format!("damaged record: {why}"), torn_tail: false });
        let next = next_record(at).unwrap_or(bytes.len());
        contents.skipped_bytes += (next - at) as u64;
        at = next;
    }
    contents
}

/// The fuzz target's body (`fuzz/fuzz_targets/decision_log.rs`, replayed by
/// `tests/fuzz_replay.rs`): any bytes, as a file or as one record, never
/// panic, and whatever decodes re-encodes to bytes that decode to it.
pub fn fuzz_decision_log(data: &[u8]) {
    let contents = read_file_bytes(data);
    let mut headed = Vec::with_capacity(HEADER_BYTES + data.len());
    encode_header(&Header { start_us: 0, fingerprint: 0 }, &mut headed);
    headed.extend_from_slice(data);
    let as_records = read_file_bytes(&headed);
    for record in contents.records.iter().chain(&as_records.records) {
        let mut bytes = Vec::new();
        encode_record(record, &mut bytes);
        assert!(bytes.len() <= RECORD_BYTES_MAX);
        let (again, len) = decode_record(&bytes).expect("an encoded record decodes");
        assert_eq!((&again, len), (record, bytes.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(seed: u8) -> Record {
        Record {
            time_us: 1_893_456_000_000_000 + u64::from(seed),
            op: Op::Report(Outcome::Failure),
            decision: Decision::Deny,
            reason: Reason::TooManyFailures,
            route: Name::from_slice(b"login"),
            rule: Name::from_slice(b"source_failures"),
            address: Some("192.0.2.7".parse().unwrap()),
            account: Some([seed; 16]),
            device: None,
            tenant: Some([2; 16]),
            client_id: None,
            password_digest: Some([4; 16]),
            password_tag: Some([5; 16]),
        }
    }

    fn file(records: &[Record]) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode_header(&Header { start_us: 7, fingerprint: 9 }, &mut bytes);
        for r in records {
            encode_record(r, &mut bytes);
        }
        bytes
    }

    #[test]
    fn a_record_round_trips_and_ipv6_is_kept_to_its_64() {
        let mut r = record(1);
        r.address = Some("2001:db8:1:2:aaaa:bbbb:cccc:dddd".parse().unwrap());
        let mut bytes = Vec::new();
        encode_record(&r, &mut bytes);
        let (back, len) = decode_record(&bytes).unwrap();
        assert_eq!(len, bytes.len());
        assert_eq!(back.address, Some("2001:db8:1:2::".parse().unwrap()));
        assert_eq!(Record { address: r.address.map(|_| back.address.unwrap()), ..r }, back);
    }

    #[test]
    fn a_torn_tail_is_reported_and_the_records_before_it_kept() {
        let bytes = file(&[record(1), record(2), record(3)]);
        let cut = &bytes[..bytes.len() - 5];
        let contents = read_file_bytes(cut);
        assert_eq!(contents.records, [record(1), record(2)]);
        assert_eq!(contents.problems.len(), 1);
        assert!(contents.problems[0].torn_tail);
    }

    #[test]
    fn a_damaged_byte_costs_its_record_only_and_names_its_offset() {
        let bytes = file(&[record(1), record(2), record(3)]);
        let one = (bytes.len() - HEADER_BYTES) / 3;
        let mut damaged = bytes.clone();
        damaged[HEADER_BYTES + one + 20] ^= 0x40;
        let contents = read_file_bytes(&damaged);
        assert_eq!(contents.records, [record(1), record(3)]);
        assert_eq!(
            contents.problems,
            [Problem {
                offset: (HEADER_BYTES + one) as u64,
                what: "damaged record: checksum mismatch".into(),
                torn_tail: false
            }]
        );
        assert_eq!(contents.skipped_bytes, one as u64);
    }

    #[test]
    fn a_foreign_file_or_version_is_refused_by_its_header() {
        assert_eq!(
            read_file_bytes(b"hello, world, this is not a log").problems[0].what,
            HeaderError::Foreign.to_string()
        );
        let mut bytes = file(&[]);
        bytes[8] = 2;
        assert_eq!(decode_header(&bytes), Err(HeaderError::Version(2)));
    }

    #[test]
    fn the_largest_record_fits_its_maximum() {
        let long = Name::from_slice(&[b'x'; NAME_BYTES_MAX]);
        let r = Record {
            route: long.clone(),
            rule: long,
            address: Some("2001:db8::".parse().unwrap()),
            device: Some([1; 16]),
            client_id: Some([1; 16]),
            ..record(1)
        };
        let mut bytes = Vec::new();
        encode_record(&r, &mut bytes);
        assert_eq!(bytes.len(), RECORD_BYTES_MAX);
        assert_eq!(decode_record(&bytes).unwrap().0, r);
    }

    /// `DECISION_LOG_QUEUE_MAX_DEFAULT`'s memory is reckoned at this.
    #[test]
    fn a_queued_record_stays_small() {
        assert!(std::mem::size_of::<Record>() <= 216, "{}", std::mem::size_of::<Record>());
    }

    fn arbitrary_record() -> impl Strategy<Value = Record> {
        let digest = proptest::option::of(any::<[u8; 16]>());
        let name = proptest::collection::vec(b'a'..=b'z', 0..=NAME_BYTES_MAX);
        (
            any::<u64>(),
            0usize..3,
            0usize..4,
            0usize..REASONS_KNOWN,
            (name.clone(), name),
            proptest::option::of(prop_oneof![
                any::<[u8; 4]>().prop_map(IpAddr::from),
                any::<u64>().prop_map(|hi| IpAddr::from(Ipv6Addr::from(u128::from(hi) << 64))),
            ]),
            [digest.clone(), digest.clone(), digest.clone(), digest.clone(), digest.clone(), digest],
        )
            .prop_map(|(time_us, op, decision, reason, (route, rule), address, d)| Record {
                time_us,
                op: [Op::Check, Op::Report(Outcome::Success), Op::Report(Outcome::Failure)][op],
                decision: DECISIONS[decision],
                reason: REASONS[reason],
                route: Name::from_vec(route),
                rule: Name::from_vec(rule),
                address,
                account: d[0],
                device: d[1],
                tenant: d[2],
                client_id: d[3],
                password_digest: d[4],
                password_tag: d[5],
            })
    }

    proptest! {
        #[test]
        fn any_record_round_trips(records in proptest::collection::vec(arbitrary_record(), 0..20)) {
            let bytes = file(&records);
            let contents = read_file_bytes(&bytes);
            prop_assert!(contents.problems.is_empty());
            prop_assert_eq!(contents.records, records);
        }

        #[test]
        fn any_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            fuzz_decision_log(&data);
        }

        #[test]
        fn any_single_damaged_byte_loses_at_most_its_record(
            records in proptest::collection::vec(arbitrary_record(), 1..8),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let mut bytes = file(&records);
            let i = HEADER_BYTES + at.index(bytes.len() - HEADER_BYTES);
            bytes[i] ^= flip;
            let contents = read_file_bytes(&bytes);
            prop_assert!(!contents.problems.is_empty());
            prop_assert!(contents.records.len() + 1 >= records.len(), "{} of {}", contents.records.len(), records.len());
        }
    }
}
