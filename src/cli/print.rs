//! What the CLI prints for people: verdicts, `status` with its limits,
//! the shared store and spray detection, activity distributions and
//! monitor mode's samples.

use super::CommonArgs;
use crate::client::ClientError;
use crate::format::{at_time, bar, human_duration, json};
use crate::protocol::{Decision, Response, Verdict};
use crate::stdout::outln;

pub(super) fn print_verdict(
    common: &CommonArgs,
    (response, extras): (Response<'static>, crate::codec::DecodedExtras),
) -> Result<Decision, ClientError> {
    let verdict = match response {
        Response::Verdict(v) => v,
        Response::Error(e) => return Err(ClientError::Daemon(e)),
        other => return Err(ClientError::Protocol(format!("{other:?}"))),
    };
    if common.json {
        let mut value = serde_json::to_value(&verdict).expect("plain data serializes");
        value["degraded"] = extras.degraded.into();
        outln!("{value}");
    } else if extras.degraded {
        outln!("{}  DEGRADED (decided on this host's share: the shared store was unreachable)", describe(&verdict));
    } else {
        outln!("{}", describe(&verdict));
    }
    Ok(verdict.decision)
}

/// The named limits as a table: a heading per group (the daemon's own,
/// then each section's and each route's, by the name's prefix), then
/// `name value` pairs two to a line, each group's columns as wide as its
/// longest name and value.
fn print_limits(limits: &[crate::protocol::NamedLimit]) {
    const COLUMNS: usize = 2;
    let group = |name: &str| name.split_once('.').map_or("", |(group, _)| group).to_string();
    let cells: Vec<(String, String, String)> = limits
        .iter()
        .map(|l| {
            let short = l.name.split_once('.').map_or(l.name.as_str(), |(_, rest)| rest);
            (group(&l.name), short.to_string(), human_limit(&l.name, l.value))
        })
        .collect();
    let mut groups: Vec<&str> = Vec::new();
    for (g, _, _) in &cells {
        if !groups.contains(&g.as_str()) {
            groups.push(g);
        }
    }
    outln!("limits:");
    for g in groups {
        let row: Vec<&(String, String, String)> = cells.iter().filter(|c| c.0 == g).collect();
        let name_width = row.iter().map(|c| c.1.len()).max().unwrap_or(0);
        let value_width = row.iter().map(|c| c.2.len()).max().unwrap_or(0);
        outln!("  {}", if g.is_empty() { "daemon" } else { g });
        for line in row.chunks(COLUMNS) {
            let text: Vec<String> =
                line.iter().map(|(_, n, v)| format!("{n:<name_width$} {v:>value_width$}")).collect();
            outln!("    {}", text.join("   ").trim_end());
        }
    }
}

/// A named limit's value in its unit: durations as people read them, the
/// socket mode in octal.
fn human_limit(name: &str, value: u64) -> String {
    if name == "socket_mode" {
        format!("0{value:o}")
    } else if name.ends_with("_ms") || name.ends_with("_ms_max") {
        human_duration(value)
    } else {
        value.to_string()
    }
}

fn describe(v: &Verdict<'_>) -> String {
    let rule = if v.rule.is_empty() { "no rule".to_string() } else { format!("rule {}", v.rule) };
    match v.decision {
        Decision::Allow => {
            format!(
                "allow  ({rule}: {} of {} left, full again in {})",
                v.remaining,
                v.limit,
                human_duration(v.reset_ms)
            )
        }
        Decision::Delay => format!("delay {}  ({rule})", human_duration(v.delay_ms)),
        Decision::Challenge => format!("challenge  ({rule})"),
        Decision::Deny => {
            let reason = json(&v.reason);
            format!("deny  retry after {}  ({rule}: {})", human_duration(v.retry_after_ms), reason.trim_matches('"'))
        }
    }
}

pub(super) fn print_status(s: &crate::protocol::Status) {
    outln!(
        "tollgate {}  up {}{}",
        s.version,
        human_duration(s.uptime_ms),
        if s.manual_clock { "  (manual clock)" } else { "" }
    );
    outln!(
        "verdicts: allow {}  delay {}  challenge {}  deny {}  errors {}",
        s.verdicts.allow,
        s.verdicts.delay,
        s.verdicts.challenge,
        s.verdicts.deny,
        s.verdicts.errors
    );
    outln!("connections: {}  log lines suppressed: {}", s.connections, s.log_lines_suppressed);
    for route in &s.routes {
        let mut extras = Vec::new();
        if route.known_devices_max > 0 {
            extras.push(format!("known devices {}/{}", route.known_devices, route.known_devices_max));
        }
        if route.recent_passwords > 0 {
            extras.push(format!("remembers {} wrong passwords per source", route.recent_passwords));
        }
        let extras = if extras.is_empty() { String::new() } else { format!(", {}", extras.join(", ")) };
        outln!("route {}  (fail {}{extras})", route.name, route.fail_policy);
        for r in &route.rules {
            let limit = if r.kind == "rate" {
                let mut text = format!("{} per {}, burst {}", r.limit, human_duration(r.period_ms), r.burst);
                for c in &r.class_limits {
                    text +=
                        &format!("; {} {} per {}, burst {}", c.class, c.limit, human_duration(c.period_ms), c.burst);
                }
                text
            } else {
                format!(
                    "{} failures per {}{}",
                    r.limit,
                    human_duration(r.period_ms),
                    if r.cleared_by_success { ", cleared by success" } else { "" }
                )
            };
            let scope = if r.devices == "all" { String::new() } else { format!(" [{} devices]", r.devices) };
            let mode = if r.monitor {
                format!("MONITOR would refuse {}", r.would_refuse)
            } else {
                format!("{} refused {}", r.responses.join(">"), r.refused)
            };
            outln!(
                "  {:<22} {:<8} key ({}){scope}  {}  entries {}/{}  {mode}",
                r.name,
                r.kind,
                r.key.join(", "),
                limit,
                r.entries,
                r.entries_max
            );
        }
    }
    outln!(
        "source classes: {} prefixes  reloads {}  failed {}{}",
        s.class_prefixes,
        s.reloads,
        s.reload_failures,
        s.last_reload_error.as_ref().map(|e| format!("  LAST RELOAD ERROR: {e}")).unwrap_or_default()
    );
    let (exemptions, limits): (Vec<_>, Vec<_>) =
        s.limits.iter().cloned().partition(|l| crate::exemptions::parse_status_name(&l.name).is_some());
    print_limits(&limits);
    if !exemptions.is_empty() {
        outln!("source exemptions (per-source rules skipped; never the account ceiling):");
        for (prefix, reason, checks) in crate::format::exemptions(&exemptions) {
            outln!("  {prefix:<24} checks exempted {checks:>10}  {reason}");
        }
    }
    let p = &s.persistence;
    outln!(
        "state: {}  commits {}  write failures {}  unwritten {}  dropped {}{}",
        p.state_path,
        p.commits,
        p.write_failures,
        p.changes_unwritten,
        p.changes_dropped,
        p.last_error.as_ref().map(|e| format!("  LAST ERROR: {e}")).unwrap_or_default()
    );
}

/// Entries of each list `status` asks for with the activity (it prints
/// only the distributions; `top` prints the lists).
pub(super) const STATUS_ACTIVITY_LISTED: u32 = 10;

/// Attempts and failures per account per day, as quantiles and a
/// histogram with bars on a log scale (the counts span orders of magnitude).
pub fn print_distributions(a: &crate::protocol::Activity) {
    if let Some(log) = &a.decision_log {
        outln!(
            "decision log: {}  records {}  dropped {}  {} bytes in {} file(s)  write errors {}{}",
            log.path,
            log.records_written,
            log.records_dropped,
            log.bytes_written,
            log.files,
            log.write_errors,
            log.last_error.as_ref().map(|e| format!("  LAST ERROR: {e}")).unwrap_or_default()
        );
    }
    for d in &a.distributions {
        outln!(
            "{} per account, {}: {} accounts (~1 in {} sampled)  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            d.name,
            d.day,
            d.accounts,
            1u64 << d.sample_shift.min(63),
            d.p50,
            d.p90,
            d.p99,
            d.p999,
            d.max
        );
        for line in histogram_lines(&d.histogram, 40) {
            outln!("  {line}");
        }
    }
}

/// One line per bucket, `        3-4 ####     759`: the bar log-scaled as
/// `top` draws it, `width` characters for the largest count.
pub fn histogram_lines(buckets: &[crate::protocol::HistogramBucket], width: usize) -> Vec<String> {
    let top = buckets.iter().map(|b| b.accounts).max().unwrap_or(0);
    let mut lower = 1u32;
    buckets
        .iter()
        .map(|b| {
            let label = if lower >= b.upto { b.upto.to_string() } else { format!("{lower}-{}", b.upto) };
            lower = b.upto.saturating_add(1);
            format!("{label:>11} {:<width$} {}", bar(b.accounts, top, width), b.accounts)
        })
        .collect()
}

pub(super) fn print_samples(samples: &[crate::protocol::WouldBeRefusal], seen: u64, since_ms: u64) {
    outln!(
        "{seen} would-be refusal(s) since {}; {} in the sample{}",
        at_time(since_ms),
        samples.len(),
        if (samples.len() as u64) < seen { " (a uniform sample; newest first)" } else { " (newest first)" }
    );
    for s in samples {
        let device = if s.device.is_empty() {
            "no device".to_string()
        } else {
            format!("{} ({})", s.device, if s.known_device { "known" } else { "unknown" })
        };
        let class = if s.class.is_empty() { String::new() } else { format!(" [{}]", s.class) };
        let account = if s.account.is_empty() { "no account" } else { &s.account };
        outln!(
            "{}  {} {}/{}  {}  {}{class}  {account}  {device}",
            at_time(s.at_ms),
            s.op,
            s.route,
            s.rule,
            json(&s.reason).trim_matches('"'),
            s.prefix
        );
    }
}

pub(super) fn print_shared(s: &crate::protocol::SharedStatus) {
    let degraded = if s.degraded {
        format!("  DEGRADED for {} (total {})", human_duration(s.degraded_for_ms), human_duration(s.degraded_total_ms))
    } else {
        String::new()
    };
    outln!("shared store: {}  {}{degraded}  transitions {}", s.url, s.state, s.transitions);
    outln!(
        "  hosts {} ({}), {} live  calls {}  timeouts {}  errors {}  bad values {}  degraded answers {}",
        s.hosts_in_force,
        s.hosts_source,
        s.hosts_live,
        s.calls,
        s.timeouts,
        s.errors,
        s.bad_values,
        s.degraded_answers
    );
    outln!(
        "  rtt us: mean {}  max {}  clock offset us {}  global rules: {}{}",
        s.rtt_mean_us,
        s.rtt_max_us,
        s.clock_offset_us,
        s.global_rules.join(", "),
        s.last_error.as_ref().map(|e| format!("  LAST ERROR: {e}")).unwrap_or_default()
    );
}

pub(super) fn print_signals(s: &crate::protocol::SignalsStatus, now_ms: u64) {
    outln!(
        "spray detection: window {} in {} parts  events {} (dropped {})  sketches {} of {} bytes  flags {} of {} \
         (dropped {})",
        human_duration(s.window_ms),
        s.sub_windows,
        s.events_total,
        s.events_dropped,
        s.sketch_bytes,
        s.sketch_bytes_max,
        s.flags,
        s.flags_max,
        s.flags_dropped
    );
    for f in &s.families {
        outln!(
            "  {:<16} {:>8} of {:<8} entries  heap {} bytes  evicted {}",
            f.name,
            f.entries,
            f.entries_max,
            f.heap_bytes,
            f.evicted
        );
    }
    for d in &s.detectors {
        outln!(
            "  {:<20} {:<8} threshold {:<4} active {:<6} raised {}",
            d.name,
            d.mode,
            d.threshold,
            d.active,
            d.raised_total
        );
    }
    for f in &s.flagged {
        let state = if f.until_ms > now_ms {
            format!("for {}", human_duration(f.until_ms - now_ms))
        } else {
            "expired".to_string()
        };
        outln!(
            "  flagged {} by {}: {} >= {}, {} ago, {state}",
            f.subject,
            f.detector,
            f.estimate,
            f.threshold,
            human_duration(now_ms.saturating_sub(f.since_ms))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_in_their_units() {
        assert_eq!(human_limit("socket_mode", 432), "0660");
        assert_eq!(human_limit("attempt_timeout_ms", 30_000), "30s");
        assert_eq!(human_limit("connections_max", 1024), "1024");
    }
}
