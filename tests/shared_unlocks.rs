//! Unlocks across hosts that the store's memory or a host's own life
//! could lose: a lockout a restarted host reloaded from its state file, an
//! unlock replayed from the log, a write-back retried after an unlock, and
//! a host that dies right after its unlock ran in the store. Each test
//! here failed on a build of the day it was written.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::redis::{require_redis, Proxy, ProxyMode, RedisServer};
use common::shared::*;
use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

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

fn count(d: &TestDaemon, needle: &str) -> usize {
    d.log().matches(needle).count()
}

fn show(d: &TestDaemon, who: &str, s: &Subject<'_>) -> Decision {
    let v = check(d, s);
    eprintln!("  {who}: {:?} {:?} retry_after {} ms", v.decision, v.reason, v.retry_after_ms);
    v.decision
}

/// A host that restarted holds the lockouts it knew by name only (the
/// state file keeps no account): an account-wide unlock on another host
/// still clears them there, since the script publishes each key it
/// unlocked. (With only the account's `A` message, the restarted host went
/// on refusing for the rest of the lockout.)
#[test]
fn an_account_wide_unlock_clears_a_lockout_a_restarted_host_reloaded() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let mut a = host(&redis.url(), &secret, "");
    let b = host(&redis.url(), &secret, "");
    std::thread::sleep(Duration::from_millis(300));
    let alice = subject("192.0.2.130", "alice");
    lock(&a, &alice);
    wait_until(&b, Duration::from_secs(5), "B refuses", || check(&b, &alice).decision == Decision::Deny);
    // A deploy restarts A (SIGTERM, its state file kept).
    a.terminate();
    a.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    eprintln!("A after restart, lockouts: {}", a.cli_json(&["lockouts"]));
    show(&a, "A before unlock", &alice);
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    eprintln!("unlock on B: {unlocked}");
    std::thread::sleep(Duration::from_millis(1000));
    eprintln!("1 s after the account-wide unlock on B:");
    let db = show(&b, "B", &alice);
    let da = show(&a, "A", &alice);
    eprintln!("store: {}", redis.cmd(&["ZRANGE", "tg:{unlocks}", "0", "-1"]));
    // The operator tries again, this time on A itself.
    let again = a.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    eprintln!("unlock on A: {again}");
    std::thread::sleep(Duration::from_millis(300));
    let da2 = show(&a, "A after unlocking on A too", &alice);
    eprintln!("A lockouts: {}", a.cli_json(&["lockouts"]));
    assert_eq!(db, Decision::Allow);
    assert_eq!((da, da2), (Decision::Allow, Decision::Allow), "A still refuses alice after account-wide unlocks");
}

/// The same when the host is down during the unlock: the keys the script
/// named are logged too, and the host forgets them when it replays the log.
#[test]
fn a_replayed_account_wide_unlock_clears_a_reloaded_lockout() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let mut a = host(&redis.url(), &secret, "");
    let b = host(&redis.url(), &secret, "");
    std::thread::sleep(Duration::from_millis(300));
    let alice = subject("192.0.2.131", "alice");
    lock(&a, &alice);
    wait_until(&b, Duration::from_secs(5), "B refuses", || check(&b, &alice).decision == Decision::Deny);
    a.terminate();
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    eprintln!("unlock on B while A is down: {unlocked}");
    std::thread::sleep(Duration::from_millis(300));
    eprintln!("log: {}", redis.cmd(&["ZRANGE", "tg:{unlocks}", "0", "-1"]));
    a.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let db = show(&b, "B", &alice);
    let da = show(&a, "A after restart + replay", &alice);
    assert_eq!(db, Decision::Allow);
    assert_eq!(da, Decision::Allow, "A refuses alice after an account-wide unlock it replayed");
}

/// A lockout whose write-back failed is not written back after an unlock
/// made meanwhile: the host that hears the unlock clears it from its
/// degraded table, so the next heartbeat's retry does not lock the
/// account in the store again.
#[test]
fn a_retried_write_back_does_not_undo_an_unlock_made_in_between() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let slow_beat = "heartbeat_ms = 2000\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let (a, b) = (host(&proxy.url(), &secret, slow_beat), host(&redis.url(), &secret, slow_beat));
    let alice = subject("192.0.2.150", "alice");
    // Learn alice's store key name, then leave the store as if that were
    // long ago (entry and index gone).
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
    assert_eq!(check(&a, &alice).decision, Decision::Deny);
    redis.cmd(&["HSET", &name, "planted", "1"]);
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "first write-back failed", || a.log().contains("not written back"));
    // The bad value goes; right after, the operator unlocks alice on B.
    redis.cmd(&["DEL", &name]);
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    let t_unlock = Instant::now();
    eprintln!("account-wide unlock on B: {unlocked}");
    std::thread::sleep(Duration::from_millis(150));
    let d_after_unlock = show(&a, "A right after the unlock", &alice);
    let t = Instant::now();
    while !a.log().contains("written back after a failed try") && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "retry logged: {} ({:?} after the unlock)",
        a.log().contains("written back after a failed try"),
        t_unlock.elapsed()
    );
    let db = show(&b, "B after A's retry", &alice);
    let da = show(&a, "A after A's retry", &alice);
    assert_eq!(d_after_unlock, Decision::Allow);
    assert_eq!((db, da), (Decision::Allow, Decision::Allow), "the retry undid the operator's unlock");
}

/// Nor does a failed retry bring back, on the host that took it, a lockout
/// an unlock cleared: the degraded entry is gone, and a merge that loses
/// to the unlock also forgets what the host refused from memory.
#[test]
fn a_failed_retry_does_not_bring_back_a_lockout_an_unlock_cleared() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let slow_beat = "heartbeat_ms = 2000\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let (a, b) = (host(&proxy.url(), &secret, slow_beat), host(&redis.url(), &secret, slow_beat));
    let alice = subject("192.0.2.160", "alice");
    check(&b, &alice);
    report(&b, &alice, Outcome::Failure);
    let name = redis.cmd(&["KEYS", "tg:*:f:login/source_failures:*"]).trim().to_string();
    proxy.set_mode(ProxyMode::Drop);
    wait_until(&a, Duration::from_secs(10), "A degraded", || {
        check(&a, &subject("192.0.2.171", "ursula"));
        a.log().contains("shared store unreachable")
    });
    for _ in 0..2 {
        check(&a, &alice);
        report(&a, &alice, Outcome::Failure);
    }
    redis.cmd(&["DEL", &name]);
    redis.cmd(&["HSET", &name, "planted", "1"]);
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "first write-back failed", || a.log().contains("not written back"));
    redis.cmd(&["DEL", &name]);
    // Source unlock on B: a tombstone at the key, U heard by A.
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "alice", "--source", "192.0.2.160"]);
    eprintln!("source unlock on B: {unlocked}");
    std::thread::sleep(Duration::from_millis(150));
    let d1 = show(&a, "A right after the unlock", &alice);
    // A's path to the store stalls over its next heartbeat: the retry's
    // merge times out.
    let failed_before = count(&a, "not written back");
    proxy.set_mode(ProxyMode::BlackHole);
    let t = Instant::now();
    while count(&a, "not written back") == failed_before && t.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("retry failed again: {}", count(&a, "not written back") > failed_before);
    proxy.set_mode(ProxyMode::Pass);
    // A reconnects (its calls time out, the breaker opens, a probe).
    let other = subject("192.0.2.9", "someone");
    wait_until(&a, Duration::from_secs(10), "A answers from the store again", || {
        !runtime().block_on(a.client().check_answered("login", &other)).degraded
    });
    std::thread::sleep(Duration::from_millis(2500));
    eprintln!(
        "A log tail:\n{}",
        a.log().lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    let db = show(&b, "B", &alice);
    let da = show(&a, "A", &alice);
    eprintln!("A lockouts: {}", a.cli_json(&["lockouts"]));
    assert_eq!(d1, Decision::Allow);
    assert_eq!((db, da), (Decision::Allow, Decision::Allow), "A refuses alice from memory after the unlock");
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
    std::thread::sleep(Duration::from_millis(200));
    show(&h, "H before", &alice);
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
    eprintln!("unlock log: {:?}", redis.cmd(&["ZRANGE", "tg:{unlocks}", "0", "-1"]));
    // A fresh host asks the store: unlocked there.
    let fresh = host(&redis.url(), &secret, "");
    std::thread::sleep(Duration::from_millis(300));
    let df = show(&fresh, "fresh host (store)", &alice);
    let dh = show(&h, "H", &alice);
    g.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let dh2 = show(&h, "H after G restarted", &alice);
    // Whether G died before or after its script ran, H answers as the
    // store does: an unlock the store made is heard (the script publishes
    // it in the same step), one it never made is not assumed.
    assert_eq!((dh, dh2), (df, df), "H disagrees with the store");
}

/// A lockout written back after an outage is in the account's index, as a
/// report's entry is: an account-wide unlock clears it in the store, and
/// every host lets the account in. (The merge left it out, so only an
/// unlock by source cleared it.)
#[test]
fn an_account_wide_unlock_clears_a_lockout_written_back_after_an_outage() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let fast = "heartbeat_ms = 200\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let (a, b) = (host(&proxy.url(), &secret, fast), host(&redis.url(), &secret, fast));
    let alice = subject("192.0.2.140", "alice");
    proxy.set_mode(ProxyMode::Drop);
    wait_until(&a, Duration::from_secs(10), "A degraded", || {
        check(&a, &subject("192.0.2.171", "ursula"));
        a.log().contains("shared store unreachable")
    });
    // alice mistypes twice from her office while A is cut off.
    for _ in 0..2 {
        check(&a, &alice);
        report(&a, &alice, Outcome::Failure);
    }
    assert_eq!(check(&a, &alice).decision, Decision::Deny);
    let before = count(&a, "global rules answered by the store");
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "A recovered", || count(&a, "global rules answered by the store") > before);
    eprintln!("written back; store keys: {}", redis.cmd(&["KEYS", "tg:*"]).replace('\n', " "));
    show(&b, "B before unlock", &alice);
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    eprintln!("account-wide unlock on B: {unlocked}");
    std::thread::sleep(Duration::from_millis(500));
    let db = show(&b, "B after", &alice);
    let da = show(&a, "A after", &alice);
    let again = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    eprintln!("second account-wide unlock on B: {again}");
    std::thread::sleep(Duration::from_millis(300));
    let db2 = show(&b, "B after a second unlock", &alice);
    let with_source = b.cli_json(&["unlock", "--route", "login", "--account", "alice", "--source", "192.0.2.140"]);
    eprintln!("unlock with --source on B: {with_source}");
    std::thread::sleep(Duration::from_millis(300));
    show(&b, "B after a source unlock", &alice);
    assert_eq!((db, da, db2), (Decision::Allow, Decision::Allow, Decision::Allow), "account-wide unlock did not take");
}
