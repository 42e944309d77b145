//! The operator's view against a real daemon on the manual clock: what
//! `tollgate top`, `sample`, `status` and `metrics` read (the version-4
//! `Activity` and `Samples` requests) counts exactly what the test's own
//! traffic did, and never names anyone.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tollgate::client::{Client, ClientConfig};
use tollgate::protocol::{Activity, Decision, Outcome, Reason, Subject, Verdict};
use tollgate::{KeyDeriver, Secret};

const LOGIN: &str = "login";
/// Planted: must never appear in anything the daemon shows.
const VICTIM: &str = "planted-victim-name-7f3a";
const ATTACKER_DEVICE: &str = "planted-attacker-device-9c1e";
const ATTACKER: &str = "203.0.113.9";
/// The account ceiling in monitor mode at 3, so the attacker's 4th and
/// 5th guesses are would-be refusals before the source rule locks at 5.
const CONFIG: &str = "[routes.login.rules.account_failures]\nmonitor = true\nthreshold = 3\n";

async fn check(client: &Client, subject: &Subject<'_>) -> Verdict<'static> {
    verdict(client.check(LOGIN, subject).await)
}

async fn report(client: &Client, subject: &Subject<'_>, outcome: Outcome) -> Verdict<'static> {
    verdict(client.report(LOGIN, subject, outcome).await)
}

/// Asks until `ready` holds: the activity thread counts off the request path.
async fn activity_when(client: &Client, ready: impl Fn(&Activity) -> bool) -> Activity {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let activity = client.activity(100).await.expect("activity");
        if ready(&activity) {
            return activity;
        }
        assert!(Instant::now() < deadline, "activity never caught up: {activity:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Traffic {
    checks: [u64; 4],
    would_refuse: u64,
    failures: u64,
    successes: u64,
}

/// Ten people log in (1 to 3 times each, from their own address and
/// device), then an attacker guesses at one account until refused.
async fn drive(client: &Client) -> Traffic {
    let mut t = Traffic { checks: [0; 4], would_refuse: 0, failures: 0, successes: 0 };
    let people: Vec<(String, String, String)> =
        (0..10).map(|i| (format!("person-{i}"), format!("198.51.100.{}", i + 1), format!("phone-{i}"))).collect();
    for (i, (account, address, device)) in people.iter().enumerate() {
        let subject =
            Subject { peer: Some(ip(address)), account: Some(account), device: Some(device), ..Subject::default() };
        for _ in 0..(i % 3) + 1 {
            let v = check(client, &subject).await;
            t.checks[v.decision as usize] += 1;
            assert!(v.proceeds(), "{v:?}");
            report(client, &subject, Outcome::Success).await;
            t.successes += 1;
        }
    }
    let attacker = Subject {
        peer: Some(ip(ATTACKER)),
        account: Some(VICTIM),
        device: Some(ATTACKER_DEVICE),
        ..Subject::default()
    };
    for _ in 0..10 {
        let v = check(client, &attacker).await;
        t.checks[v.decision as usize] += 1;
        t.would_refuse += v.reason.is_monitored() as u64;
        if v.proceeds() {
            report(client, &attacker, Outcome::Failure).await;
            t.failures += 1;
        }
    }
    t
}

fn account_text(daemon: &TestDaemon, account: &str) -> String {
    let secret = Secret::load(&daemon.dir.path().join("secret")).unwrap().expect("the daemon made its secret");
    format!("acct:{:016x}", KeyDeriver::new(&secret).account_tag(account))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_counts_exactly_what_the_traffic_did() {
    let daemon = TestDaemon::start_with(Some(&format!("{CONFIG}{COUNTING_RULES_ONLY}")), true);
    let client = daemon.client();
    let t = drive(&client).await;
    // The attacker: 5 guesses allowed (the 4th and 5th would-be refusals
    // of the monitored ceiling), then the source rule's lockout refuses 5.
    assert_eq!((t.checks, t.would_refuse, t.failures, t.successes), ([24, 0, 0, 5], 2, 5, 19));
    let victim = account_text(&daemon, VICTIM);

    // The last events the traffic made are the five refusals.
    let a = activity_when(&client, |a| !a.recent_lockouts.is_empty() && a.recent_refusals.len() == 5).await;
    let login = a.routes.iter().find(|r| r.name == LOGIN).expect("the login route");
    let c = &login.checks;
    assert_eq!([c.allow, c.delay, c.challenge, c.deny], t.checks);
    assert_eq!((c.would_refuse, login.failures, login.successes), (2, 5, 19));
    assert_eq!(login.reports.allow + login.reports.delay + login.reports.challenge + login.reports.deny, 24);
    for other in a.routes.iter().filter(|r| r.name != LOGIN) {
        assert_eq!((other.checks.allow, other.failures), (0, 0), "{}", other.name);
    }

    let prefixes: Vec<(&str, u64, u64)> =
        a.top_refused_prefixes.iter().map(|p| (p.prefix.as_str(), p.refusals, p.error)).collect();
    assert_eq!(prefixes, vec![("203.0.113.9/32", 5, 0)]);
    let accounts: Vec<(&str, u64)> = a.top_failing_accounts.iter().map(|a| (a.account.as_str(), a.failures)).collect();
    assert_eq!(accounts, vec![(victim.as_str(), 5)]);
    assert_eq!(a.recent_refusals.len(), 5);
    assert!(a.recent_refusals.iter().all(|r| r.rule == "source_failures"
        && r.decision == Decision::Deny
        && r.reason == Reason::TooManyFailures
        && r.prefix == "203.0.113.9/32"));
    assert_eq!(a.recent_lockouts.len(), 1);
    let lockout = &a.recent_lockouts[0];
    assert_eq!((lockout.route.as_str(), lockout.rule.as_str()), (LOGIN, "source_failures"));
    assert_eq!((lockout.prefix.as_str(), lockout.account.as_str()), ("203.0.113.9/32", victim.as_str()));
    assert!(lockout.retry_after_ms > 0);

    // Attempts per account today: ten people with 1, 2 or 3 and the
    // victim's 10, every account in the sample (far below its cap).
    let attempts = a.distributions.iter().find(|d| d.name == "attempts" && d.day == "today").unwrap();
    assert_eq!((attempts.accounts, attempts.sample_shift), (11, 0));
    assert_eq!((attempts.p50, attempts.p90, attempts.p99, attempts.max), (2, 3, 10, 10));
    let buckets: Vec<(u32, u64)> = attempts.histogram.iter().map(|b| (b.upto, b.accounts)).collect();
    assert_eq!(buckets, vec![(1, 4), (2, 3), (4, 3), (8, 0), (16, 1)]);
    let failures = a.distributions.iter().find(|d| d.name == "failures" && d.day == "today").unwrap();
    assert_eq!((failures.accounts, failures.p50, failures.max), (1, 5, 5));
    assert!(
        a.latency.samples > 0 && a.latency.p50_ns > 0 && a.latency.max_ns >= a.latency.p50_ns / 2,
        "{:?}",
        a.latency
    );
    assert_eq!(a.events_dropped, 0);

    // The sample of would-be refusals: the 4th and 5th guesses.
    let (samples, seen, _) = client.samples(100).await.unwrap();
    assert_eq!((samples.len(), seen), (2, 2));
    for s in &samples {
        assert_eq!((s.route.as_str(), s.rule.as_str(), s.op.as_str()), (LOGIN, "account_failures", "check"));
        assert_eq!(
            (s.reason, s.prefix.as_str(), s.account.as_str()),
            (Reason::MonitorTooManyFailures, "203.0.113.9/32", victim.as_str())
        );
        assert!(s.device.starts_with("dev:") && !s.known_device, "{s:?}");
    }

    // A day later, today's figures are yesterday's.
    daemon.advance("24h");
    let person = Subject { peer: Some(ip("198.51.100.1")), account: Some("person-0"), ..Subject::default() };
    check(&client, &person).await;
    // The day can turn on the observer's clock before the check's event is
    // drained: wait for both.
    let a = activity_when(&client, |a| {
        a.distributions.iter().any(|d| d.day == "yesterday")
            && a.distributions.iter().any(|d| d.name == "attempts" && d.day == "today" && d.accounts == 1)
    })
    .await;
    let yesterday = a.distributions.iter().find(|d| d.name == "attempts" && d.day == "yesterday").unwrap();
    assert_eq!((yesterday.accounts, yesterday.p50, yesterday.max), (11, 2, 10));
    let today = a.distributions.iter().find(|d| d.name == "attempts" && d.day == "today").unwrap();
    assert_eq!((today.accounts, today.max), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_planted_name_reaches_the_view_the_sample_the_status_or_the_metrics() {
    let daemon = TestDaemon::start_with(Some(&format!("{CONFIG}{COUNTING_RULES_ONLY}")), true);
    let client = daemon.client();
    drive(&client).await;
    activity_when(&client, |a| !a.recent_lockouts.is_empty()).await;
    let mut shown = String::new();
    for args in [&["status"][..], &["status", "--json"], &["metrics"], &["sample"], &["sample", "--json"]] {
        let out = daemon.cli(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        shown += &String::from_utf8_lossy(&out.stdout);
    }
    shown += &format!("{:?}", client.activity(1000).await.unwrap());
    let log = daemon.log();
    // Each rule that locked has its own audit line, named as itself: the
    // monitored ceiling at the third failure, the source rule at the fifth.
    let lockouts: Vec<&str> = log.lines().filter(|l| l.contains("lockout")).collect();
    assert_eq!(lockouts.len(), 2, "{log}");
    assert!(lockouts[0].contains("rule=account_failures monitor=true"), "{}", lockouts[0]);
    assert!(lockouts[1].contains("rule=source_failures monitor=false"), "{}", lockouts[1]);
    shown += &log;
    for planted in [VICTIM, ATTACKER_DEVICE, "person-", "phone-"] {
        assert!(!shown.contains(planted), "`{planted}` shown");
    }
    // What they do show: the distributions, the sample, the new families.
    assert!(shown.contains("attempts per account, today: 11 accounts"), "{shown}");
    assert!(shown.contains("2 would-be refusal(s)"), "{shown}");
    for family in
        ["tollgate_route_checks_total", "tollgate_request_latency_seconds", "tollgate_account_attempts_per_day"]
    {
        assert!(shown.contains(&format!("# TYPE {family} ")), "{family}");
    }
    assert!(shown.contains(r#"tollgate_route_checks_total{route="login",decision="deny"} 5"#), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_version_cannot_ask_and_is_told_why() {
    let daemon = TestDaemon::start();
    let v3 = Client::new(ClientConfig::new(&daemon.socket).protocol_version(3));
    let error = v3.activity(10).await.expect_err("version 3 has no activity").to_string();
    assert!(error.contains("needs version 4"), "{error}");
    let error = v3.samples(10).await.expect_err("version 3 has no samples").to_string();
    assert!(error.contains("needs version 4"), "{error}");
    // And the daemon answers a version-3 frame of request 6 with words.
    let mut frame = Vec::new();
    tollgate::codec::encode_request_versioned(4, 9, &tollgate::protocol::Request::Activity { limit: 1 }, &mut frame);
    frame[4] = 3;
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let (id, reply) = read_reply(&mut stream);
    assert_eq!(id, 9);
    let tollgate::protocol::Response::Error(e) = reply else { panic!("{reply:?}") };
    assert!(e.message.contains("needs protocol version 4"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_log_s_counters_ride_the_view_and_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[decision_log]\npath = \"{}\"\n{COUNTING_RULES_ONLY}", dir.path().join("log").display());
    let daemon = TestDaemon::start_with(Some(&config), true);
    let client = daemon.client();
    let none = TestDaemon::start();
    assert_eq!(none.client().activity(1).await.unwrap().decision_log, None, "off unless configured");
    let t = drive(&client).await;
    let answered = t.checks.iter().sum::<u64>() + t.failures + t.successes;
    let a = activity_when(&client, |a| a.decision_log.as_ref().is_some_and(|l| l.records_written == answered)).await;
    let log = a.decision_log.unwrap();
    assert_eq!((log.records_dropped, log.write_errors, log.files), (0, 0, 1), "{log:?}");
    assert!(log.path.ends_with("log") && log.bytes_written > 0, "{log:?}");
    let metrics = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    assert!(metrics.contains(&format!("tollgate_decision_log_records_total {answered}\n")), "{metrics}");
    let status = String::from_utf8(daemon.cli(&["status"]).stdout).unwrap();
    assert!(status.contains(&format!("decision log: {}  records {answered}  dropped 0", log.path)), "{status}");
}

/// Red team: `samples` (and `activity`) are open to anyone who can
/// connect, as `lockouts` is, and a 10,000-entry reply is over a megabyte.
/// `lockouts` holds all connections' replies within a 16 MiB budget (a
/// thousand clients asking at once would otherwise make the daemon hold a
/// gigabyte); the operator's view must not be the way around it. Here 60
/// peers ask for the whole sample and never read.
#[test]
fn many_peers_asking_for_the_sample_without_reading_do_not_grow_the_daemon() {
    use std::io::Write;
    let config = format!("{CONFIG}{COUNTING_RULES_ONLY}\n[activity]\nsamples_max = 100000\n");
    let daemon = TestDaemon::start_with(Some(&config), true);
    let rt = runtime();
    let client = daemon.client();
    // Three failures from three places: every later check of the victim is
    // a would-be refusal of the monitored account ceiling.
    for n in 0..3 {
        let s = Subject { peer: Some(v4(0x0a00_0001 + n)), account: Some(VICTIM), ..Subject::default() };
        rt.block_on(check(&client, &s));
        rt.block_on(report(&client, &s, Outcome::Failure));
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    for chunk in 0..24u32 {
        let mut frames = Vec::new();
        for n in chunk * 500..(chunk + 1) * 500 {
            let s = Subject { peer: Some(v4(0x0b00_0000 + n)), account: Some(VICTIM), ..Subject::default() };
            check_frame(n as usize, LOGIN, &s, &mut frames);
        }
        stream.write_all(&frames).unwrap();
        for _ in 0..500 {
            read_reply(&mut stream);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.block_on(client.samples(1)).unwrap().1 < 12_000 {
        assert!(Instant::now() < deadline, "the sample never filled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let one = rt.block_on(client.samples(10_000)).unwrap().0;
    assert_eq!(one.len(), 10_000);

    let before = daemon.rss_kib();
    let mut frame = Vec::new();
    tollgate::codec::encode_request(1, &tollgate::protocol::Request::Samples { limit: 10_000 }, &mut frame);
    let peers: Vec<_> = (0..60)
        .map(|_| {
            let mut s = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
            s.write_all(&frame).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let grown_mib = daemon.rss_kib().saturating_sub(before) / 1024;
    drop(peers);
    assert!(grown_mib <= 32, "60 unread sample replies grew the daemon by {grown_mib} MiB");
}

/// The sample holds would-be refusals of attempts: checks a monitored
/// rule would have refused. A report's verdict says what a check would now
/// get (its attempt was already let through and verified), so a monitored
/// report verdict is not one more attempt refused, and is not sampled
/// (the route's `reports.would_refuse` still counts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_counts_checks_a_monitored_rule_would_have_refused_not_reports() {
    let daemon = TestDaemon::start_with(Some(&format!("{CONFIG}{COUNTING_RULES_ONLY}")), true);
    let client = daemon.client();
    let t = drive(&client).await;
    let a = activity_when(&client, |a| !a.recent_lockouts.is_empty()).await;
    let login = a.routes.iter().find(|r| r.name == LOGIN).expect("the login route");
    assert!(login.reports.would_refuse > 0, "the drive makes monitored report verdicts: {login:?}");
    let (samples, seen, _) = client.samples(100).await.unwrap();
    assert_eq!((seen, login.checks.would_refuse), (t.would_refuse, t.would_refuse), "{samples:#?}");
    assert!(samples.iter().all(|s| s.op == "check"), "{samples:#?}");
}

/// Red team: fifty connections hammer one route at once; the route's
/// verdict counts (per-thread shards summed on read) are exactly the
/// verdicts the clients received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_connections_hammering_one_route_are_counted_exactly() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let mut tasks = Vec::new();
    for c in 0..50u32 {
        let client = daemon.client();
        tasks.push(tokio::spawn(async move {
            let mut got = [0u64; 5];
            for n in 0..200u32 {
                // A few addresses, so the request route's rate refuses some.
                let s = Subject { peer: Some(v4(0x0c00_0000 + (c * 200 + n) % 7)), ..Subject::default() };
                let v = verdict(client.check("request", &s).await);
                got[v.decision as usize] += 1;
                got[4] += v.reason.is_monitored() as u64;
            }
            got
        }));
    }
    let mut got = [0u64; 5];
    for t in tasks {
        for (total, n) in got.iter_mut().zip(t.await.unwrap()) {
            *total += n;
        }
    }
    assert_eq!(got[..4].iter().sum::<u64>(), 10_000);
    assert!(got[0] < 10_000, "some were refused: {got:?}");
    let a = daemon.client().activity(10).await.unwrap();
    let r = a.routes.iter().find(|r| r.name == "request").unwrap();
    let c = &r.checks;
    assert_eq!([c.allow, c.delay, c.challenge, c.deny, c.would_refuse], got);
}

/// Red team: every other client-chosen string (an X-Forwarded-For entry, a
/// tenant, a client id, an unknown route's name) on checks and reports
/// that are refused, would-be refused and lock: none reaches the view, the
/// sample, status, metrics, `top --once --json` or the daemon's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_chosen_string_reaches_the_operators_view_or_the_log() {
    let config = format!("{CONFIG}{COUNTING_RULES_ONLY}\n[source]\ntrusted_proxies = [\"10.0.0.0/8\"]\n");
    let daemon = TestDaemon::start_with(Some(&config), true);
    let client = daemon.client();
    let forwarded = ["planted-xff-a1, 203.0.113.77", "planted-xff-b2", "203.0.113.78, planted-xff-c3"];
    for (i, xff) in forwarded.iter().enumerate() {
        let s = Subject {
            peer: Some(ip("10.1.1.1")),
            forwarded_for: Some(xff),
            account: Some(VICTIM),
            device: Some(ATTACKER_DEVICE),
            tenant: Some("planted-tenant-d4"),
            client_id: Some("planted-client-e5"),
        };
        for _ in 0..8 {
            let v = check(&client, &s).await;
            if v.proceeds() {
                report(&client, &s, Outcome::Failure).await;
            }
        }
        let _ = client.check(&format!("planted-route-f{i}"), &s).await;
        let _ = client.report(&format!("planted-route-g{i}"), &s, Outcome::Failure).await;
    }
    activity_when(&client, |a| !a.recent_lockouts.is_empty()).await;
    let mut shown = String::new();
    for args in [&["status", "--json"][..], &["metrics"], &["sample", "--json"], &["top", "--once", "--json"]] {
        let out = daemon.cli(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        shown += &String::from_utf8_lossy(&out.stdout);
        shown += &String::from_utf8_lossy(&out.stderr);
    }
    shown += &format!("{:?}", client.activity(1000).await.unwrap());
    shown += &format!("{:?}", client.samples(1000).await.unwrap());
    shown += &daemon.log();
    assert!(shown.contains("203.0.113.77/32"), "the forwarded address's network is shown");
    for planted in ["planted-", VICTIM, ATTACKER_DEVICE] {
        assert!(!shown.contains(planted), "`{planted}` shown:\n{shown}");
    }
}

/// Red team: `activity` and `samples` pipelined between checks (and
/// between versions 3 and 4) are answered in order, each with its id.
#[test]
fn activity_and_samples_pipelined_with_checks_are_answered_in_order() {
    use std::io::Write;
    use tollgate::protocol::{Request, Response};
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let s = Subject { peer: Some(ip("198.51.100.3")), account: Some("someone"), ..Subject::default() };
    let mut frames = Vec::new();
    for id in 0..60u64 {
        let request = match id % 4 {
            0 => Request::Activity { limit: 10_000 },
            1 => Request::Samples { limit: 10 },
            _ => Request::Check { route: LOGIN, subject: s.clone() },
        };
        let version = if id % 4 == 3 { 3 } else { 4 };
        tollgate::codec::encode_request_versioned(version, id, &request, &mut frames);
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.write_all(&frames).unwrap();
    for id in 0..60u64 {
        let (got, reply) = read_reply(&mut stream);
        assert_eq!(got, id, "in order");
        match (id % 4, reply) {
            (0, Response::Activity(_)) | (1, Response::Samples { .. }) | (2 | 3, Response::Verdict(_)) => {}
            (_, other) => panic!("{id}: {other:?}"),
        }
    }
}

/// Red team: reloads in the middle of a hammering keep the route's counts
/// exact (a reload keeps a route's counters; requests answered with the old
/// limiter count into the same ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_under_load_keep_the_route_counts_exact() {
    let daemon = TestDaemon::start_with(Some(COUNTING_RULES_ONLY), true);
    let mut tasks = Vec::new();
    for c in 0..10u32 {
        let client = daemon.client();
        tasks.push(tokio::spawn(async move {
            let mut got = [0u64; 4];
            for n in 0..500u32 {
                let s = Subject { peer: Some(v4(0x0d00_0000 + (c * 500 + n) % 5)), ..Subject::default() };
                got[verdict(client.check("request", &s).await).decision as usize] += 1;
            }
            got
        }));
    }
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let extra = if i % 2 == 0 { "\n[activity]\nrecent_max = 7\n" } else { "" };
        daemon.reload_with(&format!("{COUNTING_RULES_ONLY}{extra}"));
    }
    let mut got = [0u64; 4];
    for t in tasks {
        for (total, n) in got.iter_mut().zip(t.await.unwrap()) {
            *total += n;
        }
    }
    let a = daemon.client().activity(10).await.unwrap();
    let c = &a.routes.iter().find(|r| r.name == "request").unwrap().checks;
    assert_eq!([c.allow, c.delay, c.challenge, c.deny], got);
    let status = daemon.cli_json(&["status"]);
    assert!(status.to_string().contains("\"activity.recent_max\""), "the limits in force are shown");
}
