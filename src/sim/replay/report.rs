//! What a replay says: per rule, of the candidate and of the running
//! configuration, what it refused, whom, and how many of those were people
//! (an account that later succeeded from the same prefix); counted as the
//! records go by, then written as tables or as JSON. Apart from the
//! replaying, which pairs each logged report with its check.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::protocol::{Decision, Reason};

const DAY_US: f64 = 86_400e6;

/// What one rule did (or, in `logged`, what the running configuration's
/// verdicts said it did).
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct RuleReport {
    pub route: String,
    pub rule: String,
    pub deny: u64,
    pub challenge: u64,
    pub delay: u64,
    /// Monitor mode's would-be refusals.
    pub would_refuse: u64,
    /// Distinct accounts and source prefixes among the attempts the rule
    /// denied or challenged.
    pub accounts: u64,
    pub prefixes: u64,
    /// Distinct accounts the rule denied or challenged that later in the
    /// log succeeded from the same prefix: people, not attackers.
    pub false_positive_accounts: u64,
    /// The same per day of log time.
    pub false_positive_humans_per_day: f64,
}

#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct FileReport {
    pub path: String,
    pub records: u64,
    pub problems: Vec<ProblemReport>,
}

#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct ProblemReport {
    pub offset: u64,
    pub what: String,
    pub torn_tail: bool,
}

#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct ReplayReport {
    pub files: Vec<FileReport>,
    pub records: u64,
    pub checks: u64,
    pub reports: u64,
    pub first_ms: u64,
    pub last_ms: u64,
    /// Logged reports replayed: their check proceeded under the candidate.
    pub reports_replayed: u64,
    /// Logged reports not replayed: the candidate refused their check,
    /// so the password would never have been verified.
    pub reports_skipped: u64,
    /// Logged reports with no check before them in the log (it began
    /// after the check): replayed.
    pub reports_without_check: u64,
    /// Checks the running configuration refused that the candidate lets
    /// proceed: the log has no report for them, so their outcome is
    /// unknown and they count nothing on failure rules.
    pub outcome_unknown: u64,
    /// Checks the running configuration let proceed that the candidate
    /// refuses (deny or challenge).
    pub newly_refused: u64,
    /// Checks awaiting their report forgotten to keep replay's memory
    /// bounded (more than half a million within one attempt timeout).
    pub checks_forgotten: u64,
    /// Records of a route the candidate does not have, or that it
    /// refuses as a request error (a required field missing): skipped.
    pub not_replayed: u64,
    /// Per rule of the candidate, in its routes' and rules' order.
    pub candidate: Vec<RuleReport>,
    /// Per rule named by the log's own verdicts (the running configuration).
    pub logged: Vec<RuleReport>,
}

#[derive(Default)]
struct RuleTally {
    route: String,
    rule: String,
    counts: [u64; 4],
    accounts: HashSet<[u8; 16]>,
    prefixes: HashSet<String>,
    false_positives: HashSet<[u8; 16]>,
}

/// Verdicts counted per rule, and who each rule refused, for the
/// false-positive budget.
#[derive(Default)]
pub(super) struct Tally {
    rules: Vec<RuleTally>,
    index: HashMap<(String, String), usize>,
    /// (account, prefix) → the rules that denied or challenged it.
    refused: HashMap<([u8; 16], String), Vec<u32>>,
}

impl Tally {
    pub(super) fn rule(&mut self, route: &str, rule: &str) -> usize {
        if let Some(&i) = self.index.get(&(route.to_string(), rule.to_string())) {
            return i;
        }
        self.rules.push(RuleTally { route: route.into(), rule: rule.into(), ..RuleTally::default() });
        self.index.insert((route.into(), rule.into()), self.rules.len() - 1);
        self.rules.len() - 1
    }

    pub(super) fn count(
        &mut self,
        route: &str,
        rule: &str,
        decision: Decision,
        reason: Reason,
        account: Option<[u8; 16]>,
        prefix: Option<&str>,
    ) {
        let slot = match decision {
            Decision::Deny => 0,
            Decision::Challenge => 1,
            Decision::Delay => 2,
            Decision::Allow if reason.is_monitored() => 3,
            Decision::Allow => return,
        };
        let i = self.rule(route, rule);
        let tally = &mut self.rules[i];
        tally.counts[slot] += 1;
        if slot <= 1 {
            if let Some(account) = account {
                tally.accounts.insert(account);
            }
            if let Some(prefix) = prefix {
                tally.prefixes.insert(prefix.to_string());
            }
            if let (Some(account), Some(prefix)) = (account, prefix) {
                let rules = self.refused.entry((account, prefix.to_string())).or_default();
                if !rules.contains(&(i as u32)) {
                    rules.push(i as u32);
                }
            }
        }
    }

    /// A logged success: every rule that refused this account from this
    /// prefix before refused a person.
    pub(super) fn success(&mut self, account: [u8; 16], prefix: &str) {
        if let Some(rules) = self.refused.get(&(account, prefix.to_string())) {
            for &i in rules {
                self.rules[i as usize].false_positives.insert(account);
            }
        }
    }

    pub(super) fn reports(&self, span_us: u64) -> Vec<RuleReport> {
        // A log shorter than a second would make any rate meaningless.
        let days = span_us.max(1_000_000) as f64 / DAY_US;
        self.rules
            .iter()
            .map(|t| RuleReport {
                route: t.route.clone(),
                rule: t.rule.clone(),
                deny: t.counts[0],
                challenge: t.counts[1],
                delay: t.counts[2],
                would_refuse: t.counts[3],
                accounts: t.accounts.len() as u64,
                prefixes: t.prefixes.len() as u64,
                false_positive_accounts: t.false_positives.len() as u64,
                false_positive_humans_per_day: (t.false_positives.len() as f64 / days * 10.0).round() / 10.0,
            })
            .collect()
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const RFC3339_MS_MAX: u64 = 253_402_300_799_999;

/// A log's time as a date; a time past year 9999 (a crafted or damaged
/// record whose checksum still holds) as the number it is, never a panic.
fn rfc3339(ms: u64) -> String {
    if ms > RFC3339_MS_MAX {
        return format!("{ms} ms after 1970 (past year 9999)");
    }
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

/// The text output: what was read, then one table per configuration.
pub fn text(r: &ReplayReport, candidate: &Path) -> String {
    let mut out = String::new();
    let span = std::time::Duration::from_secs(r.last_ms.saturating_sub(r.first_ms) / 1000);
    let _ = writeln!(
        out,
        "replayed {} file(s): {} records ({} checks, {} reports), {} to {} ({})",
        r.files.len(),
        r.records,
        r.checks,
        r.reports,
        rfc3339(r.first_ms),
        rfc3339(r.last_ms),
        humantime::format_duration(span)
    );
    let _ = writeln!(
        out,
        "reports: {} replayed, {} skipped (the candidate refused their check), {} without a check in the log",
        r.reports_replayed, r.reports_skipped, r.reports_without_check
    );
    let _ = writeln!(out, "checks the candidate newly refuses (deny or challenge): {}", r.newly_refused);
    let _ = writeln!(
        out,
        "checks the running config refused that the candidate lets proceed: {} (outcome unknown: the log has no report for them)",
        r.outcome_unknown
    );
    if r.not_replayed > 0 {
        let _ =
            writeln!(out, "records the candidate cannot replay (unknown route or missing field): {}", r.not_replayed);
    }
    let table = |out: &mut String, title: &str, rules: &[RuleReport]| {
        let _ = writeln!(out, "\n{title}");
        let _ = writeln!(
            out,
            "  {:<32} {:>7} {:>9} {:>6} {:>12} {:>8} {:>8} {:>8} {:>9}",
            "rule", "deny", "challenge", "delay", "would-refuse", "accounts", "prefixes", "fp accts", "fp/day"
        );
        let quiet = |r: &&RuleReport| r.deny + r.challenge + r.delay + r.would_refuse == 0;
        for rule in rules.iter().filter(|r| !quiet(r)) {
            let _ = writeln!(
                out,
                "  {:<32} {:>7} {:>9} {:>6} {:>12} {:>8} {:>8} {:>8} {:>9.1}",
                format!("{}.{}", rule.route, rule.rule),
                rule.deny,
                rule.challenge,
                rule.delay,
                rule.would_refuse,
                rule.accounts,
                rule.prefixes,
                rule.false_positive_accounts,
                rule.false_positive_humans_per_day
            );
        }
        let quiet = rules.iter().filter(quiet).count();
        if quiet > 0 {
            let _ = writeln!(out, "  ({quiet} other rules refused nothing; --json lists every rule)");
        }
    };
    table(&mut out, &format!("candidate ({}):", candidate.display()), &r.candidate);
    table(&mut out, "running config (the log's own verdicts):", &r.logged);
    let _ = writeln!(
        out,
        "\nfp: accounts a rule denied or challenged that later succeeded from the same prefix (people, not attackers)"
    );
    out
}
