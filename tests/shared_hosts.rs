//! Shared mode across hosts that disagree: clocks skewed by minutes and
//! hours (the store's clock rules global windows), a store that asks for a
//! password, and a host count learned from the store's heartbeats.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::redis::{require_redis, test_certs, RedisServer};
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
    let asked = Instant::now();
    for d in &daemons {
        let v = check(d, &mallory);
        assert_eq!((v.decision, v.rule.as_ref()), (Decision::Deny, "source_failures"), "every host refuses");
        retry.push(v.retry_after_ms);
    }
    // Time passing between the three calls (a loaded machine) explains a
    // difference too; only more than that is disagreement.
    let between_ms = asked.elapsed().as_millis() as u64;
    // Each host's own clock plays no part: an hour ahead does not end the
    // lockout, and the remaining times agree (the ladder rounds them up to
    // at least its first step alike).
    let (min, max) = (*retry.iter().min().unwrap(), *retry.iter().max().unwrap());
    assert!(
        max - min <= between_ms + 250,
        "retry_after differs by more than latency: {retry:?} ({between_ms} ms apart)"
    );
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

    // Restarted (a deploy) while the store is still away: the count learned
    // before is in the state file, so the share stays 2 of 5, not
    // ceil(5 / hosts_when_unknown) = 3.
    let mut restarted = daemons.into_iter().next().unwrap();
    restarted.terminate();
    restarted.spawn();
    let (_, s) = runtime().block_on(restarted.client().status_with_shared()).unwrap();
    let s = s.unwrap();
    assert_eq!((s.hosts_in_force, s.hosts_source.as_str()), (4, "remembered"), "{s:?}");
    assert!(restarted.log().contains("as last learned from the store"), "{}", restarted.log());
    let victor = subject("192.0.2.151", "victor");
    for n in 0..2 {
        assert_eq!(check(&restarted, &victor).decision, Decision::Allow, "degraded attempt {n} after the restart");
        report(&restarted, &victor, Outcome::Failure);
    }
    assert_eq!(check(&restarted, &victor).decision, Decision::Deny, "the remembered share, 2 of 5");
}

/// Mutual TLS: a store that asks every client for a certificate
/// (`tls-auth-clients yes`) is joined with `tls_cert_file` and
/// `tls_key_file`; without them the handshake fails, the daemon is
/// degraded and says so; a key that cannot be read is named in the log.
#[test]
fn a_store_asking_for_client_certificates_is_joined_with_this_host_s() {
    require_redis();
    let dir = tempfile::tempdir().unwrap();
    let certs = test_certs(dir.path());
    let redis = RedisServer::tls_mutual(&certs);
    let secret = shared_secret(dir.path());
    let ca_only = format!(
        "url = \"{}\"\ntimeout_ms = 200\nhosts = 3\ntls_ca_file = \"{}\"",
        redis.url(),
        certs.join("ca.crt").display()
    );
    let mutual = format!(
        "{ca_only}\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
        certs.join("client.crt").display(),
        certs.join("client.key").display()
    );
    let d = TestDaemon::start_with(Some(&config(&secret, &mutual, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.170", "trent")));
    assert!(!answered.degraded, "decided by the store over mutual TLS:\n{}", d.log());
    assert!(!redis.cmd(&["KEYS", "tg:*"]).is_empty(), "no keys reached the store");

    // The store refuses a client without a certificate.
    let d = TestDaemon::start_with(Some(&config(&secret, &ca_only, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.171", "trent")));
    assert!(answered.degraded, "no client certificate, no store");
    assert!(d.log().contains("shared store unreachable at start"), "{}", d.log());

    // A key file that cannot be read: degraded, and the log names it.
    let missing = dir.path().join("no-such-client.key");
    let unreadable = format!(
        "{ca_only}\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
        certs.join("client.crt").display(),
        missing.display()
    );
    let d = TestDaemon::start_with(Some(&config(&secret, &unreadable, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.172", "trent")));
    assert!(answered.degraded, "no key, no store");
    assert!(d.log().contains(&format!("cannot read tls_key_file {}", missing.display())), "{}", d.log());
}

#[test]
fn a_tls_store_is_joined_with_its_ca_file_and_refused_without_it() {
    require_redis();
    let dir = tempfile::tempdir().unwrap();
    let certs = test_certs(dir.path());
    let redis = RedisServer::tls(&certs);
    assert!(redis.url().starts_with("rediss://127.0.0.1:"), "{}", redis.url());
    let secret = shared_secret(dir.path());
    let with_ca = format!(
        "url = \"{}\"\ntimeout_ms = 200\nhosts = 3\ntls_ca_file = \"{}\"",
        redis.url(),
        certs.join("ca.crt").display()
    );
    let d = TestDaemon::start_with(Some(&config(&secret, &with_ca, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.160", "trent")));
    assert!(!answered.degraded, "decided by the store over TLS:\n{}", d.log());
    // The script's keys are in the store: the store answered, over TLS.
    assert!(!redis.cmd(&["KEYS", "tg:*"]).is_empty(), "no keys reached the TLS store");

    // Without the CA file the platform's roots are trusted, and they do not
    // know the test CA: degraded, and the log says why.
    let without_ca = format!("url = \"{}\"\ntimeout_ms = 200\nhosts = 3", redis.url());
    let d = TestDaemon::start_with(Some(&config(&secret, &without_ca, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.161", "trent")));
    assert!(answered.degraded, "an untrusted certificate is not the store");
    let log = d.log();
    assert!(log.contains("shared store unreachable at start"), "{log}");
    assert!(log.to_lowercase().contains("certificate"), "the log names the certificate problem:\n{log}");

    // A CA file that cannot be read: degraded, and the log names the file.
    let missing = dir.path().join("no-such-ca.pem");
    let unreadable = format!("{without_ca}\ntls_ca_file = \"{}\"", missing.display());
    let d = TestDaemon::start_with(Some(&config(&secret, &unreadable, "")), false);
    let answered = runtime().block_on(d.client().check_answered("login", &subject("192.0.2.162", "trent")));
    assert!(answered.degraded, "no CA, no store");
    assert!(d.log().contains(&format!("cannot read tls_ca_file {}", missing.display())), "{}", d.log());
}

/// The least-privilege Redis user docs/shared-mode.md gives, applied as
/// written: every command the daemon and its script send is granted, so
/// checks with devices, remembering a device, a lockout, an unlock (its
/// log trimmed) and heartbeats all run with an empty `ACL LOG`.
#[test]
fn the_documented_acl_user_runs_every_operation_with_nothing_denied() {
    require_redis();
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/shared-mode.md")).unwrap();
    let line = doc.lines().find(|l| l.starts_with("ACL SETUSER tollgate ")).expect("the ACL line in shared-mode.md");
    let password = "acl-test-password";
    let redis = RedisServer::unix();
    let args: Vec<String> = line
        .split_whitespace()
        .map(|w| if w == ">CHANGE-ME" { format!(">{password}") } else { w.to_string() })
        .collect();
    assert_eq!(redis.cmd(&args.iter().map(String::as_str).collect::<Vec<_>>()), "OK", "{line}");
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let password_file = dir.path().join("redis-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let shared = format!(
        "url = \"{}\"\nusername = \"tollgate\"\ntimeout_ms = 1000\nheartbeat_ms = 100\nhosts = 2\npassword_file = \"{}\"",
        redis.url(),
        password_file.display()
    );
    let daemons: Vec<TestDaemon> =
        (0..2).map(|_| TestDaemon::start_with(Some(&config(&secret, &shared, "")), false)).collect();
    let (a, b) = (&daemons[0], &daemons[1]);
    let decided = |d: &TestDaemon, s: &tollgate::protocol::Subject<'_>| {
        let answered = runtime().block_on(d.client().check_answered("login", s));
        assert!(!answered.degraded, "decided by the store:\n{}\n{}", d.log(), redis.cmd(&["ACL", "LOG"]));
        answered.answer.verdict().expect("a verdict").decision
    };
    // A device remembered on A is known on B.
    let home = tollgate::protocol::Subject { device: Some("cookie-acl"), ..subject("203.0.113.40", "victor") };
    assert_eq!(decided(a, &home), Decision::Allow);
    report(a, &home, Outcome::Success);
    assert_eq!(decided(b, &home), Decision::Allow);
    // A lockout through the store, then an unlock on the other host.
    let mallory = subject("192.0.2.160", "mallory");
    for _ in 0..5 {
        assert_eq!(decided(a, &mallory), Decision::Allow);
        report(a, &mallory, Outcome::Failure);
    }
    assert_eq!(decided(b, &mallory), Decision::Deny, "locked across hosts");
    let unlocked = b.cli_json(&["unlock", "--route", "login", "--account", "mallory"]);
    assert!(unlocked.get("cleared").is_some(), "{unlocked}");
    wait_until(a, Duration::from_secs(5), "A heard the unlock", || check(a, &mallory).decision == Decision::Allow);
    std::thread::sleep(Duration::from_millis(300)); // heartbeats

    // A stranger reaches the emptied store first; the two take it back.
    daemons.iter().for_each(TestDaemon::freeze);
    redis.cmd(&["FLUSHALL"]);
    let other = tempfile::tempdir().unwrap();
    let stranger = TestDaemon::start_with(Some(&config(&shared_secret(other.path()), &shared, "")), false);
    let claimed = redis.cmd(&["HGET", "tg:{meta}", "fingerprint"]);
    daemons.iter().for_each(TestDaemon::thaw);
    wait_until(a, Duration::from_secs(10), "the record taken back", || {
        redis.cmd(&["HGET", "tg:{meta}", "fingerprint"]) != claimed
    });
    drop(stranger);
    for d in [a, b] {
        let log = d.log();
        assert!(!log.contains("not logged") && !log.contains("NOPERM"), "{log}");
    }
    assert_eq!(redis.cmd(&["ACL", "LOG"]), "", "nothing denied");
}
