//! The shipped Prometheus alerting rules (`examples/prometheus/`): they
//! parse (`promtool check rules`), each fires on the series that should
//! raise it and not on a healthy daemon's (`promtool test rules`), and every
//! metric they name is one tollgate exports. `bash scripts/test.sh`
//! installs `promtool` (Debian package `prometheus`) when it is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).current_dir(rules_dir()).output().unwrap_or_else(|e| {
        panic!("promtool not found ({e}): install the Debian package `prometheus`, or run `bash scripts/test.sh`")
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_rules_parse_and_their_unit_tests_pass() {
    assert!(promtool(&["check", "rules", "tollgate.rules.yml"]).contains("SUCCESS"));
    assert!(promtool(&["test", "rules", "tollgate.rules.test.yml"]).contains("SUCCESS"));
}

#[test]
fn every_metric_the_rules_name_is_one_tollgate_exports() {
    let rules = std::fs::read_to_string(rules_dir().join("tollgate.rules.yml")).unwrap();
    let mut named: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("tollgate_"))
        .collect();
    named.sort_unstable();
    named.dedup();
    assert!(named.len() >= 10, "{named:?}");
    // A live daemon's metrics (with spray detection and the decision log
    // on), and the shared store's families from their source, since a store
    // is not running here.
    let log = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start_with(Some(&format!("[decision_log]\npath = \"{}\"\n", log.path().display())), true);
    let live = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs")).unwrap();
    for name in named {
        let exported = live.contains(&format!("# TYPE {name} "))
            || (name.starts_with("tollgate_shared_") && source.contains(&format!("\"{name}\"")));
        assert!(exported, "the rules name `{name}`, which tollgate does not export");
    }
}
