//! `tollgate metrics`: the daemon's `status` in the Prometheus text format
//! (version 0.0.4), for node_exporter's textfile collector or any scraper
//! that runs a command.
//!
//! A CLI command rather than an HTTP listener: the systemd unit gives the
//! daemon no network at all (`PrivateNetwork=yes`), and the socket's
//! permissions already say who may read `status`. Everything here comes from
//! `Status`, which holds names of routes and rules, counts and limits only:
//! no account, device, address or digest can reach a label. The shared
//! store's families come from `SharedStatus` (version 2's status extras),
//! which holds the store's URL (never printed here: it is not a label),
//! counts, and `route/rule` names.

use std::fmt::{Display, Write};

use crate::protocol::{
    Activity, DecisionCounts, RouteStatus, RuleStatus, SharedStatus, SignalFamilyStatus, SignalsStatus, Status,
};

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

    /// `value` is an integer count or an `f64` (seconds): Rust prints an
    /// `f64` in plain decimal, never with an exponent, which the format
    /// accepts as it is.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
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

/// Microseconds as the seconds Prometheus expects.
fn seconds_from_us(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The shared store's families (only a daemon with `[shared]` has them).
fn shared(out: &mut String, status: &Status, s: &SharedStatus) {
    let up = u64::from(s.state == "closed");
    let mut family =
        Family::new(out, "tollgate_shared_up", "gauge", "1 if the shared store answers global rules (breaker closed).");
    family.sample("tollgate_shared_up", &[], up);
    let mut family = Family::new(
        out,
        "tollgate_shared_degraded",
        "gauge",
        "1 if global rules are counted on this host at ceil(limit / hosts); alert on 1.",
    );
    family.sample("tollgate_shared_degraded", &[], u64::from(s.degraded));
    let mut family = Family::new(out, "tollgate_shared_state", "gauge", "The breaker's state (one-hot).");
    for state in ["closed", "open", "recovering", "refused"] {
        family.sample("tollgate_shared_state", &[("state", state)], u64::from(s.state == state));
    }
    let mut family = Family::new(
        out,
        "tollgate_shared_degraded_seconds_total",
        "counter",
        "Seconds spent degraded since the daemon started, the current stretch included.",
    );
    family.sample("tollgate_shared_degraded_seconds_total", &[], s.degraded_total_ms as f64 / 1e3);

    // Every call that was queued ended in exactly one of these (a call the
    // breaker, its cluster node's breaker or a full queue kept from the
    // store is `not_asked`).
    let ok = s.calls.saturating_sub(s.timeouts).saturating_sub(s.errors).saturating_sub(s.bad_values);
    let mut family = Family::new(
        out,
        "tollgate_shared_calls_total",
        "counter",
        "Store calls by result; not_asked: answered on this host without asking (breaker not closed, the cluster node's breaker open, queue full).",
    );
    for (result, count) in [
        ("ok", ok),
        ("timeout", s.timeouts),
        ("error", s.errors),
        ("bad_value", s.bad_values),
        ("not_asked", s.not_asked),
    ] {
        family.sample("tollgate_shared_calls_total", &[("result", result)], count);
    }

    let mut family = Family::new(
        out,
        "tollgate_shared_hosts",
        "gauge",
        "Hosts: in_force divides degraded limits; live sent a heartbeat within host_ttl_ms.",
    );
    family.sample("tollgate_shared_hosts", &[("kind", "in_force")], s.hosts_in_force);
    family.sample("tollgate_shared_hosts", &[("kind", "live")], s.hosts_live);

    let mut family =
        Family::new(out, "tollgate_shared_rtt_mean_seconds", "gauge", "Mean round trip of a batch to the store.");
    family.sample("tollgate_shared_rtt_mean_seconds", &[], seconds_from_us(s.rtt_mean_us));
    let mut family = Family::new(
        out,
        "tollgate_shared_rtt_max_seconds",
        "gauge",
        "Longest round trip of a batch to the store since the start.",
    );
    family.sample("tollgate_shared_rtt_max_seconds", &[], seconds_from_us(s.rtt_max_us));

    // (name, type, help, value) of every shared family with one sample.
    let single = [
        ("tollgate_shared_transitions_total", "counter", "Changes of the breaker's state.", s.transitions),
        (
            "tollgate_shared_degraded_answers_total",
            "counter",
            "Answers of global rules given on this host's degraded share.",
            s.degraded_answers,
        ),
        (
            "tollgate_shared_known_lockouts",
            "gauge",
            "Lockouts of global rules this host refuses from memory.",
            s.known_lockouts,
        ),
        (
            "tollgate_shared_known_lockout_refusals_total",
            "counter",
            "Checks refused from memory by a known lockout, without a store round trip.",
            s.known_lockout_refusals,
        ),
        (
            "tollgate_shared_written_back_total",
            "counter",
            "Lockouts taken while degraded and written to the store on recovery.",
            s.written_back,
        ),
        (
            "tollgate_shared_late_replies_total",
            "counter",
            "Store replies that came after their caller had been answered on this host.",
            s.late_replies,
        ),
        (
            "tollgate_shared_releases_sent_total",
            "counter",
            "Places in the store given back (late admitted checks, checks refused on this host).",
            s.releases_sent,
        ),
        (
            "tollgate_shared_noscript_reloads_total",
            "counter",
            "Script reloads after NOSCRIPT (a restarted or flushed store).",
            s.noscript_reloads,
        ),
        ("tollgate_shared_batches_total", "counter", "Script calls (batches) sent to the store.", s.batches),
        ("tollgate_shared_batched_ops_total", "counter", "Operations sent in those batches.", s.batched_ops),
    ];
    for (name, kind, help, value) in single {
        Family::new(out, name, kind, help).sample(name, &[], value);
    }

    let mut family = Family::new(
        out,
        "tollgate_rule_scope",
        "gauge",
        "Where a rule counts: global (the shared store) or host (always 1).",
    );
    for route in &status.routes {
        for rule in &route.rules {
            let global = s.global_rules.contains(&format!("{}/{}", route.name, rule.name));
            let scope = if global { "global" } else { "host" };
            family.sample("tollgate_rule_scope", &[("route", &route.name), ("rule", &rule.name), ("scope", scope)], 1);
        }
    }
}

/// The whole exposition for one `status` reply, with the shared store's
/// families when the daemon has one.
/// Spray detection's families (only a daemon with `[signals]` on has them).
/// Labels are family and detector names; flagged subjects never appear.
fn signals(out: &mut String, s: &SignalsStatus) {
    let single = [
        ("tollgate_signal_events_total", "counter", "Reports counted by spray detection.", s.events_total),
        (
            "tollgate_signal_events_dropped_total",
            "counter",
            "Reports spray detection never saw (its queue was full); alert on any.",
            s.events_dropped,
        ),
        ("tollgate_signal_sketch_bytes", "gauge", "Heap of the distinct-count sketches.", s.sketch_bytes),
        ("tollgate_signal_sketch_bytes_max", "gauge", "The sketches' heap budget.", s.sketch_bytes_max),
        ("tollgate_signal_flags", "gauge", "Flags raised and not yet expired.", u64::from(s.flags)),
        ("tollgate_signal_flags_max", "gauge", "The flag table's cap.", u64::from(s.flags_max)),
        ("tollgate_signal_flags_dropped_total", "counter", "Flags dropped at the cap.", s.flags_dropped),
    ];
    for (name, kind, help, value) in single {
        Family::new(out, name, kind, help).sample(name, &[], value);
    }
    type Of = fn(&SignalFamilyStatus) -> u64;
    let per_family: [(&str, &str, &str, Of); 4] = [
        ("tollgate_signal_entries", "gauge", "Subjects tracked, by table.", |f| f.entries),
        ("tollgate_signal_entries_max", "gauge", "A signal table's cap.", |f| f.entries_max),
        ("tollgate_signal_heap_bytes", "gauge", "Sketch heap, by table.", |f| f.heap_bytes),
        ("tollgate_signal_evictions_total", "counter", "Subjects evicted at the cap, by table.", |f| f.evicted),
    ];
    for (name, kind, help, value) in per_family {
        let mut family = Family::new(out, name, kind, help);
        for f in &s.families {
            family.sample(name, &[("family", &f.name)], value(f));
        }
    }
    let mut family = Family::new(out, "tollgate_signal_flags_active", "gauge", "Subjects flagged now, by detector.");
    for d in &s.detectors {
        family.sample("tollgate_signal_flags_active", &[("detector", &d.name), ("mode", &d.mode)], d.active);
    }
    let mut family = Family::new(out, "tollgate_signal_flags_raised_total", "counter", "Flags raised, by detector.");
    for d in &s.detectors {
        family.sample(
            "tollgate_signal_flags_raised_total",
            &[("detector", &d.name), ("mode", &d.mode)],
            d.raised_total,
        );
    }
}

/// The operator's view (version 4's `Activity`): verdicts per route,
/// request latency, the per-account distributions and the activity
/// queue. Route names only as labels; accounts only as counts.
fn activity(out: &mut String, a: &Activity) {
    let decisions =
        |c: &DecisionCounts| [("allow", c.allow), ("delay", c.delay), ("challenge", c.challenge), ("deny", c.deny)];
    let name = "tollgate_route_checks_total";
    let mut family = Family::new(out, name, "counter", "Checks answered, by route and decision.");
    for r in &a.routes {
        for (decision, n) in decisions(&r.checks) {
            family.sample(name, &[("route", &r.name), ("decision", decision)], n);
        }
    }
    let name = "tollgate_route_would_refuse_total";
    let mut family =
        Family::new(out, name, "counter", "Checks allowed that a rule in monitor mode would have refused, by route.");
    for r in &a.routes {
        family.sample(name, &[("route", &r.name)], r.checks.would_refuse);
    }
    let name = "tollgate_route_reports_total";
    let mut family = Family::new(out, name, "counter", "Reports, by route and outcome.");
    for r in &a.routes {
        family.sample(name, &[("route", &r.name), ("outcome", "failure")], r.failures);
        family.sample(name, &[("route", &r.name), ("outcome", "success")], r.successes);
    }
    let l = &a.latency;
    let name = "tollgate_request_latency_seconds";
    // Gauges, not a summary: the quantiles are of everything since start
    // (no sum is kept), and every family here is a gauge or a counter.
    let mut family = Family::new(
        out,
        name,
        "gauge",
        "Check and report latency inside the daemon since start, from a sample of batches (bucket upper bounds).",
    );
    for (q, ns) in [("0.5", l.p50_ns), ("0.9", l.p90_ns), ("0.99", l.p99_ns), ("0.999", l.p999_ns)] {
        family.sample(name, &[("quantile", q)], ns as f64 / 1e9);
    }
    let name = "tollgate_request_latency_samples_total";
    Family::new(out, name, "counter", "Requests whose latency was measured.").sample(name, &[], l.samples);
    let name = "tollgate_request_latency_max_seconds";
    Family::new(out, name, "gauge", "The longest request latency measured since start.").sample(
        name,
        &[],
        l.max_ns as f64 / 1e9,
    );
    for (metric, of, help) in [
        (
            "tollgate_account_attempts_per_day",
            "attempts",
            "Checks per account in a day, quantiles over a sample of accounts.",
        ),
        (
            "tollgate_account_failures_per_day",
            "failures",
            "Failed reports per account in a day, quantiles over a sample of accounts.",
        ),
    ] {
        let mut family = Family::new(out, metric, "gauge", help);
        for d in a.distributions.iter().filter(|d| d.name == of) {
            for (q, v) in [("0.5", d.p50), ("0.9", d.p90), ("0.99", d.p99), ("0.999", d.p999), ("1", d.max)] {
                family.sample(metric, &[("day", &d.day), ("quantile", q)], v);
            }
        }
    }
    let name = "tollgate_accounts_per_day";
    let mut family =
        Family::new(out, name, "gauge", "Accounts with an attempt (or a failure) in a day, estimated from the sample.");
    for d in &a.distributions {
        family.sample(name, &[("day", &d.day), ("kind", &d.name)], d.accounts);
    }
    let single = [
        ("tollgate_activity_events_total", "Events handed to the activity thread.", a.events),
        ("tollgate_activity_events_dropped_total", "Activity events dropped: its queue was full.", a.events_dropped),
    ];
    for (name, help, value) in single {
        Family::new(out, name, "counter", help).sample(name, &[], value);
    }
    if let Some(log) = &a.decision_log {
        let single = [
            ("tollgate_decision_log_records_total", "Decisions written to the decision log.", log.records_written),
            (
                "tollgate_decision_log_records_dropped_total",
                "Decisions not logged: the log's queue was full.",
                log.records_dropped,
            ),
            ("tollgate_decision_log_write_errors_total", "Decision log writes that failed.", log.write_errors),
        ];
        for (name, help, value) in single {
            Family::new(out, name, "counter", help).sample(name, &[], value);
        }
    }
}

pub fn prometheus(
    status: &Status,
    shared_status: Option<&SharedStatus>,
    signals_status: Option<&SignalsStatus>,
    activity_view: Option<&Activity>,
) -> String {
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
    // `[[source.exemptions]]` ride among the named values (PROTOCOL.md);
    // they are counts, not bounds, so they get their own family.
    for limit in status.limits.iter().filter(|l| crate::exemptions::parse_status_name(&l.name).is_none()) {
        family.sample("tollgate_limit", &[("name", &limit.name)], limit.value);
    }
    let help = "Checks whose source an exemption let skip the per-source rules, by exemption.";
    let mut family = Family::new(&mut out, "tollgate_source_exempted_checks_total", "counter", help);
    for (prefix, reason, checks) in crate::format::exemptions(&status.limits) {
        family.sample("tollgate_source_exempted_checks_total", &[("prefix", prefix), ("reason", reason)], checks);
    }
    if let Some(s) = shared_status {
        shared(&mut out, status, s);
    }
    if let Some(s) = signals_status {
        signals(&mut out, s);
    }
    if let Some(a) = activity_view {
        activity(&mut out, a);
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

    fn rule(name: &str, kind: &str) -> RuleStatus {
        RuleStatus {
            name: name.into(),
            kind: kind.into(),
            key: vec!["account".into()],
            limit: 5,
            burst: 0,
            period_ms: 900_000,
            cleared_by_success: true,
            entries: 0,
            entries_max: 10,
            refused_full: 0,
            monitor: false,
            responses: vec!["deny".into()],
            devices: "all".into(),
            refused: 0,
            would_refuse: 0,
            class_limits: Vec::new(),
        }
    }

    fn status() -> Status {
        Status {
            version: "0.0.0".into(),
            uptime_ms: 0,
            now_ms: 0,
            manual_clock: false,
            connections: 0,
            verdicts: Default::default(),
            routes: vec![RouteStatus {
                name: "login".into(),
                fail_policy: "open".into(),
                rules: vec![rule("source_failures", "failures"), rule("source_rate", "rate")],
                known_devices: 0,
                known_devices_max: 0,
                recent_passwords: 0,
            }],
            limits: Vec::new(),
            persistence: crate::protocol::PersistenceStatus {
                state_path: "/x".into(),
                snapshot_interval_ms: 0,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every sample line of `text` as (series, value text).
    fn samples(text: &str) -> Vec<(&str, &str)> {
        text.lines().filter(|l| !l.starts_with('#')).map(|l| l.rsplit_once(' ').expect("series value")).collect()
    }

    #[test]
    fn no_shared_family_without_a_store() {
        let text = prometheus(&status(), None, None, None);
        assert!(!text.contains("tollgate_shared_") && !text.contains("tollgate_rule_scope"), "{text}");
    }

    #[test]
    fn the_shared_store_is_exposed_with_one_help_and_type_per_family() {
        let shared = SharedStatus {
            url: "redis+unix:///run/redis/secret-path.sock".into(),
            state: "open".into(),
            degraded: true,
            degraded_total_ms: 1500,
            calls: 10,
            timeouts: 2,
            errors: 1,
            bad_values: 3,
            not_asked: 7,
            rtt_mean_us: 250,
            rtt_max_us: 1_000_000,
            hosts_in_force: 3,
            hosts_live: 2,
            global_rules: vec!["login/source_failures".into()],
            ..SharedStatus::default()
        };
        let text = prometheus(&status(), Some(&shared), None, None);
        let samples = samples(&text);
        let value = |series: &str| samples.iter().find(|(s, _)| *s == series).unwrap_or_else(|| panic!("{series}")).1;
        assert_eq!(value("tollgate_shared_up"), "0");
        assert_eq!(value("tollgate_shared_degraded"), "1");
        for (state, v) in [("closed", "0"), ("open", "1"), ("recovering", "0"), ("refused", "0")] {
            assert_eq!(value(&format!("tollgate_shared_state{{state=\"{state}\"}}")), v, "{state}");
        }
        assert_eq!(value("tollgate_shared_calls_total{result=\"ok\"}"), "4", "10 - 2 - 1 - 3");
        assert_eq!(value("tollgate_shared_calls_total{result=\"not_asked\"}"), "7");
        assert_eq!(value("tollgate_shared_degraded_seconds_total"), "1.5");
        assert_eq!(value("tollgate_shared_rtt_mean_seconds"), "0.00025");
        assert_eq!(value("tollgate_shared_rtt_max_seconds"), "1");
        assert_eq!(value("tollgate_shared_hosts{kind=\"in_force\"}"), "3");
        assert_eq!(value("tollgate_shared_hosts{kind=\"live\"}"), "2");
        assert_eq!(value("tollgate_rule_scope{route=\"login\",rule=\"source_failures\",scope=\"global\"}"), "1");
        assert_eq!(value("tollgate_rule_scope{route=\"login\",rule=\"source_rate\",scope=\"host\"}"), "1");
        assert!(!text.contains("secret-path"), "the store's URL is no label");
        // The format: one HELP and one TYPE per family, before its samples,
        // and no series twice.
        let mut families = std::collections::HashSet::new();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            assert!(families.insert(line.split(' ').nth(2).unwrap()), "family twice: {line}");
        }
        assert_eq!(text.matches("# HELP ").count(), families.len());
        let mut series = std::collections::HashSet::new();
        for (s, v) in &samples {
            assert!(series.insert(*s), "series twice: {s}");
            let family = s.split('{').next().unwrap();
            assert!(families.contains(family), "{family} has no TYPE");
            assert!(v.parse::<f64>().is_ok_and(f64::is_finite), "{s} {v}");
        }
    }
}
