//! What an auth server links to ask tollgate: the wire protocol
//! ([`protocol`], [`codec`]), and a [`Client`] with pooled connections, a
//! per-call timeout and each route's fail policy. It depends on tokio,
//! bincode and BLAKE2 only; the daemon (redb, clap, the load generator) is
//! the `tollgate` crate, which re-exports all of this.
//!
//! ```no_run
//! use tollgate_client::{Client, ClientConfig};
//! use tollgate_client::protocol::{Outcome, Subject};
//!
//! # async fn login() {
//! let client = Client::new(ClientConfig::new("/run/tollgate/tollgate.sock"));
//! let subject = Subject { peer: Some("203.0.113.9".parse().unwrap()), account: Some("alice"), ..Subject::default() };
//! if client.check("login", &subject).await.proceeds() {
//!     let verified = false; // hash and compare the password here
//!     let outcome = if verified { Outcome::Success } else { Outcome::Failure };
//!     client.report("login", &subject, outcome).await;
//! }
//! # }
//! ```
#![forbid(unsafe_code)]

mod answer;
mod attempt;
mod burst;
mod client;
pub mod codec;
mod config;
pub mod gcra;
mod late_replies;
mod password;
mod preflight;
pub mod protocol;
mod unpoisoned;

pub use answer::{Answer, Answered, ClientError, FullStatus};
pub use attempt::Attempt;
pub use client::{Client, POOL_CONNECTIONS_MAX};
pub use config::{ClientConfig, CALL_TIMEOUT_DEFAULT};
pub use late_replies::LATE_LISTENERS_MAX;
pub use password::{password_digest, password_tag, PASSWORD_TAG_PERSONAL};

/// What a client does with an attempt when the daemon cannot answer in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum FailPolicy {
    /// Let the attempt proceed: the rule protects users, and refusing every
    /// login while the limiter is down would be the bigger harm.
    Open,
    /// Refuse the attempt: the rule protects the system.
    Closed,
}

impl FailPolicy {
    pub fn name(self) -> &'static str {
        match self {
            FailPolicy::Open => "open",
            FailPolicy::Closed => "closed",
        }
    }
}

/// The built-in routes' fail policies: login and reauth protect users (open);
/// the rest protect the system (closed). The daemon's built-in routes carry
/// the same policies (a test in its config holds the two together).
pub const BUILTIN_FAIL_POLICIES: [(&str, FailPolicy); 8] = [
    ("login", FailPolicy::Open),
    ("reauth", FailPolicy::Open),
    ("request", FailPolicy::Closed),
    ("mfa_verify", FailPolicy::Closed),
    ("mfa_resend", FailPolicy::Closed),
    ("password_reset", FailPolicy::Closed),
    ("registration", FailPolicy::Closed),
    ("token", FailPolicy::Closed),
];

/// Bytes of X-Forwarded-For the daemon reads, from the right: the work per
/// request is bounded however long a header the end user sends.
pub const FORWARDED_FOR_BYTES_MAX: usize = 4096;

/// The part of an X-Forwarded-For header that is read: all of it, or for a
/// longer one the whole entries within its last `FORWARDED_FOR_BYTES_MAX`
/// bytes. Clients add entries on the left and proxies on the right, so
/// padding a header pushes no proxy-added hop out of view (ignoring an
/// overlong header would hand its sender the proxy's own bucket). The
/// client sends only this part; the daemon reads only this part.
pub fn forwarded_tail(header: &str) -> &str {
    let Some(start) = header.len().checked_sub(FORWARDED_FOR_BYTES_MAX).filter(|&s| s > 0) else {
        return header;
    };
    // From the byte before the window: a comma there means the window
    // starts with a whole entry. ASCII commas are char boundaries.
    match header.as_bytes()[start - 1..].iter().position(|&b| b == b',') {
        Some(at) => &header[start + at..],
        None => "", // one entry longer than the window: malformed
    }
}
