//! Helpers of the shared-store tests: several daemons that
//! share one secret, and attempts raced from many connections the way an
//! auth server makes them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::client::Client;
use tollgate::protocol::{Outcome, Subject, Verdict};

use super::{runtime, verdict, TestDaemon};

/// What argon2 costs a real auth server between its check and its report.
pub const PASSWORD_HASH: Duration = Duration::from_millis(100);
pub const ATTEMPTS: usize = 200;

/// The exactness tests race 200 connections on 2 loaded cores: a store
/// call can wait longer than 20 ms there, and a timed-out call is answered
/// on the host's degraded share, which adds to what the store admitted
/// (the bound the README states). These tests are about a healthy store.
pub const PATIENT: &str = "timeout_ms = 1000";

/// A secret file every daemon of a test shares: hosts of one deployment
/// must hold the same key, or their digests would not meet in the store.
pub fn shared_secret(dir: &Path) -> PathBuf {
    let path = dir.join("secret");
    tollgate::Secret::load_or_create(&path).expect("secret");
    path
}

pub fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// One attempt as an auth server makes it: check; if it may proceed, hash
/// the password (a sleep), then report a failure. True if it was tried.
pub async fn guess(client: Client, route: &str, subject: Subject<'static>, hash: Duration) -> bool {
    guess_answered(client, route, subject, hash).await.is_some()
}

/// `guess`: `None` if not tried, else whether its check was answered on
/// the host's degraded share rather than by the store.
pub async fn guess_answered(client: Client, route: &str, subject: Subject<'static>, hash: Duration) -> Option<bool> {
    let answered = client.check_answered(route, &subject).await;
    if !answered.answer.proceeds() {
        return None;
    }
    tokio::time::sleep(hash).await;
    verdict(client.report(route, &subject, Outcome::Failure).await);
    Some(answered.degraded)
}

/// `n` login attempts at once, each on its own connection, spread round
/// robin over the daemons; how many passwords were tried.
pub fn race_logins(
    daemons: &[TestDaemon],
    n: usize,
    hash: Duration,
    subject: impl Fn(usize) -> Subject<'static>,
) -> usize {
    race_logins_answered(daemons, n, hash, subject).0
}

/// `race_logins`: how many passwords were tried, and how many of those
/// checks were answered on a host's degraded share.
pub fn race_logins_answered(
    daemons: &[TestDaemon],
    n: usize,
    hash: Duration,
    subject: impl Fn(usize) -> Subject<'static>,
) -> (usize, usize) {
    let rt = runtime();
    let clients: Vec<Client> = (0..n).map(|i| daemons[i % daemons.len()].client()).collect();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (i, client) in clients.into_iter().enumerate() {
            tasks.push(tokio::spawn(guess_answered(client, "login", subject(i), hash)));
        }
        let (mut tried, mut on_share) = (0, 0);
        for t in tasks {
            if let Some(degraded) = t.await.unwrap() {
                tried += 1;
                on_share += degraded as usize;
            }
        }
        (tried, on_share)
    })
}

/// A `login` check on `daemon`.
pub fn check(daemon: &TestDaemon, subject: &Subject<'_>) -> Verdict<'static> {
    verdict(runtime().block_on(daemon.client().check("login", subject)))
}

/// A `login` report on `daemon`.
pub fn report(daemon: &TestDaemon, subject: &Subject<'_>, outcome: Outcome) {
    verdict(runtime().block_on(daemon.client().report("login", subject, outcome)));
}

/// Polls `done` every 20 ms until it holds, or fails with `what` and the
/// daemon's log after `within`.
pub fn wait_until(daemon: &TestDaemon, within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}
