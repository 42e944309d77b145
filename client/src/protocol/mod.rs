//! Every message on the wire. One enum lists every request; one lists every
//! response. PROTOCOL.md documents their bytes; `codec` turns them into frames.
//!
//! Requests borrow their strings from the read buffer, so decoding a check
//! allocates nothing.

use std::borrow::Cow;
use std::net::IpAddr;

use bincode::{BorrowDecode, Decode, Encode};

mod activity;
mod inspection;
mod status;

pub use activity::{
    latency_bucket, latency_bucket_upper_ns, AccountCount, Activity, DecisionCounts, DecisionLogStatus, Distribution,
    HistogramBucket, LatencyHistogram, PrefixCount, RecentLockout, RecentRefusal, RouteActivity, WouldBeRefusal,
    LATENCY_BUCKETS,
};
pub use inspection::{InspectedRule, Inspection};
pub use status::{
    ClassLimit, DetectorStatus, FlaggedSubject, NamedLimit, PersistenceStatus, RouteStatus, RuleStatus, SharedStatus,
    SignalFamilyStatus, SignalsStatus, Status, VerdictCounts,
};

/// The version this client sends (and the newest the daemon speaks).
/// Version byte at the start of every payload; a frame with a version
/// outside `PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION` gets an
/// `unsupported_version` error and the connection survives.
pub const PROTOCOL_VERSION: u8 = 7;
/// The oldest version the daemon still answers, in that version's bytes:
/// auth servers linking an older client keep working across an upgrade.
pub const PROTOCOL_VERSION_MIN: u8 = 1;
/// Longest account, device, tenant or client id accepted. Longer input is
/// refused rather than truncated, so two long names cannot share a key.
pub const IDENTIFIER_BYTES_MAX: usize = 512;
/// The first version whose `Check` and `Report` carry a password tag and
/// whose replies may carry the spray-detection reasons and status.
pub const SIGNALS_VERSION: u8 = 3;

const _: () = assert!(PROTOCOL_VERSION_MIN < SIGNALS_VERSION && SIGNALS_VERSION <= PROTOCOL_VERSION);
/// The first version with the operator's view: the `Activity` and
/// `Samples` requests (what `tollgate top` and `tollgate sample` ask).
pub const ACTIVITY_VERSION: u8 = 4;

const _: () = assert!(SIGNALS_VERSION < ACTIVITY_VERSION && ACTIVITY_VERSION <= PROTOCOL_VERSION);
/// The first version with `Abandon` (an attempt that ends without an
/// outcome gives back the places its check took) and with the reason
/// `attempts_in_flight`.
pub const ABANDON_VERSION: u8 = 5;

const _: () = assert!(ACTIVITY_VERSION < ABANDON_VERSION && ABANDON_VERSION <= PROTOCOL_VERSION);
/// The first version with `Inspect` (an account's standing on each rule of
/// a route, read without changing anything; admin).
pub const INSPECT_VERSION: u8 = 6;

const _: () = assert!(ABANDON_VERSION < INSPECT_VERSION && INSPECT_VERSION <= PROTOCOL_VERSION);
/// The first version with manual bans: `Ban` and `Unban` (admin), the
/// `Banned` reply and the reason `banned`.
pub const BAN_VERSION: u8 = 7;

const _: () = assert!(INSPECT_VERSION < BAN_VERSION && BAN_VERSION <= PROTOCOL_VERSION);

/// Who is attempting what. The daemon derives every key from these fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, BorrowDecode)]
pub struct Subject<'a> {
    /// Address of the TCP peer the auth server saw.
    pub peer: Option<IpAddr>,
    /// The raw X-Forwarded-For header, if any; only trusted hops are honoured.
    pub forwarded_for: Option<&'a str>,
    /// The account as typed (whether or not it exists).
    pub account: Option<&'a str>,
    pub device: Option<&'a str>,
    pub tenant: Option<&'a str>,
    pub client_id: Option<&'a str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Outcome {
    Success,
    Failure,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, BorrowDecode)]
pub enum Request<'a> {
    /// May this attempt proceed? Spends from rate budgets.
    Check {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// The attempt's credential was verified: moves failure counters.
    /// `password_digest` is an optional keyed digest of the attempted
    /// password, computed by the client with its own key (the password never
    /// leaves the auth server): a failure repeating one of the last few
    /// digests for the same (account, source) is not counted again.
    Report {
        route: &'a str,
        subject: Subject<'a>,
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
    },
    Status,
    /// Active lockouts, at most `limit` of them.
    Lockouts {
        limit: u32,
    },
    /// Clears an account's failure entries on a route (admin).
    Unlock {
        route: &'a str,
        account: &'a str,
        source: Option<IpAddr>,
    },
    /// Moves a `--manual-clock` daemon's clock forward (admin).
    ClockAdvance {
        by_ms: u64,
    },
    /// The operator's view (version 4): verdicts by route, check latency,
    /// the top refused prefixes and failing accounts, recent refusals and
    /// lockouts, and attempts per account per day; at most `limit` entries
    /// in each list.
    Activity {
        limit: u32,
    },
    /// A sample of monitor mode's would-be refusals (version 4), at most
    /// `limit` of them, newest first.
    Samples {
        limit: u32,
    },
    /// The attempt a check admitted ended without an outcome (version 5):
    /// its handler was cancelled, the end user hung up, a deadline passed.
    /// Gives back the place the check took on each failure rule and counts
    /// nothing: an attempt whose result never reached its sender taught
    /// nobody anything, so it is not a guess. Same subject as the check.
    Abandon {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// The subject's standing on each rule of the route (version 6,
    /// admin): what a check would find, read without spending, taking a
    /// place, climbing a ladder or being logged as an attempt.
    Inspect {
        route: &'a str,
        subject: Subject<'a>,
    },
    /// Refuses every check from a source network for `for_ms` (version 7,
    /// admin): durable, listed among the lockouts, lifted by `Unban` or
    /// when it ends. Banning a network already banned replaces that ban.
    Ban {
        network: IpAddr,
        prefix_len: u8,
        for_ms: u64,
        /// Why, for the audit line and the lockouts list; may be empty.
        reason: &'a str,
    },
    /// Lifts the ban on exactly this network (version 7, admin); answered
    /// with `Unlocked` (1 if it was banned, else 0).
    Unban {
        network: IpAddr,
        prefix_len: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Decision {
    Allow,
    Delay,
    Challenge,
    Deny,
}

/// Why a verdict is what it is. For logs and the audit trail only: the end
/// user sees one refusal form whatever the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Reason {
    /// Every rule consulted has room.
    Allowed,
    /// A rate rule's budget is spent.
    RateLimited,
    /// A failure rule's threshold is reached.
    TooManyFailures,
    /// Allowed because the rule that would have refused runs in monitor
    /// mode: it would have been `rate_limited`.
    MonitorRateLimited,
    /// Allowed because the rule that would have refused runs in monitor
    /// mode: it would have been `too_many_failures`.
    MonitorTooManyFailures,
    /// A signal rule refused: spray detection has flagged the attempt's
    /// source prefix or wider prefix (it failed against many distinct
    /// accounts) or its password tag (one password failing across many
    /// accounts). Version 3 and later; sent as `TooManyFailures` in
    /// versions 1 and 2.
    SpraySuspected,
    /// A signal rule refused: spray detection has flagged the account, whose
    /// failures come from many distinct source prefixes (a distributed
    /// attack on one account). Version 3 and later; sent as
    /// `TooManyFailures` in versions 1 and 2.
    DistributedAttack,
    /// A signal rule refused: spray detection has flagged the tenant (or
    /// route), whose failure ratio is far above its own baseline. Version 3
    /// and later; sent as `TooManyFailures` in versions 1 and 2.
    TenantAnomaly,
    /// Allowed because the signal rule that would have refused, or its
    /// detector, runs in monitor mode: it would have been one of the three
    /// above. Version 3 and later; sent as `MonitorTooManyFailures` in
    /// versions 1 and 2.
    MonitorSignal,
    /// A failure rule refused because the attempts in flight on its key
    /// (checked, not yet reported or abandoned) fill its threshold; its
    /// failures alone would not. Version 5 and later; sent as
    /// `TooManyFailures` in versions 1 to 4.
    AttemptsInFlight,
    /// The source is in a network an operator banned (`tollgate ban`).
    /// Version 7 and later; sent as `TooManyFailures` in versions 1 to 6.
    Banned,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Verdict<'a> {
    pub decision: Decision,
    /// When refused: wait at least this long before trying again.
    pub retry_after_ms: u64,
    /// With `delay`: hold the attempt this long before proceeding.
    pub delay_ms: u64,
    /// Limit of the tightest rule consulted.
    pub limit: u32,
    /// What is left of it.
    pub remaining: u32,
    /// Time until that rule is back to its full limit.
    pub reset_ms: u64,
    pub reason: Reason,
    /// The rule that decided (the tightest one when allowed); empty if none.
    pub rule: Cow<'a, str>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum ErrorCode {
    /// The payload does not decode as a request.
    Malformed,
    UnsupportedVersion,
    UnknownRoute,
    /// The route's rules need a subject field the request lacks.
    MissingField,
    /// An identifier is longer than the daemon accepts.
    FieldTooLong,
    PermissionDenied,
    /// `clock advance` on a daemon that runs on the system clock.
    NotManualClock,
    /// The frame's length prefix is over the maximum; the connection closes.
    FrameTooLarge,
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

/// A key currently refused by a failure rule. The key is a digest: the
/// daemon never holds the account it came from.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Lockout {
    pub route: String,
    pub rule: String,
    pub key: String,
    pub count: u32,
    pub until_ms: u64,
    pub retry_after_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(tag = "type", rename_all = "snake_case"))]
pub enum Response<'a> {
    Verdict(Verdict<'a>),
    Status(Box<Status>),
    Lockouts {
        lockouts: Vec<Lockout>,
        total: u64,
    },
    Unlocked {
        cleared: u32,
    },
    ClockAdvanced {
        now_ms: u64,
    },
    Error(ErrorReply),
    Activity(Box<Activity>),
    /// `seen`: every would-be refusal since the sample began, of which
    /// `samples` is a uniform sample.
    Samples {
        samples: Vec<WouldBeRefusal>,
        seen: u64,
        since_ms: u64,
    },
    /// The reply to `Inspect` (version 6).
    Inspection(Box<Inspection>),
    /// The reply to `Ban` (version 7): when the ban ends on the daemon's
    /// clock, and whether it replaced a ban on the same network.
    Banned {
        until_ms: u64,
        replaced: bool,
    },
}

impl Response<'_> {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Response<'static> {
        Response::Error(ErrorReply { code, message: message.into() })
    }

    pub fn into_owned(self) -> Response<'static> {
        match self {
            Response::Verdict(v) => Response::Verdict(v.into_owned()),
            Response::Status(s) => Response::Status(s),
            Response::Lockouts { lockouts, total } => Response::Lockouts { lockouts, total },
            Response::Unlocked { cleared } => Response::Unlocked { cleared },
            Response::ClockAdvanced { now_ms } => Response::ClockAdvanced { now_ms },
            Response::Error(e) => Response::Error(e),
            Response::Activity(a) => Response::Activity(a),
            Response::Samples { samples, seen, since_ms } => Response::Samples { samples, seen, since_ms },
            Response::Inspection(i) => Response::Inspection(i),
            Response::Banned { until_ms, replaced } => Response::Banned { until_ms, replaced },
        }
    }
}

impl Reason {
    /// Every reason, in the wire's order (its discriminant is its place).
    pub const ALL: [Reason; 11] = [
        Reason::Allowed,
        Reason::RateLimited,
        Reason::TooManyFailures,
        Reason::MonitorRateLimited,
        Reason::MonitorTooManyFailures,
        Reason::SpraySuspected,
        Reason::DistributedAttack,
        Reason::TenantAnomaly,
        Reason::MonitorSignal,
        Reason::AttemptsInFlight,
        Reason::Banned,
    ];

    /// A rule in monitor mode would have refused: allowed, counted, logged.
    pub fn is_monitored(self) -> bool {
        matches!(self, Reason::MonitorRateLimited | Reason::MonitorTooManyFailures | Reason::MonitorSignal)
    }

    /// The reason as a reply of `version` carries it. Versions 1 and 2 know
    /// only the first five, versions 3 and 4 the first nine, and their
    /// clients refuse an unknown discriminant: a spray-detection refusal
    /// goes to versions 1 and 2 as `TooManyFailures` and its monitor-mode
    /// twin as `MonitorTooManyFailures`, and `AttemptsInFlight` to versions
    /// 1 to 4 and `Banned` to versions 1 to 6 as `TooManyFailures`, the
    /// nearest reason they can read.
    pub fn for_version(self, version: u8) -> Reason {
        if version >= BAN_VERSION {
            return self;
        }
        match self {
            Reason::Banned => Reason::TooManyFailures,
            _ if version >= ABANDON_VERSION => self,
            Reason::AttemptsInFlight => Reason::TooManyFailures,
            _ if version >= SIGNALS_VERSION => self,
            Reason::SpraySuspected | Reason::DistributedAttack | Reason::TenantAnomaly => Reason::TooManyFailures,
            Reason::MonitorSignal => Reason::MonitorTooManyFailures,
            Reason::Allowed
            | Reason::RateLimited
            | Reason::TooManyFailures
            | Reason::MonitorRateLimited
            | Reason::MonitorTooManyFailures => self,
        }
    }
}

impl Verdict<'_> {
    pub fn into_owned(self) -> Verdict<'static> {
        Verdict { rule: Cow::Owned(self.rule.into_owned()), ..self }
    }

    /// Whether the caller may go ahead (after `delay_ms` for a delay).
    pub fn proceeds(&self) -> bool {
        matches!(self.decision, Decision::Allow | Decision::Delay)
    }
}
