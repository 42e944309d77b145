//! A breaker per Redis Cluster node. The store's breaker opens only when
//! the whole store is away; one dead or frozen master leaves the others
//! serving, and without a breaker of its own every request on its slots
//! would wait the timeout, and every batch holding one of them its
//! deadline. A node's breaker opens after `breaker_failures` failed calls
//! in a row; its slots are then answered on this host at once, and one
//! call in each probe delay (doubling to `probe_max_ms`) is let through to
//! see whether it is back.
//!
//! Which node serves a slot is read from `CLUSTER SLOTS` (at connect and
//! every heartbeat): the driver routes by its own map, but a slot's owner
//! only changes at a failover or a resharding, and a stale entry costs at
//! most one probe delay of answers on this host.

use std::collections::HashMap;

use redis::Value;

/// Redis Cluster's hash slots.
const SLOTS: usize = 16384;
/// A slot no node was seen serving: always asked.
const NO_NODE: u16 = u16::MAX;

/// One node's breaker. Pure: the time is passed in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeBreaker {
    failures_in_a_row: u32,
    /// 0 while closed; while open, when the next call may go (a probe).
    open_until_us: u64,
    probe_delay_us: u64,
    /// Since when the node has owed a reply (the first batch sent to it
    /// after its last reply), 0 none: a late call on its slots is busy
    /// while that is under `busy_max` (`breaker::replying`). The node's
    /// own, so a frozen node's late calls are lost while the others reply.
    owing_since_us: u64,
}

impl NodeBreaker {
    fn new(probe_delay_min_us: u64) -> NodeBreaker {
        NodeBreaker { failures_in_a_row: 0, open_until_us: 0, probe_delay_us: probe_delay_min_us, owing_since_us: 0 }
    }

    pub fn is_open(&self) -> bool {
        self.open_until_us > 0
    }

    /// Whether a call may go to the node now. While open, the first call
    /// after each probe delay goes, and the delay doubles, to the cap.
    fn admit(&mut self, now_us: u64, probe_delay_max_us: u64) -> bool {
        if !self.is_open() {
            return true;
        }
        if now_us < self.open_until_us {
            return false;
        }
        self.probe_delay_us = (self.probe_delay_us * 2).min(probe_delay_max_us);
        self.open_until_us = now_us + self.probe_delay_us;
        true
    }

    /// True if this closed the breaker.
    fn succeeded(&mut self, probe_delay_min_us: u64) -> bool {
        let was_open = self.is_open();
        *self = NodeBreaker { owing_since_us: self.owing_since_us, ..NodeBreaker::new(probe_delay_min_us) };
        was_open
    }

    /// True if this opened the breaker.
    fn failed(&mut self, now_us: u64, failures_to_open: u32) -> bool {
        self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
        if self.is_open() || self.failures_in_a_row < failures_to_open {
            return false;
        }
        self.open_until_us = now_us + self.probe_delay_us;
        true
    }
}

/// What a call's outcome did to its node's breaker, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    None,
    Opened(String),
    Closed(String),
}

/// The slot map and a breaker per node.
pub struct Nodes {
    failures_to_open: u32,
    probe_delay_min_us: u64,
    probe_delay_max_us: u64,
    /// Slot -> index into `nodes`; empty until the first map is read.
    owner: Vec<u16>,
    nodes: Vec<(String, NodeBreaker)>,
}

impl Nodes {
    pub fn new(failures_to_open: u32, probe_delay_min_us: u64, probe_delay_max_us: u64) -> Nodes {
        Nodes {
            failures_to_open: failures_to_open.max(1),
            probe_delay_min_us,
            probe_delay_max_us: probe_delay_max_us.max(probe_delay_min_us),
            owner: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn node_of(&self, slot: u16) -> Option<usize> {
        self.owner.get(usize::from(slot)).copied().filter(|&n| n != NO_NODE).map(usize::from)
    }

    /// Whether a call on `slot` may go to its node now.
    pub fn admit(&mut self, slot: u16, now_us: u64) -> bool {
        let max = self.probe_delay_max_us;
        match self.node_of(slot) {
            Some(n) => self.nodes[n].1.admit(now_us, max),
            None => true,
        }
    }

    /// The node serving `slot`, by its address, if known.
    pub fn name_of(&self, slot: u16) -> Option<&str> {
        self.node_of(slot).map(|n| self.nodes[n].0.as_str())
    }

    /// A batch went to `slot`'s node at `now_us`: owed from then, unless
    /// one already is.
    pub fn sent(&mut self, slot: u16, now_us: u64) {
        if let Some(n) = self.node_of(slot) {
            let owing = &mut self.nodes[n].1.owing_since_us;
            if *owing == 0 {
                *owing = now_us;
            }
        }
    }

    /// `slot`'s node replied to a batch: it owes none.
    pub fn replied(&mut self, slot: u16) {
        if let Some(n) = self.node_of(slot) {
            self.nodes[n].1.owing_since_us = 0;
        }
    }

    /// Since when `slot`'s node has owed a reply (0 none); None for a slot
    /// no node was seen serving.
    pub fn owing_since_us(&self, slot: u16) -> Option<u64> {
        self.node_of(slot).map(|n| self.nodes[n].1.owing_since_us)
    }

    /// A call on `slot` was answered (true) or failed.
    pub fn outcome(&mut self, slot: u16, answered: bool, now_us: u64) -> Change {
        let Some(n) = self.node_of(slot) else { return Change::None };
        let (name, breaker) = &mut self.nodes[n];
        if answered {
            if breaker.succeeded(self.probe_delay_min_us) {
                return Change::Closed(name.clone());
            }
        } else if breaker.failed(now_us, self.failures_to_open) {
            return Change::Opened(name.clone());
        }
        Change::None
    }

    /// The nodes whose breaker is open.
    #[cfg(test)]
    pub fn open(&self) -> Vec<&str> {
        self.nodes.iter().filter(|(_, b)| b.is_open()).map(|(name, _)| name.as_str()).collect()
    }

    /// Takes a new slot map (`CLUSTER SLOTS`'s reply). A node that was in
    /// the old map keeps its breaker; a node no longer serving slots is
    /// forgotten. An unreadable reply changes nothing.
    pub fn remap(&mut self, reply: &Value) -> Result<(), &'static str> {
        let ranges = parse_slots(reply)?;
        let mut owner = vec![NO_NODE; SLOTS];
        let mut nodes: Vec<(String, NodeBreaker)> = Vec::new();
        let mut index: HashMap<String, u16> = HashMap::new();
        for (start, end, name) in ranges {
            let n = match index.get(&name) {
                Some(&n) => n,
                None => {
                    let n = u16::try_from(nodes.len()).ok().filter(|&n| n != NO_NODE).ok_or("too many nodes")?;
                    nodes.push((name.clone(), NodeBreaker::new(self.probe_delay_min_us)));
                    index.insert(name, n);
                    n
                }
            };
            owner[usize::from(start)..=usize::from(end)].fill(n);
        }
        // A node that was in the old map keeps its breaker.
        for (name, breaker) in self.nodes.drain(..) {
            if let Some(&n) = index.get(&name) {
                nodes[usize::from(n)].1 = breaker;
            }
        }
        self.owner = owner;
        self.nodes = nodes;
        Ok(())
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, ...], replicas...], ...]`
/// as (start, end, "host:port") of each range's master.
fn parse_slots(reply: &Value) -> Result<Vec<(u16, u16, String)>, &'static str> {
    let Value::Array(ranges) = reply else { return Err("CLUSTER SLOTS is not an array") };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return Err("a slot range is not an array") };
        let slot = |v: Option<&Value>| match v {
            Some(Value::Int(i)) => u16::try_from(*i).ok().filter(|&s| usize::from(s) < SLOTS),
            _ => None,
        };
        let (Some(start), Some(end)) = (slot(fields.first()), slot(fields.get(1))) else {
            return Err("a slot range's bounds are not slots");
        };
        if start > end {
            return Err("a slot range ends before it starts");
        }
        let Some(Value::Array(master)) = fields.get(2) else { return Err("a slot range has no master") };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err("a master's host is not a string"),
        };
        let Some(Value::Int(port)) = master.get(1) else { return Err("a master's port is not an integer") };
        out.push((start, end, format!("{host}:{port}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    fn three() -> Value {
        Value::Array(vec![range(0, 5460, 7000), range(5461, 10922, 7001), range(10923, 16383, 7002)])
    }

    #[test]
    fn a_node_opens_after_the_failures_in_a_row_and_only_its_slots_stop_being_asked() {
        let mut nodes = Nodes::new(3, 100, 1000);
        nodes.remap(&three()).unwrap();
        assert_eq!(nodes.name_of(6000), Some("127.0.0.1:7001"));
        assert_eq!(nodes.outcome(6000, false, 10), Change::None);
        assert_eq!(nodes.outcome(6001, false, 11), Change::None);
        assert_eq!(nodes.outcome(6002, true, 12), Change::None, "a success starts the count again");
        assert_eq!(nodes.outcome(6000, false, 13), Change::None);
        assert_eq!(nodes.outcome(6000, false, 14), Change::None);
        assert_eq!(nodes.outcome(10000, false, 15), Change::Opened("127.0.0.1:7001".into()));
        assert_eq!(nodes.open(), ["127.0.0.1:7001"]);
        assert!(!nodes.admit(5461, 16), "its slots are answered here");
        assert!(nodes.admit(0, 16) && nodes.admit(16383, 16), "the other nodes' slots are asked");
        assert!(nodes.admit(7000, 115), "one probe after the delay");
        assert!(!nodes.admit(7000, 116), "and only one");
        assert!(!nodes.admit(7000, 314));
        assert!(nodes.admit(7000, 315), "the next after twice the delay");
        assert_eq!(nodes.outcome(7000, true, 316), Change::Closed("127.0.0.1:7001".into()));
        assert!(nodes.admit(7000, 317));
        assert!(nodes.open().is_empty());
    }

    /// One node's replies make its own late calls busy, not another's: a
    /// frozen node's slots still go to the shares.
    #[test]
    fn a_reply_is_its_nodes_alone() {
        let mut nodes = Nodes::new(1, 100, 1000);
        nodes.sent(0, 40);
        assert_eq!(nodes.owing_since_us(0), None, "no map yet: no node to ask");
        nodes.remap(&three()).unwrap();
        nodes.sent(100, 50);
        nodes.sent(100, 55);
        let each = (nodes.owing_since_us(5460), nodes.owing_since_us(5461), nodes.owing_since_us(16383));
        assert_eq!(each, (Some(50), Some(0), Some(0)), "owed since the first batch unanswered");
        assert_eq!(nodes.outcome(0, false, 60), Change::Opened("127.0.0.1:7000".into()));
        assert_eq!(nodes.outcome(0, true, 70), Change::Closed("127.0.0.1:7000".into()));
        assert_eq!(nodes.owing_since_us(0), Some(50), "a breaker closing keeps it");
        nodes.remap(&Value::Array(vec![range(0, 16383, 7000)])).unwrap();
        assert_eq!(nodes.owing_since_us(16383), Some(50), "a node kept by a new map keeps it");
        nodes.replied(16383);
        assert_eq!(nodes.owing_since_us(0), Some(0), "a reply: owes none");
    }

    #[test]
    fn probe_delays_double_to_the_cap() {
        let mut b = NodeBreaker::new(100);
        assert!(b.failed(0, 1));
        let mut admitted = Vec::new();
        for now in 0..2_000 {
            if b.admit(now, 350) {
                admitted.push(now);
            }
        }
        assert_eq!(admitted, [100, 300, 650, 1000, 1350, 1700]);
    }

    #[test]
    fn a_new_map_keeps_the_breakers_of_the_nodes_it_keeps() {
        let mut nodes = Nodes::new(1, 100, 1000);
        nodes.remap(&three()).unwrap();
        assert_eq!(nodes.outcome(0, false, 1), Change::Opened("127.0.0.1:7000".into()));
        // A resharding: 7002 takes 7000's slots, 7001 keeps its own.
        nodes.remap(&Value::Array(vec![range(0, 5460, 7002), range(5461, 10922, 7001)])).unwrap();
        assert!(nodes.admit(0, 2), "7002's breaker is closed");
        assert!(nodes.open().is_empty(), "7000 serves nothing now: forgotten");
        assert!(nodes.admit(16000, 2), "a slot nobody serves is asked (the driver answers for it)");
        nodes.remap(&Value::Array(vec![range(0, 16383, 7002)])).unwrap();
        assert_eq!(nodes.outcome(1, false, 3), Change::Opened("127.0.0.1:7002".into()));
        nodes.remap(&Value::Array(vec![range(0, 16383, 7002)])).unwrap();
        assert_eq!(nodes.open(), ["127.0.0.1:7002"], "kept open across a refresh");
    }

    #[test]
    fn replies_that_are_not_a_slot_map_change_nothing() {
        let mut nodes = Nodes::new(1, 100, 1000);
        nodes.remap(&three()).unwrap();
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(0, 16384, 7000)]),
            Value::Array(vec![range(9, 3, 7000)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(1), Value::Int(2)])]),
        ] {
            assert!(nodes.remap(&bad).is_err(), "{bad:?}");
            assert_eq!(nodes.name_of(0), Some("127.0.0.1:7000"), "the old map stands");
        }
        // Before any map, every slot is asked.
        let mut fresh = Nodes::new(1, 100, 1000);
        assert!(fresh.admit(0, 0));
        assert_eq!(fresh.outcome(0, false, 0), Change::None);
    }
}
