//! Attacks on unlocks and write-backs across hosts, from a red team's
//! second round (each failed on the build it found them in): a forged
//! unlock message while a Cluster node is away, an unlock that failed
//! replayed from the log, an unlock heard while a write-back keeps
//! failing, an account-wide unlock a host did not hear live. Real
//! redis-server processes (one, or a 3-master Cluster) and daemons.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::redis::{require_redis, Cluster, Proxy, ProxyMode, RedisServer};
use common::shared::*;
use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

fn cluster_config(cluster: &Cluster, secret: &Path, extra: &str) -> String {
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "secret = \"{}\"\n\n[shared]\nnodes = [{}]\ntimeout_ms = 200\nhosts = 3\nprobe_interval_ms = 50\nprobe_max_ms = 200\n{extra}\n{COUNTING_RULES_ONLY}",
        secret.display(),
        nodes.join(", ")
    )
}

fn all_keys(cluster: &Cluster) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for i in 0..3 {
        for k in cluster.node_cmd(i, &["KEYS", "tg:*:f:login/source_failures:*"]).lines() {
            if !k.trim().is_empty() {
                out.push((i, k.trim().to_string()));
            }
        }
    }
    out
}

/// Accounts (with their source, home node, source_failures key name and
/// account tag) found by one failure each through `d`.
struct Acct {
    name: &'static str,
    ip: &'static str,
    home: usize,
    tag: String,
}

fn find_accounts(cluster: &Cluster, d: &TestDaemon, want_home: usize, n: usize) -> Vec<Acct> {
    let mut found = Vec::new();
    for i in 0..60 {
        let name = leak(format!("victim{i}"));
        let ip = leak(format!("198.51.100.{}", 10 + i));
        let before = all_keys(cluster);
        let s = subject(ip, name);
        assert_eq!(check(d, &s).decision, Decision::Allow);
        report(d, &s, Outcome::Failure);
        let after = all_keys(cluster);
        let new: Vec<_> = after.into_iter().filter(|k| !before.contains(k)).collect();
        assert_eq!(new.len(), 1, "{new:?}");
        let (home, key) = new[0].clone();
        if home == want_home {
            let tag = key.split('{').nth(1).unwrap().split('}').next().unwrap().to_string();
            found.push(Acct { name, ip, home, tag });
            if found.len() == n {
                return found;
            }
        }
    }
    panic!("not enough accounts on node {want_home}");
}

fn guesses_until_denied(d: &TestDaemon, s: &Subject<'_>, cap: usize) -> usize {
    let mut n = 0;
    while n < cap {
        let v = check(d, s);
        if v.decision != Decision::Allow {
            break;
        }
        report(d, s, Outcome::Failure);
        n += 1;
    }
    n
}

fn wait_degraded(d: &TestDaemon, probe: &Subject<'_>) {
    let start = Instant::now();
    loop {
        let a = runtime().block_on(d.client().check_answered("login", probe));
        runtime().block_on(d.client().report("login", probe, Outcome::Success));
        if a.degraded {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "never degraded:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whoever can publish on the store's channel cannot reset a host's
/// degraded share: while a Cluster node is away, forged `A` messages for
/// the account give no more guesses than the host's share (a live unlock
/// message no longer clears the degraded table; the host's own unlock
/// does).
#[test]
fn a_forged_live_unlock_does_not_reset_the_shares_while_a_node_is_away() {
    require_redis();
    let mut cluster = Cluster::three();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let d = TestDaemon::start_with(Some(&cluster_config(&cluster, &secret, "")), false);
    std::thread::sleep(Duration::from_millis(500));
    let accts = find_accounts(&cluster, &d, 2, 2);
    let (alice, probe) = (&accts[0], &accts[1]);
    let victim = subject(alice.ip, alice.name);
    eprintln!("alice = {} on node {} tag {}", alice.name, alice.home, alice.tag);
    cluster.kill9(2);
    wait_degraded(&d, &subject(probe.ip, probe.name));
    let mut rounds = Vec::new();
    for _ in 0..6 {
        let n = guesses_until_denied(&d, &victim, 20);
        std::thread::sleep(Duration::from_millis(300));
        let still = check(&d, &victim).decision;
        rounds.push((n, still));
        let subs = cluster.node_cmd(0, &["PUBLISH", "tg:events", &format!("A login {}", alice.tag)]);
        eprintln!("forged A message, receivers: {}", subs.trim());
        std::thread::sleep(Duration::from_millis(300));
    }
    let total: usize = rounds.iter().map(|r| r.0).sum();
    eprintln!("per round (guesses, decision after 300ms): {rounds:?}; total {total} on ONE host while node away");
    eprintln!("documented bound across all hosts: 5 + 3 * 2 = 11 (this host's share: 2)");
    assert!(total <= 11, "one host alone let {total} guesses through for one account+source");
}

/// An unlock that reached no store (its node is away) is taken back from
/// the unlock log: a host that restarts and replays the log still refuses
/// the lockout the store holds.
#[test]
fn a_failed_unlock_is_not_applied_by_a_host_replaying_the_log() {
    require_redis();
    let mut cluster = Cluster::three();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let d1 = TestDaemon::start_with(Some(&cluster_config(&cluster, &secret, "")), false);
    let mut d2 = TestDaemon::start_with(Some(&cluster_config(&cluster, &secret, "")), false);
    std::thread::sleep(Duration::from_millis(500));
    let accts = find_accounts(&cluster, &d1, 2, 2);
    let (alice, probe) = (&accts[0], &accts[1]);
    let victim = subject(alice.ip, alice.name);
    // 1 failure already; four more lock alice in the store.
    let n = guesses_until_denied(&d1, &victim, 10);
    eprintln!("locked in the store after {} more failures", n);
    wait_until(&d2, Duration::from_secs(5), "d2 refuses", || check(&d2, &victim).decision == Decision::Deny);
    d2.terminate();
    cluster.kill9(2);
    wait_degraded(&d1, &subject(probe.ip, probe.name));
    // Control: restarted with the node away, d2 refuses from its state file.
    d2.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let control = check(&d2, &victim).decision;
    eprintln!("control: d2 restarted with node away: {control:?}");
    d2.terminate();
    // The operator tries to unlock; the command fails (node away).
    let out = d1.cli(&["unlock", "--route", "login", "--account", alice.name, "--source", alice.ip]);
    eprintln!(
        "unlock exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("log on node 1: {}", cluster.node_cmd(1, &["ZRANGE", "tg:{unlocks}", "0", "-1"]).trim());
    d2.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    let n = guesses_until_denied(&d2, &victim, 20);
    eprintln!("after the failed unlock, restarted d2 let {n} guesses through (control was {control:?})");
    assert_eq!(control, Decision::Deny);
    assert_eq!(n, 0, "a failed unlock was applied by d2; the store still holds the lockout");
}

fn single_config(url: &str, secret: &Path, extra: &str) -> String {
    format!("secret = \"{}\"\n\n[shared]\nurl = \"{url}\"\nhosts = 3\n{extra}\n", secret.display())
}

/// One store and two hosts of three sharing it: A reaches the store
/// through a proxy (to cut, delay or restore), B directly.
struct TwoHosts {
    redis: RedisServer,
    proxy: Proxy,
    dir: tempfile::TempDir,
    a: TestDaemon,
    b: TestDaemon,
}

fn two_hosts(extra: &str) -> TwoHosts {
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let a = TestDaemon::start_with(Some(&single_config(&proxy.url(), &secret, extra)), false);
    let b = TestDaemon::start_with(Some(&single_config(&redis.url(), &secret, extra)), false);
    TwoHosts { redis, proxy, dir, a, b }
}

/// Cuts A's link to the store and waits until A has logged its `n`th
/// outage and answers degraded. Each probe is another account's success
/// from an address of its own, so no rule on the keys under test counts it.
fn cut_until_degraded(a: &TestDaemon, proxy: &Proxy, n: usize) {
    static PROBES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    proxy.set_mode(ProxyMode::Drop);
    wait_until(a, Duration::from_secs(10), "A degraded", || {
        let i = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = subject(leak(format!("100.64.{}.{}", i / 250 % 250, i % 250 + 1)), "ursula");
        let answered = runtime().block_on(a.client().check_answered("login", &probe));
        runtime().block_on(a.client().report("login", &probe, Outcome::Success));
        answered.degraded && a.log().matches("shared store unreachable").count() >= n
    });
}

/// An unlock heard while a write-back of the same key keeps failing is not
/// undone by the failure: the host refuses from memory only while the key
/// is still due, and the merge that lands loses to the unlock.
#[test]
fn an_unlock_heard_during_a_failing_retry_is_not_undone() {
    use std::io::BufRead;
    use std::sync::{Arc, Mutex};
    require_redis();
    let extra =
        "timeout_ms = 1000\nconnect_timeout_ms = 3000\nheartbeat_ms = 100\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let TwoHosts { redis, proxy, dir: _dir, a, b } = two_hosts(extra);
    // Merges as the store sees them arrive (requests are not delayed).
    let merges: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "MONITOR"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        let merges = merges.clone();
        let out = monitor.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains("\"EVALSHA\"") && line.contains(" \"M\" ") {
                    merges.lock().unwrap().push(Instant::now());
                }
            }
        });
    }
    let mut hit = None;
    let mut last_name = String::new();
    for trial in 0..5 {
        let ip = leak(format!("192.0.2.{}", 77 + trial));
        let alice = subject(ip, "alice");
        check(&b, &alice);
        report(&b, &alice, Outcome::Failure);
        let keys = redis.cmd(&["KEYS", "tg:*:f:login/source_failures:*"]);
        let name = keys
            .lines()
            .map(str::trim)
            .find(|k| !k.is_empty() && redis.cmd(&["TYPE", k]).trim() == "string")
            .unwrap()
            .to_string();
        for k in redis.cmd(&["KEYS", "tg:*:i:*"]).lines().filter(|l| !l.is_empty()) {
            redis.cmd(&["DEL", k]);
        }
        redis.cmd(&["DEL", &name]);
        // A value tollgate did not write: every merge of this key fails.
        redis.cmd(&["HSET", &name, "planted", "1"]);
        last_name = name;
        proxy.set_mode(ProxyMode::Drop);
        let other = subject("192.0.2.171", "ursula");
        let t = Instant::now();
        loop {
            let ans = runtime().block_on(a.client().check_answered("login", &other));
            runtime().block_on(a.client().report("login", &other, Outcome::Success));
            if ans.degraded && a.log().matches("shared store unreachable").count() > trial {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "A not degraded:\n{}", a.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        let n = guesses_until_denied(&a, &alice, 10);
        let warned = a.log().matches("not written back").count();
        proxy.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
        wait_until(&a, Duration::from_secs(10), "first write-back failed", || {
            a.log().matches("not written back").count() > warned
        });
        // Two retries seen at the store: the next is due one period later.
        let seen = merges.lock().unwrap().len();
        let t = Instant::now();
        while merges.lock().unwrap().len() < seen + 2 {
            assert!(t.elapsed() < Duration::from_secs(10), "no retries seen:\n{}", a.log());
            std::thread::sleep(Duration::from_millis(5));
        }
        let (t1, t2) = {
            let m = merges.lock().unwrap();
            (m[m.len() - 2], m[m.len() - 1])
        };
        let period = t2 - t1;
        let fire = t2 + period - Duration::from_millis(220);
        while Instant::now() < fire {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
        let unlocked = Instant::now();
        std::thread::sleep(Duration::from_millis(2000));
        let next = merges.lock().unwrap().iter().copied().find(|&m| m > t2);
        let v = check(&a, &alice);
        eprintln!(
            "trial {trial}: {n} guesses on share; retry period {period:?}; unlock {r} answered {:?} before the next merge reached the store; A after unlock: {:?} retry {} ms",
            next.map(|m| m.saturating_duration_since(unlocked)),
            v.decision,
            v.retry_after_ms
        );
        if v.decision == Decision::Deny {
            hit = Some((trial, ip));
            break;
        }
        proxy.set_mode(ProxyMode::Pass);
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    let Some((trial, ip)) = hit else { panic!("never hit the race") };
    let alice = subject(ip, "alice");
    // The operator clears the planted value too: the store answers again.
    redis.cmd(&["DEL", &last_name]);
    proxy.set_mode(ProxyMode::Pass);
    std::thread::sleep(Duration::from_millis(3000));
    let (va, vb) = (check(&a, &alice), check(&b, &alice));
    eprintln!(
        "hit on trial {trial}; 3 s later: A {:?} (retry {} ms, rule {}), B {:?}",
        va.decision, va.retry_after_ms, va.rule, vb.decision
    );
    eprintln!("A lockouts: {}", a.cli_json(&["lockouts"]));
    assert_eq!(va.decision, Decision::Allow, "A keeps alice locked after the unlock");
}

/// A write-back still due (its first merge failed, the key in no index)
/// does not lock the account again after an account-wide unlock the host
/// did not hear live: the unlock leaves the account's tombstone on the
/// rule, and the merge loses to it.
#[test]
fn a_pending_write_back_does_not_relock_after_an_account_unlock_missed_live() {
    require_redis();
    let extra = "timeout_ms = 100\nheartbeat_ms = 2000\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let TwoHosts { redis, proxy, dir: _dir, a, b } = two_hosts(extra);
    let alice = subject("192.0.2.99", "alice");
    check(&b, &alice);
    report(&b, &alice, Outcome::Failure);
    let name = redis.cmd(&["KEYS", "tg:*:f:login/source_failures:*"]).trim().to_string();
    for k in redis.cmd(&["KEYS", "tg:*:[fi]:*"]).lines().filter(|l| !l.is_empty()) {
        redis.cmd(&["DEL", k]);
    }
    proxy.set_mode(ProxyMode::Drop);
    wait_degraded(&a, &subject("192.0.2.171", "ursula"));
    let n = guesses_until_denied(&a, &alice, 10);
    redis.cmd(&["HSET", &name, "planted", "1"]);
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "first write-back failed", || a.log().contains("not written back"));
    redis.cmd(&["DEL", &name]);
    // Just after A's heartbeat: its subscription drops (any pubsub reset),
    // and the operator unlocks alice on B.
    std::thread::sleep(Duration::from_millis(300));
    let killed = redis.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let r = b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    let right_after = check(&b, &alice).decision;
    std::thread::sleep(Duration::from_millis(4500));
    let (va, vb) = (check(&a, &alice), check(&b, &alice));
    eprintln!(
        "{n} guesses on A's share; pubsub clients killed: {}; unlock {r}; B right after: {right_after:?}; 4.5 s later: A {:?}, B {:?} (retry {} ms, rule {})",
        killed.trim(),
        va.decision,
        vb.decision,
        vb.retry_after_ms,
        vb.rule
    );
    eprintln!("store entry TTL {} ms", redis.cmd(&["PTTL", &name]).trim());
    assert_eq!(vb.decision, Decision::Allow, "the store locked alice again after the operator's unlock");
}

/// A's login answer for `s`, reporting the real user's success when
/// admitted: (decision, degraded).
fn user_login(d: &TestDaemon, s: &Subject<'_>) -> (Decision, bool) {
    let answered = runtime().block_on(d.client().check_answered("login", s));
    let degraded = answered.degraded;
    let decision = verdict(answered.answer).decision;
    if decision == Decision::Allow {
        runtime().block_on(d.client().report("login", s, Outcome::Success));
    }
    (decision, degraded)
}

/// An operator's unlock made after a stranger's failures locked the
/// account on a degraded host's share reaches that share once the host is
/// back: the owner is not refused there on a late reply, nor in the next
/// outage. (A lockout whose merge loses to an unlock is cleared from the
/// share; keeping it, to deny a fresh share per outage, kept this one.)
#[test]
fn an_unlock_after_a_strangers_failures_on_a_share_reaches_that_share() {
    require_redis();
    let extra = format!(
        "timeout_ms = 100\nheartbeat_ms = 200\nprobe_interval_ms = 50\nprobe_max_ms = 200\n{COUNTING_RULES_ONLY}"
    );
    let TwoHosts { redis: _redis, proxy, dir: _dir, a, b } = two_hosts(&extra);
    let outage = |n: usize| cut_until_degraded(&a, &proxy, n);
    // While A is away, a stranger locks alice's account_failures (50) on
    // A's share (ceil(50 / 3) = 17) from many networks.
    outage(1);
    let mut guesses = 0;
    for i in 0..60u32 {
        let s = subject(leak(format!("198.51.{i}.7")), "alice");
        if check(&a, &s).decision != Decision::Allow {
            break;
        }
        report(&a, &s, Outcome::Failure);
        guesses += 1;
    }
    let owner = subject("203.0.113.9", "alice");
    assert_eq!(user_login(&a, &owner).0, Decision::Deny, "the share locked alice after {guesses} guesses");
    // The owner calls; the operator unlocks her on B; A comes back.
    b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "A written back", || a.log().matches("shared store reachable").count() > 1);
    assert_eq!(user_login(&a, &owner), (Decision::Allow, false), "store up");
    // One late reply, the store still up: answered on the share.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    let late = user_login(&a, &owner);
    proxy.set_mode(ProxyMode::Pass);
    std::thread::sleep(Duration::from_millis(600));
    let outages = a.log().matches("shared store unreachable").count();
    outage(outages + 1);
    let next_outage = user_login(&a, &owner);
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(
        (late.0, next_outage.0),
        (Decision::Allow, Decision::Allow),
        "alice, unlocked after the stranger's {guesses} failures, is refused on A's share"
    );
}

/// After an operator's unlock, a link that fails again and again in the
/// unlock's window gives a degraded host one share, not one per outage: a
/// lockout the share took after the unlock is aged from when the share
/// began on the key, so its write-back is not beaten by the unlock, and
/// the host then refuses it from memory in the next outage.
#[test]
fn a_flapping_link_after_an_unlock_gives_one_share_not_one_per_outage() {
    require_redis();
    let extra = "timeout_ms = 100\nheartbeat_ms = 200\nprobe_interval_ms = 50\nprobe_max_ms = 200";
    let TwoHosts { redis: _redis, proxy, dir: _dir, a, b } = two_hosts(extra);
    let alice = subject("192.0.2.123", "alice");
    // The operator unlocks alice (on B): the account's tombstone.
    b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    std::thread::sleep(Duration::from_millis(50));
    let mut admitted = Vec::new();
    for outage in 1..=3 {
        cut_until_degraded(&a, &proxy, outage);
        admitted.push(guesses_until_denied(&a, &alice, 10));
        proxy.set_mode(ProxyMode::Pass);
        // The first "reachable" line is the start's.
        wait_until(&a, Duration::from_secs(10), "A written back", || {
            a.log().matches("shared store reachable").count() > outage
        });
    }
    // ceil(5 / 3) on source_failures: one share for all three outages.
    assert_eq!(admitted, [2, 0, 0], "a fresh share per outage\n{}", a.log());
    // And the lockout the share took is the store's: B refuses it too.
    assert_ne!(check(&b, &alice).decision, Decision::Allow, "B admits alice after A's share locked her");
}

/// Failures made on a share before an operator's unlock that spilled to
/// the share's overflow sketch (its table full of strangers' lockouts) are
/// of an unknown age when an entry takes them back in a later outage: that
/// entry's lockout does not win its merge over the unlock, and alice stays
/// unlocked on every host. (Found by review: a start noted when the entry
/// was made, after the unlock, let it win.)
#[test]
fn spilled_failures_from_before_an_unlock_do_not_win_a_later_merge() {
    require_redis();
    let extra = format!(
        "timeout_ms = 100\nheartbeat_ms = 200\nprobe_interval_ms = 50\nprobe_max_ms = 200\n\n\
         [routes.login.rules.source_failures]\nentries_max = 16\n{COUNTING_RULES_ONLY}"
    );
    let TwoHosts { redis: _redis, proxy, dir: _dir, a, b } = two_hosts(&extra);
    let outage = |n: usize| cut_until_degraded(&a, &proxy, n);
    let alice = subject("192.0.2.123", "alice");
    outage(1);
    // Strangers fill every shard of A's source_failures share with lockouts.
    for n in 0..200 {
        let stranger = subject(leak(format!("10.{}.{}.1", n / 250, n % 250)), leak(format!("filler-{n}")));
        for _ in 0..2 {
            report(&a, &stranger, Outcome::Failure);
        }
    }
    // Alice's guesser on A's share: its failures spill to the sketch.
    let guesses = guesses_until_denied(&a, &alice, 5);
    // The owner calls; the operator unlocks her on B; A comes back.
    b.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    std::thread::sleep(Duration::from_millis(50));
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "A written back", || a.log().matches("shared store reachable").count() > 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(check(&b, &alice).decision, Decision::Allow, "the store has alice unlocked");
    // One attempt admitted live, its failure reported in the next outage.
    check(&a, &alice);
    outage(2);
    report(&a, &alice, Outcome::Failure);
    proxy.set_mode(ProxyMode::Pass);
    wait_until(&a, Duration::from_secs(10), "A written back", || a.log().matches("shared store reachable").count() > 2);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        check(&b, &alice).decision,
        Decision::Allow,
        "a lockout built on {guesses} spilled failures from before the unlock won its merge\n{}",
        a.log()
    );
}

/// A lockout published (`L`) from a reply still on its way back when an
/// operator unlocked reaches the channel after the unlock's `U`/`A`: no
/// host learns it then, so none refuses the user from memory while the
/// store holds nothing (a red team's finding: all three hosts refused for
/// ten minutes). C's replies come back 300 ms late; its fifth failure runs
/// in the store, then the unlock on A, then C reads its reply.
#[test]
fn a_lockout_published_from_a_reply_in_flight_does_not_undo_an_unlock() {
    require_redis();
    let redis = RedisServer::tcp();
    let proxy = Proxy::new(redis.addr());
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let extra = format!("timeout_ms = 1000\nconnect_timeout_ms = 3000\n{COUNTING_RULES_ONLY}");
    let a = TestDaemon::start_with(Some(&single_config(&redis.url(), &secret, &extra)), false);
    let b = TestDaemon::start_with(Some(&single_config(&redis.url(), &secret, &extra)), false);
    let c = TestDaemon::start_with(Some(&single_config(&proxy.url(), &secret, &extra)), false);
    let alice = subject("192.0.2.77", "alice");
    let asks_store =
        |d: &TestDaemon, s: &Subject<'_>| !runtime().block_on(d.client().check_answered("login", s)).degraded;
    wait_until(&c, Duration::from_secs(10), "C asks the store", || asks_store(&c, &subject("100.64.9.9", "ursula")));
    for _ in 0..4 {
        assert_eq!(check(&b, &alice).decision, Decision::Allow);
        report(&b, &alice, Outcome::Failure);
    }
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(300)));
    assert_eq!(check(&c, &alice).decision, Decision::Allow);
    let fifth = {
        let (client, alice) = (c.client(), alice.clone());
        std::thread::spawn(move || runtime().block_on(client.report("login", &alice, Outcome::Failure)))
    };
    // The fifth failure has run in the store; its reply is on its way to C.
    std::thread::sleep(Duration::from_millis(100));
    let unlocked = a.cli_json(&["unlock", "--route", "login", "--account", "alice"]);
    let _ = fifth.join();
    proxy.set_mode(ProxyMode::Pass);
    // Long enough for C's `L` to reach every host.
    std::thread::sleep(Duration::from_millis(1500));
    let fresh = TestDaemon::start_with(Some(&single_config(&redis.url(), &secret, &extra)), false);
    wait_until(&fresh, Duration::from_secs(10), "a fresh host asks the store", || {
        asks_store(&fresh, &subject("100.64.9.10", "ursula"))
    });
    let store_says = check(&fresh, &alice).decision;
    assert_eq!(store_says, Decision::Allow, "the store still locks alice ({unlocked}): the race was not run");
    for (name, host) in [("A", &a), ("B", &b), ("C", &c)] {
        let v = check(host, &alice);
        assert_eq!(v.decision, Decision::Allow, "{name} refuses alice from memory after the unlock: {v:?}");
    }
}
