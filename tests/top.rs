//! `tollgate top` driven as an operator would: the real binary in a real
//! terminal (tmux, 80x24) against a real daemon under load the test
//! generates and counts; its `--once --json` held to `status --json` and to
//! the verdicts the test itself received; and a planted account name that
//! must never reach the screen or the JSON.
//!
//! The tests need tmux (`scripts/test.sh` installs it); without it the
//! terminal tests fail, as the shared-store tests do without Redis.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use tollgate::protocol::{Decision, Outcome, Verdict};

/// The account the test locks out. Its name must never appear on the
/// screen or in any JSON: the daemon keeps and sends only digests.
const PLANTED: &str = "planted.name.7f3e@example.org";
/// Where the planted account's failures come from; the class file makes
/// its /24 a `hosting` prefix.
const ATTACKER: &str = "203.0.113.5";
const ATTACKER_PREFIX: &str = "203.0.113.0/24";
/// Failures of one (account, prefix) that lock it on `login`
/// (`login.source_failures`, 5 per 15 minutes, by default).
const FAILURES_TO_LOCK: usize = 5;
/// Checks after the lockout: refusals for the top refused prefixes.
const CHECKS_WHILE_LOCKED: usize = 3;
/// How long the screen may take to show what the test waits for (two
/// ticks of one second and a slow machine).
const SCREEN_WAIT: Duration = Duration::from_secs(20);

/// What the test received, per route, as `Activity` counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RouteCounts {
    checks: [u64; 5],
    reports: [u64; 5],
    failures: u64,
    successes: u64,
}

/// Index in `[allow, delay, challenge, deny, would_refuse]`.
fn slot(v: &Verdict<'_>) -> usize {
    match v.decision {
        Decision::Allow => 0,
        Decision::Delay => 1,
        Decision::Challenge => 2,
        Decision::Deny => 3,
    }
}

#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, RouteCounts>>);

impl Tally {
    fn check(&self, route: &str, v: &Verdict<'_>) {
        let mut all = self.0.lock().unwrap();
        let c = all.entry(route.to_string()).or_default();
        c.checks[slot(v)] += 1;
        c.checks[4] += (v.decision == Decision::Allow && v.reason.is_monitored()) as u64;
    }

    fn report(&self, route: &str, outcome: Outcome, v: &Verdict<'_>) {
        let mut all = self.0.lock().unwrap();
        let c = all.entry(route.to_string()).or_default();
        c.reports[slot(v)] += 1;
        c.reports[4] += (v.decision == Decision::Allow && v.reason.is_monitored()) as u64;
        match outcome {
            Outcome::Failure => c.failures += 1,
            Outcome::Success => c.successes += 1,
        }
    }
}

/// A daemon with a class file (the attacker's /24 is `hosting`) and /24
/// source prefixes, on the manual clock (budgets do not refill: the load
/// below stays under them).
fn daemon() -> TestDaemon {
    let dir = tempfile::tempdir().unwrap();
    let classes = dir.path().join("classes.csv");
    std::fs::write(&classes, format!("{ATTACKER_PREFIX},hosting\n")).unwrap();
    let config = format!("[source]\nipv4_prefix_len = 24\nclass_file = \"{}\"\n", classes.display());
    let daemon = TestDaemon::start_with(Some(&config), true);
    // The class file is read at start; the temp dir may go.
    drop(dir);
    daemon
}

/// The planted account fails from the attacker's address until locked,
/// then is refused a few times.
fn lock_the_planted_account(daemon: &TestDaemon, tally: &Tally) {
    let rt = runtime();
    let client = daemon.client();
    let who = subject(ATTACKER, PLANTED);
    let mut locked = false;
    for _ in 0..FAILURES_TO_LOCK {
        let v = verdict(rt.block_on(client.check("login", &who)));
        tally.check("login", &v);
        let r = verdict(rt.block_on(client.report("login", &who, Outcome::Failure)));
        tally.report("login", Outcome::Failure, &r);
        locked = r.decision == Decision::Deny;
    }
    assert!(locked, "the fifth failure locks (planted account, {ATTACKER_PREFIX})");
    for _ in 0..CHECKS_WHILE_LOCKED {
        let v = verdict(rt.block_on(client.check("login", &who)));
        assert_eq!(v.decision, Decision::Deny, "locked: {v:?}");
        tally.check("login", &v);
    }
}

/// Background traffic: a check then a report, about 30 a second, from 32
/// prefixes and 40 accounts; one login in ten a mistyped password then
/// the right one (the success clears the failure: nothing locks), spread
/// so that no prefix fails against many accounts nor any account from many
/// prefixes (spray detection stays quiet); a `request` check in every
/// fourth. Stops when told; counts every verdict.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Load {
    fn start(socket: &Path, tally: Arc<Tally>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, socket) = (stop.clone(), socket.to_path_buf());
        let thread = std::thread::spawn(move || {
            let rt = runtime();
            let client = tollgate::client::Client::new(
                tollgate::client::ClientConfig::new(&socket).timeout(Duration::from_secs(10)),
            );
            let mut i: u32 = 0;
            while !flag.load(Ordering::Relaxed) {
                let peer = v4(0xc612_0007 + ((i % 32) << 8)); // 198.18.{0..31}.7
                let account = format!("user{}", i % 40);
                let who = who(peer, Some(&account));
                let outcomes: &[Outcome] =
                    if i.is_multiple_of(10) { &[Outcome::Failure, Outcome::Success] } else { &[Outcome::Success] };
                for &outcome in outcomes {
                    let v = verdict(rt.block_on(client.check("login", &who)));
                    tally.check("login", &v);
                    let r = verdict(rt.block_on(client.report("login", &who, outcome)));
                    tally.report("login", outcome, &r);
                }
                if i.is_multiple_of(4) {
                    let v = verdict(rt.block_on(client.check("request", &who)));
                    tally.check("request", &v);
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(25));
            }
        });
        Load { stop, thread: Some(thread) }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("the load thread");
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A tmux server of the test's own (its own socket) running one 80x24 pane.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start(dir: &Path, command: &str) -> Tmux {
        // Like the shared-store tests with Redis, these refuse to skip:
        // the README's test command installs tmux.
        assert!(
            Command::new("tmux").arg("-V").output().is_ok(),
            "tmux is not installed, so `tollgate top` cannot be driven in a terminal; \
             scripts/test.sh installs it (apt-get install tmux)"
        );
        let tmux = Tmux { socket: dir.join("tmux.sock") };
        // The shell line reports the exit so the test can see `q` end it.
        let line = format!("{command}; echo \"top exited with status $?\"; sleep 600");
        let out = tmux.run(&["new-session", "-d", "-s", "top", "-x", "80", "-y", "24", &line]);
        assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
        tmux
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-S").arg(&self.socket).args(args).env_remove("TMUX").output().expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        assert!(self.run(&["send-keys", "-t", "top", keys]).status.success());
    }

    /// The screen once `ok` holds for it; panics with the last screen.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "the screen never showed {what}; last screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn top_command(daemon: &TestDaemon) -> String {
    format!("{BIN} top --socket {}", daemon.socket.display())
}

/// The row of `route` in the verdicts table has a rate that is not zero.
fn route_has_nonzero_rate(screen: &str, route: &str) -> bool {
    screen.lines().skip_while(|l| !l.starts_with("checks/s")).skip(1).any(|l| {
        let mut words = l.split_whitespace();
        words.next() == Some(route) && words.any(|w| w.parse::<f64>().is_ok_and(|x| x > 0.0))
    })
}

#[test]
fn top_in_a_terminal_shows_rates_refused_prefixes_account_digests_and_lockouts_and_q_quits() {
    let daemon = daemon();
    let tally = Arc::new(Tally::default());
    lock_the_planted_account(&daemon, &tally);
    let load = Load::start(&daemon.socket, tally.clone());
    let tmux = Tmux::start(daemon.dir.path(), &top_command(&daemon));

    let screen = tmux.wait_for("login with a nonzero rate", |s| route_has_nonzero_rate(s, "login"));
    assert!(screen.lines().count() <= 24 && screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
    let screen = tmux.wait_for("the refused prefix, its class, a digest and the lockout", |s| {
        let prefix_row = s.lines().any(|l| l.starts_with(ATTACKER_PREFIX) && l.contains("hosting"));
        let lockout_row = s
            .lines()
            .skip_while(|l| !l.starts_with("recent lockouts"))
            .any(|l| l.contains("login/source_failures") && l.contains(ATTACKER_PREFIX) && l.contains("acct:"));
        prefix_row && lockout_row && s.contains("acct:")
    });
    assert!(!screen.contains(PLANTED) && !screen.contains("planted"), "a raw account name on screen:\n{screen}");

    // Pages: the tables and the attempts per account.
    tmux.keys("2");
    let tables = tmux.wait_for("the tables page", |s| s.contains("table fill") && s.contains("login/source_failures"));
    assert!(!tables.contains("planted"), "{tables}");
    tmux.keys("3");
    let accounts = tmux.wait_for("the accounts page", |s| s.contains("attempts per account today"));
    assert!(!accounts.contains("planted"), "{accounts}");

    tmux.keys("q");
    let after = tmux.wait_for("top's exit after q", |s| s.contains("top exited with status"));
    assert!(after.contains("top exited with status 0"), "{after}");
    load.stop();
}

/// Activity's counts by route, leaving out routes that counted nothing
/// (the tally has no entry for a route the test never used).
fn route_counts(activity: &serde_json::Value) -> BTreeMap<String, RouteCounts> {
    let counts = |c: &serde_json::Value| -> [u64; 5] {
        ["allow", "delay", "challenge", "deny", "would_refuse"].map(|k| c[k].as_u64().unwrap_or_else(|| panic!("{k}")))
    };
    let mut all = BTreeMap::new();
    for r in activity["routes"].as_array().unwrap_or_else(|| panic!("routes in {activity}")) {
        let got = RouteCounts {
            checks: counts(&r["checks"]),
            reports: counts(&r["reports"]),
            failures: r["failures"].as_u64().unwrap(),
            successes: r["successes"].as_u64().unwrap(),
        };
        if got != RouteCounts::default() {
            all.insert(r["name"].as_str().unwrap().to_string(), got);
        }
    }
    all
}

#[test]
fn top_once_json_agrees_with_status_and_with_the_verdicts_the_test_received() {
    let daemon = daemon();
    let tally = Arc::new(Tally::default());
    lock_the_planted_account(&daemon, &tally);
    let load = Load::start(&daemon.socket, tally.clone());
    std::thread::sleep(Duration::from_millis(500));
    load.stop();

    let received = tally.0.lock().unwrap().clone();
    let status = daemon.cli_json(&["status"]);
    // The daemon may count on a thread of its own, off the request path:
    // ask again until its counts have caught up (or the deadline says why not).
    let deadline = Instant::now() + Duration::from_secs(5);
    let top = loop {
        let top = daemon.cli_json(&["top", "--once", "--limit", "5"]);
        if route_counts(&top["activity"]) == received || Instant::now() > deadline {
            break top;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (ts, activity) = (&top["status"], &top["activity"]);
    assert!(ts.is_object() && activity.is_object(), "{top}");
    assert!(ts.get("shared").is_some() && ts.get("signals").is_some(), "the same keys as status --json: {ts}");
    let rules = |s: &serde_json::Value| -> Vec<(String, String, u64)> {
        let mut all = Vec::new();
        for route in s["routes"].as_array().unwrap() {
            for rule in route["rules"].as_array().unwrap() {
                all.push((
                    route["name"].as_str().unwrap().to_string(),
                    rule["name"].as_str().unwrap().to_string(),
                    rule["entries_max"].as_u64().unwrap(),
                ));
            }
        }
        all
    };
    assert_eq!(rules(ts), rules(&status), "the same routes, rules and caps as status --json");
    assert_eq!(ts["version"], status["version"]);
    assert_eq!(ts["limits"], status["limits"]);

    // Every verdict the test received, and nothing else, on each route.
    assert_eq!(activity["events_dropped"], 0, "no activity event was dropped: {activity}");
    let route_names: Vec<&str> = ts["routes"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    for r in activity["routes"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        assert!(route_names.contains(&name), "activity names a route status does not: {name}");
    }
    assert_eq!(
        route_counts(activity),
        received,
        "activity's counts by route (routes without traffic left out) against the verdicts the test received"
    );
    let login = &received["login"];
    assert!(login.checks[0] > 0 && login.checks[3] >= CHECKS_WHILE_LOCKED as u64, "{login:?}");

    // The lists, bounded by --limit and naming no one.
    let prefixes = activity["top_refused_prefixes"].as_array().unwrap();
    assert!(prefixes.len() <= 5);
    assert!(
        prefixes.iter().any(|p| p["prefix"] == ATTACKER_PREFIX && p["class"] == "hosting"),
        "{ATTACKER_PREFIX} (hosting) among the top refused prefixes: {prefixes:?}"
    );
    let lockouts = activity["recent_lockouts"].as_array().unwrap();
    let lockout = lockouts
        .iter()
        .find(|l| l["route"] == "login" && l["rule"] == "source_failures")
        .unwrap_or_else(|| panic!("the lockout: {lockouts:?}"));
    assert_eq!(lockout["prefix"], ATTACKER_PREFIX);
    let account = lockout["account"].as_str().unwrap();
    assert!(
        account.len() == 21 && account.starts_with("acct:") && account[5..].bytes().all(|b| b.is_ascii_hexdigit()),
        "acct: and 16 hex digits: {account}"
    );
    let accounts = activity["top_failing_accounts"].as_array().unwrap();
    assert!(accounts.iter().any(|a| a["account"] == account), "the locked account fails most: {accounts:?}");
}

#[test]
fn a_planted_account_name_never_reaches_the_screen_the_text_or_the_json() {
    let daemon = daemon();
    let tally = Arc::new(Tally::default());
    lock_the_planted_account(&daemon, &tally);
    // Its successes and checks on other routes too: every list it could be in.
    let rt = runtime();
    let client = daemon.client();
    for route in ["reauth", "mfa_verify", "password_reset"] {
        let who = tollgate::protocol::Subject {
            device: Some("planted-device"),
            tenant: Some("planted-tenant"),
            ..subject("198.51.100.77", PLANTED)
        };
        let _ = rt.block_on(client.check(route, &who));
        let _ = rt.block_on(client.report(route, &who, Outcome::Failure));
    }
    // The daemon counts off the request path: ask until the lists are in.
    let deadline = Instant::now() + SCREEN_WAIT;
    let json = loop {
        let out = daemon.cli(&["top", "--once", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json = String::from_utf8_lossy(&out.stdout).into_owned();
        if json.contains("acct:") {
            break json;
        }
        assert!(Instant::now() < deadline, "the JSON never had digests: {json}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = daemon.cli(&["top", "--once"]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("recent lockouts") && text.contains("acct:"), "{text}");
    for shown in [json.as_str(), &*text] {
        assert!(!shown.contains("planted"), "a raw identifier was shown:\n{shown}");
    }
    let tmux = Tmux::start(daemon.dir.path(), &top_command(&daemon));
    // Each page once it shows its data (the overview: the locked account's digest).
    for (page, shows) in [("1", "acct:"), ("2", "table fill"), ("3", "attempts per account")] {
        tmux.keys(page);
        let screen = tmux.wait_for(shows, |s| s.contains(shows));
        assert!(!screen.contains("planted"), "page {page}:\n{screen}");
    }
    tmux.keys("q");
    tmux.wait_for("top's exit after q", |s| s.contains("top exited with status 0"));
}

#[test]
fn without_a_daemon_once_fails_in_one_line_and_the_live_view_keeps_trying() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.sock");
    let out = Command::new(BIN).args(["top", "--once", "--json", "--socket"]).arg(&absent).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--once without a daemon exits non-zero");
    assert!(out.stdout.is_empty(), "no half snapshot on stdout");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("tollgate: error: cannot reach tollgate at"), "{stderr}");

    let command = format!("{BIN} top --socket {}", absent.display());
    let tmux = Tmux::start(dir.path(), &command);
    tmux.wait_for("UNREACHABLE with the reason", |s| s.contains("UNREACHABLE: cannot reach tollgate at"));
    // Still running a tick later: it retries, it does not give up.
    std::thread::sleep(Duration::from_millis(1500));
    let screen = tmux.screen();
    assert!(screen.contains("UNREACHABLE") && !screen.contains("top exited"), "{screen}");
    tmux.keys("q");
    tmux.wait_for("top's exit after q", |s| s.contains("top exited with status 0"));
}

/// Whether process `pid` has gone (or is a zombie nobody reaped).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
}

#[test]
fn a_terminal_that_goes_away_ends_top_instead_of_spinning() {
    // An ssh session dropped, a tmux server killed: the pty hangs up and
    // top's input reads end of file. It must exit, not read nothing in a
    // loop at full CPU (crossterm's poll does, and never returns).
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("top.pid");
    let command = format!(
        "sh -c 'echo $$ > {}; exec {BIN} top --socket {}'",
        pid_file.display(),
        dir.path().join("none.sock").display()
    );
    let tmux = Tmux::start(dir.path(), &command);
    tmux.wait_for("top's live view", |s| s.contains("UNREACHABLE"));
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(!gone(pid), "top is running");
    assert!(tmux.run(&["kill-server"]).status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(pid) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("top (pid {pid}) outlived its terminal by 10 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Red team: a terminal shrunk to a few cells (a split pane, a phone's
/// ssh client) on every page, under load, neither crashes nor ends `top`;
/// grown back it draws the full view again.
#[test]
fn a_tiny_terminal_on_every_page_does_not_crash_top() {
    let daemon = daemon();
    let tally = Arc::new(Tally::default());
    lock_the_planted_account(&daemon, &tally);
    let load = Load::start(&daemon.socket, tally.clone());
    let tmux = Tmux::start(daemon.dir.path(), &top_command(&daemon));
    tmux.wait_for("the first page", |s| s.contains("checks/s"));
    for (x, y) in [("20", "5"), ("1", "1"), ("3", "2"), ("80", "3"), ("10", "24")] {
        assert!(tmux.run(&["resize-window", "-t", "top", "-x", x, "-y", y]).status.success());
        for page in ["1", "2", "3", "Tab"] {
            tmux.keys(page);
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    assert!(tmux.run(&["resize-window", "-t", "top", "-x", "80", "-y", "24"]).status.success());
    tmux.keys("1");
    let screen = tmux.wait_for("the full view again", |s| s.contains("checks/s") || s.contains("exited"));
    assert!(!screen.contains("exited"), "top ended on a tiny terminal:\n{screen}");
    load.stop();
}

/// Red team: the daemon restarted under a live view. `top` shows it
/// unreachable, keeps trying, and once the new daemon answers shows its
/// rates again (its counters started over: no negative or huge rate).
#[test]
fn a_daemon_restarted_under_the_live_view_is_picked_up_again() {
    let mut daemon = TestDaemon::start_with(None, true);
    let tmux = Tmux::start(daemon.dir.path(), &top_command(&daemon));
    let tally = Arc::new(Tally::default());
    let load = Load::start(&daemon.socket, tally.clone());
    tmux.wait_for("a rate on the login route", |s| route_has_nonzero_rate(s, "login"));
    load.stop();
    daemon.terminate();
    tmux.wait_for("the daemon unreachable", |s| s.contains("UNREACHABLE"));
    daemon.spawn();
    let load = Load::start(&daemon.socket, tally.clone());
    let screen = tmux.wait_for("rates again", |s| !s.contains("UNREACHABLE") && route_has_nonzero_rate(s, "login"));
    load.stop();
    assert!(!screen.contains("exited"), "{screen}");
}

/// Red team: an interval far too long to add to a clock reading (an
/// operator's typo, `--interval 500000000000y`) is refused at parse time or
/// shown, never a panic in the live view.
#[test]
fn an_absurd_interval_does_not_panic_the_live_view() {
    let daemon = TestDaemon::start_with(None, true);
    let command = format!("{} --interval 500000000000y 2>&1", top_command(&daemon));
    let tmux = Tmux::start(daemon.dir.path(), &command);
    std::thread::sleep(Duration::from_millis(1500));
    let screen = tmux.wait_for("the view or a refusal", |s| s.contains("checks/s") || s.contains("exited"));
    assert!(!screen.contains("panicked"), "{screen}");
    if screen.contains("exited") {
        assert!(screen.contains("interval"), "refused with a word about the interval:\n{screen}");
    }
}
