//! The weapon budget, measured: for each way a stranger (without the
//! victim's password, on addresses of their own) can make a real user's
//! login harder, what it costs per minute and what the user sees, on an
//! unknown device and on a device her account knows. Each way runs against
//! a fresh real daemon on the manual clock, so "per minute" is exact and a
//! run takes seconds, not hours.
//!
//! ```sh
//! bash benches/weapon-budget.sh          # builds, then runs this
//! TOLLGATE_BIN=target/release/tollgate cargo run --release --example weapon_budget
//! ```
//!
//! `WEAPON_ENTRIES_MAX` (default 3200) is the scaled-down `entries_max` of
//! the full-map way; the default cap's figures are derived from the cap
//! `status` reports and the per-prefix admission rate measured here.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tollgate::client::{Answer, Client, ClientConfig};
use tollgate::protocol::{Decision, Outcome, RuleStatus, Subject, Verdict};

const VICTIM: &str = "alice@example.com";
/// The victim's own address: her unknown and known device both log in here.
const VICTIM_HOME: &str = "198.51.100.7";
const VICTIM_DEVICE: &str = "alice-phone";
const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60_000;
/// Fresh daemons per full-map play (each takes a couple of seconds).
const FULL_MAP_RUNS: u32 = 5;
/// The built-in `attempt_timeout_ms`: how long an unreported place lives.
const ATTEMPT_TIMEOUT_MS: u64 = 30_000;
/// The detection thread publishes flags every 5 ms of real time; this
/// leaves it room on a busy 2-core machine before the next check reads them.
/// The same thread also expires flags on its own tick, so each step of the
/// manual clock waits this long, as real time would pass between steps.
const PUBLISH_WAIT: Duration = Duration::from_millis(50);
/// A shorter wait for runs of hundreds of 10-second steps.
const TICK_WAIT: Duration = Duration::from_millis(10);

/// A `tollgate serve --manual-clock` in its own temp dir, killed on drop.
struct Daemon {
    child: Child,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts a daemon with `config` laid over the defaults, and logs the
    /// victim in once from her phone, so that the phone is a known device.
    async fn start(config: &str) -> Daemon {
        let bin = std::env::var("TOLLGATE_BIN")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/tollgate").into());
        let dir = tempfile::Builder::new().prefix("weapon-budget").tempdir().expect("temp dir");
        let path = |name: &str| dir.path().join(name);
        std::fs::write(path("tollgate.toml"), config).expect("write config");
        let log = std::fs::File::create(path("log")).expect("log file");
        let mut command = Command::new(&bin);
        command.args(["serve", "--manual-clock"]).env("TOLLGATE_LOG", "warn").stdin(Stdio::null());
        for (flag, name) in [("--socket", "t.sock"), ("--state", "state.redb"), ("--config", "tollgate.toml")] {
            command.arg(flag).arg(path(name));
        }
        let child = command
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let socket = path("t.sock");
        for _ in 0..2_000 {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let client = Client::new(ClientConfig::new(&socket).timeout(Duration::from_secs(10)));
        let daemon = Daemon { child, client, _dir: dir };
        let phone = victim(Some(VICTIM_DEVICE));
        assert!(daemon.check(&phone).await.proceeds(), "the victim's first login");
        daemon.client.report("login", &phone, Outcome::Success).await;
        daemon
    }

    async fn advance(&self, ms: u64) {
        self.client.advance_clock(Duration::from_millis(ms)).await.expect("a --manual-clock daemon");
    }

    async fn check(&self, subject: &Subject<'_>) -> Verdict<'static> {
        match self.client.check("login", subject).await {
            Answer::Verdict(v) => v,
            other => panic!("expected a verdict, got {other:?}"),
        }
    }

    /// What a login attempt would be told now, leaving nothing behind: an
    /// admitted check is abandoned, so the look holds no place.
    async fn look(&self, subject: &Subject<'_>) -> Verdict<'static> {
        let v = self.check(subject).await;
        if v.proceeds() {
            self.client.abandon("login", subject).await;
        }
        v
    }

    /// A wrong password: reported unless denied. A challenge is taken as
    /// solved (a paid solver), so its failure is reported too.
    async fn fail(&self, subject: &Subject<'_>) -> Verdict<'static> {
        let v = self.check(subject).await;
        if v.decision != Decision::Deny {
            self.client.report("login", subject, Outcome::Failure).await;
        }
        v
    }

    /// Failures `rule` could not hold (`refused_full`: checks admitted into
    /// a map full of places, counted as failures at once).
    async fn presumed(&self, rule: &str) -> u64 {
        self.rule(rule).await.refused_full
    }

    async fn rule(&self, name: &str) -> RuleStatus {
        let status = self.client.status().await.expect("status");
        let login = status.routes.into_iter().find(|r| r.name == "login").expect("login route");
        login.rules.into_iter().find(|r| r.name == name).expect("rule")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn victim(device: Option<&str>) -> Subject<'_> {
    Subject { peer: Some(VICTIM_HOME.parse().unwrap()), account: Some(VICTIM), device, ..Subject::default() }
}

fn from<'a>(address: &str, account: &'a str) -> Subject<'a> {
    Subject { peer: Some(address.parse().expect("an address")), account: Some(account), ..Subject::default() }
}

/// `deny too_many_failures (account_failures)`, or `allow`.
fn describe(v: &Verdict<'_>) -> String {
    if v.proceeds() {
        return "allow".into();
    }
    let name = |x: serde_json::Value| x.as_str().unwrap_or("?").to_string();
    let reason = name(serde_json::to_value(v.reason).unwrap());
    format!("{} {reason} ({})", name(serde_json::to_value(v.decision).unwrap()), v.rule)
}

/// What the victim was told over a run, by verdict: unknown device, known.
#[derive(Default)]
struct Seen([BTreeMap<String, u32>; 2]);

impl Seen {
    async fn look(&mut self, daemon: &Daemon) {
        for (tally, device) in self.0.iter_mut().zip([None, Some(VICTIM_DEVICE)]) {
            *tally.entry(describe(&daemon.look(&victim(device)).await)).or_default() += 1;
        }
    }

    fn summary(&self, device: usize) -> String {
        let looks: u32 = self.0[device].values().sum();
        let mut parts: Vec<_> = self.0[device].iter().collect();
        parts.sort_by_key(|(_, n)| std::cmp::Reverse(**n));
        let parts: Vec<_> =
            parts.iter().map(|(v, n)| format!("{v} {:.0}%", **n as f64 * 100.0 / looks as f64)).collect();
        parts.join(", ")
    }
}

/// How long after the attack stops until both devices are allowed again,
/// looking every `step_ms`.
async fn recovery_ms(daemon: &Daemon, step_ms: u64, limit_ms: u64) -> u64 {
    let mut waited = 0;
    while waited < limit_ms {
        let unknown = daemon.look(&victim(None)).await.proceeds();
        if unknown && daemon.look(&victim(Some(VICTIM_DEVICE))).await.proceeds() {
            return waited;
        }
        daemon.advance(step_ms).await;
        waited += step_ms;
    }
    waited
}

/// way | attacker cost | what the user sees (unknown device) | known device
type Row = [String; 4];

/// Way 1: checks on her account from `addresses` of the attacker's, never
/// reported. The attacker polls every second; the victim looks first each
/// second, so she wins any place that lapsed since the attacker's last poll.
async fn places_in_flight(addresses: u32) -> Row {
    let daemon = Daemon::start("").await;
    let (minutes, warm_up) = (5, 1);
    let (mut admitted, mut requests, mut seen) = (0u32, 0u32, Seen::default());
    for second in 0..minutes * 60 {
        daemon.advance(SECOND_MS).await;
        if second >= warm_up * 60 {
            seen.look(&daemon).await;
        }
        for n in 1..=addresses {
            let address = format!("203.0.113.{n}");
            for _ in 0..6 {
                let v = daemon.check(&from(&address, VICTIM)).await;
                if second >= warm_up * 60 {
                    requests += 1;
                    admitted += u32::from(v.proceeds());
                }
                if !v.proceeds() {
                    break;
                }
            }
        }
    }
    let lasts = recovery_ms(&daemon, SECOND_MS, 10 * MINUTE_MS).await;
    let per_minute = |n: u32| n / (minutes - warm_up);
    [
        format!("1. places in flight: unreported checks, {addresses} addresses"),
        format!(
            "{} admitted checks/min ({} requests/min polling each second), {addresses} addresses, no failure",
            per_minute(admitted),
            per_minute(requests)
        ),
        format!("{}; for {} s after it stops", seen.summary(0), lasts / SECOND_MS),
        seen.summary(1),
    ]
}

/// Way 2: real failed logins on her account from `pool` addresses, only
/// when the account-wide ceiling has room (every 10 s).
async fn failures_from_many_sources(pool: usize) -> Row {
    let daemon = Daemon::start("").await;
    let (minutes, warm_up) = (60, 15);
    let (mut failures, mut challenged, mut used, mut seen) = (0u32, 0u32, vec![false; pool], Seen::default());
    for tick in 0..minutes * 6 {
        daemon.advance(10 * SECOND_MS).await;
        let measuring = tick >= warm_up * 6;
        if measuring {
            seen.look(&daemon).await;
        }
        for (n, used) in used.iter_mut().enumerate() {
            let v = daemon.fail(&from(&format!("203.0.113.{}", 101 + n), VICTIM)).await;
            if v.decision == Decision::Deny && v.rule == "account_failures" {
                break;
            }
            if v.decision != Decision::Deny {
                *used = true;
                if measuring {
                    failures += 1;
                    challenged += u32::from(v.decision == Decision::Challenge);
                }
            }
        }
        tokio::time::sleep(TICK_WAIT).await;
    }
    let lasts = recovery_ms(&daemon, MINUTE_MS, 120 * MINUTE_MS).await;
    let per_minute = failures as f64 / (minutes - warm_up) as f64;
    [
        format!("2. failures from many sources, {pool} addresses offered"),
        format!(
            "{per_minute:.1} failed logins/min ({challenged} of {failures} past a challenge), {} addresses used",
            used.iter().filter(|u| **u).count()
        ),
        format!("{}; for {} min after it stops", seen.summary(0), lasts / MINUTE_MS),
        seen.summary(1),
    ]
}

/// Way 3: failures that raise a spray flag. The first burst fails until
/// the victim's unknown device is challenged; the same number is repeated
/// every `every_min` minutes (61: just after the flag's hour, see
/// `steady_spray`), three times, and the victim looks every minute.
async fn spray_flag(way: &str, sources: &[String], every_min: u32, account_of: impl Fn(u32) -> String) -> Row {
    let daemon = Daemon::start("").await;
    let mut burst = 0;
    while burst < 200 && daemon.look(&victim(None)).await.proceeds() {
        daemon.fail(&from(&sources[burst as usize % sources.len()], &account_of(burst))).await;
        burst += 1;
        tokio::time::sleep(PUBLISH_WAIT).await;
    }
    let (mut seen, mut challenged) = (Seen::default(), [0u32; 3]);
    for minute in 0..3 * every_min {
        if minute > 0 && minute % every_min == 0 {
            for n in 0..burst {
                daemon.fail(&from(&sources[n as usize % sources.len()], &account_of(n + minute * 1000))).await;
            }
            tokio::time::sleep(PUBLISH_WAIT).await;
        }
        seen.look(&daemon).await;
        challenged[(minute / every_min) as usize] += u32::from(!daemon.look(&victim(None)).await.proceeds());
        daemon.advance(MINUTE_MS).await;
        tokio::time::sleep(PUBLISH_WAIT).await;
    }
    let used = sources.len().min(burst as usize);
    [
        format!("3. {way}"),
        format!(
            "{burst} failed logins every {every_min} min ({:.2}/min) from {used} addresses",
            burst as f64 / every_min as f64
        ),
        format!("{}; challenged minutes of each burst's {every_min}: {challenged:?}", seen.summary(0)),
        seen.summary(1),
    ]
}

/// A spray that never pauses: one failure a minute on her account, from 8
/// addresses in turn, for three hours. The detector fires on every one,
/// but an extended flag is not republished to the request path (only a
/// new or expired one is), so what checks see lapses an hour after the
/// first raise and the flag, extended forever, is never raised anew.
async fn steady_spray(sources: &[String]) -> Row {
    let daemon = Daemon::start("").await;
    let (mut seen, mut challenged) = (Seen::default(), [0u32; 3]);
    for minute in 0..180u32 {
        daemon.fail(&from(&sources[minute as usize % sources.len()], VICTIM)).await;
        tokio::time::sleep(PUBLISH_WAIT).await;
        seen.look(&daemon).await;
        challenged[minute as usize / 60] += u32::from(!daemon.look(&victim(None)).await.proceeds());
        daemon.advance(MINUTE_MS).await;
        tokio::time::sleep(PUBLISH_WAIT).await;
    }
    [
        "3. account_distributed, steady: one failure a minute, never pausing".into(),
        format!("1 failed login/min from {} addresses, 3 hours", sources.len()),
        format!("{}; challenged minutes in hours 1, 2, 3: {challenged:?}", seen.summary(0)),
        seen.summary(1),
    ]
}

/// Logins a fresh prefix gets admitted at once, and then per minute
/// (the `source_rate` rule, measured rather than read from the config),
/// and the built-in `entries_max` of `source_failures` as `status` says it.
async fn admission_per_prefix() -> (u64, u64, u64) {
    let daemon = Daemon::start("").await;
    let entries_max = daemon.rule("source_failures").await.entries_max;
    let (mut n, mut burst, mut per_minute) = (0u64, 0u64, 0u64);
    for second in 0..=60 {
        loop {
            n += 1;
            let v = daemon.look(&from("2001:db8:99::1", &format!("rate-{n}"))).await;
            if !v.proceeds() {
                break;
            }
            *(if second == 0 { &mut burst } else { &mut per_minute }) += 1;
        }
        daemon.advance(SECOND_MS).await;
    }
    (burst, per_minute, entries_max)
}

/// Unreported checks on distinct fresh accounts, each attacker prefix a
/// /64 of one /48 sending until `source_rate` refuses it.
struct Flood {
    accounts: u64,
    prefixes: u64,
}

impl Flood {
    async fn send(&mut self, daemon: &Daemon, prefix: u64) -> (u64, u64) {
        let (mut admitted, before) = (0, daemon.presumed("source_failures").await);
        loop {
            self.accounts += 1;
            let v =
                daemon.check(&from(&format!("2001:db8:bad:{prefix:x}::1"), &format!("flood-{}", self.accounts))).await;
            if !v.proceeds() {
                return (admitted, daemon.presumed("source_failures").await - before);
            }
            admitted += 1;
        }
    }

    /// Whether a bystander's fresh check now finds the map full.
    async fn full(&mut self, daemon: &Daemon) -> bool {
        self.accounts += 1;
        let account = format!("bystander-{}", self.accounts);
        let bystander = from("192.0.2.1", &account);
        let before = daemon.presumed("source_failures").await;
        daemon.look(&bystander).await;
        daemon.presumed("source_failures").await > before
    }
}

/// What the victim (or a stranger) does once the maps are full.
#[derive(Clone, Copy)]
enum Play {
    /// Three wrong passwords, then her right one.
    Typos { known_device: bool },
    /// A stranger's 50 unreported checks on her account from one address.
    StrangerChecks,
}

/// Way 4, one run: fill the maps of places at `entries_max`, keep them full
/// for a minute with the same prefixes at their steady rate, then `play`.
async fn full_map(entries_max: u64, play: Play) -> (String, String, bool) {
    let config = format!(
        "[routes.login.rules.source_failures]\nentries_max = {entries_max}\n\
         [routes.login.rules.account_failures]\nentries_max = {entries_max}\n"
    );
    let daemon = Daemon::start(&config).await;
    let mut flood = Flood { accounts: 0, prefixes: 0 };
    let (mut to_fill, mut first_presumed) = (0, None);
    // One fresh prefix's burst after another, until a burst is almost all
    // presumed (its checks found no room for a place).
    loop {
        let (admitted, presumed) = flood.send(&daemon, flood.prefixes).await;
        flood.prefixes += 1;
        if presumed > 0 && first_presumed.is_none() {
            first_presumed = Some(to_fill + admitted - presumed);
        }
        to_fill += admitted;
        if presumed * 20 >= admitted * 19 || flood.prefixes > 4 * entries_max / 100 {
            break;
        }
    }
    let (mut full_seconds, mut kept) = (0, 0);
    for _ in 0..60 {
        daemon.advance(SECOND_MS).await;
        for prefix in 0..flood.prefixes {
            kept += flood.send(&daemon, prefix).await.0;
        }
        full_seconds += u32::from(flood.full(&daemon).await);
    }
    let fill = format!(
        "first presumed at check {}, full after {to_fill} unreported checks from {} /64s of one /48; kept full \
         {full_seconds} of 60 s with {kept}/min",
        first_presumed.unwrap_or(0),
        flood.prefixes,
    );
    let presumed = || async { daemon.presumed("source_failures").await + daemon.presumed("account_failures").await };
    let before = presumed().await;
    let (told, refused) = match play {
        Play::Typos { known_device } => {
            let her = victim(known_device.then_some(VICTIM_DEVICE));
            let mut told = Vec::new();
            for _ in 0..3 {
                told.push(describe(&daemon.fail(&her).await));
            }
            let last = daemon.look(&her).await;
            told.push(format!("then her password: {}", describe(&last)));
            (told, !last.proceeds())
        }
        Play::StrangerChecks => {
            for _ in 0..50 {
                daemon.check(&from("2001:db8:bad:ffff::1", VICTIM)).await;
            }
            let v = daemon.look(&victim(None)).await;
            let known = describe(&daemon.look(&victim(Some(VICTIM_DEVICE))).await);
            (vec![format!("unknown device: {}", describe(&v)), format!("known: {known}")], !v.proceeds())
        }
    };
    (fill, format!("{} ({} presumed failures)", told.join("; "), presumed().await - before), refused)
}

/// `full_map` on fresh daemons `FULL_MAP_RUNS` times: whether the map is
/// full on the victim's shard of a rule depends on where the daemon's
/// secret puts her keys. The first run's figures, its story, and in how
/// many runs she was refused at the end.
async fn full_map_runs(entries_max: u64, play: Play) -> (String, String) {
    let (fill, story, refused) = full_map(entries_max, play).await;
    let mut refusals = u32::from(refused);
    for _ in 1..FULL_MAP_RUNS {
        refusals += u32::from(full_map(entries_max, play).await.2);
    }
    (fill, format!("{story}; refused at the end in {refusals} of {FULL_MAP_RUNS} runs"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let entries_max: u64 = std::env::var("WEAPON_ENTRIES_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(3_200);
    let mut rows = Vec::new();
    for addresses in [10, 9, 7, 5] {
        rows.push(places_in_flight(addresses).await);
    }
    for pool in [10, 9] {
        rows.push(failures_from_many_sources(pool).await);
    }
    let stranger_addresses: Vec<String> = (0..8).map(|n| format!("203.0.113.{}", 201 + n)).collect();
    let made_up = |n: u32| format!("made-up-{n}");
    rows.push(
        spray_flag("account_distributed: failures on her account", &stranger_addresses, 61, |_| VICTIM.into()).await,
    );
    rows.push(steady_spray(&stranger_addresses).await);
    rows.push(spray_flag("narrow_spray: a stranger behind her own address", &[VICTIM_HOME.into()], 61, made_up).await);
    let her_24: Vec<String> = (0..16).map(|n| format!("198.51.100.{}", 100 + n)).collect();
    rows.push(spray_flag("wide_spray: 16 other addresses of her /24", &her_24, 61, made_up).await);
    let (burst, per_minute, entries_max_default) = admission_per_prefix().await;
    let (fill, unknown) = full_map_runs(entries_max, Play::Typos { known_device: false }).await;
    let (_, known) = full_map_runs(entries_max, Play::Typos { known_device: true }).await;
    let (_, stranger) = full_map_runs(entries_max, Play::StrangerChecks).await;
    // A prefix holds at most what it is admitted within one place's life.
    let places_per_prefix = burst.max(per_minute * ATTEMPT_TIMEOUT_MS / MINUTE_MS);
    rows.push([
        format!("4. a full map of places (entries_max {entries_max}): 3 typos, then her password"),
        format!(
            "{fill}. Measured per /64: {burst} at once, then {per_minute}/min. At the default {entries_max_default} \
             (status): ~{} /64s to fill, ~{} checks/min from ~{} /64s to keep full",
            entries_max_default.div_ceil(burst),
            entries_max_default * MINUTE_MS / ATTEMPT_TIMEOUT_MS,
            entries_max_default.div_ceil(places_per_prefix),
        ),
        unknown,
        known,
    ]);
    rows.push([
        "4b. while full: a stranger's 50 unreported checks on her account, one address".into(),
        "50 checks, once, from one /64".into(),
        stranger,
        "(in the left column)".into(),
    ]);
    println!("| way | attacker cost | what the user sees (unknown device) | known device |");
    println!("|---|---|---|---|");
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
}
