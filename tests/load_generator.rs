//! `tollgate bench` against real daemons: the counts it reports are exact
//! for the workloads the performance targets are measured with, so its
//! figures can be trusted (no timing is asserted here; figures come from
//! `benches/`).

mod common;

use common::*;

/// A route whose one rule locks an account at its 10th failure.
const TRIPS: &str = "[routes.trips]\nfail_policy = \"open\"\n\
    [routes.trips.rules.account_failures]\nkind = \"failures\"\nkey = [\"account\"]\n\
    threshold = 10\nwindow_secs = 3600\nentries_max = 100000\n";

fn bench(daemon: &TestDaemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    daemon.cli_json(&all)
}

fn entries(daemon: &TestDaemon, route: &str) -> u64 {
    let status = daemon.cli_json(&["status"]);
    let route = status["routes"].as_array().unwrap().iter().find(|r| r["name"] == route).expect("route in status");
    route["rules"].as_array().unwrap().iter().map(|r| r["entries"].as_u64().unwrap()).sum()
}

#[test]
fn report_mix_with_repeat_trips_exactly_every_nth_report() {
    let daemon = TestDaemon::start_with(Some(TRIPS), false);
    // 5 connections with 400 operations each, 3 in flight (batches do not
    // line up with accounts): each account gets its 10 failures in a row
    // on one connection.
    let r = bench(
        &daemon,
        &[
            "--connections",
            "5",
            "--in-flight",
            "3",
            "--route",
            "trips",
            "--mix",
            "report",
            "--failure-ratio",
            "1",
            "--repeat",
            "10",
            "--distribution",
            "sequential",
            "--keys",
            "1000000",
            "--operations",
            "2000",
        ],
    );
    assert_eq!(r["requests"], 2000, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["refused"], 200, "exactly the 10th report of each account trips: {r}");
    let lockouts = daemon.cli_json(&["lockouts", "--limit", "1000"]);
    assert_eq!(lockouts["total"], 200, "{lockouts}");
    assert_eq!(entries(&daemon, "trips"), 200);
}

#[test]
fn key_offset_moves_to_fresh_accounts() {
    let daemon = TestDaemon::start_with(Some(TRIPS), false);
    let run = |offset: &str| {
        bench(
            &daemon,
            &[
                "--connections",
                "4",
                "--route",
                "trips",
                "--mix",
                "report",
                "--failure-ratio",
                "1",
                "--distribution",
                "sequential",
                "--keys",
                "500",
                "--key-offset",
                offset,
                "--operations",
                "500",
            ],
        )
    };
    assert_eq!(run("0")["refused"], 0);
    assert_eq!(entries(&daemon, "trips"), 500);
    assert_eq!(run("500")["refused"], 0);
    assert_eq!(entries(&daemon, "trips"), 1000, "the offset run counted 500 other accounts");
}

#[test]
fn prefill_makes_every_key_live_and_a_paced_run_keeps_its_rate() {
    let config = "[routes.request.rules.source_rate]\nlimit = 1\nperiod_secs = 86400\nburst = 1\n\
                  monitor = true\nentries_max = 100000\n";
    let daemon = TestDaemon::start_with(Some(config), false);
    let fill = bench(&daemon, &["--connections", "5", "--keys", "20000", "--prefill", "--operations", "0"]);
    assert_eq!(fill["requests"], 0, "{fill}");
    assert_eq!(entries(&daemon, "request"), 20_000, "one live GCRA key per source");
    // 400 checks a second for 1 s over 2 threads: never more than the
    // schedule (a stalled thread catches up, it does not run over), and
    // no error. (How close it stays to the schedule is timing: not here.)
    let paced = bench(&daemon, &["--connections", "2", "--keys", "20000", "--rate", "400", "--duration", "1s"]);
    let sent = paced["requests"].as_u64().unwrap();
    assert!((100..=400).contains(&sent), "{paced}");
    assert_eq!(paced["errors"], 0, "{paced}");
    assert_eq!(paced["offered_ops_per_s"], 400.0, "{paced}");
    assert_eq!(entries(&daemon, "request"), 20_000, "the paced run touched only live keys");
}

/// An echo server on a temp socket, killed on drop.
struct EchoServer {
    child: std::process::Child,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl EchoServer {
    fn start(extra: &[&str]) -> EchoServer {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("echo.sock");
        let child = std::process::Command::new(BIN)
            .args(["echo-server", "--socket"])
            .arg(&socket)
            .args(extra)
            .spawn()
            .expect("start echo server");
        for _ in 0..200 {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        EchoServer { child, socket, _dir: dir }
    }

    fn bench(&self, extra: &[&str]) -> serde_json::Value {
        let out = std::process::Command::new(BIN)
            .args(["bench", "--json", "--connections", "3", "--in-flight", "16", "--operations", "4800"])
            .args(extra)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("run bench");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn raw_mode_against_the_echo_server_counts_every_frame() {
    let echo = EchoServer::start(&[]);
    let r = echo.bench(&["--raw"]);
    assert_eq!((r["requests"].as_u64(), r["errors"].as_u64()), (Some(4800), Some(0)), "{r}");
}

#[test]
fn the_fixed_verdict_floor_decodes_requests_and_answers_verdicts() {
    use std::io::{Read, Write};
    use tollgate::codec;
    use tollgate::protocol::{Decision, ErrorCode, Request, Response, Subject};

    let echo = EchoServer::start(&["--verdict"]);
    // Decoded replies, every one an allow verdict: no errors, no refusals.
    let r = echo.bench(&[]);
    assert_eq!((r["requests"].as_u64(), r["errors"].as_u64(), r["refused"].as_u64()), (Some(4800), Some(0), Some(0)));

    // A check gets its own id back on an allow; a malformed payload gets
    // the decode error under its id, and the connection stays usable.
    let mut stream = std::os::unix::net::UnixStream::connect(&echo.socket).unwrap();
    let mut frames = Vec::new();
    let subject = Subject { peer: Some("192.0.2.1".parse().unwrap()), ..Subject::default() };
    codec::encode_request(41, &Request::Check { route: "request", subject }, &mut frames);
    let mut bad = vec![tollgate::protocol::PROTOCOL_VERSION];
    bad.extend_from_slice(&42u64.to_le_bytes());
    bad.extend_from_slice(&[0xff; 3]);
    frames.extend_from_slice(&(bad.len() as u32).to_le_bytes());
    frames.extend_from_slice(&bad);
    stream.write_all(&frames).unwrap();
    let mut replies = Vec::new();
    for _ in 0..2 {
        let mut header = [0u8; 4];
        stream.read_exact(&mut header).unwrap();
        let mut payload = vec![0u8; u32::from_le_bytes(header) as usize];
        stream.read_exact(&mut payload).unwrap();
        replies.push(codec::decode_response(&payload).unwrap());
    }
    assert!(matches!(&replies[0], (41, Response::Verdict(v)) if v.decision == Decision::Allow), "{replies:?}");
    assert!(matches!(&replies[1], (42, Response::Error(e)) if e.code == ErrorCode::Malformed), "{replies:?}");
}

#[test]
fn a_paced_run_times_the_echo_floor_alongside_every_operation() {
    let daemon = TestDaemon::start_with(None, false);
    let echo = EchoServer::start(&[]);
    let floor = echo.socket.to_str().unwrap();
    let paced = bench(
        &daemon,
        &["--connections", "2", "--in-flight", "2", "--rate", "400", "--duration", "1s", "--floor-socket", floor],
    );
    let sent = paced["requests"].as_u64().unwrap();
    assert!((100..=400).contains(&sent), "{paced}");
    assert_eq!(paced["floor_requests"].as_u64(), Some(sent), "every operation went to both: {paced}");
    assert_eq!(paced["errors"], 0, "{paced}");
    assert!(paced["floor_p50_us"].as_u64().unwrap() > 0, "{paced}");
    // Without it the floor fields stay empty; without --rate it is refused.
    let alone = bench(&daemon, &["--connections", "1", "--rate", "100", "--duration", "200ms"]);
    assert_eq!(alone["floor_requests"], 0, "{alone}");
    let unpaced = daemon.cli(&["bench", "--operations", "10", "--floor-socket", floor]);
    assert!(!unpaced.status.success());
    assert!(String::from_utf8_lossy(&unpaced.stderr).contains("--rate"), "{unpaced:?}");
}
