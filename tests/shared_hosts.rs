//! Shared mode across hosts that disagree: clocks skewed by minutes and
//! hours (the store's clock rules global windows), a store that asks for a
//! password, and a host count learned from the store's heartbeats.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::redis::{require_redis, RedisServer};
use common::shared::*;
use common::*;
use tollgate::protocol::{Decision, Outcome};

fn config(secret: &Path, shared: &str, rules: &str) -> String {
    format!("secret = \"{}\"\n\n[shared]\n{shared}\n{rules}\n", secret.display())
}

/// A two-second window, so a lockout ends within the test.
const SHORT_WINDOW: &str = "[routes.login.rules.source_failures]\nwindow_secs = 2\n";

#[test]
fn hosts_whose_clocks_differ_by_minutes_and_hours_decide_alike() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let shared = format!("url = \"{}\"\ntimeout_ms = 200\nhosts = 3", redis.url());
    let daemons: Vec<TestDaemon> =
        (0..3).map(|_| TestDaemon::start_with(Some(&config(&secret, &shared, SHORT_WINDOW)), true)).collect();
    // Manual clocks, set 0, 7 minutes and an hour ahead of each other.
    daemons[1].advance("7m");
    daemons[2].advance("1h");
    let mallory = subject("192.0.2.130", "mallory");
    // Failures reported through all three, in turn: one window, one count.
    for n in 0..5 {
        let d = &daemons[n % 3];
        assert_eq!(check(d, &mallory).decision, Decision::Allow, "attempt {n}");
        report(d, &mallory, Outcome::Failure);
    }
    // Five more failures (reports need no check): the sliding window holds
    // the lockout at least half into the next window, whenever the store's
    // window boundary falls during the test.
    for n in 0..5 {
        report(&daemons[n % 3], &mallory, Outcome::Failure);
    }
    let mut retry = Vec::new();
    for d in &daemons {
        let v = check(d, &mallory);
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "every host refuses");
        retry.push(v.retry_after_ms);
    }
    // Each host's own clock plays no part: an hour ahead does not end the
    // lockout, and the remaining times agree (the ladder rounds them up to
    // at least its first step alike).
    let (min, max) = (*retry.iter().min().unwrap(), *retry.iter().max().unwrap());
    assert!(max - min <= 250, "retry_after differs by more than latency: {retry:?}");
    // The store's clock ends it for all at once: once the store's window
    // has passed (in real time), every host admits again, whatever its own
    // clock says; advancing a host's clock does not end it early.
    daemons[0].advance("10m");
    assert_eq!(check(&daemons[0], &mallory).decision, Decision::Deny, "ten minutes on one host's clock end nothing");
    let deadline = Instant::now() + Duration::from_secs(6);
    for d in &daemons {
        loop {
            // A host remembers the lockout on its own clock for the store's
            // remaining time: move each clock past it, as time would.
            d.advance("3s");
            if check(d, &mallory).decision == Decision::Allow {
                break;
            }
            assert!(Instant::now() < deadline, "the store's window never ended for a host:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_store_that_asks_for_a_password_is_joined_with_the_password_file() {
    require_redis();
    let dir = tempfile::tempdir().unwrap();
    let password = "correct-horse-battery";
    let redis = RedisServer::unix_with_password(password);
    let secret = shared_secret(dir.path());
    let password_file = dir.path().join("redis-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let shared = format!(
        "url = \"{}\"\ntimeout_ms = 200\nhosts = 3\npassword_file = \"{}\"",
        redis.url(),
        password_file.display()
    );
    let d = TestDaemon::start_with(Some(&config(&secret, &shared, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.140", "peggy")));
    assert!(!answered.degraded, "decided by the store:\n{}", d.log());
    assert!(!d.log().contains(password), "the password never reaches the log");

    // A wrong password: the daemon starts degraded and says why.
    std::fs::write(&password_file, "wrong\n").unwrap();
    let d = TestDaemon::start_with(Some(&config(&secret, &shared, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.141", "peggy")));
    assert!(answered.degraded, "without the right password nothing reaches the store");
    assert!(d.log().contains("shared store unreachable at start"), "{}", d.log());
    assert!(!d.log().contains("wrong"), "not even a wrong password is logged:\n{}", d.log());
}

#[test]
fn the_host_count_is_learned_from_the_store_and_sets_the_degraded_share() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let shared = format!("url = \"{}\"\ntimeout_ms = 50\nheartbeat_ms = 100\nhost_ttl_ms = 1000", redis.url());
    let daemons: Vec<TestDaemon> =
        (0..4).map(|_| TestDaemon::start_with(Some(&config(&secret, &shared, "")), false)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, s) = runtime().block_on(daemons[0].client().status_with_shared()).unwrap();
        let s = s.unwrap();
        if s.hosts_in_force == 4 {
            assert_eq!((s.hosts_live, s.hosts_source.as_str()), (4, "learned"), "{s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "4 hosts never learned: {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Degraded with 4 hosts: ceil(5 / 4) = 2 attempts on this host.
    redis.kill9();
    let trudy = subject("192.0.2.150", "trudy");
    for n in 0..2 {
        let v = check(&daemons[0], &trudy);
        assert_eq!(v.decision, Decision::Allow, "degraded attempt {n}");
        report(&daemons[0], &trudy, Outcome::Failure);
    }
    assert_eq!(check(&daemons[0], &trudy).decision, Decision::Deny, "the learned share, 2 of 5");
}
