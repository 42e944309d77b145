//! The decision log and its what-if replay.
//!
//! With `[decision_log]` on, every check and report verdict becomes a
//! compact record (`record.rs`: digests and addresses, never a name) that
//! the request thread hands to a bounded queue; one thread writes them to
//! size-rotated, age- and count-bounded files (`writer.rs`). `tollgate
//! replay` (`sim/replay/`, beside the simulator) runs those records through a limiter built from a
//! candidate configuration, on the log's own clock, and counts per rule
//! what the candidate would have refused.
//!
//! The log never blocks a request: a full queue drops the record and
//! counts it, a failed write is counted and logged, rate-capped.

mod record;
mod writer;

pub use record::{
    decode_header, decode_record, fuzz_decision_log, mask_64, read_file_bytes, FileContents, Header, HeaderError, Name,
    Op, Problem, Record, RecordError, HEADER_BYTES, RECORD_BYTES_MAX,
};
pub(crate) use writer::log_files;
pub use writer::{DecisionLog, FLUSH_INTERVAL_MS};

use crate::protocol::Outcome;

/// What the log needs of a request beyond its route, subject and verdict:
/// a report's outcome and the client's password digests. Copied along
/// the request path, used only when the log is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// None: a check.
    pub(crate) outcome: Option<Outcome>,
    pub(crate) password_digest: Option<[u8; 16]>,
    pub(crate) password_tag: Option<[u8; 16]>,
}

impl Attempt {
    pub(crate) fn check(password_tag: Option<[u8; 16]>) -> Attempt {
        Attempt { outcome: None, password_digest: None, password_tag }
    }

    pub(crate) fn report(
        outcome: Outcome,
        password_digest: Option<[u8; 16]>,
        password_tag: Option<[u8; 16]>,
    ) -> Attempt {
        Attempt { outcome: Some(outcome), password_digest, password_tag }
    }
}

/// The writer's counters: the protocol's `DecisionLogStatus` itself, which
/// the version-4 `Activity` reply carries (status, metrics, `top`).
pub type DecisionLogStats = crate::protocol::DecisionLogStatus;
