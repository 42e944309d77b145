//! `[metrics] listen`: the daemon serves `GET /metrics` over HTTP on a
//! loopback address or a Unix socket, the same families `tollgate metrics`
//! prints; other paths and methods are refused, a peer that sends nothing
//! holds up no one, and an address off the host is refused at start.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;

fn get(stream: &mut (impl Read + Write), request: &str) -> (String, String) {
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

#[test]
fn metrics_are_served_over_a_unix_socket_and_loopback_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("metrics.sock");
    // A free loopback port: bound, then let go for the daemon.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let daemon = TestDaemon::start_with(Some(&format!("[metrics]\nlisten = \"{}\"\n", socket.display())), true);
    daemon.cli(&["check", "--route", "login", "--ip", "192.0.2.1", "--account", "alice"]);
    // An idle peer holds one slot; the scrape below is answered all the same.
    let _idle = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut unix = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    unix.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, body) = get(&mut unix, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let cli = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    let families =
        |text: &str| -> Vec<String> { text.lines().filter(|l| l.starts_with("# TYPE ")).map(String::from).collect() };
    assert_eq!(families(&body), families(&cli), "the same families as `tollgate metrics`");
    assert!(body.contains("tollgate_verdicts_total{decision=\"allow\"} 1"), "{body}");
    let limits = daemon.cli_json(&["status"])["limits"].to_string();
    assert!(limits.contains("metrics.scrapes_concurrently_max"), "the listener's limits in status: {limits}");

    let mut other = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    assert_eq!(get(&mut other, "GET / HTTP/1.1\r\n\r\n").0, "HTTP/1.1 404 Not Found");
    let mut post = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    assert_eq!(get(&mut post, "POST /metrics HTTP/1.1\r\n\r\n").0, "HTTP/1.1 405 Method Not Allowed");

    let tcp_daemon = TestDaemon::start_with(Some(&format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")), true);
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (status, body) = get(&mut tcp, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 200 OK", "{}", tcp_daemon.log());
    assert!(body.contains("# TYPE tollgate_uptime_seconds gauge"), "{body}");
}

#[test]
fn a_metrics_address_off_the_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(&config, "[metrics]\nlisten = \"0.0.0.0:9464\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("metrics.listen") && err.contains("loopback"), "{err}");
}
