//! What `status` says about the daemon itself, against real daemons on the
//! manual clock, held to PROTOCOL.md's `Status` section: the named limits
//! are exactly the documented lists, in order (the daemon's own, spray
//! detection's when it is on, the operator's view's), then one
//! `<route>.known_devices_per_account_max` per route that keeps known
//! devices; `socket_mode` is the mode's bits in decimal; `uptime_ms` follows
//! the manual clock.

mod common;

use std::time::Duration;

use common::*;

/// The names PROTOCOL.md lists between "The daemon lists these limits" and
/// the paragraph on `socket_mode`, in order.
fn documented_limit_names() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("PROTOCOL.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc.find("The daemon lists these limits").expect("the limits paragraph");
    let list = &doc[start..];
    let list = &list[list.find("\n\n").unwrap()..list.find("`socket_mode` is the socket file's").unwrap()];
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The names PROTOCOL.md lists for spray detection (after "while spray
/// detection is on"), in order.
fn documented_signal_limit_names() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("PROTOCOL.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc.find("while\nspray detection is on").expect("the signals limits paragraph");
    let list = &doc[start..];
    let list = &list[list.find("\n\n").unwrap()..list.find("Then, always, the limits of the operator's view").unwrap()];
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The names PROTOCOL.md lists for the operator's view (`[activity]`, always
/// on), in order: the backquoted names of the paragraph after the one that
/// introduces them.
fn documented_activity_limit_names() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("PROTOCOL.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc.find("Then, always, the limits of the operator's view").expect("the activity limits paragraph");
    let list = &doc[start..];
    let list = &list[list.find("\n\n").unwrap()..];
    let list = &list[..list[2..].find("\n\n").unwrap() + 2];
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The names PROTOCOL.md lists for the decision log (after "while the
/// decision log is on"), in order.
fn documented_decision_log_limit_names() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("PROTOCOL.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let start = doc.find("while the decision log is on").expect("the decision log limits paragraph");
    let list = &doc[start..];
    let list = &list[list.find("\n\n").unwrap()..list.find("Then come the per-route limits").unwrap()];
    list.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

async fn limits(daemon: &TestDaemon) -> Vec<(String, u64)> {
    let status = daemon.client().status().await.unwrap();
    status.limits.into_iter().map(|l| (l.name, l.value)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_the_documented_limits_then_one_per_route_keeping_known_devices() {
    let documented = documented_limit_names();
    assert_eq!(documented.len(), 29, "{documented:?}");

    let signals = documented_signal_limit_names();
    assert_eq!(signals.len(), 25, "{signals:?}");

    let activity = documented_activity_limit_names();
    assert_eq!(activity.len(), 8, "{activity:?}");
    assert!(activity.iter().all(|name| name.starts_with("activity.")), "{activity:?}");

    // Spray detection off: the daemon's own, then the operator's view's.
    let daemon = TestDaemon::start_with(Some("[signals]\nenabled = false\n"), true);
    let all = limits(&daemon).await;
    let names: Vec<String> = all.iter().map(|(name, _)| name.clone()).collect();
    let mut expected = documented.clone();
    expected.extend(activity.iter().cloned());
    expected.push("login.known_devices_per_account_max".into());
    assert_eq!(names, expected);
    // The most any `Activity` list or `Samples` reply carries, as documented.
    assert!(all.contains(&("activity.listed_max".to_string(), 10_000)), "{all:?}");
    // A new state file's key derivation, which remembers no digests.
    assert!(all.contains(&("key_derivation".to_string(), 2)), "{all:?}");
    assert!(all.contains(&("recent_digests_slots".to_string(), 0)), "{all:?}");

    // On (the default): its limits after the daemon's own.
    let daemon = TestDaemon::start();
    let names: Vec<String> = limits(&daemon).await.into_iter().map(|(name, _)| name).collect();
    let mut expected = documented.clone();
    expected.extend(signals.iter().cloned());
    expected.extend(activity.iter().cloned());
    expected.push("login.known_devices_per_account_max".into());
    assert_eq!(names, expected);

    // A second route keeping known devices adds its own, in route order.
    let config = "[routes.reauth]\nknown_device_ttl_secs = 3600\nknown_devices_per_account_max = 4\n";
    let daemon = TestDaemon::start_with(Some(config), true);
    let all = limits(&daemon).await;
    let per_route: Vec<(&str, u64)> =
        all[documented.len() + signals.len() + activity.len()..].iter().map(|(n, v)| (n.as_str(), *v)).collect();
    assert_eq!(per_route, [("login.known_devices_per_account_max", 16), ("reauth.known_devices_per_account_max", 4)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_mode_is_sent_in_decimal_and_uptime_follows_the_manual_clock() {
    let daemon = TestDaemon::start();
    let client = daemon.client();
    let socket_mode = limits(&daemon).await.into_iter().find(|(name, _)| name == "socket_mode").unwrap().1;
    assert_eq!(socket_mode, 432, "0660 in decimal");

    let status = client.status().await.unwrap();
    assert_eq!((status.uptime_ms, status.now_ms), (0, 1_893_456_000_000));
    client.advance_clock(Duration::from_millis(90_061_500)).await.unwrap();
    let status = client.status().await.unwrap();
    assert_eq!((status.uptime_ms, status.now_ms), (90_061_500, 1_893_456_000_000 + 90_061_500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_log_lists_its_bounds_after_the_operator_s_view_while_on() {
    let documented = documented_limit_names();
    let signals = documented_signal_limit_names();
    let activity = documented_activity_limit_names();
    let decision_log = documented_decision_log_limit_names();
    assert_eq!(decision_log.len(), 6, "{decision_log:?}");
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[decision_log]\npath = \"{}\"\nfile_bytes_max = 8192\nfiles_max = 3\nage_max_secs = 600\nqueue_max = 64\n",
        dir.path().join("decisions").display()
    );
    let daemon = TestDaemon::start_with(Some(&config), true);
    let all = limits(&daemon).await;
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected: Vec<&str> =
        documented.iter().chain(&signals).chain(&activity).chain(&decision_log).map(String::as_str).collect();
    expected.push("login.known_devices_per_account_max");
    assert_eq!(names, expected);
    let ours: Vec<(&str, u64)> =
        all.iter().filter(|(n, _)| n.starts_with("decision_log.")).map(|(n, v)| (n.as_str(), *v)).collect();
    assert_eq!(
        ours,
        [
            ("decision_log.file_bytes_max", 8192),
            ("decision_log.files_max", 3),
            ("decision_log.age_max_secs", 600),
            ("decision_log.queue_max", 64),
            ("decision_log.record_bytes_max", 262),
            ("decision_log.flush_interval_ms", 1000),
        ]
    );
}

/// `status` shows the limits in force: after a reload, what the reload
/// applied (the attempt timeout, spray detection's thresholds) with its new
/// value, and what needs a restart (the snapshot interval, the server's
/// limits) with the value still running, as the reload's warning says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_limits_a_reload_applied_and_keeps_those_it_did_not() {
    let before = "attempt_timeout_ms = 30000\nsnapshot_interval_ms = 1000\n\
                  [server]\nconnections_max = 500\n[signals]\nqueue_max = 1000\nnarrow_spray.threshold = 21\n";
    let daemon = TestDaemon::start_with(Some(before), true);
    let value = |all: &[(String, u64)], name: &str| all.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let all = limits(&daemon).await;
    assert_eq!(value(&all, "attempt_timeout_ms"), Some(30_000));
    assert_eq!(value(&all, "signals.narrow_spray.threshold"), Some(21));

    daemon.reload_with(
        "attempt_timeout_ms = 20000\nsnapshot_interval_ms = 5000\nkey_derivation = 1\n\
         [server]\nconnections_max = 100\n[signals]\nqueue_max = 2000\nnarrow_spray.threshold = 30\n",
    );
    let status = daemon.cli_json(&["status"]);
    assert_eq!(status["reload_failures"], 0, "{status}");
    let all = limits(&daemon).await;
    assert_eq!(value(&all, "attempt_timeout_ms"), Some(20_000), "applied by the reload");
    assert_eq!(value(&all, "signals.narrow_spray.threshold"), Some(30), "applied by the reload");
    assert_eq!(value(&all, "snapshot_interval_ms"), Some(1000), "needs a restart: the running value");
    assert_eq!(value(&all, "connections_max"), Some(500), "needs a restart: the running value");
    assert_eq!(value(&all, "key_derivation"), Some(2), "the state file's, kept by a reload");
    assert_eq!(value(&all, "signals.queue_max"), Some(1000), "the queue is made at start: the running value");
    assert!(daemon.log().contains("need a restart"), "{}", daemon.log());
}
