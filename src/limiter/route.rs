//! A route's rules and the tables behind them, as the limiter holds them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::shards::SharedTable;
use crate::activity::counters::RouteCounters;
use crate::config::{ByClass, DetectorSet, DeviceScope, FailPolicy, RateLimit, Rung};
use crate::expiring::{ExpiringMap, Slot};
use crate::failure_window::{FailureWindowTable, WindowSpec};
use crate::gcra::GcraTable;
use crate::keys::{Component, Key};

/// A rule's table. A failure rule's `spec` is also held by each shard's
/// table, which needs it for its own arithmetic; this copy is the same value
/// (both set from one `WindowSpec` in `build_rule`, on build and reload),
/// read without taking a shard lock (the ladder's cool-down, status,
/// restore).
pub(super) enum Table {
    Rate {
        rate: RateLimit,
        by_class: ByClass<Option<RateLimit>>,
        shards: SharedTable<GcraTable>,
    },
    Failures {
        spec: WindowSpec,
        cleared_by_success: bool,
        shards: SharedTable<FailureWindowTable>,
    },
    /// Refuses while the subject is flagged by one of `detectors`; holds
    /// nothing but its ladder (`Rule::escalation`).
    Signal {
        detectors: DetectorSet,
        window_us: u64,
    },
}

#[derive(Default)]
pub(super) struct RuleCounters {
    pub(super) refused: AtomicU64,
    pub(super) would_refuse: AtomicU64,
}

pub(super) struct Rule {
    pub(super) name: String,
    /// `route/rule`: how the state file names this rule's entries.
    pub(super) id: Arc<str>,
    /// A 16-bit digest of `id`: which rule a known lockout belongs to, in
    /// memory and in the state file. Not the rule's index, which a reload
    /// that reorders or adds rules would change.
    pub(super) tag: u16,
    pub(super) key: Vec<Component>,
    pub(super) monitor: bool,
    pub(super) responses: Vec<Rung>,
    pub(super) required: bool,
    pub(super) devices: DeviceScope,
    /// A rate or failure rule keyed on the source (`prefix`, alone or with
    /// other components): an exempt source skips it (`exemptions.rs`).
    pub(super) exemptible: bool,
    pub(super) table: Table,
    /// Refusals per key within a cool-down: the ladder's position.
    pub(super) escalation: SharedTable<ExpiringMap<u16>>,
    pub(super) counters: Arc<RuleCounters>,
    /// In shared mode, a global rule's whole limit, which the store
    /// enforces for every host; `table` then holds this host's degraded
    /// share, ceil(limit / hosts), used while the store cannot answer.
    pub(super) global: Option<Full>,
}

/// A global rule's limit across every host.
#[derive(Clone, Copy)]
pub(super) enum Full {
    Failures(WindowSpec),
    Rate { rate: RateLimit, by_class: ByClass<Option<RateLimit>> },
}

impl Rule {
    /// How long a key's escalation lasts after its last refusal.
    pub(super) fn cool_down_us(&self) -> u64 {
        match &self.table {
            Table::Rate { rate, .. } => rate.period_us,
            Table::Failures { spec, .. } => spec.window_us,
            Table::Signal { window_us, .. } => *window_us,
        }
    }
}

pub(super) struct KnownDevices {
    pub(super) ttl_us: u64,
    /// Each device's account tag (what its store name needs, to teach a
    /// store that lost its data: `Limiter::lessons`); 0 for one put back
    /// from the state file, whose rows do not keep it, until her next
    /// login on it.
    pub(super) shards: SharedTable<ExpiringMap<u64>>,
    pub(super) per_account_max: u16,
    /// New devices made known per account (by account tag), expiring a TTL
    /// after the account's last one.
    pub(super) per_account: SharedTable<ExpiringMap<u16>>,
}

impl KnownDevices {
    /// Remembers (account, device) after a success: refreshes a known one;
    /// makes a new one known only while the account is under its cap.
    pub(super) fn remember(&self, key: Key, now_us: u64) {
        let slot = Slot { expires_us: now_us + self.ttl_us, value: key.account_tag };
        {
            let mut devices = self.shards.of(key);
            if devices.get(key.tuple, now_us).is_some() {
                devices.set(key.tuple, slot, now_us);
                return;
            }
        }
        let admitted = self.per_account.of_bits(key.account_tag).update(key.account_tag, now_us, |count| {
            let made = count.map_or(0, |c| c.value);
            if made >= self.per_account_max {
                return (count, false);
            }
            (Some(Slot { expires_us: now_us + self.ttl_us, value: made + 1 }), true)
        });
        if admitted {
            self.shards.of(key).set(key.tuple, slot, now_us);
        }
    }
}

/// The last few wrong-password digests per (account, source prefix).
pub(super) struct RecentPasswords {
    pub(super) remembered: usize,
    pub(super) ttl_us: u64,
    pub(super) shards: SharedTable<ExpiringMap<[u32; 4]>>,
}

pub(super) struct Route {
    pub(super) name: String,
    pub(super) fail_policy: FailPolicy,
    pub(super) rules: Vec<Rule>,
    pub(super) known_devices: Option<KnownDevices>,
    pub(super) recent_passwords: Option<RecentPasswords>,
    /// Shared mode: keys the store said are locked, each with its rule's
    /// tag, its account and the instant (this host's clock) the lockout
    /// ends, so a known lockout is refused from memory without a round
    /// trip, listed, and cleared by an account-wide unlock without the
    /// store's index.
    pub(super) known_lockouts: Option<SharedTable<ExpiringMap<KnownLockout>>>,
    /// Shared mode: keys the store's last word showed spent, refused to
    /// a check it does not answer in time (`spent_keys.rs`).
    pub(super) spent_keys: Option<SharedTable<ExpiringMap<super::spent_keys::Spent>>>,
    /// Shared mode: failures this host's reports counted in the store on a
    /// global failure key (`spent_keys.rs`).
    pub(super) store_counted: Option<SharedTable<ExpiringMap<super::spent_keys::StoreCounted>>>,
    /// The route has a signal rule: its reports feed spray detection.
    pub(super) feeds_signals: bool,
    /// The tenant digest (64 bits) the signals use for this route's
    /// requests that name no tenant.
    pub(super) pseudo_tenant: u64,
    /// Verdicts given on this route, for the operator's view.
    pub(super) activity: Arc<RouteCounters>,
}

/// A known lockout's value: the rule's tag, the key's account tag (0
/// when not known: a lockout restored from the state file, which keeps the
/// tag only), and when this host learned it (0 restored), so an unlock
/// replayed from the store's log forgets only lockouts older than itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KnownLockout {
    pub(super) rule: u16,
    pub(super) account_tag: u64,
    pub(super) learned_us: u64,
}
