//! Shared mode against real `redis-server` processes and several
//! real daemons: the single-host guarantees hold across hosts, including
//! under concurrency, and a store that dies, freezes or is cut off leaves
//! every answer bounded and the control in place (degraded shares).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{require_redis, Proxy, ProxyMode, RedisServer};
use common::shared::*;
use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

/// `extra` is more `[shared]` keys; `timeout_ms` is 100 unless it sets it.
fn shared_config(url: &str, secret: &Path, extra: &str) -> String {
    // 100 ms, not the default 2: a loaded 2-core CI machine cannot promise
    // a healthy store's reply in 2 ms, and a test that expects the store
    // to decide must not see a timeout. The waits tests bound (250 ms)
    // stay well above it.
    // (`connect_timeout_ms` is another key: only a line naming `timeout_ms` itself counts.)
    let sets_timeout = extra.lines().any(|line| line.trim_start().starts_with("timeout_ms"));
    let timeout = if sets_timeout { "" } else { "timeout_ms = 100\n" };
    format!(
        "secret = \"{}\"\n\n[shared]\nurl = \"{url}\"\n{timeout}hosts = 3\nprobe_interval_ms = 50\nprobe_max_ms = 200\n{extra}\n",
        secret.display()
    )
}

/// `n` daemons on the system clock (the store's clock rules global rules)
/// sharing `url`.
fn daemons(n: usize, url: &str, secret: &Path, extra: &str) -> Vec<TestDaemon> {
    (0..n).map(|_| TestDaemon::start_with(Some(&shared_config(url, secret, extra)), false)).collect()
}

#[test]
fn three_daemons_admit_five_parallel_guesses_from_one_address() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(3, &redis.url(), &shared_secret(dir.path()), PATIENT);
    let tried = race_logins(&daemons, ATTEMPTS, PASSWORD_HASH, |_| subject("198.51.100.7", "alice"));
    assert_eq!(tried, 5, "one limit for three hosts: 5 guesses, not 15");
    for d in &daemons {
        let v = check(d, &subject("198.51.100.7", "alice"));
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "every host refuses");
    }
    assert_eq!(check(&daemons[0], &subject("203.0.113.9", "alice")).decision, Decision::Allow);
}

#[test]
fn three_daemons_admit_fifty_guesses_against_one_account_from_many_addresses() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(3, &redis.url(), &shared_secret(dir.path()), PATIENT);
    let tried = race_logins(&daemons, ATTEMPTS, PASSWORD_HASH, |n| {
        subject(leak(format!("198.51.{}.{}", 100 + n / 250, 1 + n % 250)), "bob")
    });
    assert_eq!(tried, 50, "the account ceiling is one for three hosts: 50, not 150");
    let v = check(&daemons[2], &subject("203.0.113.9", "bob"));
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "account_failures"));
}

#[test]
fn a_store_killed_mid_traffic_leaves_every_answer_bounded_and_the_degraded_share_enforced() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(2, &redis.url(), &shared_secret(dir.path()), "");
    // Traffic on both daemons while the store dies under it.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rt = runtime();
    let mut tasks = Vec::new();
    for (i, d) in daemons.iter().enumerate() {
        for c in 0..10 {
            let client = d.client();
            let stop = stop.clone();
            tasks.push(rt.spawn(async move {
                let mut slowest = Duration::ZERO;
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let who = format!("user-{i}-{c}-{n}");
                    let s = Subject { peer: Some(ip("198.51.100.20")), account: Some(&who), ..Subject::default() };
                    let started = Instant::now();
                    let v = client.check("login", &s).await;
                    slowest = slowest.max(started.elapsed());
                    verdict(v);
                    n += 1;
                }
                (slowest, n)
            }));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    redis.kill9();
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    let mut answered = 0;
    for t in tasks {
        let (s, n) = rt.block_on(t).unwrap();
        slowest = slowest.max(s);
        answered += n;
    }
    assert!(answered > 100, "traffic flowed: {answered}");
    // 100 ms timeout; a loaded 2-core machine gets slack (the strict figure
    // is the benchmark's).
    assert!(slowest < Duration::from_millis(250), "an answer took {slowest:?} while the store died");

    // Degraded: each host counts a global rule at ceil(5 / 3) = 2.
    let mallory = subject("192.0.2.66", "mallory");
    for n in 0..2 {
        let v = check(&daemons[0], &mallory);
        assert_eq!(v.decision, Decision::Allow, "degraded attempt {n}");
        report(&daemons[0], &mallory, Outcome::Failure);
    }
    let answered = runtime().block_on(daemons[0].client().check_answered("login", &mallory));
    assert!(answered.degraded, "the verdict says it was decided on this host's share");
    let v = verdict(answered.answer);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "the third, degraded");
    assert!(daemons[0].log().contains("degraded"), "a log line says so:\n{}", daemons[0].log());
    let (_, shared) = runtime().block_on(daemons[0].client().status_with_shared()).unwrap();
    let shared = shared.expect("a shared daemon's status has the store's");
    assert!(shared.degraded && shared.state == "open", "{shared:?}");
    assert!(shared.timeouts + shared.errors > 0 && shared.degraded_answers > 0, "{shared:?}");
    assert_eq!(shared.hosts_in_force, 3);

    // The store comes back empty (no persistence): the lockout taken while
    // degraded is written back, and the other host refuses it via the store.
    redis.restart();
    for d in &daemons {
        wait_for_recovery(d);
    }
    let answered = runtime().block_on(daemons[1].client().check_answered("login", &mallory));
    assert!(!answered.degraded, "decided by the store again");
    let v = verdict(answered.answer);
    assert_eq!(
        (v.decision, v.rule.as_ref()),
        (Decision::Deny, "source_failures"),
        "written back:\n{}",
        daemons[0].log()
    );
    let (_, shared) = runtime().block_on(daemons[0].client().status_with_shared()).unwrap();
    let shared = shared.unwrap();
    assert_eq!((shared.state.as_str(), shared.degraded), ("closed", false), "{shared:?}");
    assert!(shared.written_back >= 1 && shared.transitions >= 2 && shared.degraded_total_ms > 0, "{shared:?}");
}

/// Waits until the daemon's store is reachable again after an outage (the
/// second "reachable" line: the first is the start's).
fn wait_for_recovery(daemon: &TestDaemon) {
    wait_until(daemon, Duration::from_secs(10), "no recovery", || {
        daemon.log().matches("shared store reachable").count() >= 2
    });
}

#[test]
fn a_frozen_store_opens_the_breaker_and_nothing_waits_on_it() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "");
    let d = &daemons[0];
    let erin = subject("192.0.2.70", "erin");
    assert_eq!(check(d, &erin).decision, Decision::Allow);
    redis.pause();
    let rt = runtime();
    let client = d.client();
    let mut slowest = Duration::ZERO;
    for n in 0..50 {
        let who = format!("frozen-{n}");
        let s = Subject { peer: Some(ip("192.0.2.71")), account: Some(&who), ..Subject::default() };
        let started = Instant::now();
        verdict(rt.block_on(client.check("login", &s)));
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_millis(250), "an answer waited {slowest:?} on a frozen store");
    assert!(d.log().contains("shared store unreachable"), "the breaker opened:\n{}", d.log());
    redis.resume();
    wait_for_recovery(d);
}

#[test]
fn one_daemon_cut_off_is_degraded_alone() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let cut = TestDaemon::start_with(Some(&shared_config(&proxy.url(), &secret, "")), false);
    let whole = TestDaemon::start_with(Some(&shared_config(&redis.url(), &secret, "")), false);
    proxy.set_mode(ProxyMode::BlackHole);
    let trent = subject("192.0.2.80", "trent");
    // Three failures through the whole daemon reach the store; the cut-off
    // one counts its own share (2) and refuses a third attempt there.
    for _ in 0..3 {
        assert_eq!(check(&whole, &trent).decision, Decision::Allow);
        report(&whole, &trent, Outcome::Failure);
    }
    for _ in 0..2 {
        check(&cut, &subject("192.0.2.81", "ursula"));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cut.log().contains("shared store unreachable") {
        assert!(Instant::now() < deadline, "the cut-off daemon never noticed:\n{}", cut.log());
        check(&cut, &subject("192.0.2.81", "ursula"));
    }
    assert!(!whole.log().contains("shared store unreachable"), "the other daemon is unaffected:\n{}", whole.log());
    // The whole daemon still counts exactly through the store: 2 left.
    assert_eq!(check(&whole, &trent).remaining, 1, "5 - 3 failures - 1 in flight");
    // Back to Pass: the cut-off daemon reconnects (its black-holed socket
    // never closes, so only a new connection finds the store).
    proxy.set_mode(ProxyMode::Pass);
    wait_for_recovery(&cut);
    let answered = runtime().block_on(cut.client().check_answered("login", &trent));
    assert!(!answered.degraded, "through the proxy again");
    let v = verdict(answered.answer);
    assert_eq!((v.decision, v.remaining), (Decision::Allow, 0), "the store's count: 3 failures, 2 in flight");
}

#[test]
fn a_host_with_another_secret_refuses_to_join() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let _first = daemons(1, &redis.url(), &shared_secret(dir.path()), "");
    let other = tempfile::tempdir().unwrap();
    let mut second = TestDaemon::prepare(Some(&shared_config(&redis.url(), &shared_secret(other.path()), "")), false);
    let status = second.serve_command().output().expect("run serve");
    assert!(!status.status.success(), "a host keyed with another secret must not join");
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(stderr.contains("was joined with another secret key"), "{stderr}");
    let _ = &mut second;
}

/// Hosts that would name one account's keys differently never share a
/// store. A deployment whose hosts keep BLAKE2b keys (state files from
/// before key derivations): a host added with a new state file learns
/// their derivation from the store and counts with them; one set to
/// another is refused, naming the setting, which its file, still without
/// rows, takes. A new file whose store cannot be reached starts degraded
/// on the newest, and says so.
#[test]
fn a_new_host_takes_the_stores_key_derivation_and_one_set_otherwise_is_refused() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let with = |setting: &str| format!("{setting}\n{}", shared_config(&redis.url(), &secret, ""));
    // Asking writes nothing: a start that fails after it (its class file
    // is missing) leaves the empty store unclaimed.
    let doomed = TestDaemon::prepare(Some(&with("")), false);
    let missing_classes = doomed.dir.path().join("missing.csv");
    let config = format!("{}\n[source]\nclass_file = \"{}\"\n", with(""), missing_classes.display());
    std::fs::write(doomed.config.as_ref().unwrap(), config).unwrap();
    let status = doomed.serve_command().output().expect("run serve");
    assert!(!status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert_eq!(redis.cmd(&["EXISTS", "tg:{meta}"]).trim(), "0", "the store was claimed by a start that failed");
    let first = TestDaemon::start_with(Some(&with("key_derivation = 1")), false);
    let added = TestDaemon::start_with(Some(&with("")), false);
    added.wait_for_log("key_derivation=1");
    let yusuf = subject("192.0.2.95", "yusuf");
    for _ in 0..5 {
        report(&first, &yusuf, Outcome::Failure);
    }
    assert_eq!(check(&added, &yusuf).decision, Decision::Deny, "one name for the account on both hosts");

    let mut other = TestDaemon::prepare(Some(&with("key_derivation = 2")), false);
    let status = other.serve_command().output().expect("run serve");
    assert!(!status.status.success(), "a host deriving keys otherwise must not join");
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(stderr.contains("use key derivation 1, and this host's uses 2: set key_derivation = 1"), "{stderr}");
    std::fs::write(other.config.as_ref().unwrap(), with("key_derivation = 1")).unwrap();
    other.spawn();
    assert_eq!(check(&other, &yusuf).decision, Decision::Deny, "its file, without rows, took the setting");

    // Without its secret file, a new host is refused before it makes one
    // (or a state file) under a secret of its own.
    let keyless = TestDaemon::prepare(None, false);
    let missing = keyless.dir.path().join("secret");
    let config = format!(
        "secret = \"{}\"\n{}",
        missing.display(),
        shared_config(&redis.url(), &secret, "").split_once('\n').unwrap().1
    );
    std::fs::write(keyless.dir.path().join("tollgate.toml"), config).unwrap();
    let status =
        keyless.serve_command().arg("--config").arg(keyless.dir.path().join("tollgate.toml")).output().unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(!status.status.success() && stderr.contains("another secret key"), "{stderr}");
    assert!(!missing.exists() && !keyless.state.exists(), "nothing left behind");

    // A new state file, and no store to ask: degraded on the newest, as
    // any host starts while the store is away, and says so.
    let gone = shared_config("redis+unix:///nonexistent/r.sock", &secret, "");
    let unasked = TestDaemon::start_with(Some(&gone), false);
    unasked.wait_for_log("key_derivation=2");
    assert!(unasked.log().contains("cannot learn the shared store's key derivation"), "{}", unasked.log());
}

#[test]
fn garbage_at_a_key_degrades_that_decision_only() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "");
    let d = &daemons[0];
    let victor = subject("192.0.2.90", "victor");
    assert_eq!(check(d, &victor).decision, Decision::Allow);
    report(d, &victor, Outcome::Failure);
    let keys = redis.cmd(&["KEYS", "tg:*:f:login/source_failures:*"]);
    let key = keys.lines().next().expect("the entry is in the store").trim().to_string();
    redis.cmd(&["DEL", &key]);
    redis.cmd(&["LPUSH", &key, "not ours"]);
    let v = check(d, &victor);
    assert_eq!(v.decision, Decision::Allow, "answered on this host's share, not an error");
    assert!(d.log().contains("did not write"), "a clear log line:\n{}", d.log());
    redis.cmd(&["SET", &key, "hello"]);
    verdict(runtime().block_on(d.client().report("login", &victor, Outcome::Failure)));
    // Other keys still go to the store, and the breaker stays closed.
    assert!(!d.log().contains("shared store unreachable"), "{}", d.log());
    let wendy = subject("192.0.2.91", "wendy");
    assert_eq!(check(d, &wendy).decision, Decision::Allow);
    assert!(redis.cmd(&["DBSIZE"]).trim().parse::<u32>().unwrap() >= 2, "wendy's entry reached the store");
}

#[test]
fn a_lockout_from_the_store_survives_a_restart_without_the_store() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let mut daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "");
    let d = &mut daemons[0];
    let mallory = subject("192.0.2.99", "mallory");
    for _ in 0..5 {
        assert_eq!(check(d, &mallory).decision, Decision::Allow);
        report(d, &mallory, Outcome::Failure);
    }
    assert_eq!(check(d, &mallory).decision, Decision::Deny);
    d.kill9();
    redis.kill9();
    d.spawn();
    let v = check(d, &mallory);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "refused without the store");
    assert!(v.retry_after_ms > 0);
}

#[test]
fn host_rules_never_touch_the_store() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "");
    let d = &daemons[0];
    redis.pause();
    let rt = runtime();
    let client = d.client();
    let started = Instant::now();
    for n in 0..200 {
        let s = Subject { peer: Some(v4(n)), ..Subject::default() };
        assert_eq!(verdict(rt.block_on(client.check("request", &s))).decision, Decision::Allow);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "200 host-rule checks took {:?}", started.elapsed());
    assert!(!d.log().contains("shared store unreachable"), "no store call was made:\n{}", d.log());
    let (_, shared) = rt.block_on(client.status_with_shared()).unwrap();
    let shared = shared.unwrap();
    assert!(shared.global_rules.contains(&"login/source_failures".to_string()), "{shared:?}");
    assert!(!shared.global_rules.iter().any(|r| r.starts_with("request/")), "{shared:?}");
    redis.resume();
}

/// Waits until `daemon`'s check of `who` has `decision`, or panics.
fn until_decision(daemon: &TestDaemon, who: &Subject<'_>, decision: Decision, what: &str) {
    wait_until(daemon, Duration::from_secs(5), what, || check(daemon, who).decision == decision);
}

#[test]
fn a_lockout_is_pushed_to_the_other_hosts_and_refused_there_without_the_store() {
    lockout_is_pushed_and_refused_without_the_store("");
}

/// RESP3 delivers pub/sub messages as pushes, not as replies: the
/// subscription must hear them all the same.
#[test]
fn a_lockout_is_pushed_over_resp3_as_over_resp2() {
    lockout_is_pushed_and_refused_without_the_store("?protocol=resp3");
}

/// `query` is appended to the store's URL.
fn lockout_is_pushed_and_refused_without_the_store(query: &str) {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(2, &format!("{}{query}", redis.url()), &shared_secret(dir.path()), "");
    // Every connection of both hosts (its calls and its subscription)
    // speaks the protocol the URL names. redis-cli's own is left out
    // (`cmd=client|list`, `cmd=client` before Redis 7); Redis shows `resp=`
    // from 7.0, so on 6.2 only the connections are counted.
    let started = Instant::now();
    let (clients, ours) = loop {
        let clients = redis.cmd(&["CLIENT", "LIST"]);
        let ours: Vec<String> = clients.lines().filter(|l| !l.contains(" cmd=client")).map(str::to_string).collect();
        let subscribed = ours.iter().filter(|l| l.contains(" sub=1 ")).count();
        if (ours.len(), subscribed) == (4, 2) || started.elapsed() > Duration::from_secs(5) {
            break (clients, ours);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(ours.len(), 4, "two daemons, a connection and a subscription each:\n{clients}");
    assert_eq!(ours.iter().filter(|l| l.contains(" sub=1 ")).count(), 2, "two subscriptions:\n{clients}");
    let resp = if query.contains("resp3") { "resp=3" } else { "resp=2" };
    if clients.contains(" resp=") {
        assert!(ours.iter().all(|l| l.contains(resp)), "all {resp}:\n{clients}");
    }
    let mallory = subject("192.0.2.110", "mallory");
    for _ in 0..5 {
        assert_eq!(check(&daemons[0], &mallory).decision, Decision::Allow);
        report(&daemons[0], &mallory, Outcome::Failure);
    }
    // B never asked the store about mallory; it hears the lockout (within
    // a few hundred ms here; longer when the machine is loaded, so waited
    // for, as B lists it from memory). With the store frozen, it still
    // refuses, from memory, at once.
    wait_until(&daemons[1], Duration::from_secs(5), "B heard mallory's lockout", || {
        daemons[1].cli_json(&["lockouts"]).to_string().contains("source_failures")
    });
    redis.pause();
    let started = Instant::now();
    let v = check(&daemons[1], &mallory);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "pushed:\n{}", daemons[1].log());
    assert!(v.retry_after_ms > 0);
    assert!(started.elapsed() < Duration::from_millis(100), "no wait on the frozen store: {:?}", started.elapsed());
    redis.resume();
}

#[test]
fn an_unlock_clears_the_store_and_every_host_forgets_the_lockout() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(2, &redis.url(), &shared_secret(dir.path()), "");
    std::thread::sleep(Duration::from_millis(300));
    let mallory = subject("192.0.2.120", "mallory");
    for _ in 0..5 {
        check(&daemons[0], &mallory);
        report(&daemons[0], &mallory, Outcome::Failure);
    }
    until_decision(&daemons[1], &mallory, Decision::Deny, "B refuses the lockout");
    // Unlock the whole account (every source) on A.
    let out = daemons[0].cli(&["unlock", "--route", "login", "--account", "mallory"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    until_decision(&daemons[1], &mallory, Decision::Allow, "B forgot the lockout after the unlock");
    assert_eq!(check(&daemons[0], &mallory).decision, Decision::Allow, "A too");
}

/// An unlock sends every rule's op at once: a slow store costs it one
/// round trip, not one per rule (login's account and source rules are two;
/// they were sent one after the other).
#[test]
fn an_unlock_through_a_slow_store_waits_one_round_trip_not_one_per_rule() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start_with(
        Some(&shared_config(&proxy.url(), &shared_secret(dir.path()), "connect_timeout_ms = 2000")),
        false,
    );
    let rt = runtime();
    // The store answers (a first check on a busy machine may not, in time).
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(d.client().check_answered("login", &subject("192.0.2.9", "mallory"))).degraded {
        assert!(Instant::now() < deadline, "the store never answered:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Long enough that a CLI's start on a busy machine fits well inside one,
    // short of the connection's own reply timeout (`LATE_REPLY_WAIT_MS`).
    let delay = Duration::from_millis(700);
    proxy.set_mode(ProxyMode::Delay(delay));
    let started = Instant::now();
    let out = d.cli(&["unlock", "--route", "login", "--account", "mallory"]);
    let took = started.elapsed();
    proxy.set_mode(ProxyMode::Pass);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), d.log());
    assert!(took >= delay, "the store's reply was waited for: {took:?}");
    assert!(took < delay * 2, "two rules' ops in one round trip, not two: {took:?}");
}

/// A write-back larger than the queue to the store (`pending_max`) is
/// sent in chunks the queue holds: every lockout taken while the store was
/// away reaches it. Sent all at once, the merges past the queue's room
/// were refused (QueueFull) and never written (a red team's finding).
#[test]
fn a_write_back_larger_than_the_queue_reaches_the_store_whole() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start_with(
        Some(&shared_config(&redis.url(), &shared_secret(dir.path()), "pending_max = 2")),
        false,
    );
    redis.kill9();
    const LOCKED: usize = 8;
    for i in 0..LOCKED {
        let who = subject(leak(format!("192.0.2.{}", 10 + i)), leak(format!("victim{i}")));
        // ceil(5 / 3 hosts) = 2 failures lock while degraded.
        for _ in 0..2 {
            check(&d, &who);
            report(&d, &who, Outcome::Failure);
        }
        assert_eq!(check(&d, &who).decision, Decision::Deny, "locked while degraded");
    }
    redis.restart();
    wait_until(&d, Duration::from_secs(10), "recovered", || d.log().matches("shared store reachable").count() >= 2);
    let (_, shared) = runtime().block_on(d.client().status_with_shared()).unwrap();
    let shared = shared.expect("shared status");
    assert!(!d.log().contains("a lockout was not written back"), "{}", d.log());
    assert!(shared.written_back as usize >= LOCKED, "every lockout written back: {shared:?}");
}

/// An op the script cannot read (a short packed argument) fails on its
/// own: the batch's other ops still run. Unguarded, the script's error
/// aborted the whole batch (a red team's finding).
#[test]
fn an_op_the_script_cannot_read_fails_alone_and_the_rest_of_its_batch_runs() {
    require_redis();
    let redis = RedisServer::unix();
    let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/shared/decide.lua")).unwrap();
    let sha = redis.cmd(&["SCRIPT", "LOAD", &script]);
    assert_eq!(sha.len(), 40, "{sha}");
    // Op 1: a check whose argument says one rule and holds none. Op 2: a
    // heartbeat (plain arguments), which adds this host to a sorted set.
    let out = redis.cmd(&[
        "EVALSHA",
        &sha,
        "2",
        "tg:{a}:f:login/x:00",
        "tg:{hosts}",
        "2",
        "C",
        "1",
        "1",
        "\u{1}",
        "H",
        "2",
        "1",
        "host-1",
        "60000000",
    ]);
    assert!(!out.contains("ERR"), "the batch ran: {out}");
    assert_eq!(redis.cmd(&["ZCARD", "tg:{hosts}"]), "1", "the heartbeat after the bad op ran");
    assert_eq!(redis.cmd(&["EXISTS", "tg:{a}:f:login/x:00"]), "0", "the bad op wrote nothing");
}

#[test]
fn a_flushed_script_is_loaded_again_and_the_check_still_goes_to_the_store() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "timeout_ms = 500");
    let d = &daemons[0];
    assert_eq!(check(d, &subject("192.0.2.160", "oscar")).decision, Decision::Allow);
    // What a failover to a replica, or an operator's SCRIPT FLUSH, does.
    redis.cmd(&["SCRIPT", "FLUSH"]);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.161", "oscar")));
    assert!(!answered.degraded, "NOSCRIPT is answered by loading the script, not by degrading");
    let (_, shared) = runtime().block_on(d.client().status_with_shared()).unwrap();
    assert!(shared.unwrap().noscript_reloads >= 1);
}

#[test]
fn a_slow_or_dropping_path_to_the_store_degrades_only_its_daemon() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let cut = TestDaemon::start_with(Some(&shared_config(&proxy.url(), &secret, "")), false);
    let whole = TestDaemon::start_with(Some(&shared_config(&redis.url(), &secret, "")), false);
    let rt = runtime();
    for (mode, what) in
        [(ProxyMode::Delay(Duration::from_millis(300)), "delayed past the timeout"), (ProxyMode::Drop, "dropped")]
    {
        proxy.set_mode(mode);
        let mut slowest = Duration::ZERO;
        let mut degraded = false;
        for n in 0..20 {
            let who = format!("slow-{n}");
            let s = Subject { peer: Some(ip("192.0.2.170")), account: Some(&who), ..Subject::default() };
            let started = Instant::now();
            degraded |= rt.block_on(cut.client().check_answered("login", &s)).degraded;
            slowest = slowest.max(started.elapsed());
        }
        assert!(degraded, "{what}: answered on the host's share:\n{}", cut.log());
        assert!(slowest < Duration::from_millis(250), "{what}: an answer took {slowest:?}");
        let answered = rt.block_on(whole.client().check_answered("login", &subject("192.0.2.171", "quentin")));
        assert!(!answered.degraded, "{what}: the other daemon is unaffected");
        proxy.set_mode(ProxyMode::Pass);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rt.block_on(cut.client().check_answered("login", &subject("192.0.2.172", "quentin"))).degraded {
            assert!(Instant::now() < deadline, "{what}: no recovery:\n{}", cut.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

// The red team's cases: each failed before its fix.

/// A check whose store reply arrives after the timeout took places in the
/// store while the daemon answered on its share (a lone late check, not in
/// a burst): the places are given back.
#[test]
fn a_late_admitted_check_gives_its_store_places_back() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start_with(Some(&shared_config(&proxy.url(), &shared_secret(dir.path()), "")), false);
    let rt = runtime();
    assert!(!rt.block_on(d.client().check_answered("login", &subject("192.0.2.9", "warm"))).degraded);
    let before: Vec<String> = redis.cmd(&["--scan", "--pattern", "*:f:*"]).lines().map(str::to_owned).collect();
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    assert!(rt.block_on(d.client().check_answered("login", &subject("192.0.2.10", "late"))).degraded);
    std::thread::sleep(Duration::from_millis(600));
    proxy.set_mode(ProxyMode::Pass);
    std::thread::sleep(Duration::from_millis(600));
    let (_, shared) = rt.block_on(d.client().status_with_shared()).unwrap();
    assert!(shared.unwrap().late_replies >= 1, "the reply came late");
    for k in redis.cmd(&["--scan", "--pattern", "*:f:*"]).lines().filter(|k| !before.iter().any(|b| b == k)) {
        // An entry is 39 bytes and 8 per place in flight.
        let len: usize = redis.cmd(&["STRLEN", k]).trim().parse().unwrap();
        assert_eq!((len - 39) / 8, 0, "{k} still holds a place the late check took");
    }
}

/// A wrong-type value at an account's index key degrades that account's
/// decisions only, not the host's (it once aborted whole batches and
/// opened the breaker).
#[test]
fn a_wrong_type_index_key_degrades_only_its_account() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), "timeout_ms = 1000");
    let d = &daemons[0];
    let victim = subject("198.51.100.7", "poisoned");
    check(d, &victim);
    report(d, &victim, Outcome::Failure);
    let index: Vec<String> = redis.cmd(&["--scan", "--pattern", "*:i:*"]).lines().map(str::to_owned).collect();
    assert!(!index.is_empty(), "an index key exists");
    for k in &index {
        redis.cmd(&["DEL", k]);
        redis.cmd(&["SET", k, "garbage"]);
    }
    for _ in 0..3 {
        report(d, &victim, Outcome::Failure);
    }
    let answered = runtime().block_on(d.client().check_answered("login", &subject("203.0.113.50", "innocent")));
    assert!(!answered.degraded, "an unrelated account stays with the store:\n{}", d.log());
    let (_, shared) = runtime().block_on(d.client().status_with_shared()).unwrap();
    assert!(shared.unwrap().bad_values >= 1);
}

/// A device alice logged in from on host A is known to host B too: the
/// account ceiling a spray holds does not refuse her there.
#[test]
fn alice_on_her_known_device_logs_in_on_another_host_while_a_spray_holds_her_ceiling() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons =
        daemons(2, &redis.url(), &shared_secret(dir.path()), &format!("timeout_ms = 1000{COUNTING_RULES_ONLY}"));
    let (a, b) = (&daemons[0], &daemons[1]);
    let home = Subject { device: Some("cookie-7f1c2a"), ..subject("203.0.113.9", "alice") };
    assert_eq!(check(a, &home).decision, Decision::Allow);
    report(a, &home, Outcome::Success);
    for n in 1..=60 {
        let s = subject(leak(format!("192.0.2.{n}")), "alice");
        let d = if n % 2 == 0 { a } else { b };
        if check(d, &s).decision == Decision::Allow {
            report(d, &s, Outcome::Failure);
        }
    }
    let stranger = Subject { device: Some("cookie-0000"), ..subject("198.51.100.99", "alice") };
    let v = check(b, &stranger);
    assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "account_failures"), "the spray holds the ceiling");
    for (host, d) in [("A", a), ("B", b)] {
        let v = check(d, &home);
        assert_eq!(v.decision, Decision::Allow, "host {host}: her known device is not locked out ({v:?})");
    }
}

/// Red team: a lockout a global rule takes in the store is a
/// lockout like any other, so the operator's view lists it in its recent
/// lockouts, as it does on a host without `[shared]`.
#[test]
fn a_global_rules_lockout_is_in_the_operators_view() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(1, &redis.url(), &shared_secret(dir.path()), PATIENT);
    let d = &daemons[0];
    let mallory = subject("192.0.2.120", "mallory");
    for _ in 0..5 {
        assert_eq!(check(d, &mallory).decision, Decision::Allow);
        report(d, &mallory, Outcome::Failure);
    }
    assert_eq!(check(d, &mallory).decision, Decision::Deny, "locked by the store");
    let rt = runtime();
    let client = d.client();
    wait_until(d, Duration::from_secs(5), "the lockout in the view", || {
        let a = rt.block_on(client.activity(100)).unwrap();
        a.recent_lockouts.iter().any(|l| l.route == "login" && l.rule == "source_failures")
    });
}

/// An abandoned attempt gives back the place its check took in the store,
/// on every host: five checks on one host hold the (account, address) at
/// its threshold everywhere, their abandons free it everywhere, and
/// nothing was counted (the next report's verdict shows all 5 left).
#[test]
fn an_abandoned_attempt_gives_back_its_place_in_the_store() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let daemons = daemons(2, &redis.url(), &shared_secret(dir.path()), "");
    let carol = subject("198.51.100.8", "carol");
    for _ in 0..5 {
        assert_eq!(check(&daemons[0], &carol).decision, Decision::Allow);
    }
    let held = check(&daemons[1], &carol);
    assert_eq!((held.decision, held.rule.as_ref()), (Decision::Deny, "source_failures"), "5 places held");
    let rt = runtime();
    for _ in 0..5 {
        let answered = rt.block_on(daemons[0].client().abandon("login", &carol));
        assert!(!answered.degraded, "decided in the store: {answered:?}");
        verdict(answered.answer);
    }
    let freed = check(&daemons[1], &carol);
    assert_eq!(freed.decision, Decision::Allow, "{freed:?}");
    let reported = verdict(rt.block_on(daemons[1].client().report("login", &carol, Outcome::Success)));
    assert_eq!(reported.remaining, 5, "no failure was counted: {reported:?}");

    // Places nobody will report are undone by an unlock, in the store too:
    // five unreported checks on one host, the source's unlock on the other.
    // (An account-wide unlock finds the store's entries through the
    // account's index, which lists entries with failures only: places on
    // an entry without failures there lapse on their own.)
    let dave = subject("198.51.100.9", "dave");
    for _ in 0..5 {
        assert_eq!(check(&daemons[0], &dave).decision, Decision::Allow);
    }
    let held = check(&daemons[1], &dave);
    assert_eq!((held.decision, held.reason), (Decision::Deny, tollgate::protocol::Reason::AttemptsInFlight));
    let unlocked =
        daemons[1].cli_json(&["unlock", "--route", "login", "--account", "dave", "--source", "198.51.100.9"]);
    assert!(unlocked["cleared"].as_u64().unwrap() >= 1, "{unlocked}");
    assert_eq!(check(&daemons[0], &dave).decision, Decision::Allow, "the store's places went with the unlock");
}

/// A route of the most rules config allows, every one global: its
/// answers outgrow the room kept inline for them on each host, and the
/// store's reply to each check carries all sixteen rules. The tightest
/// (the last) still decides, exactly, across two hosts.
#[test]
fn a_route_of_sixteen_global_rules_is_decided_by_the_store_rule_by_rule() {
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("[responses]\njitter_percent = 0\n");
    for i in 0..tollgate::RULES_PER_ROUTE_MAX {
        let threshold = if i + 1 == tollgate::RULES_PER_ROUTE_MAX { 2 } else { 100 };
        rules += &format!(
            "[routes.wide.rules.r{i:02}]\nkind = \"failures\"\nkey = [\"account\"]\nthreshold = {threshold}\nwindow_secs = 60\n"
        );
    }
    let daemons = daemons(2, &redis.url(), &shared_secret(dir.path()), &rules);
    let alice = subject("192.0.2.40", "alice");
    for d in &daemons {
        let answered = runtime().block_on(d.client().check_answered("wide", &alice));
        assert!(!answered.degraded, "the store decides: {}", d.log());
        let v = verdict(answered.answer);
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Allow, "r15"), "{v:?}");
        verdict(runtime().block_on(d.client().report("wide", &alice, Outcome::Failure)));
    }
    for d in &daemons {
        let answered = runtime().block_on(d.client().check_answered("wide", &alice));
        assert!(!answered.degraded, "the store decides: {}", d.log());
        let v = verdict(answered.answer);
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "r15"), "two failures, one on each host: {v:?}");
    }
    let bob = verdict(runtime().block_on(daemons[1].client().check("wide", &subject("192.0.2.40", "bob"))));
    assert_eq!((bob.decision, bob.remaining), (Decision::Allow, 1), "another account is untouched");
}
