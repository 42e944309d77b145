//! The shipped Prometheus alerting rules (`examples/prometheus/`): they
//! parse (`promtool check rules`), each fires on the series that should
//! raise it and not on a healthy daemon's (`promtool test rules`), and every
//! metric they name is one tollgate exports. The Grafana dashboard
//! (`examples/grafana/`) is held to the exported names and labels too. `bash scripts/test.sh`
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

/// The metric names in `text`, each once.
fn metric_names(text: &str) -> Vec<&str> {
    let mut named: Vec<&str> =
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("tollgate_")).collect();
    named.sort_unstable();
    named.dedup();
    named
}

/// A live daemon's metrics (with spray detection and the decision log on,
/// after one check so the latency families exist), and the shared store's
/// families from their source, since a store is not running here.
fn exported() -> (String, String) {
    let log = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start_with(Some(&format!("[decision_log]\npath = \"{}\"\n", log.path().display())), true);
    daemon.cli(&["check", "--route", "login", "--ip", "192.0.2.1", "--account", "alice"]);
    let live = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.rs")).unwrap();
    (live, source)
}

fn is_exported(name: &str, (live, source): &(String, String)) -> bool {
    live.contains(&format!("# TYPE {name} "))
        || (name.starts_with("tollgate_shared_") && source.contains(&format!("\"{name}\"")))
}

#[test]
fn every_metric_the_rules_name_is_one_tollgate_exports() {
    let rules = std::fs::read_to_string(rules_dir().join("tollgate.rules.yml")).unwrap();
    let named = metric_names(&rules);
    assert!(named.len() >= 10, "{named:?}");
    let exported = exported();
    for name in named {
        assert!(is_exported(name, &exported), "the rules name `{name}`, which tollgate does not export");
    }
}

/// The Grafana dashboard is JSON Grafana reads (every panel placed, on the
/// dashboard's data source), every metric its queries name is exported,
/// and every label a query groups by is one the metric carries.
#[test]
fn the_grafana_dashboard_queries_what_tollgate_exports() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/grafana/tollgate.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let exported = exported();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    let mut names = 0;
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        assert!(panel["gridPos"]["w"].is_u64() && panel["gridPos"]["h"].is_u64(), "{title}: placed");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr");
            for name in metric_names(expr) {
                assert!(is_exported(name, &exported), "{title}: `{name}` is not exported");
                names += 1;
            }
            // `by (a, b)`: each label is on the metric's live lines.
            if let Some(rest) = expr.split_once("by (").map(|(_, r)| r) {
                let labels = rest.split(')').next().unwrap_or_default();
                for name in metric_names(expr).into_iter().filter(|n| !n.starts_with("tollgate_shared_")) {
                    for label in labels.split(',').map(str::trim).filter(|l| !l.is_empty()) {
                        let carried = exported
                            .0
                            .lines()
                            .any(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("{label}=\"")));
                        assert!(carried, "{title}: `{name}` has no `{label}` label");
                    }
                }
            }
        }
    }
    assert!(names >= 15, "{names} metric references");
}
