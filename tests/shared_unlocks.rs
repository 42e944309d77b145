//! Unlocks and write-backs across hosts that the store's memory or a
//! host's own life could lose: a lockout a restarted host reloaded from its
//! state file, an unlock replayed from the log, a host dying mid-unlock, a
//! lockout written back after an outage (retried when its first merge
//! fails, never undoing an unlock made meanwhile). Real redis-server
//! processes and daemons; each test failed on a build of the day it was
//! written.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::redis::{require_redis, Proxy, ProxyMode, RedisServer};
use common::shared::*;
use common::*;
use tollgate::protocol::{Decision, Outcome, Reason, Subject};

fn config(url: &str, secret: &Path, extra: &str) -> String {
    format!("secret = \"{}\"\n\n[shared]\nurl = \"{url}\"\ntimeout_ms = 100\nhosts = 3\n{extra}\n", secret.display())
}

fn host(url: &str, secret: &Path, extra: &str) -> TestDaemon {
    TestDaemon::start_with(Some(&config(url, secret, extra)), false)
}

fn lock(d: &TestDaemon, s: &Subject<'_>) {
    for _ in 0..5 {
        check(d, s);
        report(d, s, Outcome::Failure);
    }
}

fn unlock(d: &TestDaemon, account: &str) -> serde_json::Value {
    d.cli_json(&["unlock", "--route", "login", "--account", account])
}

/// Two hosts on one store, `alice` locked through A and refused by B.
/// Fields drop in order: the hosts before their store.
struct Locked {
    a: TestDaemon,
    b: TestDaemon,
    alice: Subject<'static>,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

fn alice_locked(ip: &'static str) -> Locked {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let (a, b) = (host(&redis.url(), &secret, ""), host(&redis.url(), &secret, ""));
    std::thread::sleep(Duration::from_millis(300)); // both subscribed
    let alice = subject(ip, "alice");
    lock(&a, &alice);
    wait_until(&b, Duration::from_secs(5), "B refuses", || check(&b, &alice).decision == Decision::Deny);
    Locked { a, b, alice, _redis: redis, _dir: dir }
}

/// A behind a proxy, cut off (degraded), has locked `alice` on its share
/// (ceil(5 / 3) = 2 failures); B asks the store directly. With `plant`, the
/// store holds a value tollgate did not write at alice's key when A comes
/// back, so A's first write-back fails; the test then clears it.
struct CutOff {
    a: TestDaemon,
    b: TestDaemon,
    alice: Subject<'static>,
    proxy: Proxy,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

fn alice_locked_while_cut_off(ip: &'static str, heartbeat_ms: u64, plant: bool) -> CutOff {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let extra = format!("heartbeat_ms = {heartbeat_ms}\nprobe_interval_ms = 50\nprobe_max_ms = 200");
    let (a, b) = (host(&proxy.url(), &secret, &extra), host(&redis.url(), &secret, &extra));
    let alice = subject(ip, "alice");
    // One failure through B names alice's key; then the store forgets it
    // (entry and index), as if long ago.
    check(&b, &alice);
    report(&b, &alice, Outcome::Failure);
    let name = redis.cmd(&["KEYS", "tg:*:f:login/source_failures:*"]).trim().to_string();
    for k in redis.cmd(&["KEYS", "tg:*:[fi]:*"]).lines().filter(|l| !l.is_empty()) {
        redis.cmd(&["DEL", k]);
    }
    proxy.set_mode(ProxyMode::Drop);
    wait_until(&a, Duration::from_secs(10), "A degraded", || {
        check(&a, &subject("192.0.2.171", "ursula"));
        a.log().contains("shared store unreachable")
    });
    for _ in 0..2 {
        check(&a, &alice);
        report(&a, &alice, Outcome::Failure);
    }
    assert_eq!(check(&a, &alice).decision, Decision::Deny, "locked on A's share");
    let recovered = a.log().matches("global rules answered by the store").count();
    if plant {
        redis.cmd(&["HSET", &name, "planted", "1"]);
    }
    proxy.set_mode(ProxyMode::Pass);
    if plant {
        wait_until(&a, Duration::from_secs(10), "first write-back failed", || a.log().contains("not written back"));
        assert_eq!(check(&a, &alice).decision, Decision::Deny, "A refuses it from memory meanwhile");
        redis.cmd(&["DEL", &name]);
    } else {
        wait_until(&a, Duration::from_secs(10), "A recovered", || {
            a.log().matches("global rules answered by the store").count() > recovered
        });
    }
    CutOff { a, b, alice, proxy, _redis: redis, _dir: dir }
}

/// Waits up to `within` for A's log to say a retried write-back took.
fn until_written_back_after_a_failure(a: &TestDaemon, within: Duration) {
    let deadline = Instant::now() + within;
    while !a.log().contains("written back after a failed try") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A host that restarted holds the lockouts it knew by name only (the
/// state file keeps no account): an account-wide unlock on another host
/// still clears them there, since the script publishes each key it
/// unlocked. (With only the account's `A` message, the restarted host went
/// on refusing for the rest of the lockout.)
#[test]
fn an_account_wide_unlock_clears_a_lockout_a_restarted_host_reloaded() {
    let Locked { mut a, b, alice, _redis: _store, _dir: _files } = alice_locked("192.0.2.130");
    a.terminate(); // a deploy: SIGTERM, the state file kept
    a.spawn();
    std::thread::sleep(Duration::from_millis(1500)); // subscribed again
    assert_eq!(check(&a, &alice).decision, Decision::Deny, "reloaded from the state file");
    unlock(&b, "alice");
    wait_until(&a, Duration::from_secs(5), "A heard the unlock", || check(&a, &alice).decision == Decision::Allow);
    assert_eq!(check(&b, &alice).decision, Decision::Allow);
}

/// The same when the host is down during the unlock: the keys the script
/// named are logged too, and the host forgets them when it replays the log.
#[test]
fn a_replayed_account_wide_unlock_clears_a_reloaded_lockout() {
    let Locked { mut a, b, alice, _redis: _store, _dir: _files } = alice_locked("192.0.2.131");
    a.terminate();
    unlock(&b, "alice");
    a.spawn();
    wait_until(&a, Duration::from_secs(5), "A replayed the unlock", || check(&a, &alice).decision == Decision::Allow);
    assert_eq!(check(&b, &alice).decision, Decision::Allow);
}

/// The unlocking host dies mid-unlock (killed while its store calls are
/// late): whatever the store did, the other hosts agree with it. The
/// unlock is logged before it runs and the script publishes what it
/// unlocked in the same step, so an unlock the store made is heard.
#[test]
fn a_host_dying_mid_unlock_leaves_every_host_agreeing_with_the_store() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let (mut g, h) = (host(&proxy.url(), &secret, ""), host(&redis.url(), &secret, ""));
    std::thread::sleep(Duration::from_millis(300));
    let alice = subject("192.0.2.180", "alice");
    lock(&h, &alice);
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(150)));
    let mut cli = Command::new(BIN)
        .args(["unlock", "--route", "login", "--account", "alice", "--source", "192.0.2.180"])
        .env("TOLLGATE_SOCKET", &g.socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(70));
    g.kill9();
    let _ = cli.wait();
    proxy.set_mode(ProxyMode::Pass);
    std::thread::sleep(Duration::from_millis(1500));
    // A fresh host asks the store.
    let fresh = host(&redis.url(), &secret, "");
    std::thread::sleep(Duration::from_millis(300));
    let store = check(&fresh, &alice).decision;
    let heard = check(&h, &alice).decision;
    g.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let later = check(&h, &alice).decision;
    // Whether G died before or after its script ran, H answers as the
    // store does: an unlock the store made is heard, one it never made is
    // not assumed.
    assert_eq!((heard, later), (store, store), "H disagrees with the store");
}

/// A lockout A took on its degraded share reaches the store even when the
/// first write-back of it fails: A sends it again at a heartbeat, so B,
/// which asks the store, refuses the key too. (A failed merge was never
/// sent again: B let the attacker guess again for the store's threshold.)
#[test]
fn a_lockout_whose_write_back_failed_is_written_back_at_a_later_heartbeat() {
    let c = alice_locked_while_cut_off("192.0.2.170", 200, true);
    until_written_back_after_a_failure(&c.a, Duration::from_secs(5));
    let v = check(&c.b, &c.alice);
    assert_eq!((v.decision, v.reason), (Decision::Deny, Reason::TooManyFailures), "B refuses through the store");
}

/// A lockout whose write-back failed is not written back after an unlock
/// made meanwhile: the host that hears the unlock clears it from its
/// degraded table, so the next heartbeat's retry does not lock the
/// account in the store again.
#[test]
fn a_retried_write_back_does_not_undo_an_unlock_made_in_between() {
    let c = alice_locked_while_cut_off("192.0.2.150", 2000, true);
    unlock(&c.b, "alice");
    wait_until(&c.a, Duration::from_secs(5), "A heard the unlock", || {
        check(&c.a, &c.alice).decision == Decision::Allow
    });
    std::thread::sleep(Duration::from_millis(2500)); // past A's next heartbeat
    assert_eq!(check(&c.b, &c.alice).decision, Decision::Allow, "the retry undid the unlock in the store");
    assert_eq!(check(&c.a, &c.alice).decision, Decision::Allow);
}

/// Nor does a failed retry bring back, on the host that took it, a lockout
/// an unlock cleared: the degraded entry is gone, and a merge that loses
/// to the unlock also forgets what the host refused from memory.
#[test]
fn a_failed_retry_does_not_bring_back_a_lockout_an_unlock_cleared() {
    let c = alice_locked_while_cut_off("192.0.2.160", 2000, true);
    c.b.cli_json(&["unlock", "--route", "login", "--account", "alice", "--source", "192.0.2.160"]);
    wait_until(&c.a, Duration::from_secs(5), "A heard the unlock", || {
        check(&c.a, &c.alice).decision == Decision::Allow
    });
    // A's path to the store stalls over its next heartbeat, then returns.
    c.proxy.set_mode(ProxyMode::BlackHole);
    std::thread::sleep(Duration::from_millis(2500));
    c.proxy.set_mode(ProxyMode::Pass);
    let other = subject("192.0.2.9", "someone");
    wait_until(&c.a, Duration::from_secs(10), "A answers from the store again", || {
        !runtime().block_on(c.a.client().check_answered("login", &other)).degraded
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(check(&c.b, &c.alice).decision, Decision::Allow);
    assert_eq!(check(&c.a, &c.alice).decision, Decision::Allow, "A refuses alice from memory after the unlock");
}

/// A lockout written back after an outage is in the account's index, as a
/// report's entry is: an account-wide unlock clears it in the store, and
/// every host lets the account in. (The merge left it out, so only an
/// unlock by source cleared it.)
#[test]
fn an_account_wide_unlock_clears_a_lockout_written_back_after_an_outage() {
    let c = alice_locked_while_cut_off("192.0.2.140", 200, false);
    assert_eq!(check(&c.b, &c.alice).decision, Decision::Deny, "written back: B refuses through the store");
    unlock(&c.b, "alice");
    wait_until(&c.a, Duration::from_secs(5), "A heard the unlock", || {
        check(&c.a, &c.alice).decision == Decision::Allow
    });
    assert_eq!(check(&c.b, &c.alice).decision, Decision::Allow, "the store's entry was unlocked");
}
