//! The decision log and `tollgate replay`, against real daemons and real
//! files: a scripted scenario is recorded by a daemon under one
//! configuration, and replaying its log through a stricter one refuses
//! exactly what a second daemon running the stricter one refuses when the
//! same script is driven at it directly. Also: no raw identifier in the
//! log, a crash's file replays, damage is named by file and offset, and
//! rotation and retention happen.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

const PLANTED_ACCOUNT: &str = "planted-account-7f3a9c@example.com";
const PLANTED_DEVICE: &str = "planted-device-Qx81Z";
/// The client's key for password digests and tags.
const CLIENT_KEY: [u8; 32] = [9; 32];

/// One attempt of the script: who, from where, with which password, and
/// the clock advance before it (ms).
struct Step {
    advance_ms: u64,
    peer: &'static str,
    account: String,
    device: Option<&'static str>,
    password: String,
    correct: bool,
}

/// The scenario, deterministic: people with typos, one of whom fails
/// three times before succeeding; an attacker failing repeatedly against
/// several accounts from one address; a distributed attack on one
/// account from thirty addresses; the planted account and device.
fn script() -> Vec<Step> {
    let mut steps = Vec::new();
    let mut step = |advance_ms, peer, account: &str, device, password: &str, correct| {
        steps.push(Step { advance_ms, peer, account: account.into(), device, password: password.into(), correct })
    };
    // alice: one typo, then in, on her laptop.
    step(0, "198.51.100.10", "alice@example.com", Some("alice-laptop"), "alice-typo", false);
    step(1_000, "198.51.100.10", "alice@example.com", Some("alice-laptop"), "alice-right", true);
    // carol: three wrong passwords, then the right one, then (16 minutes
    // later, past any failure window) the right one again.
    for (i, password) in ["carol-1", "carol-2", "carol-3"].into_iter().enumerate() {
        step(2_000 + i as u64, "198.51.100.20", "carol@example.com", None, password, false);
    }
    step(5_000, "198.51.100.20", "carol@example.com", None, "carol-right", true);
    // The planted account, on its planted device: fails once, then in.
    step(1_000, "198.51.100.30", PLANTED_ACCOUNT, Some(PLANTED_DEVICE), "planted-wrong", false);
    step(1_000, "198.51.100.30", PLANTED_ACCOUNT, Some(PLANTED_DEVICE), "planted-right", true);
    // The attacker: six guesses at each of six accounts, one address.
    for account in ["bob", "dave", "erin", "frank", "grace", "heidi"] {
        for guess in 0..6 {
            step(100, "203.0.113.66", &format!("{account}@example.com"), None, &format!("guess-{guess}"), false);
        }
    }
    // A distributed attack on one account: one guess from each of thirty addresses.
    const PEERS: [&str; 30] = [
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.4",
        "192.0.2.5",
        "192.0.2.6",
        "192.0.2.7",
        "192.0.2.8",
        "192.0.2.9",
        "192.0.2.10",
        "192.0.2.11",
        "192.0.2.12",
        "192.0.2.13",
        "192.0.2.14",
        "192.0.2.15",
        "192.0.2.16",
        "192.0.2.17",
        "192.0.2.18",
        "192.0.2.19",
        "192.0.2.20",
        "192.0.2.21",
        "192.0.2.22",
        "192.0.2.23",
        "192.0.2.24",
        "192.0.2.25",
        "192.0.2.26",
        "192.0.2.27",
        "192.0.2.28",
        "192.0.2.29",
        "192.0.2.30",
    ];
    for (i, peer) in PEERS.into_iter().enumerate() {
        step(500, peer, "victim@example.com", None, &format!("spray-{i}"), false);
    }
    // Sixteen minutes on: carol and alice come back and get in.
    step(16 * 60_000, "198.51.100.20", "carol@example.com", None, "carol-right", true);
    step(1_000, "198.51.100.10", "alice@example.com", Some("alice-laptop"), "alice-right", true);
    steps
}

/// Per rule: (deny, challenge, delay, would-refuse) and the distinct
/// accounts and prefixes among the denied and challenged.
#[derive(Debug, Default, PartialEq, Eq)]
struct Refusals {
    counts: [u64; 4],
    accounts: BTreeSet<String>,
    prefixes: BTreeSet<String>,
}

/// Drives the script at a daemon as an auth server would: check, and
/// report only if the check let the attempt proceed (allow or delay).
/// Returns what the checks' verdicts refused, per rule.
async fn drive(daemon: &TestDaemon) -> BTreeMap<String, Refusals> {
    let client = daemon.client();
    let mut refused: BTreeMap<String, Refusals> = BTreeMap::new();
    for step in script() {
        if step.advance_ms > 0 {
            client.advance_clock(std::time::Duration::from_millis(step.advance_ms)).await.unwrap();
        }
        let subject = Subject {
            peer: Some(ip(step.peer)),
            account: Some(&step.account),
            device: step.device,
            ..Subject::default()
        };
        let tag = tollgate::client::password_tag(&CLIENT_KEY, &step.password);
        let v = verdict(client.check_tagged("login", &subject, Some(tag)).await.answer);
        let slot = match v.decision {
            Decision::Deny => Some(0),
            Decision::Challenge => Some(1),
            Decision::Delay => Some(2),
            Decision::Allow if v.reason.is_monitored() => Some(3),
            Decision::Allow => None,
        };
        if let Some(slot) = slot {
            let entry = refused.entry(v.rule.to_string()).or_default();
            entry.counts[slot] += 1;
            if slot <= 1 {
                entry.accounts.insert(step.account.clone());
                entry.prefixes.insert(step.peer.to_string());
            }
        }
        if matches!(v.decision, Decision::Allow | Decision::Delay) {
            let outcome = if step.correct { Outcome::Success } else { Outcome::Failure };
            let digest = tollgate::client::password_digest(&CLIENT_KEY, &step.account, &step.password);
            let reported = client.report_tagged("login", &subject, outcome, Some(digest), Some(tag)).await.answer;
            verdict(reported);
        }
    }
    refused
}

fn log_config(dir: &Path, extra: &str) -> String {
    format!("{COUNTING_RULES_ONLY}\n[decision_log]\npath = \"{}\"\n{extra}", dir.display())
}

/// Stricter than the defaults: a source's failures on one account lock it
/// at 3 (not 5), an account's at 10 (not 50), and a source gets 10 checks
/// at once (not 300).
const STRICTER: &str = "
[routes.login.rules.source_failures]
threshold = 3

[routes.login.rules.account_failures]
threshold = 10

[routes.login.rules.source_rate]
limit = 20
burst = 10
";

fn replay(logs: &[&Path], config: &Path) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("replay").args(logs).arg("--config").arg(config).arg("--json");
    cmd.output().expect("run tollgate replay")
}

fn replay_json(logs: &[&Path], config: &Path) -> serde_json::Value {
    let out = replay(logs, config);
    assert!(out.status.success(), "replay failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The replay's per-rule refusals (rules that refused anything).
fn replayed(rules: &serde_json::Value) -> BTreeMap<String, Refusals> {
    let mut out = BTreeMap::new();
    for rule in rules.as_array().unwrap() {
        let n = |k: &str| rule[k].as_u64().unwrap();
        let counts = [n("deny"), n("challenge"), n("delay"), n("would_refuse")];
        if counts == [0; 4] {
            continue;
        }
        assert_eq!(rule["route"], "login");
        // Distinct counts only: the names are digests in the log.
        let accounts = (0..n("accounts")).map(|i| i.to_string()).collect();
        let prefixes = (0..n("prefixes")).map(|i| i.to_string()).collect();
        out.insert(rule["rule"].as_str().unwrap().to_string(), Refusals { counts, accounts, prefixes });
    }
    out
}

/// A direct run's refusals with names replaced by how many there are.
fn counted(direct: &BTreeMap<String, Refusals>) -> BTreeMap<String, Refusals> {
    direct
        .iter()
        .map(|(rule, r)| {
            let accounts = (0..r.accounts.len()).map(|i| i.to_string()).collect();
            let prefixes = (0..r.prefixes.len()).map(|i| i.to_string()).collect();
            (rule.clone(), Refusals { counts: r.counts, accounts, prefixes })
        })
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tglog"))
        .collect();
    files.sort();
    files
}

fn records_in(file: &Path) -> usize {
    tollgate::read_file_bytes(&std::fs::read(file).unwrap_or_default()).records.len()
}

/// Waits (up to 20 s: the machine may be loaded) for the writer thread,
/// which drains every 10 ms and flushes every second.
fn wait_for(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "the decision log's writer did not get there in 20 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn rule_row<'v>(rules: &'v serde_json::Value, name: &str) -> &'v serde_json::Value {
    rules.as_array().unwrap().iter().find(|r| r["rule"] == name).unwrap_or_else(|| panic!("no rule {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stricter_candidate_replayed_refuses_exactly_what_a_direct_run_refuses() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let original = log_config(&logs, "");
    let mut recorder = TestDaemon::start_with(Some(&original), true);
    let as_logged = drive(&recorder).await;
    assert!(recorder.terminate().success());

    let stricter = format!("{COUNTING_RULES_ONLY}\n{STRICTER}");
    let direct = TestDaemon::start_with(Some(&stricter), true);
    let strict_direct = drive(&direct).await;

    // The scenario is worth replaying: the stricter run refuses more, on
    // three rules, and the original refuses the attacker.
    assert_eq!(as_logged.keys().collect::<Vec<_>>(), ["source_failures"]);
    assert_eq!(as_logged["source_failures"].counts, [6, 0, 0, 0]);
    assert_eq!(strict_direct.keys().collect::<Vec<_>>(), ["account_failures", "source_failures", "source_rate"]);

    let candidate = write(scratch.path(), "stricter.toml", &stricter);
    let report = replay_json(&[&logs], &candidate);
    assert_eq!(replayed(&report["candidate"]), counted(&strict_direct), "{report:#}");
    // The log's own verdicts are the recorder's.
    assert_eq!(replayed(&report["logged"]), counted(&as_logged), "{report:#}");

    let steps = script().len() as u64;
    assert_eq!(report["checks"], steps);
    assert_eq!(report["records"].as_u64().unwrap(), steps + report["reports"].as_u64().unwrap());
    assert_eq!(report["reports_without_check"], 0);
    assert_eq!(report["not_replayed"], 0);
    let direct_refusals: u64 = strict_direct.values().map(|r| r.counts[0] + r.counts[1]).sum();
    let logged_refusals: u64 = as_logged.values().map(|r| r.counts[0] + r.counts[1]).sum();
    assert_eq!(report["newly_refused"].as_u64().unwrap(), direct_refusals - logged_refusals);
    assert_eq!(report["outcome_unknown"], 0);
    // Each newly refused attempt had a report in the log, now skipped.
    assert_eq!(report["reports_skipped"], report["newly_refused"]);
    // carol, refused at her fourth attempt, got in sixteen minutes later
    // from the same address: one person the stricter source rule bothers.
    let source_failures = rule_row(&report["candidate"], "source_failures");
    assert_eq!(source_failures["false_positive_accounts"], 1, "{report:#}");
    assert_eq!(rule_row(&report["logged"], "source_failures")["false_positive_accounts"], 0);

    // The original configuration replayed reproduces the log's verdicts.
    let same = write(scratch.path(), "original.toml", &original);
    let again = replay_json(&[&logs], &same);
    assert_eq!(replayed(&again["candidate"]), counted(&as_logged), "{again:#}");
    assert_eq!((again["newly_refused"].as_u64(), again["reports_skipped"].as_u64()), (Some(0), Some(0)));

    // The text output says the same, with its own line for the log's verdicts.
    let text = Command::new(BIN).arg("replay").arg(&logs).arg("--config").arg(&candidate).output().unwrap();
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("running config (the log's own verdicts):"), "{text}");
    assert!(text.contains("login.source_failures"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raw_account_or_device_name_reaches_the_log() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let mut daemon = TestDaemon::start_with(Some(&log_config(&logs, "")), true);
    drive(&daemon).await;
    assert!(daemon.terminate().success());
    let files = log_files(&logs);
    assert_eq!(files.len(), 1);
    let bytes = std::fs::read(&files[0]).unwrap();
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    // The planted names, their halves, and every script account's local part.
    assert!(contains(b"login"), "the route name is in clear: the search works");
    for needle in
        [PLANTED_ACCOUNT, PLANTED_DEVICE, "planted", "7f3a9c", "Qx81Z", "alice", "carol", "victim", "example.com"]
    {
        assert!(!contains(needle.as_bytes()), "{needle} is in the decision log");
        assert!(!daemon.log().contains(needle), "{needle} is in the daemon's log");
    }
    let contents = tollgate::read_file_bytes(&bytes);
    assert!(contents.problems.is_empty());
    let planted = contents.records.iter().filter(|r| r.address == Some(ip("198.51.100.30"))).count();
    assert_eq!(planted, 4, "two checks and two reports of the planted account");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_log_replays_and_damage_is_named_by_file_and_offset() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let config = log_config(&logs, "");
    let candidate = write(scratch.path(), "candidate.toml", &config);
    let mut daemon = TestDaemon::start_with(Some(&config), true);
    let client = daemon.client();
    // 40 checks, flushed (the writer flushes every second), then 40 more
    // and kill -9 at once: the first 40 are on disk whatever else is.
    for i in 0..40u32 {
        verdict(client.check("login", &who(v4(i), Some(&format!("user{i}")))).await);
    }
    wait_for(|| log_files(&logs).first().is_some_and(|f| records_in(f) >= 40));
    for i in 40..80u32 {
        verdict(client.check("login", &who(v4(i), Some(&format!("user{i}")))).await);
    }
    daemon.kill9();
    let files = log_files(&logs);
    assert_eq!(files.len(), 1);
    let written = tollgate::read_file_bytes(&std::fs::read(&files[0]).unwrap());
    assert!(written.records.len() >= 40 && written.problems.is_empty(), "{:?}", written.problems);

    // Restarted, the daemon begins a new file; both replay.
    daemon.spawn();
    for i in 0..10u32 {
        verdict(daemon.client().check("login", &who(v4(i), Some(&format!("user{i}")))).await);
    }
    assert!(daemon.terminate().success());
    let files = log_files(&logs);
    assert_eq!(files.len(), 2);
    let report = replay_json(&[&logs], &candidate);
    assert_eq!(report["checks"].as_u64().unwrap(), written.records.len() as u64 + 10);

    // A torn tail (a write cut short by a crash): reported as a warning,
    // every whole record before it replayed.
    let first = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &first[..first.len() - 7]).unwrap();
    let out = replay(&[&logs], &candidate);
    assert!(out.status.success(), "a torn tail is what a crash leaves: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checks"].as_u64().unwrap(), written.records.len() as u64 - 1 + 10);
    let torn = &report["files"][0]["problems"][0];
    assert_eq!(torn["torn_tail"], true);
    // Every record of that file is the same size: a check's, with an
    // account, an IPv4 address and the same rule.
    let records = written.records.len();
    assert_eq!((first.len() - 28) % records, 0);
    let record_bytes = (first.len() - 28) / records;
    assert_eq!(torn["offset"].as_u64().unwrap(), (first.len() - record_bytes) as u64);
    assert!(stderr.contains(&format!("warning: {} at offset {}", files[0].display(), torn["offset"])), "{stderr}");

    // One damaged byte in the middle: an error naming the file and the
    // offset, exit status 1, and the figures of everything else.
    let mut damaged = first[..first.len() - 7].to_vec();
    let middle = 28 + 20 * record_bytes;
    damaged[middle + 12] ^= 0xff;
    std::fs::write(&files[0], &damaged).unwrap();
    let out = replay(&[&logs], &candidate);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("error: {} at offset {middle}: damaged record", files[0].display())), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["checks"].as_u64().unwrap(), written.records.len() as u64 - 2 + 10);
    // A reader that stops early (`| head`) does not hide the damage: the
    // error line and the exit status stay.
    let mut child = Command::new(BIN)
        .arg("replay")
        .arg(&logs)
        .arg("--config")
        .arg(&candidate)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("error: {} at offset {middle}: damaged record", files[0].display())), "{stderr}");
    assert!(stderr.contains("damaged or unreadable part(s) of the log were skipped"), "{stderr}");

    // A file that is not a decision log.
    let foreign = write(scratch.path(), "notes.tglog", "these are not decisions, just some text");
    let out = replay(&[&foreign], &candidate);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at offset 0: not a tollgate decision log"), "{stderr}");
}

#[test]
fn files_rotate_at_file_bytes_max_and_past_files_max_the_oldest_go() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let mut daemon = TestDaemon::start_with(Some(&log_config(&logs, "file_bytes_max = 4096\nfiles_max = 3\n")), true);
    let rt = runtime();
    let client = daemon.client();
    // 300 checks of 62 bytes: about 66 to a file, so 5 files were begun.
    rt.block_on(async {
        for i in 0..300u32 {
            verdict(client.check("login", &who(v4(i), Some(&format!("user{i}")))).await);
        }
    });
    assert!(daemon.terminate().success());
    let files = log_files(&logs);
    assert_eq!(files.len(), 3, "{files:?}");
    let mut records = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let bytes = std::fs::read(file).unwrap();
        // Each closed file was filled to within a record of the limit.
        let full = i + 1 == files.len() || bytes.len() > 4096 - 62;
        assert!(bytes.len() <= 4096 && full, "{}: {} bytes", file.display(), bytes.len());
        let contents = tollgate::read_file_bytes(&bytes);
        assert!(contents.problems.is_empty());
        records.extend(contents.records);
    }
    // The newest records are kept, the last one last.
    assert_eq!(records.last().unwrap().address, Some(v4(299)));
    assert!(records.len() < 300 - 66, "{}", records.len());
}

#[test]
fn files_older_than_age_max_are_deleted_on_the_daemons_clock() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let config = log_config(&logs, "file_bytes_max = 4096\nfiles_max = 100\nage_max_secs = 60\n");
    let mut daemon = TestDaemon::start_with(Some(&config), true);
    let rt = runtime();
    let client = daemon.client();
    let start_ms = 1_893_456_000_000u64;
    let phase = |n: u32| {
        rt.block_on(async {
            for i in 0..100u32 {
                verdict(client.check("login", &who(v4(n * 1000 + i), Some(&format!("user{n}-{i}")))).await);
            }
        })
    };
    // Each phase's records are written before the clock moves on: a writer
    // lagging on a loaded machine would otherwise write the first phase's
    // last records into a file begun after the move.
    let written = |n: u64| {
        wait_for(|| {
            let activity = rt.block_on(client.activity(1)).unwrap();
            activity.decision_log.is_some_and(|l| l.records_written >= n)
        })
    };
    phase(0);
    written(100);
    wait_for(|| log_files(&logs).len() >= 2);
    let first_phase = log_files(&logs);
    assert!(first_phase.len() >= 2, "{first_phase:?}");
    daemon.advance("2m");
    phase(1);
    written(200);
    daemon.advance("2m");
    phase(2);
    assert!(daemon.terminate().success());
    // Every file begun at the start is gone: the files after them began
    // more than a minute before the last rotation.
    let started = |p: &PathBuf| -> u64 {
        let name = p.file_name().unwrap().to_str().unwrap();
        name["decisions-".len()..].split('-').next().unwrap().parse().unwrap()
    };
    let left = log_files(&logs);
    assert!(left.iter().all(|p| started(p) >= start_ms + 120_000), "{left:?}");
    assert!(left.iter().any(|p| started(p) == start_ms + 240_000), "{left:?}");
    for gone in &first_phase {
        assert!(!gone.exists(), "{} kept", gone.display());
    }
}

#[test]
fn a_reload_that_changes_the_decision_log_fails_and_keeps_the_running_one() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let daemon = TestDaemon::start_with(Some(&log_config(&logs, "")), true);
    daemon.reload_with(&log_config(&logs, "files_max = 2\n"));
    let status = daemon.cli_json(&["status"]);
    assert_eq!((status["reloads"].as_u64(), status["reload_failures"].as_u64()), (Some(0), Some(1)));
    assert!(status["last_reload_error"].as_str().unwrap().contains("[decision_log] differs"), "{status}");
    let files_max =
        status["limits"].as_array().unwrap().iter().find(|l| l["name"] == "decision_log.files_max").unwrap();
    assert_eq!(files_max["value"], 16);
    // The same section reloads.
    daemon.reload_with(&log_config(&logs, ""));
    assert_eq!(daemon.cli_json(&["status"])["reloads"], 1);
}

/// CRC-32 (IEEE), as the log's records carry it: a crafted record must
/// pass its checksum to reach the replay at all.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A record re-made from `body` with a valid length and checksum.
fn record_from(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0xD5];
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32(&out[1..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// `tollgate replay` trusts no value in a file: records whose checksums
/// hold but whose times are past year 9999 are reported as numbers (they
/// once ended the replay with a panic, exit 101), and route and rule names
/// holding terminal escape sequences are printed escaped, never raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_log_cannot_crash_the_replay_or_drive_the_terminal() {
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("decisions");
    let config = log_config(&logs, "");
    let candidate = write(scratch.path(), "candidate.toml", &config);
    let mut daemon = TestDaemon::start_with(Some(&config), true);
    verdict(daemon.client().check("login", &who(v4(1), Some("alice"))).await);
    wait_for(|| log_files(&logs).first().is_some_and(|f| records_in(f) >= 1));
    assert!(daemon.terminate().success());
    let file = std::fs::read(&log_files(&logs)[0]).unwrap();
    let first = 28; // the header's bytes
    assert_eq!(file[first], 0xD5, "a record marker after the header");
    let body_len = usize::from(u16::from_le_bytes([file[first + 1], file[first + 2]]));
    let body = &file[first + 3..first + 3 + body_len];
    let route_len = usize::from(body[13]);
    let rule_at = 14 + route_len;
    let rule_len = usize::from(body[rule_at]);
    let rest = &body[rule_at + 1 + rule_len..];
    let named = |time_us: u64, route: &str, rule: &str| {
        let mut b = time_us.to_le_bytes().to_vec();
        b.extend_from_slice(&body[8..10]); // op, then the decision...
        b[9] = 3; // ...made a deny, so its rule is listed
        b.extend_from_slice(&body[10..13]);
        b.push(route.len() as u8);
        b.extend_from_slice(route.as_bytes());
        b.push(rule.len() as u8);
        b.extend_from_slice(rule.as_bytes());
        b.extend_from_slice(rest);
        record_from(&b)
    };
    let mut crafted = file[..first].to_vec();
    let now = u64::from_le_bytes(body[..8].try_into().unwrap());
    crafted.extend(named(now, "login", "source_failures"));
    crafted.extend(named(now, "lo\u{1b}[2Jgin", "rule\u{1b}]0;owned\u{7}"));
    crafted.extend(named(1 << 63, "login", "source_failures"));
    crafted.extend(named(u64::MAX, "login", "source_failures"));
    let path = scratch.path().join("crafted.tglog");
    std::fs::write(&path, &crafted).unwrap();
    assert_eq!(records_in(&path), 4, "every crafted record passes its checksum");

    let out = Command::new(BIN).arg("replay").arg(&path).arg("--config").arg(&candidate).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("past year 9999"), "{stdout}");
    assert!(
        !out.stdout.contains(&0x1b) && !out.stdout.contains(&0x07),
        "a control byte reached the terminal: {stdout}"
    );
    assert!(stdout.contains("lo\\u{1b}[2Jgin.rule\\u{1b}]0;owned\\u{7}"), "{stdout}");
    let json = replay_json(&[&path], &candidate);
    assert_eq!(json["records"], 4, "{json:#}");
}
