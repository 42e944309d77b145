//! How a `Client` is set up: the daemon's socket, the per-call timeout,
//! each route's fail policy and static budget, the protocol version a new
//! connection starts from, and how long late answers count as busy. Apart
//! from the call path, so that everything an auth server may choose reads
//! in one place with its defaults.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::gcra::GcraSpec;
use crate::protocol::{PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use crate::{FailPolicy, BUILTIN_FAIL_POLICIES};

/// Per-call timeout for the request path: low single-digit milliseconds, so
/// a stalled daemon costs a login no more than a few ms before the fail
/// policy decides.
pub const CALL_TIMEOUT_DEFAULT: Duration = Duration::from_millis(5);
/// How long a run of timeouts from a daemon that has answered this client
/// is taken for a busy daemon, not a lost one (`ClientConfig::busy_max`).
pub const BUSY_MAX_DEFAULT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub socket: PathBuf,
    pub timeout: Duration,
    /// Fail policy per route; routes not listed use `default_fail_policy`.
    pub fail_policies: HashMap<String, FailPolicy>,
    pub default_fail_policy: FailPolicy,
    /// For closed routes: attempts this process lets through per route while
    /// the daemon is unreachable (a GCRA per route, not per key). None by
    /// default: closed means refuse.
    pub static_budgets: HashMap<String, GcraSpec>,
    /// The protocol version sent on a new connection (`PROTOCOL_VERSION`
    /// by default). A connection whose daemon refuses it as unsupported
    /// steps down one version at a time by itself.
    pub protocol_version: u8,
    /// A timeout in a run of timeouts (ended only by a timely answer this
    /// long after its last timeout) younger than this, or this soon after
    /// an answer (in time, or heard late: a timed-out call is listened to
    /// this long, `LATE_LISTENERS_MAX` at once), from a daemon that has
    /// answered this client in time, is
    /// `ClientError::Busy` (the attempt does not proceed), not an outage
    /// for the fail policy, in a burst on its account: its own, or others'
    /// (for a requester with a success through this client, at most this
    /// long in 120 times this: `burst`). Zero: every timeout is an outage.
    pub busy_max: Duration,
}

impl ClientConfig {
    /// The built-in routes' policies, the 5 ms timeout.
    pub fn new(socket: impl Into<PathBuf>) -> ClientConfig {
        let fail_policies = BUILTIN_FAIL_POLICIES.iter().map(|&(name, policy)| (name.to_string(), policy)).collect();
        ClientConfig {
            socket: socket.into(),
            timeout: CALL_TIMEOUT_DEFAULT,
            fail_policies,
            default_fail_policy: FailPolicy::Open,
            static_budgets: HashMap::new(),
            protocol_version: PROTOCOL_VERSION,
            busy_max: BUSY_MAX_DEFAULT,
        }
    }

    pub fn busy_max(mut self, busy_max: Duration) -> ClientConfig {
        self.busy_max = busy_max;
        self
    }

    /// Speaks `version` from the first request: an older one skips the
    /// fallback's extra round trips per connection to a daemon known to be old.
    ///
    /// # Panics
    /// If `version` is not one this client speaks.
    pub fn protocol_version(mut self, version: u8) -> ClientConfig {
        assert!(
            (PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version),
            "protocol version {version} is not one this client speaks ({PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION})"
        );
        self.protocol_version = version;
        self
    }

    /// Lets a closed route through at `limit` per `period` (burst `burst`)
    /// in this process while the daemon is unreachable: a conservative
    /// floor instead of an outage. Size it for one process of many.
    pub fn static_budget(mut self, route: &str, limit: u32, period: Duration, burst: u32) -> ClientConfig {
        let spec = GcraSpec::new(limit.max(1), (period.as_micros() as u64).max(1), burst.max(1));
        self.static_budgets.insert(route.to_string(), spec);
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> ClientConfig {
        self.timeout = timeout;
        self
    }

    pub fn fail_policy(mut self, route: &str, policy: FailPolicy) -> ClientConfig {
        self.fail_policies.insert(route.to_string(), policy);
        self
    }
}
