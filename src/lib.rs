//! tollgate: a per-host login rate limiter.
//!
//! The request path, in order:
//! - [`server`]: accepts connections on the Unix socket, reads frames, and
//!   dispatches each request (`Daemon::handle`).
//! - [`codec`]: frames and the bincode payloads (pure, no I/O).
//! - [`protocol`]: every request and response type.
//! - [`limiter`]: routes and rules; derives keys and runs one table step
//!   per rule (pure: time is passed in).
//! - [`source`]: the client address behind proxies, and its prefix.
//! - [`keys`]: keyed BLAKE2b digests of every identifier.
//! - [`gcra`] and [`failure_window`]: the two counters.
//! - [`store`]: the redb state file and its writer thread (the only module
//!   that touches redb).
//!
//! Around it: [`config`] (TOML over built-in defaults), [`clock`] (the only
//! place time is read), [`client`] (what an auth server links) and [`cli`].
//! ARCHITECTURE.md states the invariants.
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod clock;
pub mod codec;
pub mod config;
pub mod failure_window;
pub mod gcra;
pub mod keys;
pub mod limiter;
pub mod protocol;
pub mod server;
pub mod source;
pub mod store;

/// The README's Rust example compiles as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
