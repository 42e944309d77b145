//! Helpers of the shared-store tests: several daemons that
//! share one secret, and attempts raced from many connections the way an
//! auth server makes them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tollgate::client::Client;
use tollgate::protocol::{Outcome, Subject, Verdict};

use super::redis::{require_redis, RedisServer};
use super::{ip, runtime, subject, verdict, TestDaemon};

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
    let (tried, degraded) = guess_seen(client, route, subject, hash).await;
    tried.then_some(degraded)
}

/// `guess`: whether it was tried, and whether its check, tried or not,
/// was answered on the host's degraded share.
pub async fn guess_seen(client: Client, route: &str, subject: Subject<'static>, hash: Duration) -> (bool, bool) {
    let answered = client.check_answered(route, &subject).await;
    if !answered.answer.proceeds() {
        return (false, answered.degraded);
    }
    tokio::time::sleep(hash).await;
    verdict(client.report(route, &subject, Outcome::Failure).await);
    (true, answered.degraded)
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
    let seen = race_logins_seen(daemons, n, hash, subject);
    (seen.tried, seen.tried_on_share)
}

/// What a race of logins saw.
pub struct Seen {
    pub tried: usize,
    /// Tried, their checks answered on a host's degraded share.
    pub tried_on_share: usize,
    /// Checks answered on a share, tried or refused.
    pub on_share: usize,
}

/// `race_logins`, and which checks were answered on a share.
pub fn race_logins_seen(
    daemons: &[TestDaemon],
    n: usize,
    hash: Duration,
    subject: impl Fn(usize) -> Subject<'static>,
) -> Seen {
    let rt = runtime();
    let clients: Vec<Client> = (0..n).map(|i| daemons[i % daemons.len()].client()).collect();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (i, client) in clients.into_iter().enumerate() {
            tasks.push(tokio::spawn(guess_seen(client, "login", subject(i), hash)));
        }
        let mut seen = Seen { tried: 0, tried_on_share: 0, on_share: 0 };
        for t in tasks {
            let (tried, degraded) = t.await.unwrap();
            seen.tried += tried as usize;
            seen.tried_on_share += (tried && degraded) as usize;
            seen.on_share += degraded as usize;
        }
        seen
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

/// `n` hosts with the shipped `[shared]` defaults but for the host count
/// (3 for three, so a degraded share would be ceil(5 / 3) = 2 and show),
/// and `top` and `shared` lines.
pub fn hosts_with(n: usize, url: &str, secret: &Path, top: &str, shared: &str) -> Vec<TestDaemon> {
    let config =
        format!("secret = \"{}\"\n{top}\n[shared]\nurl = \"{url}\"\nhosts = {n}\n{shared}\n", secret.display());
    let daemons: Vec<TestDaemon> = (0..n).map(|_| TestDaemon::start_with(Some(&config), false)).collect();
    // The store answers each host before the burst (a first call on a
    // loaded machine may miss its 2 ms).
    for d in &daemons {
        wait_until(d, Duration::from_secs(10), "the store answers", || {
            !runtime().block_on(d.client().check_answered("login", &subject("192.0.2.250", "warmup"))).degraded
        });
    }
    daemons
}

/// One test at a time: a burst is the attacker's, not the sum of four
/// tests' bursts on two cores (a run of late calls longer than busy_max is
/// an overloaded store, and the shares answer).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Hosts on their own store, this test alone on the machine. Fields
/// drop in order: the daemons before their store.
pub struct Hosts {
    pub daemons: Vec<TestDaemon>,
    pub redis: RedisServer,
    _dir: tempfile::TempDir,
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl Hosts {
    pub fn start() -> Hosts {
        Hosts::start_with(3, "", "")
    }

    pub fn start_with(n: usize, top: &str, shared: &str) -> Hosts {
        require_redis();
        let alone = one_at_a_time();
        let redis = RedisServer::unix();
        let dir = tempfile::tempdir().unwrap();
        let daemons = hosts_with(n, &redis.url(), &shared_secret(dir.path()), top, shared);
        Hosts { daemons, redis, _dir: dir, _alone: alone }
    }
}

/// Runs of each burst: "every run" is the promise, so more than one.
pub const RUNS: usize = 3;

/// Bursts with the store answering in time between them (a heartbeat,
/// each second, at least `busy_max_ms` after the last late call): each is a
/// burst of its own, its run of late calls young. Closer together they
/// are one run, busy while the store answers checks in time between them
/// (`bursts_closer_than_busy_max_are_each_held_by_the_store`).
pub fn between_bursts(run: usize) {
    if run > 0 {
        quiet();
    }
}

/// A quiet moment: the run of late calls before it ends.
pub fn quiet() {
    std::thread::sleep(Duration::from_millis(1600));
}

pub fn subject_of(peer: &str, account: &'static str) -> Subject<'static> {
    Subject { peer: Some(ip(peer)), account: Some(account), ..Subject::default() }
}
