//! `inspect` against a real daemon on the manual clock: it reads a
//! subject's standing without changing it, shows failures, places and
//! lockouts as checks and reports leave them, survives a `kill -9`, is
//! for admins only, and needs protocol version 6.

mod common;

use common::*;
use tollgate::codec::{self, FRAME_HEADER_BYTES};
use tollgate::protocol::{ErrorCode, InspectedRule, Inspection, Outcome, Request, Response, Subject};

fn alice() -> Subject<'static> {
    subject("198.51.100.7", "alice")
}

fn inspect(daemon: &TestDaemon, who: &Subject<'_>) -> Inspection {
    runtime().block_on(daemon.client().inspect("login", who)).expect("inspect")
}

fn rule<'i>(inspection: &'i Inspection, name: &str) -> &'i InspectedRule {
    inspection.rules.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no rule {name}: {inspection:?}"))
}

#[test]
fn inspecting_spends_nothing_takes_no_place_and_shows_checks_and_reports() {
    let daemon = TestDaemon::start();
    let rt = runtime();
    let client = daemon.client();
    let counted = |status: serde_json::Value| (status["verdicts"].clone(), status["activity"]["routes"].clone());
    let before = counted(daemon.cli_json(&["status"]));
    let fresh = inspect(&daemon, &alice());
    for _ in 0..50 {
        assert_eq!(inspect(&daemon, &alice()), fresh, "an inspection changes nothing another can see");
    }
    assert_eq!(counted(daemon.cli_json(&["status"])), before, "no verdict counted, no attempt observed");
    let rate = rule(&fresh, "source_rate");
    assert_eq!((rate.kind.as_str(), rate.remaining, rate.refuses), ("rate", rate.limit, false), "the whole burst");
    let source = rule(&fresh, "source_failures");
    assert_eq!((source.failures, source.in_flight, source.remaining, source.locked), (0, 0, 5, false));
    assert_eq!(rule(&fresh, "known_device_failures").skipped, "known devices only");
    assert_eq!(fresh.device, "", "no device named");

    // alice, inspected 50 times, gets the very verdict of bob, never inspected.
    let bob = subject("198.51.100.8", "bob");
    let checked = verdict(rt.block_on(client.check("login", &alice())));
    assert_eq!(checked, verdict(rt.block_on(client.check("login", &bob))));
    let after = inspect(&daemon, &alice());
    assert_eq!(rule(&after, "source_rate").remaining, rate.limit - 1, "the check spent one, the inspections none");
    let source = rule(&after, "source_failures");
    assert_eq!((source.failures, source.in_flight, source.remaining), (0, 1, 4), "the check holds one place");
    assert_eq!(rule(&after, "account_failures").in_flight, 1);

    verdict(rt.block_on(client.report("login", &alice(), Outcome::Failure)));
    let source = rule(&inspect(&daemon, &alice()), "source_failures").clone();
    assert_eq!((source.failures, source.in_flight, source.remaining, source.refuses), (1, 0, 4, false));
    assert!(source.reset_ms > 0, "the failure expires in time");
    // Without an address, the rules keyed on it are skipped, not refused.
    let no_ip = inspect(&daemon, &Subject { account: Some("alice"), ..Subject::default() });
    assert_eq!(rule(&no_ip, "source_failures").skipped, "needs peer");
    assert_eq!(rule(&no_ip, "account_failures").failures, 1);
}

#[test]
fn a_lockout_shows_until_when_and_survives_kill_9() {
    let mut daemon = TestDaemon::start();
    let mallory = mallory();
    fail_five_times(&daemon, &mallory);
    daemon.advance("10s");
    let locked = inspect(&daemon, &mallory);
    let source = rule(&locked, "source_failures").clone();
    assert!(source.locked && source.refuses, "{source:?}");
    assert_eq!((source.failures, source.limit, source.remaining), (5, 5, 0));
    assert_eq!(source.retry_after_ms, source.until_ms - locked.now_ms, "until is now plus the wait");
    // The same lockout `lockouts` lists, by the same key digest.
    let listed = daemon.cli_json(&["lockouts"]);
    let entry = listed["lockouts"].as_array().unwrap().iter().find(|l| l["rule"] == "source_failures").unwrap();
    assert_eq!((entry["key"].as_str().unwrap(), entry["until_ms"].as_u64().unwrap()), (&*source.key, source.until_ms));

    daemon.kill9();
    daemon.spawn();
    // The manual clock starts over: back to where it was.
    daemon.advance("10s");
    let restarted = inspect(&daemon, &mallory);
    assert_eq!(rule(&restarted, "source_failures"), &source, "durable before its reply, so after a kill -9");

    // The CLI: a table, one JSON object, and exit 5 while a rule refuses.
    let args = ["inspect", "--account", "mallory", "--ip", "203.0.113.5"];
    let table = daemon.cli(&args);
    assert_eq!(table.status.code(), Some(5), "{}", String::from_utf8_lossy(&table.stderr));
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.starts_with("route login at 2030-01-01T00:00:"), "{text}");
    let line = text.lines().find(|l| l.trim_start().starts_with("source_failures")).expect(&text);
    assert!(line.contains("locked") && line.contains("failures 5/5  in flight 0  left 0"), "{line}");
    assert!(line.contains("until 2030-01-01T00:") && line.contains("(retry after 14m 51s)"), "{line}");
    let json = daemon.cli(&[&args[..], &["--json"]].concat());
    assert_eq!(json.status.code(), Some(5));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let rules = value["rules"].as_array().unwrap();
    let listed = rules.iter().find(|r| r["name"] == "source_failures").expect("every rule is listed");
    assert_eq!((listed["locked"].as_bool(), listed["until_ms"].as_u64()), (Some(true), Some(source.until_ms)));
    assert!(!String::from_utf8_lossy(&json.stdout).contains("mallory"), "never echoes the account");
    let clear = daemon.cli(&["inspect", "--account", "alice", "--ip", "198.51.100.7"]);
    assert_eq!(clear.status.code(), Some(0), "nothing refuses alice");

    // Audited by uid and route, never the account.
    let log = daemon.log();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("inspect")).collect();
    assert!(!audit.is_empty(), "an audit line:\n{log}");
    assert!(audit.iter().all(|l| !l.contains("mallory") && !l.contains("alice")), "{audit:?}");
}

#[test]
fn a_version_5_frame_of_inspect_is_malformed_naming_version_6() {
    let daemon = TestDaemon::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let request = Request::Inspect { route: "login", subject: alice() };
    let mut frame = Vec::new();
    codec::encode_request_versioned(5, 21, &request, &mut frame);
    std::io::Write::write_all(&mut stream, &frame).unwrap();
    let mut header = [0u8; FRAME_HEADER_BYTES];
    std::io::Read::read_exact(&mut stream, &mut header).unwrap();
    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
    std::io::Read::read_exact(&mut stream, &mut payload).unwrap();
    let (id, reply, extras) = codec::decode_response_versioned(&payload).unwrap();
    let Response::Error(error) = reply else { panic!("{reply:?}") };
    assert_eq!((id, extras.version, error.code), (21, 5, ErrorCode::Malformed), "in the request's version");
    assert_eq!(error.message, "request `inspect` needs protocol version 6; this frame is version 5");
    // The vector file's reply, but for its id (14 there).
    let vectors: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("tests/vectors/protocol.json").unwrap()).unwrap();
    let in_file = vectors["vectors"].as_array().unwrap().iter().find(|v| v["name"] == "error-inspect-needs-v6-v5");
    let in_file = in_file.and_then(|v| v["frame"].as_str()).expect("the vector");
    let mut whole = header.to_vec();
    whole.extend_from_slice(&payload);
    whole[5..13].copy_from_slice(&14u64.to_le_bytes());
    let hex: String = whole.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, in_file);
    // The connection survives; the same request in version 6 is answered.
    let reply = call_std(&mut stream, 22, &request);
    assert!(matches!(reply, Response::Inspection(_)), "{reply:?}");
}

#[test]
fn only_an_admin_may_inspect() {
    let Some(daemon) = TestDaemon::open_to_everyone() else { return };
    let out = daemon.cli_as_nobody(&["inspect", "--account", "alice", "--ip", "198.51.100.7"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("permission denied") && stderr.contains("may not inspect"), "{stderr}");
    assert!(daemon.log().contains("permission denied"), "an audit line");
    assert_eq!(daemon.cli(&["inspect", "--account", "alice"]).status.code(), Some(0), "root may");
}

/// With a shared store, a global rule shows this host's view, said so in
/// the reply: here a lockout taken through another host, which this host
/// learned from the store.
#[test]
fn in_shared_mode_global_rules_show_this_hosts_view_and_say_so() {
    use common::redis::{require_redis, RedisServer};
    use common::shared::{check, report, shared_secret, wait_until};
    use std::time::Duration;
    use tollgate::protocol::Decision;
    require_redis();
    let redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let secret = shared_secret(dir.path());
    let config = format!(
        "secret = \"{}\"\n\n[shared]\nurl = \"{}\"\ntimeout_ms = 100\nhosts = 3\n",
        secret.display(),
        redis.url()
    );
    let (a, b) = (TestDaemon::start_with(Some(&config), false), TestDaemon::start_with(Some(&config), false));
    std::thread::sleep(Duration::from_millis(300)); // both subscribed
    let alice = alice();
    assert!(!rule(&inspect(&b, &alice), "source_failures").locked);
    for _ in 0..5 {
        check(&a, &alice);
        report(&a, &alice, Outcome::Failure);
    }
    wait_until(&b, Duration::from_secs(5), "B refuses", || check(&b, &alice).decision == Decision::Deny);
    let seen = inspect(&b, &alice);
    assert!(seen.shared, "the reply says figures are this host's");
    let source = rule(&seen, "source_failures");
    assert!(source.global && source.locked && source.refuses, "{source:?}");
    assert!(source.until_ms > seen.now_ms && source.retry_after_ms > 0, "{source:?}");
}
