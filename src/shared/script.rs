//! The operations `decide.lua` runs, as the daemon builds them, and their
//! replies as it reads them. A reply is read with bounds checked at every
//! step: a store that answers something else (another program's script,
//! a damaged value) gives an error, never a panic.

use redis::Value;
use smallvec::SmallVec;

/// The script, compiled in: every host runs the same bytes, so the SHA the
/// store caches is the same for all of them.
pub const SCRIPT: &str = include_str!("decide.lua");

/// One operation of a batch: its kind letter, its arguments and its keys.
/// The script finds the next op from the counts sent before each, so an
/// op that stops early (a bad value) cannot misalign the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Op {
    pub kind: u8,
    pub args: Args,
    pub keys: Keys,
    /// A check's keys (a bit each, by index) that name what the requester
    /// chooses, a device cookie or an OAuth client id: no part of its
    /// requester (`HotKeys::enter`), or a guesser would make each guess a
    /// requester of its own. Not sent.
    pub chosen_keys: u64,
}

/// An op's arguments: one packed on the request path, held inline (a
/// request's allocations were a sixth of its cost in shared mode).
pub type Args = SmallVec<[Vec<u8>; 1]>;

/// An op's keys: a login's check names four at most, inline.
pub type Keys = SmallVec<[String; 4]>;

/// A check's rule as its reply lays it out, read back from the check's
/// packed argument (`Op::check_shapes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Device,
    Failures { window_us: u64 },
    Rate,
}

/// Bytes after a check rule's kind letter, as `Op::check` packs them.
const CHECK_FAILURES_BYTES: usize = 1 + 8 + 4 + 8 + 1;
const CHECK_RATE_BYTES: usize = 1 + 8 + 8 + 1;

/// The one argument of a packed op (check, report, release, merge): its
/// numbers little-endian, as the script's `struct.unpack` formats read
/// them (B u8, H u16, I4 u32, i8 i64, c1 a kind letter). One argument in
/// place of a dozen decimal ones is what the store and the driver spend
/// least on, at both ends.
#[derive(Default)]
struct Packed(Vec<u8>);

impl Packed {
    /// Room for a rule count and `rules` rules of at most 27 bytes (a
    /// check's failure rule: kind, scope, window, threshold, timeout,
    /// monitor), so a check or report is one allocation.
    fn with_rules(rules: usize) -> Packed {
        Packed(Vec::with_capacity(1 + 27 * rules))
    }

    fn u8(&mut self, v: u8) -> &mut Packed {
        self.0.push(v);
        self
    }

    fn u16(&mut self, v: u16) -> &mut Packed {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u32(&mut self, v: u32) -> &mut Packed {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A time or length in µs. The script's numbers are doubles: every
    /// value sent is far under 2^53, so it is read exactly.
    fn u64(&mut self, v: u64) -> &mut Packed {
        self.0.extend_from_slice(&(v.min(i64::MAX as u64) as i64).to_le_bytes());
        self
    }

    /// A rule count: the script reads one byte. A route has at most
    /// `RULES_PER_ROUTE_MAX` (16) rules, and an op adds two device keys.
    fn count(&mut self, n: usize) -> &mut Packed {
        self.u8(u8::try_from(n).expect("at most RULES_PER_ROUTE_MAX rules and two device keys"))
    }
}

impl Op {
    /// An op on one key, its arguments added with `arg`.
    fn keyed(kind: u8, key: String) -> Op {
        Op { kind, keys: smallvec::smallvec![key], ..Op::default() }
    }

    fn arg(mut self, v: impl ToString) -> Op {
        self.args.push(v.to_string().into_bytes());
        self
    }

    fn packed(kind: u8, packed: Packed, keys: Keys) -> Op {
        Op { kind, args: smallvec::smallvec![packed.0], keys, chosen_keys: 0 }
    }

    /// A check: `rules` failure and rate rules, each with its key (moved
    /// into the op, not copied).
    pub fn check<R: IntoIterator<Item = CheckRule, IntoIter: ExactSizeIterator>>(rules: R) -> Op {
        let rules = rules.into_iter();
        let mut p = Packed::with_rules(rules.len());
        let mut keys = Keys::with_capacity(rules.len());
        p.count(rules.len());
        for rule in rules {
            match rule {
                CheckRule::Device { key } => {
                    p.u8(b'd');
                    keys.push(key);
                }
                CheckRule::Failures { key, scope, window_us, threshold, timeout_us, monitor } => {
                    p.u8(b'f').u8(scope).u64(window_us).u32(threshold).u64(timeout_us).u8(monitor as u8);
                    keys.push(key);
                }
                CheckRule::Rate { key, scope, interval_us, tolerance_us, monitor } => {
                    p.u8(b'g').u8(scope).u64(interval_us).u64(tolerance_us).u8(monitor as u8);
                    keys.push(key);
                }
            }
        }
        Op::packed(b'C', p, keys)
    }

    /// A check's rules in order, read back from its packed argument (only
    /// when a reply comes late, so a check carries nothing more).
    fn check_shapes(&self) -> Result<Vec<Shape>, ReplyError> {
        let short = ReplyError::Malformed("a check's argument is short");
        let arg = self.args.first().ok_or(short.clone())?;
        let (&count, mut rest) = arg.split_first().ok_or(short.clone())?;
        let mut shapes = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let (&kind, after) = rest.split_first().ok_or(short.clone())?;
            let (shape, len) = match kind {
                b'd' => (Shape::Device, 0),
                b'f' => {
                    let window = after.get(1..9).ok_or(short.clone())?;
                    let window_us = i64::from_le_bytes(window.try_into().expect("8 bytes")) as u64;
                    (Shape::Failures { window_us }, CHECK_FAILURES_BYTES)
                }
                b'g' => (Shape::Rate, CHECK_RATE_BYTES),
                _ => return Err(ReplyError::Malformed("a check rule of an unknown kind")),
            };
            rest = after.get(len..).ok_or(short.clone())?;
            shapes.push(shape);
        }
        Ok(shapes)
    }

    /// Gives back the places this check took, read from its reply: one on
    /// each failure rule the script applied and did not refuse, if it
    /// admitted. None when it took none. A rule the device's scope skipped
    /// took no place, so it gives none back (that place would be another
    /// attempt's).
    pub fn release_taken(&self, reply: &Reply) -> Result<Option<Op>, ReplyError> {
        let mut ints = Ints::new(reply);
        if self.kind != b'C' || !ints.flag()? {
            return Ok(None);
        }
        ints.next()?; // the store's time
        let mut places = Vec::new();
        for (key, shape) in self.keys.iter().zip(self.check_shapes()?) {
            if shape == Shape::Device {
                continue;
            }
            let code = ints.next()?;
            if code == 2 {
                continue; // skipped: nothing follows
            }
            match shape {
                Shape::Failures { window_us } => {
                    if code == 0 {
                        places.push((key.clone(), window_us));
                    }
                    StoreEntry::read(&mut ints)?;
                }
                Shape::Rate => {
                    ints.next()?;
                }
                Shape::Device => unreachable!("passed over above"),
            }
        }
        Ok((!places.is_empty()).then(|| Op::release(&places)))
    }

    /// A report: its rules, each with its keys (moved into the op).
    pub fn report<R: IntoIterator<Item = ReportRule, IntoIter: ExactSizeIterator>>(rules: R) -> Op {
        let rules = rules.into_iter();
        let mut p = Packed::with_rules(rules.len());
        let mut keys = Keys::with_capacity(rules.len() + 2);
        p.count(rules.len());
        for rule in rules {
            match rule {
                ReportRule::Device { key } => {
                    p.u8(b'd');
                    keys.push(key);
                }
                ReportRule::Remember { key, count_key, ttl_us, per_account_max } => {
                    p.u8(b'D').u64(ttl_us).u16(per_account_max);
                    keys.push(key);
                    keys.push(count_key);
                }
                ReportRule::Failures { key, index, scope, window_us, threshold, release, count, clear } => {
                    p.u8(if index.is_some() { b'F' } else { b'f' }).u8(scope);
                    p.u64(window_us).u32(threshold).u8(release as u8).u8(count as u8).u8(clear as u8);
                    keys.push(key);
                    keys.extend(index);
                }
                ReportRule::Rate { key, scope } => {
                    p.u8(b'g').u8(scope);
                    keys.push(key);
                }
            }
        }
        Op::packed(b'R', p, keys)
    }

    /// Gives back one place on each (key, window length).
    pub fn release(places: &[(String, u64)]) -> Op {
        let mut p = Packed::default();
        p.u16(u16::try_from(places.len()).expect("at most RULES_PER_ROUTE_MAX rules"));
        for (_, window_us) in places {
            p.u64(*window_us);
        }
        Op::packed(b'X', p, places.iter().map(|(key, _)| key.clone()).collect())
    }

    /// A lockout taken while degraded, written back; `index`: the
    /// account's index of the rule's entries, which an account-wide unlock
    /// reads, for a rule keyed on the account and more.
    pub fn merge(
        key: String,
        index: Option<String>,
        window_us: u64,
        threshold: u32,
        lock_remaining_us: u64,
        age_us: u64,
    ) -> Op {
        let mut p = Packed::default();
        p.u64(window_us).u32(threshold).u64(lock_remaining_us).u64(age_us).u8(index.is_some() as u8);
        Op::packed(b'M', p, std::iter::once(key).chain(index).collect())
    }

    /// Unlocks one entry, or with `indexed` every entry an account's index
    /// lists; the script publishes each unlocked key on `channel`.
    pub fn unlock(key: String, window_us: u64, indexed: bool, channel: &str) -> Op {
        Op::keyed(b'U', key).arg(window_us).arg(indexed as u8).arg(channel)
    }

    pub fn heartbeat(key: String, host: &str, ttl_us: u64) -> Op {
        Op::keyed(b'H', key).arg(host).arg(ttl_us)
    }

    /// Reads the recorded fingerprint, writing nothing.
    pub fn read_fingerprint(key: String) -> Op {
        Op::keyed(b'F', key)
    }

    /// Joins as `host` (claimed for `ttl_us` in `{key}:claims`), having last
    /// read the record made at `seen_since` ("" if never); records the
    /// fingerprint if none is only if `create`.
    pub fn join(key: String, fingerprint: &str, host: &str, ttl_us: u64, seen_since: &str, create: bool) -> Op {
        let claims = format!("{key}:claims");
        let mut op = Op::keyed(b'J', key).arg(fingerprint).arg(host).arg(ttl_us).arg(seen_since).arg(u8::from(create));
        op.keys.push(claims);
        op
    }
}

/// A rule's device scope as the script reads it: 0 applies always, 1 only
/// to a device no host has seen log in, 2 only to a known one.
pub type Scope = u8;

#[derive(Clone, Debug)]
pub enum CheckRule {
    /// First, if any: the (account, device) key the scopes are decided by.
    Device {
        key: String,
    },
    Failures {
        key: String,
        scope: Scope,
        window_us: u64,
        threshold: u32,
        timeout_us: u64,
        monitor: bool,
    },
    Rate {
        key: String,
        scope: Scope,
        interval_us: u64,
        tolerance_us: u64,
        monitor: bool,
    },
}

#[derive(Clone, Debug)]
pub enum ReportRule {
    /// First, if any: the (account, device) key the scopes are decided by.
    Device {
        key: String,
    },
    /// Last, on a success: the device becomes known to every host, while
    /// the account has made fewer than `per_account_max` known within
    /// `ttl_us` (counted at `count_key`).
    Remember {
        key: String,
        count_key: String,
        ttl_us: u64,
        per_account_max: u16,
    },
    Failures {
        key: String,
        /// The account's index of this rule's entries, for a rule keyed on
        /// the account and something else, when the failure is counted
        /// (nothing else writes it).
        index: Option<String>,
        window_us: u64,
        threshold: u32,
        release: bool,
        count: bool,
        clear: bool,
        scope: Scope,
    },
    Rate {
        key: String,
        scope: Scope,
    },
}

/// The arguments of one EVALSHA for a batch of ops: the key count, the
/// keys, then ARGV, whose last argument is `checks_until_us`: the store's
/// time after which a check of the batch takes no place (0: no limit).
pub fn batch_command(sha: &str, ops: &[&Op], checks_until_us: u64) -> redis::Cmd {
    batch_command_of("EVALSHA", sha, ops, checks_until_us)
}

/// The same batch as EVAL with the script's text: a Cluster node that
/// answered NOSCRIPT caches the script by running it, so the reload reaches
/// exactly the node that lacked it (the cluster client routes EVAL by key).
pub fn batch_eval_command(ops: &[&Op], checks_until_us: u64) -> redis::Cmd {
    batch_command_of("EVAL", SCRIPT, ops, checks_until_us)
}

fn batch_command_of(name: &str, script: &str, ops: &[&Op], checks_until_us: u64) -> redis::Cmd {
    // Sized once: a batch's dozens of arguments would otherwise grow both
    // of the command's buffers several times.
    let args = 5 + ops.iter().map(|op| 3 + op.keys.len() + op.args.len()).sum::<usize>();
    let bytes = name.len()
        + script.len()
        + 64
        + ops
            .iter()
            .map(|op| 16 + op.keys.iter().map(String::len).chain(op.args.iter().map(Vec::len)).sum::<usize>())
            .sum::<usize>();
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg(name).arg(script).arg(ops.iter().map(|op| op.keys.len()).sum::<usize>());
    for op in ops {
        for key in &op.keys {
            cmd.arg(key);
        }
    }
    cmd.arg(ops.len());
    for op in ops {
        cmd.arg(&[op.kind][..]).arg(op.args.len()).arg(op.keys.len());
        for arg in &op.args {
            cmd.arg(&arg[..]);
        }
    }
    cmd.arg(checks_until_us);
    cmd
}

/// Redis Cluster's hash slot of a key: CRC16/XMODEM of its hash tag (the
/// bytes between the first `{` and the next `}`, if not empty), else of the
/// whole key, modulo 16384.
pub fn hash_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key);
    crc16_xmodem(tagged) % 16384
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The one slot all of an op's keys hash to; None for a keyless op, and
/// Err for an op whose keys span slots (Redis Cluster refuses it whole,
/// CROSSSLOT, so it must not ride with others).
pub fn op_slot(op: &Op) -> Result<Option<u16>, ()> {
    let mut slots = op.keys.iter().map(|k| hash_slot(k.as_bytes()));
    let Some(first) = slots.next() else { return Ok(None) };
    if slots.all(|s| s == first) {
        Ok(Some(first))
    } else {
        Err(())
    }
}

/// Why a reply could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The op's rule (1-based) holds a value tollgate did not write.
    #[error("rule {0} holds a value tollgate did not write")]
    NotOurs(usize),
    /// The op's rule holds a key of another type.
    #[error("rule {0} holds a key of another type")]
    WrongType(usize),
    #[error("the store's reply is not what the script returns: {0}")]
    Malformed(&'static str),
    /// A check the store ran after its host stopped waiting for it: it
    /// took no place (the host could not have given one back).
    #[error("the store ran the check after its host stopped waiting")]
    Expired { store_now: u64 },
}

/// An op's reply: integers, or the join's strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub ints: Vec<i64>,
    pub strings: Vec<String>,
}

/// Splits a batch's reply into one per op: one string for a batch of
/// packed ops only (each op's int64s behind their count, a u16), else one
/// value an op.
pub fn split_batch(value: Value, ops: usize) -> Result<Vec<Result<Reply, ReplyError>>, ReplyError> {
    let items = match value {
        Value::BulkString(bytes) => return split_packed_batch(&bytes, ops),
        Value::Array(items) => items,
        _ => return Err(ReplyError::Malformed("not an array")),
    };
    if items.len() != ops {
        return Err(ReplyError::Malformed("one reply per op"));
    }
    Ok(items.into_iter().map(op_reply).collect())
}

fn split_packed_batch(mut bytes: &[u8], ops: usize) -> Result<Vec<Result<Reply, ReplyError>>, ReplyError> {
    let short = ReplyError::Malformed("a batch's packed reply is short");
    let mut replies = Vec::with_capacity(ops);
    for _ in 0..ops {
        let (count, rest) = bytes.split_first_chunk::<2>().ok_or(short.clone())?;
        let len = usize::from(u16::from_le_bytes(*count)) * 8;
        let ints = rest.get(..len).ok_or(short.clone())?;
        replies.push(checked(Reply { ints: int64s(ints), strings: Vec::new() }));
        bytes = &rest[len..];
    }
    if !bytes.is_empty() {
        return Err(ReplyError::Malformed("one reply per op"));
    }
    Ok(replies)
}

/// Little-endian int64s; `bytes` is whole int64s.
fn int64s(bytes: &[u8]) -> Vec<i64> {
    bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect()
}

fn op_reply(value: Value) -> Result<Reply, ReplyError> {
    let reply = match value {
        // A packed op's reply: its int64s, little-endian.
        Value::BulkString(bytes) => {
            if bytes.len() % 8 != 0 {
                return Err(ReplyError::Malformed("a packed reply is not whole int64s"));
            }
            Reply { ints: int64s(&bytes), strings: Vec::new() }
        }
        Value::Array(items) => {
            let mut reply = Reply { ints: Vec::with_capacity(items.len()), strings: Vec::new() };
            for item in items {
                match item {
                    Value::Int(i) => reply.ints.push(i),
                    Value::BulkString(bytes) => {
                        reply.strings.push(String::from_utf8(bytes).map_err(|_| ReplyError::Malformed("not UTF-8"))?)
                    }
                    Value::SimpleString(s) => reply.strings.push(s),
                    _ => return Err(ReplyError::Malformed("an op's reply holds something else than integers")),
                }
            }
            reply
        }
        _ => return Err(ReplyError::Malformed("an op's reply is not an array")),
    };
    checked(reply)
}

/// An op's reply, or the error its first integer codes.
fn checked(reply: Reply) -> Result<Reply, ReplyError> {
    match reply.ints.first() {
        Some(&-1) => Err(ReplyError::NotOurs(rule_index(&reply))),
        Some(&-2) => Err(ReplyError::WrongType(rule_index(&reply))),
        Some(&-3) => Err(ReplyError::Malformed("the script failed on this op (an argument it could not read)")),
        Some(&-4) => Err(ReplyError::Expired { store_now: reply.ints.get(1).map_or(0, |&t| t.max(0) as u64) }),
        Some(&code) if code < 0 => Err(ReplyError::Malformed("unknown error code")),
        Some(_) => Ok(reply),
        None => Err(ReplyError::Malformed("an empty op reply")),
    }
}

fn rule_index(reply: &Reply) -> usize {
    reply.ints.get(1).map_or(0, |&i| i.max(0) as usize)
}

/// A reader over an op's integers: every read is bounds-checked.
pub struct Ints<'r> {
    ints: &'r [i64],
    at: usize,
}

impl<'r> Ints<'r> {
    pub fn new(reply: &'r Reply) -> Ints<'r> {
        Ints { ints: &reply.ints, at: 0 }
    }

    /// The next integer, not consumed.
    pub fn peek(&self) -> Result<i64, ReplyError> {
        self.ints.get(self.at).copied().ok_or(ReplyError::Malformed("an op's reply is short"))
    }

    pub fn next(&mut self) -> Result<i64, ReplyError> {
        let v = *self.ints.get(self.at).ok_or(ReplyError::Malformed("an op's reply is short"))?;
        self.at += 1;
        Ok(v)
    }

    /// A non-negative integer that fits `u64`.
    pub fn unsigned(&mut self) -> Result<u64, ReplyError> {
        u64::try_from(self.next()?).map_err(|_| ReplyError::Malformed("a negative count or time"))
    }

    pub fn u32(&mut self) -> Result<u32, ReplyError> {
        u32::try_from(self.unsigned()?).map_err(|_| ReplyError::Malformed("a count over 32 bits"))
    }

    pub fn flag(&mut self) -> Result<bool, ReplyError> {
        match self.next()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ReplyError::Malformed("a flag that is not 0 or 1")),
        }
    }
}

/// A failure entry as the store holds it, in the store's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreEntry {
    pub window_us: u64,
    pub window: u32,
    pub previous: u32,
    pub current: u32,
    pub in_flight: u32,
    /// Until the first place in flight lapses (0: none).
    pub first_lapse_in_us: u64,
    /// Until a lockout written back by a host ends (0: none).
    pub lock_remaining_us: u64,
}

impl StoreEntry {
    /// The seven integers `standing` appends.
    pub fn read(ints: &mut Ints<'_>) -> Result<StoreEntry, ReplyError> {
        let window = ints.u32()?;
        let previous = ints.u32()?;
        let current = ints.u32()?;
        let in_flight = ints.u32()?;
        let first_lapse_in_us = ints.unsigned()?;
        let lock_remaining_us = ints.unsigned()?;
        let window_us = ints.unsigned()?;
        if window_us == 0 {
            return Err(ReplyError::Malformed("a window of length 0"));
        }
        Ok(StoreEntry { window_us, window, previous, current, in_flight, first_lapse_in_us, lock_remaining_us })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values from `redis-cli CLUSTER KEYSLOT` on a Redis 7 node.
    #[test]
    fn hash_slots_match_redis_cluster() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3, "the CRC16/XMODEM check value");
        for (key, slot) in [
            ("foo", 12182),
            ("bar", 5061),
            ("hello", 866),
            ("somekey", 11058),
            ("123456789", 12739),
            ("{user1000}.following", 3443),
            ("tg:{00000000deadbeef}:f:login/x:00", 6110),
            ("{}x", 10595),
            ("a{}{b}", 15033),
        ] {
            assert_eq!(hash_slot(key.as_bytes()), slot, "{key}");
        }
        let one = Op::release(&[("tg:{a}:f:x".into(), 1), ("tg:{a}:i:x".into(), 1)]);
        assert_eq!(op_slot(&one), Ok(Some(hash_slot(b"a"))));
        let two = Op::release(&[("tg:{a}:f:x".into(), 1), ("tg:{b}:f:x".into(), 1)]);
        assert_eq!(op_slot(&two), Err(()));
        assert_eq!(op_slot(&Op::check(vec![])), Ok(None));
    }

    #[test]
    fn a_batch_lays_out_keys_then_each_ops_counts_and_arguments() {
        let a = Op::release(&[("k1".into(), 5), ("k2".into(), 6)]);
        let b = Op::unlock("k3".into(), 7, false, "ch");
        let cmd = batch_command("sha", &[&a, &b], 123);
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<cursor>".to_vec(),
            })
            .collect();
        // The release's one argument: its count (u16), then each window
        // (i64), little-endian, as the script's struct.unpack reads them.
        let mut release = vec![2, 0];
        release.extend_from_slice(&5i64.to_le_bytes());
        release.extend_from_slice(&6i64.to_le_bytes());
        let plain = |s: &str| s.as_bytes().to_vec();
        let mut expected: Vec<Vec<u8>> =
            ["EVALSHA", "sha", "3", "k1", "k2", "k3", "2", "X", "1", "2"].iter().map(|s| plain(s)).collect();
        expected.push(release);
        expected.extend(["U", "3", "1", "7", "0", "ch", "123"].iter().map(|s| plain(s)));
        assert_eq!(args, expected);
    }

    #[test]
    fn a_check_packs_each_rules_numbers_in_the_scripts_formats() {
        let op = Op::check(vec![
            CheckRule::Device { key: "d".into() },
            CheckRule::Failures {
                key: "f".into(),
                scope: 1,
                window_us: 900_000_000,
                threshold: 5,
                timeout_us: 30_000_000,
                monitor: true,
            },
            CheckRule::Rate { key: "r".into(), scope: 0, interval_us: 7, tolerance_us: 70, monitor: false },
        ]);
        assert_eq!(op.keys[..], ["d", "f", "r"]);
        let mut want = vec![3, b'd', b'f', 1];
        want.extend_from_slice(&900_000_000i64.to_le_bytes());
        want.extend_from_slice(&5u32.to_le_bytes());
        want.extend_from_slice(&30_000_000i64.to_le_bytes());
        want.extend_from_slice(&[1, b'g', 0]);
        want.extend_from_slice(&7i64.to_le_bytes());
        want.extend_from_slice(&70i64.to_le_bytes());
        want.push(0);
        assert_eq!(op.args[..], [want]);
    }

    #[test]
    fn a_late_check_gives_back_only_the_places_it_took() {
        let failures = |key: &str, window_us| CheckRule::Failures {
            key: key.into(),
            scope: 0,
            window_us,
            threshold: 5,
            timeout_us: 1,
            monitor: false,
        };
        let op = Op::check(vec![
            CheckRule::Device { key: "dev".into() },
            failures("took", 10),
            failures("skipped", 20),
            CheckRule::Rate { key: "rate".into(), scope: 0, interval_us: 1, tolerance_us: 1, monitor: false },
            failures("refused-in-monitor", 30),
        ]);
        let entry = [0, 0, 0, 0, 0, 0, 10];
        let mut ints = vec![1, 1_000];
        ints.push(0);
        ints.extend(entry);
        ints.push(2); // skipped by the device's scope: no place, nothing follows
        ints.extend([0, 999]); // the rate rule: ok, its TAT
        ints.push(1);
        ints.extend(entry);
        let admitted = Reply { ints: ints.clone(), strings: vec![] };
        assert_eq!(op.release_taken(&admitted), Ok(Some(Op::release(&[("took".into(), 10)]))));
        ints[0] = 0;
        let refused = Reply { ints, strings: vec![] };
        assert_eq!(op.release_taken(&refused), Ok(None), "a refused check took nothing");
        let short = Reply { ints: vec![1, 1_000, 0, 0], strings: vec![] };
        assert!(op.release_taken(&short).is_err(), "a short reply is an error, not a guess");
    }

    #[test]
    fn a_packed_reply_is_read_as_int64s_and_a_ragged_one_is_an_error() {
        let mut bytes = Vec::new();
        for v in [1i64, 1_800_000_000_000_000, -7] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let replies = split_batch(Value::Array(vec![Value::BulkString(bytes.clone())]), 1).unwrap();
        assert_eq!(replies[0].as_ref().unwrap().ints, [1, 1_800_000_000_000_000, -7]);
        bytes.pop();
        let ragged = split_batch(Value::Array(vec![Value::BulkString(bytes)]), 1).unwrap();
        assert!(matches!(ragged[0], Err(ReplyError::Malformed(_))));
        let mut theirs = Vec::new();
        theirs.extend_from_slice(&(-1i64).to_le_bytes());
        theirs.extend_from_slice(&2i64.to_le_bytes());
        let theirs = split_batch(Value::Array(vec![Value::BulkString(theirs)]), 1).unwrap();
        assert_eq!(theirs[0], Err(ReplyError::NotOurs(2)));
    }

    /// A batch of packed ops only answers in one string: each op's int64s
    /// behind their count. A count past the end, or bytes after the last
    /// op, fail the batch.
    #[test]
    fn a_batch_answered_in_one_string_is_split_by_each_ops_count() {
        let mut bytes = Vec::new();
        for op in [&[1i64, 7][..], &[-4, 99], &[0]] {
            bytes.extend_from_slice(&(op.len() as u16).to_le_bytes());
            op.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
        }
        let replies = split_batch(Value::BulkString(bytes.clone()), 3).unwrap();
        assert_eq!(replies[0].as_ref().unwrap().ints, [1, 7]);
        assert_eq!(replies[1], Err(ReplyError::Expired { store_now: 99 }));
        assert_eq!(replies[2].as_ref().unwrap().ints, [0]);
        assert!(split_batch(Value::BulkString(bytes.clone()), 4).is_err(), "an op past the end");
        assert!(split_batch(Value::BulkString(bytes[..bytes.len() - 1].to_vec()), 3).is_err(), "short");
        assert!(split_batch(Value::BulkString(bytes.clone()), 2).is_err(), "bytes after the last op");
        bytes.push(0);
        assert!(split_batch(Value::BulkString(bytes), 3).is_err(), "a stray byte");
    }

    /// The script on a real redis-server, in RESP2 and RESP3: each op of
    /// a batch (a release, a check the script cannot read, a check; then a
    /// check and a heartbeat) is answered in its own place.
    /// A redis-server of its own, killed when dropped, and its directory
    /// removed after it.
    struct Killed(std::process::Child, #[allow(dead_code)] tempfile::TempDir);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn real_redis() -> (Killed, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("r.sock");
        let server = std::process::Command::new("redis-server")
            .args(["--port", "0", "--unixsocket", socket.to_str().unwrap(), "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (run `bash scripts/test.sh`, which installs it)");
        let server = Killed(server, dir);
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(started.elapsed() < std::time::Duration::from_secs(5), "redis-server did not listen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        (server, socket)
    }

    #[test]
    fn the_script_answers_every_op_of_a_real_batch_in_its_place() {
        let (_server, socket) = real_redis();
        for protocol in ["", "?protocol=resp3"] {
            let client = redis::Client::open(format!("redis+unix://{}{protocol}", socket.display())).unwrap();
            let mut connection = client.get_connection().unwrap();
            let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query(&mut connection).unwrap();
            let unreadable = Op {
                kind: b'C',
                args: smallvec::smallvec![vec![1]],
                keys: smallvec::smallvec!["tg:{a}:f:login/x:00".into()],
                chosen_keys: 0,
            };
            let ops = [Op::release(&[("tg:{a}:f:login/y:00".into(), 60_000_000)]), unreadable, Op::check(vec![])];
            let ops: Vec<&Op> = ops.iter().collect();
            let value: Value = batch_command(&sha, &ops, 0).query(&mut connection).unwrap();
            let replies = split_batch(value, ops.len()).unwrap();
            assert_eq!(replies[0].as_ref().map(|r| r.ints[0]), Ok(0), "{protocol}: the release");
            assert!(matches!(replies[1], Err(ReplyError::Malformed(_))), "{protocol}: {:?}", replies[1]);
            assert_eq!(replies[2].as_ref().map(|r| r.ints[0]), Ok(1), "{protocol}: a check of no rules admits");
            let ops = [Op::check(vec![]), Op::heartbeat("tg:{hosts}".into(), "host-1", 60_000_000)];
            let ops: Vec<&Op> = ops.iter().collect();
            let value: Value = batch_command(&sha, &ops, 0).query(&mut connection).unwrap();
            let replies = split_batch(value, ops.len()).unwrap();
            assert_eq!(replies[0].as_ref().map(|r| r.ints[0]), Ok(1), "{protocol}: the check");
            assert_eq!(replies[1].as_ref().map(|r| r.ints[0]), Ok(1), "{protocol}: one host heard");
        }
    }

    /// The record of the secret's fingerprint after the store lost its
    /// data: made or taken back only by hosts that read a record before,
    /// whose fingerprint more live hosts claim; never on a tie, never by a
    /// fresh host (which claims nothing either), never back by the one
    /// displaced (its since is the record's); a claim lapses at its TTL.
    #[test]
    fn only_more_hosts_that_saw_the_store_before_it_forgot_take_its_record_back() {
        let (_server, socket) = real_redis();
        let client = redis::Client::open(format!("redis+unix://{}", socket.display())).unwrap();
        let mut connection = client.get_connection().unwrap();
        let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT).query(&mut connection).unwrap();
        let mut join = |fp: &str, host: &str, seen: &str, create: bool, ttl_us: u64| -> (String, String) {
            let op = Op::join("tg:{meta}".into(), fp, host, ttl_us, seen, create);
            let value: Value = batch_command(&sha, &[&op], 0).query(&mut connection).unwrap();
            let reply = split_batch(value, 1).unwrap().remove(0).unwrap();
            (reply.strings[0].clone(), reply.strings[2].clone())
        };
        let flush = || {
            let _: () = redis::cmd("FLUSHALL").query(&mut client.get_connection().unwrap()).unwrap();
        };
        let minute = 60_000_000;
        let (recorded, before) = join("A", "a1", "", true, minute);
        assert_eq!(recorded, "A", "the first join records");
        flush();
        assert_eq!(join("B", "b0", "", false, minute).0, "", "a host refused from the start makes no record");
        let (recorded, since) = join("B", "b1", "", true, minute);
        assert_eq!(recorded, "B", "a stranger reached the emptied store first");
        assert_ne!(since, before);
        assert_eq!(join("A", "a1", &before, true, minute).0, "B", "a tie leaves it (b0 claimed nothing)");
        assert_eq!(join("C", "c1", "", true, minute).0, "B", "a fresh host takes nothing, and claims nothing");
        assert_eq!(join("A", "a2", &before, true, minute), ("A".into(), since.clone()), "two against one");
        for host in ["b2", "b3", "b4"] {
            assert_eq!(join("B", host, &since, true, minute).0, "A", "the displaced stranger saw this record made");
        }
        // Emptied again with the strangers gone: a host refused before, which
        // read a record, makes it again (no one else would).
        flush();
        let (recorded, again) = join("A", "a1", &since, false, minute);
        assert_eq!(recorded, "A");
        assert_ne!(again, since, "a new record: the store lost its data");
        // A claim lapses at its own TTL: the stranger's, of 1 µs, is gone.
        flush();
        assert_eq!(join("B", "b1", "", true, 1).0, "B");
        assert_eq!(join("A", "a1", &again, true, minute).0, "A", "one against none");
    }

    #[test]
    fn replies_that_are_not_the_scripts_are_errors_not_panics() {
        assert!(split_batch(Value::Int(3), 1).is_err());
        assert!(split_batch(Value::Array(vec![]), 1).is_err());
        let bad = split_batch(Value::Array(vec![Value::Int(1)]), 1).unwrap();
        assert!(matches!(bad[0], Err(ReplyError::Malformed(_))));
        let theirs = split_batch(Value::Array(vec![Value::Array(vec![Value::Int(-2), Value::Int(3)])]), 1).unwrap();
        assert_eq!(theirs[0], Err(ReplyError::WrongType(3)));
        let short = Reply { ints: vec![1, 2], strings: vec![] };
        let mut ints = Ints::new(&short);
        ints.next().unwrap();
        assert!(StoreEntry::read(&mut ints).is_err());
        let negative = Reply { ints: vec![-5], strings: vec![] };
        assert!(Ints::new(&negative).unsigned().is_err());
    }
}
