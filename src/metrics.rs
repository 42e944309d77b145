//! `tollgate metrics`: the daemon's `status` in the Prometheus text format
//! (version 0.0.4), for node_exporter's textfile collector or any scraper
//! that runs a command.
//!
//! A CLI command rather than an HTTP listener: the systemd unit gives the
//! daemon no network at all (`PrivateNetwork=yes`), and the socket's
//! permissions already say who may read `status`. Everything here comes from
//! `Status`, which holds names of routes and rules, counts and limits only:
//! no account, device, address or digest can reach a label.

use std::fmt::Write;

use crate::protocol::{RouteStatus, RuleStatus, Status};

/// One metric family: its samples are written together, after one HELP and
/// one TYPE line, as the format requires.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, text)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape(text));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A per-rule family, one sample for every rule of every route.
fn per_rule(out: &mut String, status: &Status, name: &str, kind: &str, help: &str, value: fn(&RuleStatus) -> u64) {
    let mut family = Family::new(out, name, kind, help);
    for route in &status.routes {
        for rule in &route.rules {
            family.sample(name, &[("route", &route.name), ("rule", &rule.name), ("kind", &rule.kind)], value(rule));
        }
    }
}

/// A per-route family over the routes `applies` picks.
fn per_route(
    out: &mut String,
    status: &Status,
    name: &str,
    help: &str,
    applies: fn(&RouteStatus) -> bool,
    value: fn(&RouteStatus) -> u64,
) {
    let mut family = Family::new(out, name, "gauge", help);
    for route in status.routes.iter().filter(|r| applies(r)) {
        family.sample(name, &[("route", &route.name)], value(route));
    }
}

/// The whole exposition for one `status` reply.
pub fn prometheus(status: &Status) -> String {
    let mut out = String::new();
    let mut family = Family::new(&mut out, "tollgate_info", "gauge", "Version of the daemon (always 1).");
    family.sample("tollgate_info", &[("version", &status.version)], 1);
    let p = &status.persistence;
    // (name, type, help, value) of every family with a single sample.
    let single = [
        ("tollgate_uptime_seconds", "gauge", "Seconds since the daemon started.", status.uptime_ms / 1000),
        ("tollgate_connections", "gauge", "Client connections open now.", status.connections),
        ("tollgate_request_errors_total", "counter", "Requests answered with an error.", status.verdicts.errors),
        ("tollgate_state_commits_total", "counter", "State file transactions committed.", p.commits),
        ("tollgate_state_write_failures_total", "counter", "State file writes that failed.", p.write_failures),
        (
            "tollgate_state_changes_unwritten",
            "gauge",
            "Changes held in memory until the state file is rewritten.",
            p.changes_unwritten,
        ),
        (
            "tollgate_state_changes_dropped_total",
            "counter",
            "Changes beyond the retry buffer (memory still holds them).",
            p.changes_dropped,
        ),
        (
            "tollgate_state_healthy",
            "gauge",
            "1 if the last state file write succeeded; alert on 0.",
            u64::from(p.last_error.is_none()),
        ),
        ("tollgate_reloads_total", "counter", "Configuration reloads applied.", status.reloads),
        ("tollgate_reload_failures_total", "counter", "Reloads refused (bad file).", status.reload_failures),
        ("tollgate_class_prefixes", "gauge", "Prefixes in the source class file.", status.class_prefixes),
        (
            "tollgate_log_lines_suppressed_total",
            "counter",
            "Refusal and audit log lines dropped by the per-second cap.",
            status.log_lines_suppressed,
        ),
    ];
    for (name, kind, help, value) in single {
        Family::new(&mut out, name, kind, help).sample(name, &[], value);
    }

    let v = &status.verdicts;
    let mut family = Family::new(&mut out, "tollgate_verdicts_total", "counter", "Verdicts answered, by decision.");
    for (decision, count) in [("allow", v.allow), ("delay", v.delay), ("challenge", v.challenge), ("deny", v.deny)] {
        family.sample("tollgate_verdicts_total", &[("decision", decision)], count);
    }

    per_rule(&mut out, status, "tollgate_rule_refused_total", "counter", "Checks the rule refused (enforcing).", |r| {
        r.refused
    });
    per_rule(
        &mut out,
        status,
        "tollgate_rule_would_refuse_total",
        "counter",
        "Checks the rule would have refused (monitor mode).",
        |r| r.would_refuse,
    );
    per_rule(
        &mut out,
        status,
        "tollgate_rule_refused_full_total",
        "counter",
        "Failures not counted because the rule's table held nothing but lockouts.",
        |r| r.refused_full,
    );
    per_rule(&mut out, status, "tollgate_rule_entries", "gauge", "Live entries in the rule's table.", |r| r.entries);
    per_rule(&mut out, status, "tollgate_rule_entries_max", "gauge", "The rule's table cap (entries_max).", |r| {
        r.entries_max
    });
    per_rule(
        &mut out,
        status,
        "tollgate_rule_limit",
        "gauge",
        "Rate rules: requests per period; failure rules: the threshold.",
        |r| u64::from(r.limit),
    );
    per_rule(
        &mut out,
        status,
        "tollgate_rule_period_seconds",
        "gauge",
        "Rate rules: the period; failure rules: the window.",
        |r| r.period_ms / 1000,
    );
    per_rule(&mut out, status, "tollgate_rule_monitor", "gauge", "1 if the rule only counts (monitor mode).", |r| {
        u64::from(r.monitor)
    });

    per_route(
        &mut out,
        status,
        "tollgate_known_devices",
        "Known (account, device) pairs remembered.",
        |r| r.known_devices_max > 0,
        |r| r.known_devices,
    );
    per_route(
        &mut out,
        status,
        "tollgate_known_devices_max",
        "Cap of the known-device table.",
        |r| r.known_devices_max > 0,
        |r| r.known_devices_max,
    );

    let mut family = Family::new(&mut out, "tollgate_limit", "gauge", "The daemon's named bounds (unit in the name).");
    for limit in &status.limits {
        family.sample("tollgate_limit", &[("name", &limit.name)], limit.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("line\nbreak"), "line\\nbreak");
    }
}
