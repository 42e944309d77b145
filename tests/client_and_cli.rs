//! The client library's fail policies and timeouts, the CLI's output and
//! errors, start-up refusals, and the daemon's answers to bad frames.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tollgate::client::{Answer, Client, ClientConfig, ClientError};
use tollgate::codec;
use tollgate::protocol::{Decision, ErrorCode, Outcome, Request, Response, Subject};
use tollgate::FailPolicy;

#[tokio::test]
async fn an_unreachable_daemon_gets_each_routes_fail_policy() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(ClientConfig::new(dir.path().join("absent.sock")));
    let s = subject("198.51.100.7", "alice");
    let login = client.check("login", &s).await;
    assert!(matches!(login, Answer::Unavailable { policy: FailPolicy::Open, error: ClientError::Connect { .. }, .. }));
    assert!(login.proceeds(), "login protects users: fails open");
    let request = client.check("request", &s).await;
    assert!(matches!(request, Answer::Unavailable { policy: FailPolicy::Closed, .. }));
    assert!(!request.proceeds(), "request protects the system: fails closed");
}

#[tokio::test]
async fn a_closed_route_lets_its_static_budget_through_while_the_daemon_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        ClientConfig::new(dir.path().join("absent.sock")).static_budget("request", 1, Duration::from_secs(3600), 3);
    let client = Client::new(config);
    let s = subject("198.51.100.7", "alice");
    let mut through = 0;
    for _ in 0..10 {
        let answer = client.check("request", &s).await;
        assert!(matches!(answer, Answer::Unavailable { policy: FailPolicy::Closed, .. }));
        through += answer.proceeds() as u32;
        // Reporting an attempt's outcome is not a second attempt.
        let report = client.report("request", &s, Outcome::Success).await;
        assert!(matches!(report, Answer::Unavailable { policy: FailPolicy::Closed, .. }));
    }
    assert_eq!(through, 3, "the burst of the static budget, then refusals");
}

#[tokio::test]
async fn an_overlong_forwarded_for_header_is_read_from_the_right_not_refused_nor_ignored() {
    // The peer is a trusted proxy: the right-most untrusted hop is the client.
    let daemon = TestDaemon::start_with(Some("[source]\ntrusted_proxies = [\"198.51.100.0/24\"]\n"), true);
    let client = daemon.client();
    let short = Subject { forwarded_for: Some("203.0.113.9"), ..subject("198.51.100.7", "alice") };
    // 3,000 entries the end user put on the left (36 KB: over the frame
    // size whole), then the hop the proxy added.
    let header = format!("{}203.0.113.9", "192.0.2.77, ".repeat(3000));
    let padded = Subject { forwarded_for: Some(&header), ..subject("198.51.100.7", "alice") };
    for _ in 0..2 {
        let answer = client.report("login", &padded, Outcome::Failure).await;
        assert!(matches!(answer, Answer::Verdict(_)), "counted, not refused as malformed: {answer:?}");
    }
    let answer = client.check("login", &short).await;
    // remaining after a check: the threshold less the failures and the
    // attempts in flight, this one included.
    assert_eq!(verdict(answer).remaining, 2, "both failures counted against (alice, 203.0.113.9)");
    let proxy = client.check("login", &subject("198.51.100.7", "alice")).await;
    assert_eq!(verdict(proxy).remaining, 4, "padding did not move them into the proxy's bucket");
    // The daemon's own rule, for a caller that sends the header whole (the
    // CLI does): 10 KB fits a frame, and is read from the right.
    let whole = format!("{}203.0.113.9", "192.0.2.77, ".repeat(850));
    let args = ["report", "--route", "login", "--ip", "198.51.100.7", "--account", "alice", "--outcome", "failure"];
    let mut args = args.to_vec();
    args.extend(["--xff", &whole]);
    assert_eq!(daemon.cli_json(&args)["remaining"], 2, "the third failure of (alice, 203.0.113.9)");
}

#[tokio::test]
async fn a_daemon_that_does_not_answer_times_out_in_milliseconds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let _listener = tokio::net::UnixListener::bind(&path).unwrap(); // accepts (backlog), never replies
    let client = Client::new(ClientConfig::new(&path));
    let started = std::time::Instant::now();
    let answer = client.check("login", &subject("198.51.100.7", "alice")).await;
    let took = started.elapsed();
    assert!(
        matches!(answer, Answer::Unavailable { policy: FailPolicy::Open, error: ClientError::Timeout(t), .. } if t == Duration::from_millis(5)),
        "{answer:?}"
    );
    eprintln!("timed out after {took:?} (timeout 5 ms)");
}

/// A daemon that answered this client a moment ago and now does not is
/// busy, not down, for checks in a burst on one account: they do not
/// proceed (a guess let through by a slow limiter has no limit at all). A
/// lone check's timeout, or any after the daemon has not answered for
/// `busy_max`, is an outage, and `login` fails open as before.
#[test]
fn a_timeout_from_a_daemon_that_just_answered_is_busy_and_does_not_proceed() {
    let daemon = TestDaemon::start();
    let rt = runtime();
    let client = Client::new(ClientConfig::new(&daemon.socket).busy_max(Duration::from_millis(300)));
    let alice = subject("198.51.100.7", "alice");
    assert!(rt.block_on(client.check("login", &alice)).proceeds());
    daemon.freeze();
    let (burst, lone) = rt.block_on(async {
        let burst = futures_util::future::join(client.check("login", &alice), client.check("login", &alice)).await;
        (burst, client.check("login", &subject("198.51.100.8", "erin")).await)
    });
    for busy in [&burst.0, &burst.1] {
        assert!(matches!(busy, Answer::Unavailable { error: ClientError::Busy(_), .. }), "{busy:?}");
        assert!(!busy.proceeds(), "a burst's attempt on a busy daemon does not proceed");
    }
    assert!(matches!(lone, Answer::Unavailable { error: ClientError::Timeout(_), .. }), "{lone:?}");
    assert!(lone.proceeds(), "a lone login fails open");
    std::thread::sleep(Duration::from_millis(350));
    let down = rt.block_on(futures_util::future::join(client.check("login", &alice), client.check("login", &alice)));
    daemon.thaw();
    assert!(matches!(down.0, Answer::Unavailable { error: ClientError::Timeout(_), .. }), "{down:?}");
    assert!(down.0.proceeds() && down.1.proceeds(), "login fails open once the daemon is late for busy_max");
}

/// Waits until the daemon counts exactly one connection, the client's own.
/// The start-up probe's connection is counted until the daemon reads its
/// end, which under load can come after the first request; a client that
/// holds two connections still fails here after 5 s.
async fn settle_at_one_connection(client: &Client) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let connections = client.status().await.unwrap().connections;
        if connections == 1 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{connections} connections, expected the client's one");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reuses_its_connection_and_refuses_overlong_identifiers() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    for _ in 0..20 {
        verdict(client.check("login", &subject("198.51.100.7", "alice")).await);
    }
    settle_at_one_connection(&client).await;
    let long = "a".repeat(513);
    let answer = client.check("login", &subject("198.51.100.7", &long)).await;
    assert!(matches!(&answer, Answer::Rejected(e) if e.code == ErrorCode::FieldTooLong), "{answer:?}");
    assert!(!answer.proceeds());
    let missing = client.check("login", &Subject { peer: Some(ip("198.51.100.7")), ..Subject::default() }).await;
    assert!(matches!(&missing, Answer::Rejected(e) if e.code == ErrorCode::MissingField), "{missing:?}");
}

#[test]
fn cli_prints_verdicts_as_json_and_one_line_errors() {
    let daemon = TestDaemon::start();
    let args = ["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"];
    let v = daemon.cli_json(&args);
    for field in ["retry_after_ms", "delay_ms", "limit", "remaining", "reset_ms", "reason", "rule"] {
        assert!(v.get(field).is_some(), "{field} missing in {v}");
    }
    assert_eq!(v["decision"], "allow");
    let human = daemon.cli(&args);
    assert!(String::from_utf8_lossy(&human.stdout).starts_with("allow"));

    for _ in 0..5 {
        daemon.cli_json(&[
            "report",
            "--route",
            "login",
            "--ip",
            "198.51.100.7",
            "--account",
            "alice",
            "--outcome",
            "failure",
        ]);
    }
    let denied = daemon.cli_json(&args);
    assert_eq!(denied["decision"], "deny");
    assert_eq!(denied["reason"], "too_many_failures");
    let lockouts = daemon.cli_json(&["lockouts"]);
    assert_eq!(lockouts["total"], 1);
    let key = lockouts["lockouts"][0]["key"].as_str().unwrap();
    assert_eq!(key.len(), 32, "a 128-bit digest, never the account");
    let unlocked = daemon.cli_json(&["unlock", "--route", "login", "--account", "alice", "--source", "198.51.100.7"]);
    assert_eq!(unlocked["cleared"], 2, "the (alice, source) entry and alice's ceiling entry");
    assert_eq!(daemon.cli_json(&args)["decision"], "allow");

    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["manual_clock"], true);
    assert!(status["limits"].as_array().unwrap().iter().any(|l| l["name"] == "connections_max"));
    let login = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == "login").unwrap();
    let rules: Vec<&str> = login["rules"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        rules,
        ["account_failures", "known_device_failures", "source_failures", "source_rate", "spray_signals"],
        "rules are listed by name"
    );

    let bad_route = daemon.cli(&["check", "--route", "nope", "--ip", "198.51.100.7"]);
    assert!(!bad_route.status.success());
    let stderr = String::from_utf8_lossy(&bad_route.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("unknown route `nope`"), "{stderr}");
    assert!(stderr.contains("the routes are login, "), "the routes are listed: {stderr}");

    let bad_flag = daemon.cli(&["report", "--route", "login", "--ip", "1.2.3.4", "--outcome", "maybe"]);
    assert!(!bad_flag.status.success());
}

#[test]
fn cli_without_a_daemon_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["status", "--socket"])
        .arg(dir.path().join("none.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no tollgate socket at"), "{stderr}");
}

#[test]
fn clock_advance_is_refused_on_the_system_clock() {
    let daemon = TestDaemon::start_with(None, false);
    let out = daemon.cli(&["clock", "advance", "15m"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--manual-clock"));
}

#[test]
fn invalid_config_and_corrupt_state_stop_the_start_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[routes.login.rules.source_failures]\nthreshold = 0\nthreshhold = 3\n").unwrap();
    let serve = |extra: &[&str]| {
        std::process::Command::new(BIN)
            .arg("serve")
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .arg("--state")
            .arg(dir.path().join("state.redb"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = serve(&["--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("threshhold"), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&config, "[routes.login.rules.source_failures]\nthreshold = 0\n").unwrap();
    let out = serve(&["--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("routes.login.rules.source_failures.threshold"), "{stderr}");

    std::fs::write(dir.path().join("state.redb"), vec![0x5Au8; 16384]).unwrap();
    let out = serve(&[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("corrupt or unreadable") && stderr.contains("--discard-corrupt-state"), "{stderr}");
}

/// A second `serve` on a socket a daemon answers on is refused, and
/// before it creates anything: no secret and no state file of its own are
/// left beside the running daemon's.
#[test]
fn a_live_daemons_socket_is_not_stolen() {
    let daemon = TestDaemon::start();
    let other = tempfile::tempdir().unwrap();
    let state = other.path().join("state.redb");
    let out = std::process::Command::new(BIN)
        .arg("serve")
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("--state")
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by a running daemon"));
    assert!(!state.exists() && !other.path().join("secret").exists(), "nothing created");
    assert_eq!(daemon.cli_json(&["status"])["manual_clock"], true, "the first daemon still serves");
}

fn read_reply(stream: &mut std::os::unix::net::UnixStream) -> (u64, Response<'static>) {
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).unwrap();
    let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
    stream.read_exact(&mut payload).unwrap();
    codec::decode_response(&payload).unwrap()
}

#[test]
fn bad_frames_get_error_replies_and_the_connection_survives() {
    let daemon = TestDaemon::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let frame = |payload: &[u8]| {
        let mut f = (payload.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(payload);
        f
    };
    let mut wrong_version = vec![9u8];
    wrong_version.extend_from_slice(&41u64.to_le_bytes());
    let mut unknown_op = vec![1u8];
    unknown_op.extend_from_slice(&42u64.to_le_bytes());
    unknown_op.extend_from_slice(&77u32.to_le_bytes());
    for (payload, id, code) in [
        (wrong_version, 41, ErrorCode::UnsupportedVersion),
        (unknown_op, 42, ErrorCode::Malformed),
        (vec![1, 2, 3], 0, ErrorCode::Malformed),
    ] {
        stream.write_all(&frame(&payload)).unwrap();
        let (reply_id, reply) = read_reply(&mut stream);
        assert_eq!(reply_id, id);
        assert!(matches!(reply, Response::Error(ref e) if e.code == code), "{reply:?}");
    }
    // still serving on the same connection
    let mut ok = Vec::new();
    let s = subject("198.51.100.7", "alice");
    let report = Request::Report { route: "login", subject: s, outcome: Outcome::Failure, password_digest: None };
    codec::encode_request(43, &report, &mut ok);
    stream.write_all(&ok).unwrap();
    let (id, reply) = read_reply(&mut stream);
    assert_eq!(id, 43);
    assert!(matches!(reply, Response::Verdict(ref v) if v.decision == Decision::Allow && v.remaining == 4));

    // a 4 GiB length prefix: an error reply, then the connection closes
    stream.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let (_, reply) = read_reply(&mut stream);
    assert!(matches!(reply, Response::Error(ref e) if e.code == ErrorCode::FrameTooLarge), "{reply:?}");
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).unwrap(), 0, "closed");
    assert_eq!(daemon.cli_json(&["status"])["verdicts"]["errors"], 4);
}

/// An error reply to a frame the daemon could read the version and id of
/// is written in that version, so a strict client of versions 2 to 5 reads
/// it; a frame of a version the daemon does not speak, or too short to
/// hold an id, is answered in version 1. The bytes of the vectors file's
/// `error-activity-needs-v4-v3` come back from a real daemon.
#[test]
fn error_replies_carry_the_version_of_the_request() {
    let daemon = TestDaemon::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let read_raw = |stream: &mut std::os::unix::net::UnixStream| {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header).unwrap();
        let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
        stream.read_exact(&mut payload).unwrap();
        payload
    };
    let activity = Request::Activity { limit: 10 };
    let abandon = Request::Abandon { route: "login", subject: subject("198.51.100.7", "alice") };
    let check = Request::Check { route: "login", subject: subject("198.51.100.7", "alice") };
    let mut frames: Vec<(Vec<u8>, u8)> = Vec::new();
    for version in 1..=3 {
        let mut f = Vec::new();
        codec::encode_request_versioned(version, 11, &activity, &mut f);
        frames.push((f, version));
    }
    for version in 1..=4 {
        let mut f = Vec::new();
        codec::encode_request_versioned(version, 13, &abandon, &mut f);
        frames.push((f, version));
    }
    for version in 2..=5 {
        // A check cut short inside its subject: malformed, in its version.
        let mut f = Vec::new();
        codec::encode_request_versioned(version, 14, &check, &mut f);
        f.truncate(f.len() - 3);
        let payload_len = (f.len() - codec::FRAME_HEADER_BYTES) as u32;
        f[..4].copy_from_slice(&payload_len.to_le_bytes());
        frames.push((f, version));
    }
    // An unknown request tag in version 4, and a version not spoken.
    let mut unknown = vec![0u8; 4];
    unknown.push(4);
    unknown.extend_from_slice(&15u64.to_le_bytes());
    unknown.extend_from_slice(&99u32.to_le_bytes());
    let len = (unknown.len() - 4) as u32;
    unknown[..4].copy_from_slice(&len.to_le_bytes());
    frames.push((unknown, 4));
    let mut unspoken = vec![0u8; 4];
    unspoken.push(9);
    unspoken.extend_from_slice(&16u64.to_le_bytes());
    unspoken[..4].copy_from_slice(&9u32.to_le_bytes());
    frames.push((unspoken, 1));
    for (frame, version) in frames {
        stream.write_all(&frame).unwrap();
        let payload = read_raw(&mut stream);
        let (_, reply, extras) = codec::decode_response_versioned(&payload).unwrap();
        assert!(matches!(reply, Response::Error(_)), "{reply:?}");
        assert_eq!((payload[0], extras.version), (version, version), "{reply:?} for {frame:02x?}");
    }
    // The file's vector, byte for byte.
    let mut f = Vec::new();
    codec::encode_request_versioned(3, 11, &activity, &mut f);
    stream.write_all(&f).unwrap();
    let vectors: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("tests/vectors/protocol.json").unwrap()).unwrap();
    let expected = vectors["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "error-activity-needs-v4-v3")
        .map(|v| v["frame"].as_str().unwrap().to_string())
        .unwrap();
    let payload = read_raw(&mut stream);
    let mut whole = (payload.len() as u32).to_le_bytes().to_vec();
    whole.extend_from_slice(&payload);
    let hex: String = whole.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, expected);
}

/// A `malformed` reply's message names what is wrong in plain words (no
/// decoder's Debug text), with the request's id, and the connection serves
/// on. PROTOCOL.md, section 8, lists these texts as informational.
/// Version 3 against the real daemon: tagged checks and reports are
/// answered as untagged ones are (one failure flags nothing), the same
/// attempts from a version-2 client count alike, only the version-3
/// client's tag reaches spray detection (the version-2 one cannot send it),
/// and a tag that does not decode is refused by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_3_tagged_attempts_are_answered_as_version_2_ones() {
    let daemon = TestDaemon::start();
    let tag = Some(tollgate::client::password_tag(&[7; 32], "hunter2"));
    let new = daemon.client();
    let old = Client::new(ClientConfig::new(&daemon.socket).timeout(Duration::from_secs(10)).protocol_version(2));
    let mut remaining = Vec::new();
    for (client, account) in [(&new, "alice"), (&old, "bob")] {
        let attempt = subject("198.51.100.7", account);
        let checked = client.check_tagged("login", &attempt, tag).await;
        assert!(checked.answer.proceeds() && !checked.degraded, "{checked:?}");
        let reported = client.report_tagged("login", &attempt, Outcome::Failure, None, tag).await;
        remaining.push(verdict(reported.answer).remaining);
    }
    assert_eq!(remaining[0], remaining[1], "a version-3 failure counts as a version-2 one");
    // The detection thread ingests within its publish interval.
    let mut signals = None;
    for _ in 0..200 {
        let full = new.status_full().await.unwrap();
        assert_eq!(full.shared, None);
        let s = full.signals.expect("spray detection is on by default");
        if s.events_total == 2 {
            signals = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let signals = signals.expect("both failures reach spray detection");
    let passwords = signals.families.iter().find(|f| f.name == "passwords").unwrap();
    assert_eq!(passwords.entries, 1, "the version-3 client's tag, not the version-2 one's");

    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = Vec::new();
    let check = Request::Check { route: "login", subject: subject("198.51.100.7", "carol") };
    codec::encode_request_with_extras(3, 60, &check, &codec::RequestExtras { password_tag: tag }, &mut frame);
    let option_at = frame.len() - 17;
    frame[option_at] = 2;
    stream.write_all(&frame).unwrap();
    match read_reply(&mut stream) {
        (60, Response::Error(e)) => assert_eq!(
            (e.code, e.message.as_ref()),
            (ErrorCode::Malformed, "option tag 2 in field `password_tag` is not 0 (none) or 1 (some)")
        ),
        other => panic!("expected malformed, got {other:?}"),
    }
}

#[test]
fn malformed_replies_say_what_is_wrong_in_plain_words() {
    let daemon = TestDaemon::start();
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let frame = |id: u64, body: &[u8]| {
        let mut payload = vec![1u8];
        payload.extend_from_slice(&id.to_le_bytes());
        payload.extend_from_slice(body);
        let mut f = (payload.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&payload);
        f
    };
    let mut bad_route = 0u32.to_le_bytes().to_vec(); // Check, route "\xff\xfe"
    bad_route.extend_from_slice(&2u64.to_le_bytes());
    bad_route.extend_from_slice(&[0xff, 0xfe]);
    let mut status_and_more = 2u32.to_le_bytes().to_vec();
    status_and_more.extend_from_slice(&[0, 0, 0]);
    for (id, body, expected) in [
        (50, 42u32.to_le_bytes().to_vec(), "unknown request tag 42 (the known tags are 0 to 5)"),
        (51, bad_route, "string not UTF-8 in field `route` (at byte 0 of it)"),
        (52, vec![5, 0, 0, 0, 1, 2, 3], "message ends inside field `by_ms`: 8 bytes needed, 3 left"),
        (53, status_and_more, "3 byte(s) left over after a complete message"),
    ] {
        stream.write_all(&frame(id, &body)).unwrap();
        let (reply_id, reply) = read_reply(&mut stream);
        assert_eq!(reply_id, id);
        match reply {
            Response::Error(e) => assert_eq!((e.code, e.message.as_ref()), (ErrorCode::Malformed, expected)),
            other => panic!("expected malformed, got {other:?}"),
        }
    }
    // Shorter than the envelope: id 0.
    stream.write_all(&[3, 0, 0, 0, 1, 2, 3]).unwrap();
    match read_reply(&mut stream) {
        (0, Response::Error(e)) => assert_eq!(
            (e.code, e.message.as_ref()),
            (
                ErrorCode::Malformed,
                "payload of 3 bytes is shorter than the 9-byte envelope (version byte and request id)"
            )
        ),
        other => panic!("expected malformed with id 0, got {other:?}"),
    }
    let mut status = Vec::new();
    codec::encode_request(54, &Request::Status, &mut status);
    stream.write_all(&status).unwrap();
    assert!(matches!(read_reply(&mut stream), (54, Response::Status(_))));
}

#[test]
fn no_raw_account_name_reaches_the_state_file_or_the_log() {
    let mut daemon = TestDaemon::start();
    let planted = "planted-account-name-4d1e@example.com";
    for n in 0..6 {
        daemon.cli_json(&[
            "report",
            "--route",
            "login",
            "--ip",
            &format!("198.51.100.{n}"),
            "--account",
            planted,
            "--outcome",
            "failure",
        ]);
    }
    daemon.cli_json(&["unlock", "--route", "login", "--account", planted]);
    for _ in 0..5 {
        daemon.cli_json(&[
            "report",
            "--route",
            "login",
            "--ip",
            "198.51.100.9",
            "--account",
            planted,
            "--outcome",
            "failure",
        ]);
    }
    assert!(daemon.terminate().success());
    let state = std::fs::read(&daemon.state).unwrap();
    assert!(!state.is_empty());
    assert!(!state.windows(planted.len()).any(|w| w == planted.as_bytes()), "account name in the state file");
    assert!(!daemon.log().contains("planted-account"), "account name in the log");
}

#[test]
fn a_frame_trickled_slower_than_the_read_timeout_is_dropped() {
    let daemon = TestDaemon::start_with(Some("[server]\nframe_read_timeout_ms = 300\n"), true);
    let mut frame = Vec::new();
    codec::encode_request(1, &Request::Status, &mut frame);
    let mut stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // one byte every 100 ms: each read is quick, the frame is not
    let mut sent = 0;
    for byte in &frame {
        if stream.write_all(&[*byte]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sent < frame.len(), "the daemon waited {sent} bytes for a frame of {}", frame.len());
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply to a frame that never arrived in time");
    // an ordinary client is unaffected
    assert_eq!(daemon.cli_json(&["status"])["manual_clock"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_the_client_reconnects_transparently() {
    let daemon = TestDaemon::start_with(Some("[server]\nidle_timeout_ms = 1000\n"), true);
    let client = daemon.client();
    verdict(client.check("login", &subject("198.51.100.7", "alice")).await);
    settle_at_one_connection(&client).await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    // The pooled connection was closed by the daemon; the next call works.
    let v = verdict(client.check("login", &subject("198.51.100.7", "alice")).await);
    assert_eq!(v.decision, Decision::Allow);
    settle_at_one_connection(&client).await;
}

/// Parses Prometheus text: checks every family has one HELP and one TYPE
/// line before its samples and that its samples are not split up; returns
/// each sample's series (`name{labels}`) and value (counts are whole numbers;
/// seconds need not be).
fn parse_exposition(text: &str) -> std::collections::BTreeMap<String, f64> {
    let mut samples = std::collections::BTreeMap::new();
    let mut families_done = std::collections::HashSet::new();
    let mut current: Option<String> = None;
    let mut typed = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap().to_string();
            assert!(families_done.insert(name.clone()), "family {name} appears twice");
            current = Some(name);
            typed = false;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            assert_eq!(parts.next(), current.as_deref(), "TYPE follows its HELP: {line}");
            assert!(matches!(parts.next(), Some("counter" | "gauge")), "{line}");
            typed = true;
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(typed && current.as_deref() == Some(name), "sample outside its family: {line}");
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && name.starts_with("tollgate_"),
            "metric name {name}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "labels of {line}");
                for pair in labels[1..labels.len() - 1].split(',') {
                    let (label, quoted) = pair.split_once('=').unwrap_or_else(|| panic!("label {pair}"));
                    assert!(label.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "label name {label}");
                    assert!(quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'), "{pair}");
                }
            }
        }
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value.is_finite() && value >= 0.0, "{line}");
        assert!(samples.insert(series.to_string(), value).is_none(), "series twice: {series}");
    }
    samples
}

#[test]
fn metrics_print_status_in_the_prometheus_text_format_without_identifiers() {
    let daemon = TestDaemon::start();
    let attempt = ["--route", "login", "--ip", "198.51.100.9", "--account", "mallory@example.com"];
    for _ in 0..5 {
        let mut args = vec!["report"];
        args.extend(attempt);
        args.extend(["--outcome", "failure"]);
        assert!(daemon.cli(&args).status.success());
    }
    let mut args = vec!["check"];
    args.extend(attempt);
    assert_eq!(daemon.cli_json(&args)["decision"], "deny");

    let out = daemon.cli(&["metrics"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let metrics = parse_exposition(&text);
    let status = daemon.cli_json(&["status"]);
    let series =
        |name: &str, rule: &str, kind: &str| format!("{name}{{route=\"login\",rule=\"{rule}\",kind=\"{kind}\"}}");
    assert_eq!(metrics[&series("tollgate_rule_refused_total", "source_failures", "failures")], 1.0);
    assert_eq!(metrics[&series("tollgate_rule_refused_total", "source_rate", "rate")], 0.0);
    assert_eq!(metrics[&series("tollgate_rule_entries", "source_failures", "failures")], 1.0);
    assert_eq!(metrics[&series("tollgate_rule_limit", "source_failures", "failures")], 5.0);
    assert_eq!(metrics[&series("tollgate_rule_period_seconds", "source_failures", "failures")], 900.0);
    for decision in ["allow", "delay", "challenge", "deny"] {
        assert_eq!(
            metrics[&format!("tollgate_verdicts_total{{decision=\"{decision}\"}}")],
            status["verdicts"][decision].as_f64().unwrap(),
            "{decision}"
        );
    }
    assert_eq!(metrics["tollgate_verdicts_total{decision=\"deny\"}"], 2.0, "the fifth failure and the check");
    assert_eq!(metrics["tollgate_state_healthy"], 1.0);
    assert_eq!(metrics["tollgate_limit{name=\"connections_max\"}"], 1024.0);
    let rules: usize = status["routes"].as_array().unwrap().iter().map(|r| r["rules"].as_array().unwrap().len()).sum();
    let refused_series = metrics.keys().filter(|k| k.starts_with("tollgate_rule_refused_total{")).count();
    assert_eq!(refused_series, rules, "one series per rule of every route");
    for secret in ["mallory", "example.com", "198.51.100"] {
        assert!(!text.contains(secret), "metrics leak {secret}");
    }
    assert!(!daemon.cli(&["metrics", "--json"]).status.success(), "one format only");
}

/// `tollgate status | head -1`: the reader goes away before the output is
/// written. The CLI stops quietly, as `cat` would, instead of panicking
/// on the closed pipe (Rust ignores SIGPIPE, so each print fails instead).
#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    let daemon = TestDaemon::start();
    let dir = tempfile::tempdir().unwrap();
    let without_a_daemon: [&[&str]; 1] = [&["simulate", "--hours", "1"]];
    let client: [&[&str]; 5] = [&["status"], &["status", "--json"], &["metrics"], &["lockouts"], &["man"]];
    for args in without_a_daemon.iter().chain(client.iter()) {
        let mut child = Command::new(BIN)
            .args(*args)
            .env("TOLLGATE_SOCKET", &daemon.socket)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tollgate {args:?}: {:?}: {stderr}", out.status);
        assert!(stderr.is_empty(), "tollgate {args:?} said: {stderr}");
    }
    // Any other failed write (a full disk) is an error, in one line.
    for args in [&["simulate", "--hours", "1"][..], &["top", "--interval", "100ms"], &["status"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = Command::new(BIN).args(args).env("TOLLGATE_SOCKET", &daemon.socket).stdout(full).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "tollgate {args:?}: {stderr}");
        assert_eq!(
            stderr.trim(),
            "tollgate: error: cannot write to standard output: No space left on device (os error 28)",
            "tollgate {args:?}"
        );
    }
}

/// `tollgate check` exits with its verdict, as documented in its help and
/// the man page: 0 allow, 3 delay, 4 challenge, 5 deny, 1 an error, 2 a
/// usage error; `report` exits 0 whatever its verdict.
#[test]
fn check_exits_with_its_verdict_for_shell_scripts() {
    let config = "[routes.login.rules.source_failures]\nresponses = [\"delay\", \"challenge\", \"deny\"]\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    let check = ["check", "--route", "login", "--ip", "198.51.100.7", "--account", "alice"];
    let code = |args: &[&str]| daemon.cli(args).status.code();
    assert_eq!(code(&check), Some(0), "allow");
    let report = ["report", "--route", "login", "--ip", "198.51.100.7", "--account", "alice", "--outcome", "failure"];
    for _ in 0..5 {
        assert_eq!(code(&report), Some(0), "a report exits 0");
    }
    assert_eq!(code(&check), Some(3), "delay");
    assert_eq!(code(&check), Some(4), "challenge");
    assert_eq!(code(&check), Some(5), "deny");
    assert_eq!(code(&["check", "--route", "nope", "--ip", "198.51.100.7"]), Some(1), "an error");
    assert_eq!(code(&["check", "--bogus"]), Some(2), "a usage error");
    let help = String::from_utf8_lossy(&daemon.cli(&["check", "--help"]).stdout).to_string();
    assert!(help.contains("5 deny"), "{help}");
}

/// A CLI that cannot reach the daemon says what to do: no socket names
/// `--socket`, `TOLLGATE_SOCKET` and `systemctl status tollgate`; a socket
/// left by a daemon that stopped says no daemon runs. `serve` takes its
/// socket from `TOLLGATE_SOCKET` as every other command does.
#[test]
fn an_unreachable_daemon_is_explained_and_serve_honours_tollgate_socket() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    let run = |args: &[&str], socket: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env("TOLLGATE_SOCKET", socket)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (code, err) = run(&["status"], &missing);
    assert_eq!(code, Some(1));
    for hint in ["no tollgate socket at", "--socket", "TOLLGATE_SOCKET", "systemctl status tollgate"] {
        assert!(err.contains(hint), "{hint}: {err}");
    }
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let (code, err) = run(&["check", "--route", "login", "--ip", "192.0.2.1"], &stale);
    assert_eq!(code, Some(1));
    assert!(err.contains("the daemon is not running"), "{err}");

    // serve with no --socket: TOLLGATE_SOCKET names it.
    let socket = dir.path().join("from-env.sock");
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--state"])
        .arg(dir.path().join("state.redb"))
        .env("TOLLGATE_SOCKET", &socket)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, err) = run(&["status"], &socket);
    let _ = serve.kill();
    let _ = serve.wait();
    assert_eq!(code, Some(0), "{err}");
}

/// `status` prints its limits as a table, a heading per group and two
/// `name value` pairs a line, not as one line of hundreds of columns; and
/// `lockouts` says when a lockout ends as a date.
#[test]
fn status_and_lockouts_read_as_tables_and_dates() {
    let daemon = TestDaemon::start();
    let status = String::from_utf8(daemon.cli(&["status"]).stdout).unwrap();
    let limits: Vec<&str> =
        status.lines().skip_while(|l| *l != "limits:").take_while(|l| !l.starts_with("state:")).collect();
    assert!(limits.len() > 20, "{status}");
    let widest = limits.iter().map(|l| l.len()).max().unwrap_or(0);
    assert!(widest <= 100, "a limits line of {widest} columns:\n{status}");
    assert!(status.contains("\n  signals\n"), "{status}");
    assert!(status.lines().any(|l| l.contains("attempt_timeout_ms") && l.contains("30s")), "{status}");
    for _ in 0..5 {
        daemon.cli(&["report", "--route", "login", "--ip", "192.0.2.9", "--account", "bob", "--outcome", "failure"]);
    }
    let lockouts = String::from_utf8(daemon.cli(&["lockouts"]).stdout).unwrap();
    assert!(lockouts.contains("until 20") && lockouts.contains("Z  (retry after "), "{lockouts}");
}

/// `check-config` reads a file as `serve` would, reports every problem at
/// once and exits 78, or says it is valid and exits 0; it creates nothing
/// (no state file, no secret), unlike a `serve` that would refuse.
#[test]
fn check_config_reports_every_problem_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = |config: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check-config", "--config"])
            .arg(config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let state = dir.path().join("state.redb");
    let good = dir.path().join("good.toml");
    std::fs::write(&good, format!("state = \"{}\"\nattempt_timeout_ms = 20000\n", state.display())).unwrap();
    let (code, out, err) = run(&good);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("valid"), "{out}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!("state = \"{}\"\nsnapshot_interval_ms = 0\nattempt_timeout_ms = 0\n", state.display()),
    )
    .unwrap();
    let (code, _, err) = run(&bad);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("snapshot_interval_ms") && err.contains("attempt_timeout_ms"), "both problems: {err}");

    let classes = dir.path().join("classes.txt");
    std::fs::write(&classes, "not a cidr hosting\n").unwrap();
    let with_classes = dir.path().join("classes.toml");
    std::fs::write(
        &with_classes,
        format!("state = \"{}\"\n[source]\nclass_file = \"{}\"\n", state.display(), classes.display()),
    )
    .unwrap();
    let (code, _, err) = run(&with_classes);
    assert_eq!(code, Some(78), "a bad class file: {err}");

    assert!(!state.exists(), "no state file made");
    assert!(!dir.path().join("secret").exists(), "no secret made");
}

/// `unlock` says when it cleared nothing and exits 6, so a script can tell
/// a typo in the account from an unlock that took.
#[test]
fn an_unlock_that_clears_nothing_says_so_and_exits_6() {
    let daemon = TestDaemon::start();
    let unlock = ["unlock", "--route", "login", "--account", "nobody"];
    let out = daemon.cli(&unlock);
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cleared nothing"), "{out:?}");
    for _ in 0..5 {
        daemon.cli(&["report", "--route", "login", "--ip", "192.0.2.5", "--account", "bob", "--outcome", "failure"]);
    }
    let out = daemon.cli(&["unlock", "--route", "login", "--account", "bob"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
