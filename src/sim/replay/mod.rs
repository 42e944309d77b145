//! `tollgate replay LOG... --config candidate.toml`: the decision log run
//! through a limiter built from a candidate configuration, on the log's
//! own clock, in-process (no daemon), as `tollgate simulate` runs its
//! traffic.
//!
//! Each record is replayed at its own time with a subject whose account,
//! device, tenant and client id are the hex of the logged digests (keys
//! only need to be consistent within the replay) and whose peer is the
//! logged address (already resolved: no X-Forwarded-For). A logged report
//! is replayed only if the candidate let its check proceed: the most
//! recent unpaired check of the same route, account, device and address
//! that the running configuration let proceed. A check the running
//! configuration refused has no report in the log, so if the candidate
//! lets it proceed its outcome is unknown; the output counts those.

mod report;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::classes::ClassTable;
use crate::config::Config;
use crate::decision_log::{decode_header, log_files, read_file_bytes, Name, Op, Problem, Record, HEADER_BYTES};
use crate::keys::{KeyDeriver, Secret, SECRET_BYTES};
use crate::limiter::{Limiter, Report};
use crate::protocol::{Decision, Outcome, Subject};
use crate::signals::pump::{channel, Pump};
use crate::store::Journal;
use report::Tally;
pub use report::{text, FileReport, ProblemReport, ReplayReport, RuleReport};

/// Checks waiting for their report: past this many, those older than the
/// candidate's attempt timeout are forgotten (an auth server reports
/// within it).
const PENDING_CHECKS_MAX: usize = 1 << 20;

#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Decision log files, or directories of them (every `.tglog` file in
    /// them), replayed oldest first.
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// The candidate configuration to replay the log through.
    #[arg(long)]
    pub config: PathBuf,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// Whether an attempt with this verdict goes on to its password check.
/// A challenge waits for the person to answer it, which the log cannot
/// know, so it is counted as not proceeding.
fn proceeds(decision: Decision) -> bool {
    matches!(decision, Decision::Allow | Decision::Delay)
}

/// A check waiting for its report.
struct Pending {
    time_us: u64,
    candidate_proceeded: bool,
}

type PairKey = (Name, Option<[u8; 16]>, Option<[u8; 16]>, Option<IpAddr>);

/// The candidate's limiter and everything counted so far.
pub struct Replayer {
    limiter: Limiter,
    /// Spray detection's engine, drained after every replayed report.
    pump: Option<Pump>,
    attempt_timeout_us: u64,
    pending: HashMap<PairKey, Vec<Pending>>,
    pending_count: usize,
    candidate: Tally,
    logged: Tally,
    report: ReplayReport,
}

fn hex(digest: &[u8; 16]) -> String {
    let mut out = String::with_capacity(32);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl Replayer {
    /// A limiter built from `config` as the daemon builds one, with a fixed
    /// throwaway secret (its keys are digests of digests, and a fixed one
    /// makes a replay's output repeatable).
    pub fn new(config: &Config, classes: Arc<ClassTable>) -> Replayer {
        let keys = KeyDeriver::new(&Secret::from_bytes([0x5e; SECRET_BYTES]));
        let mut pump = None;
        let mut link = None;
        if let Some(signals) = &config.signals {
            let (l, p) = channel(signals, &keys);
            link = Some(l);
            pump = Some(p);
        }
        let mut limiter = Limiter::new(config, classes, keys, Journal::discard());
        if let Some(link) = link {
            limiter = limiter.with_signals(Some(link));
        }
        let mut candidate = Tally::default();
        for route in &config.routes {
            for rule in &route.rules {
                candidate.rule(&route.name, &rule.name);
            }
        }
        Replayer {
            limiter,
            pump,
            attempt_timeout_us: config.attempt_timeout_ms * 1000,
            pending: HashMap::new(),
            pending_count: 0,
            candidate,
            logged: Tally::default(),
            report: ReplayReport::default(),
        }
    }

    pub fn feed(&mut self, r: &Record) {
        let t = r.time_us;
        let report = &mut self.report;
        if report.records == 0 {
            report.first_ms = t / 1000;
        }
        report.records += 1;
        report.last_ms = report.last_ms.max(t / 1000);
        let [account, device, tenant, client_id] =
            [r.account, r.device, r.tenant, r.client_id].map(|d| d.map(|d| hex(&d)));
        let subject = Subject {
            peer: r.address,
            forwarded_for: None,
            account: account.as_deref(),
            device: device.as_deref(),
            tenant: tenant.as_deref(),
            client_id: client_id.as_deref(),
        };
        let route = std::str::from_utf8(&r.route).unwrap_or_default();
        let prefix = self.limiter.client_prefix(&subject).map(|p| p.to_string());
        let key: PairKey = (r.route.clone(), r.account, r.device, r.address);
        match r.op {
            Op::Check => {
                report.checks += 1;
                let rule = std::str::from_utf8(&r.rule).unwrap_or_default();
                self.logged.count(route, rule, r.decision, r.reason, r.account, prefix.as_deref());
                let plan = match self.limiter.plan_check(route, &subject, t) {
                    Ok(plan) => plan.with_password_tag(r.password_tag),
                    Err(_) => {
                        report.not_replayed += 1;
                        return;
                    }
                };
                let verdict = self.limiter.decide_check(plan, t);
                self.candidate.count(
                    route,
                    &verdict.rule,
                    verdict.decision,
                    verdict.reason,
                    r.account,
                    prefix.as_deref(),
                );
                let (logged_proceeded, candidate_proceeded) = (proceeds(r.decision), proceeds(verdict.decision));
                report.outcome_unknown += u64::from(candidate_proceeded && !logged_proceeded);
                report.newly_refused +=
                    u64::from(logged_proceeded && matches!(verdict.decision, Decision::Deny | Decision::Challenge));
                // Only a check the running configuration let proceed can
                // have a report in the log.
                if logged_proceeded {
                    self.remember(key, Pending { time_us: t, candidate_proceeded });
                }
            }
            Op::Report(outcome) => {
                report.reports += 1;
                if let (Outcome::Success, Some(account), Some(prefix)) = (outcome, r.account, &prefix) {
                    self.candidate.success(account, prefix);
                    self.logged.success(account, prefix);
                }
                match self.pair(&key) {
                    Some(false) => {
                        self.report.reports_skipped += 1;
                        return;
                    }
                    Some(true) => {}
                    None => self.report.reports_without_check += 1,
                }
                let sent =
                    Report { outcome: Some(outcome), password_digest: r.password_digest, password_tag: r.password_tag };
                let reported = self.limiter.report_with(route, &subject, &sent, t);
                match reported {
                    Ok(_) => self.report.reports_replayed += 1,
                    Err(_) => self.report.not_replayed += 1,
                }
                if let Some(pump) = &self.pump {
                    pump.drain(t);
                }
            }
        }
    }

    fn remember(&mut self, key: PairKey, check: Pending) {
        if self.pending_count >= PENDING_CHECKS_MAX {
            let cutoff = check.time_us.saturating_sub(self.attempt_timeout_us);
            self.pending.retain(|_, checks| {
                checks.retain(|c| c.time_us >= cutoff);
                !checks.is_empty()
            });
            self.pending_count = self.pending.values().map(Vec::len).sum();
            // Still full: that many checks within one attempt timeout all
            // await a report. Forget them (their reports will be replayed
            // as without a check) rather than sweep again at every check.
            if self.pending_count >= PENDING_CHECKS_MAX / 2 {
                self.report.checks_forgotten += self.pending_count as u64;
                self.pending.clear();
                self.pending_count = 0;
            }
        }
        self.pending.entry(key).or_default().push(check);
        self.pending_count += 1;
    }

    /// The report's check: the most recent unpaired one the running
    /// configuration let proceed (only those are remembered). Whether the
    /// candidate let it proceed.
    fn pair(&mut self, key: &PairKey) -> Option<bool> {
        let checks = self.pending.get_mut(key)?;
        let check = checks.pop()?;
        self.pending_count -= 1;
        if checks.is_empty() {
            self.pending.remove(key);
        }
        Some(check.candidate_proceeded)
    }

    pub fn finish(mut self, files: Vec<FileReport>) -> ReplayReport {
        if let Some(pump) = &self.pump {
            pump.drain(self.report.last_ms * 1000);
        }
        let span_us = (self.report.last_ms - self.report.first_ms) * 1000;
        self.report.candidate = self.candidate.reports(span_us);
        let mut logged = self.logged.reports(span_us);
        logged.sort_by(|a, b| (&a.route, &a.rule).cmp(&(&b.route, &b.rule)));
        self.report.logged = logged;
        self.report.files = files;
        self.report
    }
}

/// Every log file the arguments name (a directory: its `.tglog` files).
fn files_named(logs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in logs {
        if path.is_dir() {
            let found = log_files(path).map_err(|e| anyhow::anyhow!("cannot list {}: {e}", path.display()))?;
            if found.is_empty() {
                anyhow::bail!("{} holds no decision log files (decisions-*.tglog)", path.display());
            }
            files.extend(found.into_iter().map(|(_, _, p)| p));
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Replays `files` (read one at a time, oldest header first) through a
/// limiter built from `config`.
pub fn replay_files(config: &Config, classes: Arc<ClassTable>, files: &[PathBuf]) -> ReplayReport {
    let mut replayer = Replayer::new(config, classes);
    let mut reports = Vec::new();
    // Ordered by each file's start time (its header), then name.
    let mut ordered: Vec<(u64, &Path)> = files
        .iter()
        .map(|p| {
            let start = std::fs::File::open(p).ok().and_then(|mut f| {
                let mut header = [0u8; HEADER_BYTES];
                std::io::Read::read_exact(&mut f, &mut header).ok()?;
                decode_header(&header).ok().map(|h| h.start_us)
            });
            (start.unwrap_or(0), p.as_path())
        })
        .collect();
    ordered.sort();
    let mut fingerprint = None;
    for (_, path) in ordered {
        let mut file = FileReport { path: path.display().to_string(), ..FileReport::default() };
        let problem = |p: Problem| ProblemReport { offset: p.offset, what: p.what, torn_tail: p.torn_tail };
        match std::fs::read(path) {
            Err(e) => {
                file.problems.push(ProblemReport { offset: 0, what: format!("cannot read: {e}"), torn_tail: false })
            }
            Ok(bytes) => {
                let contents = read_file_bytes(&bytes);
                file.problems.extend(contents.problems.into_iter().map(problem));
                let same_secret = match (contents.header, fingerprint) {
                    (Some(h), None) => {
                        fingerprint = Some(h.fingerprint);
                        true
                    }
                    (Some(h), Some(first)) => h.fingerprint == first,
                    (None, _) => true,
                };
                if same_secret {
                    file.records = contents.records.len() as u64;
                    for record in &contents.records {
                        replayer.feed(record);
                    }
                } else {
                    file.problems.push(ProblemReport {
                        offset: 0,
                        what: "written under a different secret or key derivation than the first file (its digests do not match): \
                               not replayed"
                            .into(),
                        torn_tail: false,
                    });
                }
            }
        }
        reports.push(file);
    }
    replayer.finish(reports)
}

/// `tollgate replay`.
pub fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let raw = Config::read_raw(&args.config, true)?;
    let config =
        Config::build(raw).map_err(|e| anyhow::anyhow!("config file {} is invalid:\n{e}", args.config.display()))?;
    let classes = match &config.class_file {
        Some(path) => ClassTable::load(path)?,
        None => ClassTable::default(),
    };
    let files = files_named(&args.logs)?;
    let report = replay_files(&config, Arc::new(classes), &files);
    let output = if args.json { serde_json::to_string_pretty(&report)? + "\n" } else { text(&report, &args.config) };
    // A reader that stops early (`| head`) cuts the report short, but not
    // the damage below: its lines and the exit status still come.
    let written = crate::stdout::try_write_bytes(output.as_bytes());
    let mut damaged = 0;
    for file in &report.files {
        for p in &file.problems {
            let kind = if p.torn_tail { "warning" } else { "error" };
            let line = format!("{kind}: {} at offset {}: {}", file.path, p.offset, p.what);
            eprintln!("tollgate: {}", crate::stdout::printable(&line));
            damaged += usize::from(!p.torn_tail);
        }
    }
    if damaged > 0 {
        anyhow::bail!(
            "{damaged} damaged or unreadable part(s) of the log were skipped; the figures above are of the rest"
        );
    }
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => anyhow::bail!(crate::stdout::error_line(&e)),
        _ => Ok(()),
    }
}
