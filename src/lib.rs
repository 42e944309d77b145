//! tollgate: a per-host login rate limiter.
//!
//! The request path, in order:
//! - [`server`]: accepts connections on the Unix socket, reads frames, and
//!   dispatches each request (`Daemon::handle`).
//! - [`codec`]: frames and the bincode payloads (pure, no I/O).
//! - [`protocol`]: every request and response type.
//! - [`limiter`]: routes and rules; plans a check (derives its keys), then
//!   runs one table step per rule (pure: time is passed in).
//! - [`source`]: the client address behind proxies, and its prefix;
//!   [`classes`]: the source class of an address (CIDR file).
//! - [`keys`]: keyed BLAKE2b digests of every identifier (SipHash for
//!   source prefixes).
//! - [`gcra`] and [`failure_window`]: the two counters; [`overflow`]: where
//!   a failure table full of lockouts still counts; [`tat_table`]: the
//!   GCRA table's storage; [`expiring`]: the bounded map behind escalation,
//!   known devices and recent passwords.
//! - [`store`]: the redb state file and its writer thread (the only module
//!   that touches redb).
//!
//! Around it: [`access`] (who may ask what, by peer credentials), [`audit`]
//! (rate-capped refusal and audit lines), [`notify`] (systemd readiness and
//! watchdog), [`metrics`] (`status` as
//! Prometheus text), [`config`] (TOML over built-in defaults), [`clock`] (the only
//! place time is read), [`client`] (what an auth server links), [`cli`], and
//! [`bench`] (the load generator and the echo server: the transport and
//! codec floors).
//! ARCHITECTURE.md states the invariants.
// No unsafe code, with two audited exceptions in `tat_table`, both hints
// that cannot change memory: the cache prefetch (`prefetch_read`) and the
// huge-page advice for large GCRA tables (`advise_huge_pages`).
#![deny(unsafe_code)]

// The client side is its own crate (what an auth server links); the daemon
// speaks through the same types.
pub use tollgate_client as client;
pub use tollgate_client::{codec, protocol};

pub mod access;
pub mod audit;
pub mod bench;
pub mod classes;
pub mod cli;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod expiring;
pub mod failure_window;
pub mod gcra;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod notify;
pub mod overflow;
pub mod server;
pub mod source;
pub mod store;
pub mod tat_table;

/// The README's Rust example compiles as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
