//! The `Inspect` reply (version 6): one account's standing on each rule of
//! a route, read without changing anything. It answers a single admin
//! request and shares no types with the other replies.

use bincode::{Decode, Encode};

/// An `Inspect` reply (version 6): the subject's standing on each rule of
/// the route, as of `now_ms`. Keys are keyed digests, as `lockouts` shows
/// them; the request's identifiers are not echoed.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Inspection {
    pub now_ms: u64,
    pub route: String,
    /// `known` or `unknown` when the route keeps known devices and the
    /// request names an account and a device; empty otherwise.
    pub device: String,
    /// The daemon runs with a shared store: global rules are decided
    /// there, and their figures here are this host's view only (its
    /// degraded share and the store's lockouts it has learned).
    pub shared: bool,
    /// Every rule of the route, in order.
    pub rules: Vec<InspectedRule>,
}

/// One rule's standing for the inspected subject.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct InspectedRule {
    pub name: String,
    /// `rate`, `failures` or `signal`.
    pub kind: String,
    /// Why the rule does not apply to this subject (`needs peer`,
    /// `unknown devices only`, ...); empty when it applies. A rule that
    /// does not apply has no key and every figure 0.
    pub skipped: String,
    /// The key's keyed digest, 32 hex digits (as `lockouts` lists it).
    pub key: String,
    /// Evaluated and counted, never enforced.
    pub monitor: bool,
    /// Shared mode: decided in the store (see `Inspection::shared`).
    pub global: bool,
    /// Failure rules: the threshold; rate rules: the burst.
    pub limit: u32,
    /// Failure rules: failures in the sliding window, rounded up as a
    /// check counts them.
    pub failures: u32,
    /// Failure rules: attempts checked and not yet reported (places).
    pub in_flight: u32,
    /// Checks the rule would still admit now (failure rules: the threshold
    /// less failures and places; rate rules: the budget left).
    pub remaining: u32,
    /// Failure rules: the failures reach the threshold (a lockout).
    pub locked: bool,
    /// Signal rules: the detector whose flag covers the subject, or empty.
    pub flagged_by: String,
    /// A check now would be refused by this rule (or, in monitor mode,
    /// would have been).
    pub refuses: bool,
    /// When the refusal ends on the daemon's clock, and how long from now;
    /// 0 when it does not refuse (a signal rule's flag promises no end: 0).
    pub until_ms: u64,
    pub retry_after_ms: u64,
    /// Rate rules: until the budget is full again; failure rules: until
    /// the counts expire.
    pub reset_ms: u64,
}
