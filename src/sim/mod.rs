//! `tollgate simulate`: generated traffic through the real limiter and the
//! real spray detection, on a simulated clock, so a detector's precision is
//! a number: how many attempts an attack gets before it is flagged, and how
//! many people the flags bother. The same code drives
//! `tests/spray_detection.rs`.
//!
//! No daemon and no socket: the limiter is built as the daemon builds it
//! (the default configuration, or a file's), and reports go through the
//! same queue to the same engine; the simulation drains the queue itself
//! every `publish_lag` reports, as the daemon's thread does every few
//! milliseconds.

pub mod replay;
mod traffic;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;

use crate::classes::ClassTable;
use crate::clock::MANUAL_CLOCK_START_US;
use crate::config::Config;
use crate::keys::{KeyDeriver, Secret, SECRET_BYTES};
use crate::limiter::{Limiter, Report};
use crate::protocol::{Decision, Outcome, Reason, Subject};
use crate::signals::pump::{channel, Pump};
use crate::stdout::outln;
use crate::store::Journal;
use crate::unpoisoned::Unpoisoned;
pub use traffic::Mix;
use traffic::{Actor, Attempt, HOUR};

/// The simulated Monday, 2030-01-07 (the manual clock starts on a Tuesday).
const MONDAY_US: u64 = MANUAL_CLOCK_START_US + 6 * 24 * HOUR;

#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Mixes to superimpose, comma-separated: office, university, mobile
    /// (legitimate); spray24, spray_resi, stuffing, v6_rotation, targeted,
    /// flood (attacks, from 9:05).
    #[arg(long, value_delimiter = ',', default_value = "office,spray24")]
    pub mix: Vec<String>,
    /// The random generator's seed: the same seed, the same run.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Hours simulated from 6:00.
    #[arg(long, default_value_t = 14)]
    pub hours: u64,
    /// Reports between two publications of the flags (the daemon's lag).
    #[arg(long, default_value_t = 1)]
    pub publish_lag: u32,
    /// The flood mix's distinct /64s (each from its own /48).
    #[arg(long, default_value_t = 1_000_000)]
    pub flood_prefixes: u64,
    /// A configuration file to run instead of the built-in defaults.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// One attack's outcome.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct AttackReport {
    pub mix: String,
    pub attempts: u64,
    /// 1-based index of the first attempt a signal rule answered (or, for
    /// IPv6 rotation, the attempt after which its /48 was widened).
    pub detected_at: Option<u64>,
    pub detector: Option<String>,
    /// Attempts that reached a password check (allowed or delayed).
    pub reached_password_check: u64,
    pub challenged: u64,
    pub denied: u64,
    /// Attempts whose credential was right and that reached the check.
    pub compromised: u64,
    /// IPv6 rotation: attempts allowed in the hour after widening.
    pub allowed_after_widening: Option<u64>,
}

/// What the legitimate traffic met.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct LegitReport {
    pub attempts: u64,
    pub humans: u64,
    /// Distinct people given any delay, challenge or refusal, by whether
    /// the attempt came from a device the account knew.
    pub fp_humans_known_device: u64,
    pub fp_humans_unknown_device: u64,
    /// Of those, by a signal rule (spray detection) alone.
    pub fp_humans_signals: u64,
    pub refused_humans_known_device: u64,
    /// Mail clients retrying stale passwords that met a refusal.
    pub fp_machines: u64,
    /// The targeted account's owner on their usual device, refused.
    pub owner_known_refused: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct FamilyMemory {
    pub name: String,
    pub entries: u64,
    pub entries_max: u64,
    pub heap_bytes: u64,
    pub evicted: u64,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct SimReport {
    pub mixes: Vec<String>,
    pub seed: u64,
    pub hours: u64,
    pub publish_lag: u32,
    pub attacks: Vec<AttackReport>,
    pub legit: LegitReport,
    pub events: u64,
    pub events_dropped: u64,
    pub memory: Vec<FamilyMemory>,
    /// The most subjects tracked at once (sampled every 256 reports) and
    /// the bytes the engine's tables held for them then.
    pub tracked: u64,
    pub tracked_bytes: u64,
    /// Flags raised per detector.
    pub raised: Vec<(String, u64)>,
    /// The first flags raised (at most 32): detector, subject, estimate, when.
    pub flagged: Vec<String>,
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub mixes: Vec<Mix>,
    pub seed: u64,
    /// Hours from 6:00 (1 to 24).
    pub hours: u64,
    /// Reports between two publications of the flags.
    pub publish_lag: u32,
    /// The flood mix's distinct /64s.
    pub flood_prefixes: u64,
}

impl Scenario {
    /// `mixes` over 14 hours (6:00 to 20:00), seed 7, flags published after
    /// every report, the flood at a million prefixes.
    pub fn of(mixes: &[Mix]) -> Scenario {
        Scenario { mixes: mixes.to_vec(), seed: 7, hours: 14, publish_lag: 1, flood_prefixes: 1_000_000 }
    }
}

/// Runs a scenario on the simulated Monday with `config`.
pub fn run(config: &Config, scenario: &Scenario) -> SimReport {
    let Scenario { ref mixes, seed, hours, publish_lag, flood_prefixes } = *scenario;
    let publish_lag = publish_lag.max(1);
    let signals = config.signals.clone().expect("spray detection on: `[signals] enabled` is not false");
    let classes = Arc::new(ClassTable::parse(traffic::CLASS_FILE).expect("the simulation's class file parses"));
    let mut secret = [0u8; SECRET_BYTES];
    secret[..8].copy_from_slice(&seed.to_le_bytes());
    let keys = KeyDeriver::new(&Secret::from_bytes(secret));
    let (link, pump) = channel(&signals, &keys);
    let limiter = Limiter::new(config, classes, keys, Journal::discard()).with_signals(Some(link.clone()));
    let client_key = [7u8; 32];

    // Everyone's usual device is known from before the day: a success a
    // week earlier, which counts nothing any detector keeps a week.
    let before = MONDAY_US - 7 * 24 * HOUR;
    for (user, peer) in traffic::known_users(mixes) {
        let account = account_name(user);
        let mut devices = vec![traffic::usual_device(user)];
        if traffic::is_stale(user) {
            devices.push(traffic::mail_client(user));
        }
        for device in devices {
            let device = device_name(device);
            let subject = subject(&account, Some(&device), peer);
            let _ = limiter.report("login", &subject, Outcome::Success, None, before);
        }
        // As the daemon's thread would: the queue never fills.
        if user.is_multiple_of(1024) {
            pump.drain(before);
        }
    }
    pump.drain(before);

    let mut attempts: Vec<Attempt> = Vec::new();
    for (i, mix) in mixes.iter().enumerate() {
        attempts.extend(traffic::generate(*mix, i as u8, seed, MONDAY_US, hours, flood_prefixes));
    }
    attempts.sort_by_key(|a| a.t_us);

    let mut sim = Sim::new(mixes);
    let mut since_drain = 0;
    for a in &attempts {
        let account = account_name(a.account);
        let device = a.device.map(device_name);
        let subject = subject(&account, device.as_deref(), a.peer);
        let password = password_text(a.password);
        let tag = tollgate_client::password_tag(&client_key, &password);
        let plan = limiter.plan_check("login", &subject, a.t_us).expect("the login route").with_password_tag(Some(tag));
        let verdict = limiter.decide_check(plan, a.t_us);
        let proceeds = sim.record_check(a, verdict.decision, verdict.reason, &verdict.rule);
        if proceeds {
            let outcome = if a.correct { Outcome::Success } else { Outcome::Failure };
            let digest = tollgate_client::password_digest(&client_key, &account, &password);
            let report = Report { outcome: Some(outcome), password_digest: Some(digest), password_tag: Some(tag) };
            let _ = limiter.report_with("login", &subject, &report, a.t_us);
            since_drain += 1;
            if since_drain >= publish_lag {
                since_drain = 0;
                pump.drain(a.t_us);
                sim.after_drain(&pump);
            }
        }
    }
    pump.drain(attempts.last().map_or(MONDAY_US, |a| a.t_us));
    sim.finish(&pump, link.dropped(), mixes, seed, hours, publish_lag)
}

fn account_name(user: u32) -> String {
    format!("user{user}@example.com")
}

fn device_name(device: u64) -> String {
    format!("device-{device:x}")
}

fn password_text(password: u64) -> String {
    format!("password-{password:x}")
}

fn subject<'a>(account: &'a str, device: Option<&'a str>, peer: std::net::IpAddr) -> Subject<'a> {
    Subject { peer: Some(peer), account: Some(account), device, ..Subject::default() }
}

fn is_signal(reason: Reason) -> bool {
    matches!(reason, Reason::SpraySuspected | Reason::DistributedAttack | Reason::TenantAnomaly | Reason::MonitorSignal)
}

struct Sim {
    attacks: Vec<AttackReport>,
    /// Per attack: whether it is the IPv6 rotation, and when (in its
    /// attempts) and at what time its /48 was widened.
    widened: Vec<Option<(u64, u64)>>,
    widenings_seen: u64,
    /// The last attack attempt checked: its mix, index and time.
    last_attacker: Option<(usize, u64, u64)>,
    /// The most subjects the engine tracked at once, and their bytes.
    peak: (u64, u64),
    drains: u64,
    legit: LegitReport,
    humans: BTreeSet<u32>,
    fp_known: BTreeSet<u32>,
    fp_unknown: BTreeSet<u32>,
    fp_signals: BTreeSet<u32>,
    refused_known: BTreeSet<u32>,
    fp_machines: BTreeSet<u32>,
    /// Devices each account has succeeded from (the sim's view of "known").
    known: HashMap<u32, BTreeSet<u64>>,
}

impl Sim {
    fn new(mixes: &[Mix]) -> Sim {
        let attacks = mixes.iter().map(|m| AttackReport { mix: m.name().into(), ..AttackReport::default() }).collect();
        Sim {
            attacks,
            widened: vec![None; mixes.len()],
            widenings_seen: 0,
            last_attacker: None,
            peak: (0, 0),
            drains: 0,
            legit: LegitReport::default(),
            humans: BTreeSet::new(),
            fp_known: BTreeSet::new(),
            fp_unknown: BTreeSet::new(),
            fp_signals: BTreeSet::new(),
            refused_known: BTreeSet::new(),
            fp_machines: BTreeSet::new(),
            known: HashMap::new(),
        }
    }

    /// Records a check's verdict; true if the attempt goes on to its
    /// password check (and so to a report).
    fn record_check(&mut self, a: &Attempt, decision: Decision, reason: Reason, rule: &str) -> bool {
        let bothered = decision != Decision::Allow || (is_signal(reason) && reason != Reason::MonitorSignal);
        let usual = a.device == Some(traffic::usual_device(a.account))
            || a.device.is_some_and(|d| self.known.get(&a.account).is_some_and(|k| k.contains(&d)));
        match a.actor {
            Actor::Attacker { mix } => {
                let report = &mut self.attacks[mix as usize];
                report.attempts += 1;
                self.last_attacker = Some((mix as usize, report.attempts, a.t_us));
                if report.detected_at.is_none() && is_signal(reason) {
                    report.detected_at = Some(report.attempts);
                    report.detector = Some(rule.to_string());
                }
                if let Some((_, at_us)) = self.widened[mix as usize] {
                    if a.t_us < at_us + HOUR && matches!(decision, Decision::Allow | Decision::Delay) {
                        *report.allowed_after_widening.get_or_insert(0) += 1;
                    }
                }
                match decision {
                    Decision::Allow | Decision::Delay => {
                        report.reached_password_check += 1;
                        report.compromised += u64::from(a.correct);
                        true
                    }
                    Decision::Challenge => {
                        report.challenged += 1;
                        false
                    }
                    Decision::Deny => {
                        report.denied += 1;
                        false
                    }
                }
            }
            Actor::Human { .. } | Actor::Owner => {
                let user = a.account;
                self.legit.attempts += 1;
                self.humans.insert(user);
                if bothered {
                    if usual {
                        self.fp_known.insert(user)
                    } else {
                        self.fp_unknown.insert(user)
                    };
                    if is_signal(reason) {
                        self.fp_signals.insert(user);
                    }
                    if decision == Decision::Deny && usual {
                        self.refused_known.insert(user);
                    }
                    if a.actor == Actor::Owner && usual {
                        self.legit.owner_known_refused += 1;
                    }
                }
                if a.correct {
                    if let Some(d) = a.device {
                        self.known.entry(a.account).or_default().insert(d);
                    }
                }
                // A person passes a challenge and waits out a delay.
                decision != Decision::Deny
            }
            Actor::Machine { user } => {
                self.legit.attempts += 1;
                if bothered && std::env::var_os("SIM_DEBUG").is_some() && !self.fp_machines.contains(&user) {
                    eprintln!("machine {user} at {}: {decision:?} {reason:?} {rule}", a.t_us);
                }
                if bothered {
                    self.fp_machines.insert(user);
                }
                decision != Decision::Deny
            }
        }
    }

    /// After the flags are published: was a block just widened?
    fn after_drain(&mut self, pump: &Pump) {
        let engine = pump.engine();
        let engine = engine.locked();
        let widenings = engine.widenings_total();
        if widenings > self.widenings_seen {
            self.widenings_seen = widenings;
            if let Some((mix, attempt, t_us)) = self.last_attacker {
                if self.attacks[mix].mix == Mix::V6Rotation.name() && self.widened[mix].is_none() {
                    self.widened[mix] = Some((attempt, t_us));
                }
            }
        }
        self.drains += 1;
        if self.drains.is_multiple_of(256) {
            let (tracked, bytes) = engine.bytes();
            if tracked > self.peak.0 {
                self.peak = (tracked, bytes);
            }
        }
    }

    fn finish(mut self, pump: &Pump, dropped: u64, mixes: &[Mix], seed: u64, hours: u64, lag: u32) -> SimReport {
        // Widening shows in no verdict: its detection is the attempt after
        // which the block counted as one source.
        for (report, widened) in self.attacks.iter_mut().zip(&self.widened) {
            if let Some((attempt, _)) = widened {
                report.detected_at = Some(*attempt);
                report.detector = Some("ipv6_widening".into());
            }
        }
        let engine = pump.engine();
        let engine = engine.locked();
        let status = engine.status(dropped, u64::MAX / 2);
        let (tracked, tracked_bytes) = engine.bytes().max(self.peak);
        self.legit.humans = self.humans.len() as u64;
        self.legit.fp_humans_known_device = self.fp_known.len() as u64;
        self.legit.fp_humans_unknown_device = self.fp_unknown.len() as u64;
        self.legit.fp_humans_signals = self.fp_signals.len() as u64;
        self.legit.refused_humans_known_device = self.refused_known.len() as u64;
        self.legit.fp_machines = self.fp_machines.len() as u64;
        SimReport {
            mixes: mixes.iter().map(|m| m.name().to_string()).collect(),
            seed,
            hours,
            publish_lag: lag,
            attacks: self.attacks.into_iter().zip(mixes).filter(|(_, m)| m.is_attack()).map(|(r, _)| r).collect(),
            legit: self.legit,
            events: status.events_total,
            events_dropped: status.events_dropped,
            memory: status
                .families
                .iter()
                .map(|f| FamilyMemory {
                    name: f.name.clone(),
                    entries: f.entries,
                    entries_max: f.entries_max,
                    heap_bytes: f.heap_bytes,
                    evicted: f.evicted,
                })
                .collect(),
            tracked,
            tracked_bytes,
            raised: status.detectors.iter().map(|d| (d.name.clone(), d.raised_total)).collect(),
            flagged: status
                .flagged
                .iter()
                .rev()
                .map(|f| {
                    let at_s = (f.since_ms * 1000).saturating_sub(MONDAY_US) / 1_000_000;
                    let (h, m, s) = (at_s / 3600, at_s / 60 % 60, at_s % 60);
                    format!("{h:02}:{m:02}:{s:02} {} {} ({} ≥ {})", f.detector, f.subject, f.estimate, f.threshold)
                })
                .collect(),
        }
    }
}

/// The report as a table for people.
pub fn print(report: &SimReport) {
    outln!(
        "mixes {} · seed {} · {} h from 06:00 · flags published every {} report(s)",
        report.mixes.join("+"),
        report.seed,
        report.hours,
        report.publish_lag
    );
    outln!(
        "{:<12} {:>8} {:>12} {:<22} {:>10} {:>10} {:>8} {:>11}",
        "attack",
        "attempts",
        "detected_at",
        "by",
        "reached",
        "challenged",
        "denied",
        "compromised"
    );
    for a in &report.attacks {
        outln!(
            "{:<12} {:>8} {:>12} {:<22} {:>10} {:>10} {:>8} {:>11}",
            a.mix,
            a.attempts,
            a.detected_at.map_or("never".into(), |d| d.to_string()),
            a.detector.as_deref().unwrap_or("-"),
            a.reached_password_check,
            a.challenged,
            a.denied,
            a.compromised
        );
        if let Some(n) = a.allowed_after_widening {
            outln!("{:<12} allowed in the hour after widening: {n}", "");
        }
    }
    let l = &report.legit;
    outln!(
        "legitimate: {} attempts by {} people; bothered (delay, challenge or refusal): {} on a known device, {} on an \
         unknown one ({} by spray detection); refused on a known device: {}; owner of the targeted account refused on \
         their device: {}; stale mail clients bothered: {}",
        l.attempts,
        l.humans,
        l.fp_humans_known_device,
        l.fp_humans_unknown_device,
        l.fp_humans_signals,
        l.refused_humans_known_device,
        l.owner_known_refused,
        l.fp_machines
    );
    outln!(
        "spray detection: {} events ({} dropped); at most {} subjects tracked, in {} bytes ({} bytes each)",
        report.events,
        report.events_dropped,
        report.tracked,
        report.tracked_bytes,
        report.tracked_bytes.checked_div(report.tracked).unwrap_or(0)
    );
    for f in &report.memory {
        outln!(
            "  {:<16} {:>8} of {:>8} entries, {:>10} heap bytes, {:>8} evicted",
            f.name,
            f.entries,
            f.entries_max,
            f.heap_bytes,
            f.evicted
        );
    }
    let raised: Vec<String> = report.raised.iter().map(|(d, n)| format!("{d} {n}")).collect();
    outln!("flags raised: {}", raised.join(", "));
    for f in &report.flagged {
        outln!("  {f}");
    }
}

/// `tollgate simulate`.
pub fn simulate(args: &SimulateArgs) -> anyhow::Result<()> {
    let mut mixes = Vec::new();
    for name in &args.mix {
        let mix = Mix::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Mix::ALL.iter().map(|m| m.name()).collect();
            anyhow::anyhow!("unknown mix `{name}` (one of {})", known.join(", "))
        })?;
        mixes.push(mix);
    }
    if !(1..=24).contains(&args.hours) {
        anyhow::bail!("--hours: 1 to 24");
    }
    let config = match &args.config {
        Some(path) => {
            let raw = Config::read_raw(path, true)?;
            Config::build(raw).map_err(|e| anyhow::anyhow!("config file {} is invalid:\n{e}", path.display()))?
        }
        None => Config::default(),
    };
    if config.signals.is_none() {
        anyhow::bail!("the configuration turns spray detection off ([signals] enabled = false): nothing to simulate");
    }
    let scenario = Scenario {
        mixes,
        seed: args.seed,
        hours: args.hours,
        publish_lag: args.publish_lag,
        flood_prefixes: args.flood_prefixes,
    };
    let report = run(&config, &scenario);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    Ok(())
}
