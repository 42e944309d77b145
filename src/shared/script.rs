//! The operations `decide.lua` runs, as the daemon builds them, and their
//! replies as it reads them. A reply is read with bounds checked at every
//! step: a store that answers something else (another program's script,
//! a damaged value) gives an error, never a panic.

use redis::Value;

/// The script, compiled in: every host runs the same bytes, so the SHA the
/// store caches is the same for all of them.
pub const SCRIPT: &str = include_str!("decide.lua");

/// One operation of a batch: its kind letter, its arguments and its keys.
/// The script finds the next op from the counts sent before each, so an
/// op that stops early (a bad value) cannot misalign the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Op {
    pub kind: u8,
    pub args: Vec<String>,
    pub keys: Vec<String>,
}

impl Op {
    fn new(kind: u8) -> Op {
        Op { kind, args: Vec::new(), keys: Vec::new() }
    }

    fn arg(&mut self, v: impl ToString) -> &mut Op {
        self.args.push(v.to_string());
        self
    }

    /// A check: `rules` failure and rate rules, each with its key.
    pub fn check(rules: &[CheckRule]) -> Op {
        let mut op = Op::new(b'C');
        op.arg(rules.len());
        for rule in rules {
            match *rule {
                CheckRule::Device { ref key } => {
                    op.arg("d");
                    op.keys.push(key.clone());
                }
                CheckRule::Failures { ref key, scope, window_us, threshold, timeout_us, monitor } => {
                    op.arg("f").arg(scope).arg(window_us).arg(threshold).arg(timeout_us).arg(monitor as u8);
                    op.keys.push(key.clone());
                }
                CheckRule::Rate { ref key, scope, interval_us, tolerance_us, monitor } => {
                    op.arg("g").arg(scope).arg(interval_us).arg(tolerance_us).arg(monitor as u8);
                    op.keys.push(key.clone());
                }
            }
        }
        op
    }

    pub fn report(rules: &[ReportRule]) -> Op {
        let mut op = Op::new(b'R');
        op.arg(rules.len());
        for rule in rules {
            match *rule {
                ReportRule::Device { ref key } => {
                    op.arg("d");
                    op.keys.push(key.clone());
                }
                ReportRule::Remember { ref key, ref count_key, ttl_us, per_account_max } => {
                    op.arg("D").arg(ttl_us).arg(per_account_max);
                    op.keys.push(key.clone());
                    op.keys.push(count_key.clone());
                }
                ReportRule::Failures { ref key, ref index, scope, window_us, threshold, release, count, clear } => {
                    op.arg(if index.is_some() { "F" } else { "f" }).arg(scope);
                    op.arg(window_us).arg(threshold).arg(release as u8).arg(count as u8).arg(clear as u8);
                    op.keys.push(key.clone());
                    op.keys.extend(index.iter().cloned());
                }
                ReportRule::Rate { ref key, scope } => {
                    op.arg("g").arg(scope);
                    op.keys.push(key.clone());
                }
            }
        }
        op
    }

    /// Gives back one place on each (key, window length).
    pub fn release(places: &[(String, u64)]) -> Op {
        let mut op = Op::new(b'X');
        op.arg(places.len());
        for (key, window_us) in places {
            op.arg(window_us);
            op.keys.push(key.clone());
        }
        op
    }

    pub fn merge(key: String, window_us: u64, threshold: u32, lock_remaining_us: u64, age_us: u64) -> Op {
        let mut op = Op::new(b'M');
        op.arg(window_us).arg(threshold).arg(lock_remaining_us).arg(age_us);
        op.keys.push(key);
        op
    }

    /// Unlocks one entry, or with `indexed` every entry an account's index
    /// lists; each unlocked key is published on `channel`.
    pub fn unlock(key: String, window_us: u64, indexed: bool, channel: &str) -> Op {
        let mut op = Op::new(b'U');
        op.arg(window_us).arg(indexed as u8).arg(channel);
        op.keys.push(key);
        op
    }

    pub fn heartbeat(key: String, host: &str, ttl_us: u64) -> Op {
        let mut op = Op::new(b'H');
        op.arg(host).arg(ttl_us);
        op.keys.push(key);
        op
    }

    pub fn join(key: String, fingerprint: &str) -> Op {
        let mut op = Op::new(b'J');
        op.arg(fingerprint);
        op.keys.push(key);
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
        /// the account and something else.
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
/// keys, then ARGV.
pub fn batch_command(sha: &str, ops: &[&Op]) -> redis::Cmd {
    batch_command_of("EVALSHA", sha, ops)
}

/// The same batch as EVAL with the script's text: a Cluster node that
/// answered NOSCRIPT caches the script by running it, so the reload reaches
/// exactly the node that lacked it (the cluster client routes EVAL by key).
pub fn batch_eval_command(ops: &[&Op]) -> redis::Cmd {
    batch_command_of("EVAL", SCRIPT, ops)
}

fn batch_command_of(name: &str, script: &str, ops: &[&Op]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(script).arg(ops.iter().map(|op| op.keys.len()).sum::<usize>());
    for op in ops {
        cmd.arg(&op.keys);
    }
    cmd.arg(ops.len());
    for op in ops {
        cmd.arg(&[op.kind][..]).arg(op.args.len()).arg(op.keys.len()).arg(&op.args);
    }
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
}

/// An op's reply: integers, or the join's strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub ints: Vec<i64>,
    pub strings: Vec<String>,
}

/// Splits a batch's reply into one per op.
pub fn split_batch(value: Value, ops: usize) -> Result<Vec<Result<Reply, ReplyError>>, ReplyError> {
    let Value::Array(items) = value else { return Err(ReplyError::Malformed("not an array")) };
    if items.len() != ops {
        return Err(ReplyError::Malformed("one reply per op"));
    }
    Ok(items.into_iter().map(op_reply).collect())
}

fn op_reply(value: Value) -> Result<Reply, ReplyError> {
    let Value::Array(items) = value else { return Err(ReplyError::Malformed("an op's reply is not an array")) };
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
    match reply.ints.first() {
        Some(&-1) => Err(ReplyError::NotOurs(rule_index(&reply))),
        Some(&-2) => Err(ReplyError::WrongType(rule_index(&reply))),
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
        assert_eq!(op_slot(&Op::check(&[])), Ok(None));
    }

    #[test]
    fn a_batch_lays_out_keys_then_each_ops_counts_and_arguments() {
        let a = Op::release(&[("k1".into(), 5), ("k2".into(), 6)]);
        let b = Op::unlock("k3".into(), 7, false, "ch");
        let cmd = batch_command("sha", &[&a, &b]);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect();
        assert_eq!(
            args,
            ["EVALSHA", "sha", "3", "k1", "k2", "k3", "2", "X", "3", "2", "2", "5", "6", "U", "3", "1", "7", "0", "ch"]
        );
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
