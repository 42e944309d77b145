//! The hand-written encoder of a `Verdict` reply. Every check and report
//! gets one, so it writes bincode's bytes directly instead of going
//! through bincode's writer.

use super::{ENVELOPE_BYTES, FRAME_HEADER_BYTES};
use crate::protocol::Verdict;

/// A `Verdict` reply's frame, written field by field. Every check and report
/// gets one, and bincode's writer checked capacity and length at each of
/// its nine fields: 235 instructions a reply against 77 here. The bytes are
/// bincode's own, which a property test holds this to for every verdict.
/// `flags` is version 2's trailing byte (`None` in version 1); the reason is
/// written as `version` can read it.
pub(super) fn encode_verdict(version: u8, id: u64, verdict: &Verdict<'_>, flags: Option<u8>, out: &mut Vec<u8>) {
    // Length prefix, version, id, then the Response variant (0 = Verdict),
    // decision, retry_after_ms, delay_ms, limit, remaining, reset_ms,
    // reason and the rule's length: fixed offsets, so one stack array and
    // one copy (a copy per field called memcpy for each).
    const FIXED_BYTES: usize = FRAME_HEADER_BYTES + ENVELOPE_BYTES + 4 + 4 + 8 + 8 + 4 + 4 + 8 + 4 + 8;
    let rule = verdict.rule.as_bytes();
    let flags = flags.as_slice();
    let payload = FIXED_BYTES - FRAME_HEADER_BYTES + rule.len() + flags.len();
    let mut fixed = [0u8; FIXED_BYTES];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        fixed[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&(payload as u32).to_le_bytes());
    put(&[version]);
    put(&id.to_le_bytes());
    put(&0u32.to_le_bytes());
    put(&(verdict.decision as u32).to_le_bytes());
    put(&verdict.retry_after_ms.to_le_bytes());
    put(&verdict.delay_ms.to_le_bytes());
    put(&verdict.limit.to_le_bytes());
    put(&verdict.remaining.to_le_bytes());
    put(&verdict.reset_ms.to_le_bytes());
    put(&(verdict.reason.for_version(version) as u32).to_le_bytes());
    put(&(rule.len() as u64).to_le_bytes());
    out.reserve(FIXED_BYTES + rule.len() + flags.len());
    out.extend_from_slice(&fixed);
    out.extend_from_slice(rule);
    out.extend_from_slice(flags);
}
