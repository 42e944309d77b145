//! What an operator sees of the shared store: `tollgate metrics`
//! against a real daemon and a real `redis-server`, before and after the
//! store dies. The README and docs/operations.md tell operators to alert on
//! these series, so their names and values are tested here.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::redis::{require_redis, RedisServer};
use common::*;
use tollgate::protocol::Decision;

/// One daemon on `url`, with a 20 ms timeout as the other shared tests
/// (the 2 ms default is for an idle store on the same host, not for a
/// loaded 2-core test machine).
fn daemon(url: &str, secret: &Path) -> TestDaemon {
    tollgate::Secret::load_or_create(secret).expect("secret");
    let config = format!(
        "secret = \"{}\"\n\n[shared]\nurl = \"{url}\"\ntimeout_ms = 20\nhosts = 3\nprobe_interval_ms = 50\nprobe_max_ms = 200\n",
        secret.display()
    );
    TestDaemon::start_with(Some(&config), false)
}

/// Every sample of an exposition, series to value; checks the format as it
/// goes: one HELP and one TYPE per family, before its samples, no series
/// twice, every value a finite number.
fn exposition(daemon: &TestDaemon) -> (String, HashMap<String, f64>) {
    let out = daemon.cli(&["metrics"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut typed = HashMap::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter"].contains(&kind), "{line}");
            assert!(typed.insert(family.to_string(), kind.to_string()).is_none(), "family twice: {line}");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let family = series.split('{').next().unwrap();
        assert!(typed.contains_key(family), "a sample before its TYPE: {line}");
        if typed[family] == "counter" {
            assert!(family.ends_with("_total"), "a counter's name ends in _total: {line}");
        }
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(value.is_finite() && value >= 0.0, "{line}");
        assert!(samples.insert(series.to_string(), value).is_none(), "series twice: {series}");
    }
    (text, samples)
}

#[test]
fn metrics_show_the_shared_store_up_then_degraded_when_it_dies() {
    require_redis();
    let mut redis = RedisServer::unix();
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(&redis.url(), &dir.path().join("secret"));
    let mallory = subject("192.0.2.66", "mallory@example.com");
    assert_eq!(verdict(runtime().block_on(d.client().check("login", &mallory))).decision, Decision::Allow);

    let (text, m) = exposition(&d);
    assert_eq!(m["tollgate_shared_up"], 1.0, "{text}");
    assert_eq!(m["tollgate_shared_degraded"], 0.0);
    assert_eq!(m["tollgate_shared_state{state=\"closed\"}"], 1.0);
    assert_eq!(m["tollgate_shared_state{state=\"open\"}"], 0.0);
    assert!(m["tollgate_shared_calls_total{result=\"ok\"}"] >= 1.0, "the check (and the join) asked the store");
    assert!(m["tollgate_shared_batches_total"] >= 1.0);
    assert!(m["tollgate_shared_rtt_max_seconds"] > 0.0);
    assert_eq!(m["tollgate_shared_hosts{kind=\"in_force\"}"], 3.0, "configured");
    assert_eq!(m["tollgate_rule_scope{route=\"login\",rule=\"source_failures\",scope=\"global\"}"], 1.0);
    assert_eq!(m["tollgate_rule_scope{route=\"login\",rule=\"source_rate\",scope=\"host\"}"], 1.0);
    assert_eq!(m["tollgate_rule_scope{route=\"request\",rule=\"source_rate\",scope=\"host\"}"], 1.0);
    for secret in ["mallory", "example.com", "192.0.2", redis.socket_path().to_str().unwrap()] {
        assert!(!text.contains(secret), "metrics leak {secret}");
    }

    redis.kill9();
    // Global checks fail until the breaker opens (breaker_failures in a row).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    while !d.log().contains("shared store unreachable") {
        assert!(Instant::now() < deadline, "the breaker never opened:\n{}", d.log());
        let who = format!("user-{n}");
        verdict(runtime().block_on(d.client().check("login", &subject("192.0.2.67", &who))));
        n += 1;
    }
    verdict(runtime().block_on(d.client().check("login", &subject("192.0.2.68", "peggy"))));
    std::thread::sleep(Duration::from_millis(20)); // degraded time is counted in ms

    let (text, m) = exposition(&d);
    assert_eq!(m["tollgate_shared_up"], 0.0, "{text}");
    assert_eq!(m["tollgate_shared_degraded"], 1.0);
    let states: f64 = ["closed", "open", "recovering", "refused"]
        .iter()
        .map(|s| m[&format!("tollgate_shared_state{{state=\"{s}\"}}")])
        .sum();
    assert_eq!(states, 1.0, "one-hot");
    assert_eq!(m["tollgate_shared_state{state=\"closed\"}"], 0.0);
    assert!(m["tollgate_shared_transitions_total"] >= 1.0);
    assert!(
        m["tollgate_shared_calls_total{result=\"timeout\"}"] + m["tollgate_shared_calls_total{result=\"error\"}"]
            >= 1.0,
        "{text}"
    );
    assert!(m["tollgate_shared_calls_total{result=\"not_asked\"}"] >= 1.0, "the check after the breaker opened");
    assert!(m["tollgate_shared_degraded_answers_total"] >= 1.0);
    assert!(m["tollgate_shared_degraded_seconds_total"] > 0.0, "the current stretch counts");
}

#[test]
fn metrics_have_no_shared_family_without_a_store() {
    let d = TestDaemon::start();
    let (text, _) = exposition(&d);
    assert!(!text.contains("tollgate_shared_") && !text.contains("tollgate_rule_scope"), "{text}");
}
