//! Command-line interface: flags defined once (clap derive) and used for
//! parsing and `--help`. `serve` starts the daemon (see `main.rs`); every
//! other command is a client of a running daemon.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::client::{Client, ClientConfig, ClientError};
use crate::config::SOCKET_PATH_DEFAULT;
use crate::format::{at_time, human_duration, json, parse_duration, status_json};
use crate::protocol::{Decision, Outcome, Request, Subject};
use crate::stdout::{out, outln};

mod bans;
mod inspect;
mod man;
mod print;
mod reload;
pub use man::{man_page, print_man_page};
use print::{
    print_distributions, print_samples, print_shared, print_signals, print_status, print_verdict,
    STATUS_ACTIVITY_LISTED,
};

#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about = "Per-host login rate limiter: daemon and CLI")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Serve(ServeArgs),
    /// Check a configuration as `serve` would read it, and its class file,
    /// without starting or creating anything: every problem at once; exit 0
    /// when valid, 78 when not (like `nginx -t`).
    CheckConfig(CheckConfigArgs),
    /// Ask whether an attempt may proceed (spends from rate budgets).
    ///
    /// Exit status: 0 allow, 3 delay (proceed after the delay), 4 challenge,
    /// 5 deny, 1 an error (no daemon, a refused request), 2 a usage error.
    Check(AttemptArgs),
    /// Report an attempt's outcome (moves failure counters).
    Report(ReportArgs),
    /// Limits in force, table fill, uptime and verdict counts.
    Status(CommonArgs),
    /// The same figures in the Prometheus text format (for a textfile collector).
    Metrics(MetricsArgs),
    /// A live view of a running daemon (q quits; read-only).
    ///
    /// Verdicts per second by route, check latency, table fill, the top
    /// refused prefixes and failing accounts (digests, never names), spray
    /// flags, monitor mode's would-be refusals, lockouts as they happen and
    /// attempts per account per day. Tab or 1-3 turn pages; q, Esc or
    /// Ctrl-C quits. Plain text when stdout is not a terminal; `--once
    /// --json` prints one snapshot for scripts. It only reads: nothing it
    /// does changes the daemon.
    Top(crate::top::TopArgs),
    /// Keys currently refused by a failure rule (digests, never names).
    Lockouts(LockoutsArgs),
    /// A uniform sample of monitor mode's would-be refusals: when, which
    /// rule, the client's network and class, account and device digests,
    /// and whether the device was known (never a name).
    Sample(SampleArgs),
    /// An account's standing on each rule of a route, read without
    /// changing anything (admin): failures, attempts in flight, lockouts
    /// and until when, rate budgets left, spray flags.
    ///
    /// Exit status: 0 when no enforcing rule would refuse a check now, 5
    /// when one would (a lockout, attempts in flight, a spent budget, a
    /// flag), 1 an error (permission denied: not an admin).
    Inspect(inspect::InspectArgs),
    /// Reload the daemon's config and class file and wait for its answer:
    /// exit 0 when it applied them, 1 when it refused them (the unit's
    /// `ExecReload=`).
    Reload(reload::ReloadArgs),
    /// Clear an account's lockouts and counters on a route, or with `--ip`
    /// alone lift a ban (admin).
    ///
    /// Exit status: 0 when something was cleared, 6 when nothing was (no
    /// lockout or count of the account on the route; no ban on exactly that
    /// network), 1 an error.
    Unlock(UnlockArgs),
    /// Refuse every check from a source network for a while (admin):
    /// durable across restarts, listed by `lockouts`, lifted by `unlock
    /// --ip` or when it ends. Checks from it are denied with the reason
    /// `banned`, whatever the rules and exemptions say.
    Ban(bans::BanArgs),
    /// Move a --manual-clock daemon's clock (admin; for tests).
    Clock {
        #[command(subcommand)]
        command: ClockCommand,
    },
    /// Load-test a running daemon: throughput and latency percentiles.
    Bench(crate::bench::BenchArgs),
    /// Replay generated attacks and legitimate traffic through the limiter
    /// and spray detection on a simulated clock: detection latency and
    /// false positives (no daemon needed).
    Simulate(crate::sim::SimulateArgs),
    /// Run a decision log through a candidate configuration on the log's
    /// own clock: per rule, what it would have refused, and the people it
    /// would have bothered (no daemon needed).
    Replay(crate::sim::replay::ReplayArgs),
    /// A bare length-prefixed echo server: the transport floor for `bench --raw`.
    EchoServer {
        /// The socket to listen on.
        #[arg(long)]
        socket: PathBuf,
        /// Decode each request and answer it with one fixed `allow` verdict
        /// instead of echoing it: the server loop and codec without the
        /// limiter, for `bench` without `--raw`.
        #[arg(long)]
        verdict: bool,
    },
    /// Print the man page (roff): `tollgate man > /usr/local/share/man/man1/tollgate.1`.
    Man,
    /// Print shell completions: `tollgate completions bash > /etc/bash_completion.d/tollgate`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Config file; without it, /etc/tollgate/tollgate.toml if present, else built-in defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// Config file; without it, /etc/tollgate/tollgate.toml if present, else built-in defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Socket path [default: /run/tollgate/tollgate.sock, or the config's].
    #[arg(long, env = "TOLLGATE_SOCKET")]
    pub socket: Option<PathBuf>,
    /// State file [default: /var/lib/tollgate/state.redb, or the config's].
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Secret key file [default: `secret` next to the state file].
    #[arg(long)]
    pub secret: Option<PathBuf>,
    /// Start the clock at 2030-01-01T00:00:00Z and move it only with `tollgate clock advance`.
    #[arg(long)]
    pub manual_clock: bool,
    /// If the state file is corrupt, move it aside and start empty instead of refusing to start.
    #[arg(long)]
    pub discard_corrupt_state: bool,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The daemon's socket.
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = SOCKET_PATH_DEFAULT)]
    pub socket: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the daemon.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `metrics` prints one format only, so it takes no `--json`.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// The daemon's socket.
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = SOCKET_PATH_DEFAULT)]
    pub socket: PathBuf,
    /// How long to wait for the daemon.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct AttemptArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Route (rule set), e.g. login, reauth, request.
    #[arg(long)]
    pub route: String,
    /// The peer address the auth server saw.
    #[arg(long)]
    pub ip: IpAddr,
    /// The raw X-Forwarded-For header.
    #[arg(long)]
    pub xff: Option<String>,
    /// The account (user name) the attempt is for.
    #[arg(long)]
    pub account: Option<String>,
    /// The device's identifier (a long-lived cookie or device id).
    #[arg(long)]
    pub device: Option<String>,
    /// The tenant, on a multi-tenant auth server.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The OAuth client id (the `token` route).
    #[arg(long)]
    pub client_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub attempt: AttemptArgs,
    /// Whether the credential was right.
    #[arg(long, value_parser = outcome_parser())]
    pub outcome: Outcome,
}

#[derive(Debug, Args)]
pub struct LockoutsArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// List at most this many.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct SampleArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print at most this many, newest first.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct UnlockArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The route whose rules are cleared, e.g. login.
    #[arg(long, required_unless_present = "ip")]
    pub route: Option<String>,
    /// The account whose lockouts and counters are cleared.
    #[arg(long, required_unless_present = "ip")]
    pub account: Option<String>,
    /// Clear only this source's entries (and the account-wide ones).
    #[arg(long)]
    pub source: Option<IpAddr>,
    /// Instead: lift the ban on exactly this network (as `tollgate lockouts` lists it).
    #[arg(long, value_parser = bans::parse_network, conflicts_with_all = ["route", "account", "source"])]
    pub ip: Option<ipnet::IpNet>,
}

#[derive(Debug, Subcommand)]
pub enum ClockCommand {
    /// Move the clock forward, e.g. `15m`, `90s`, `1h`.
    Advance {
        /// How far, e.g. 15m.
        #[arg(value_parser = parse_duration)]
        by: Duration,
        #[command(flatten)]
        common: CommonArgs,
    },
}

/// The one line a failed command ends with, on standard error. An error
/// may quote a daemon's reply or a file, so it is made printable as
/// standard output is.
pub fn print_error(e: &dyn std::fmt::Display) {
    eprintln!("tollgate: error: {}", crate::stdout::printable(&e.to_string()));
}

/// `tollgate simulate`: no daemon, so not a client command.
pub fn simulate(args: &crate::sim::SimulateArgs) -> std::process::ExitCode {
    match crate::sim::simulate(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            print_error(&format_args!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `tollgate top`: its own loop (it waits for keys between ticks), so not
/// one request through `run`.
pub fn top(args: &crate::top::TopArgs) -> std::process::ExitCode {
    crate::top::run(args)
}

/// `tollgate replay`: no daemon, so not a client command.
pub fn replay(args: &crate::sim::replay::ReplayArgs) -> std::process::ExitCode {
    match crate::sim::replay::replay(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            print_error(&format_args!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `--outcome`: one of two words, listed in `--help` and in an error.
fn outcome_parser() -> impl clap::builder::TypedValueParser<Value = Outcome> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["success", "failure"]).map(|word| {
        if word == "success" {
            Outcome::Success
        } else {
            Outcome::Failure
        }
    })
}

impl AttemptArgs {
    fn subject(&self) -> Subject<'_> {
        Subject {
            peer: Some(self.ip),
            forwarded_for: self.xff.as_deref(),
            account: self.account.as_deref(),
            device: self.device.as_deref(),
            tenant: self.tenant.as_deref(),
            client_id: self.client_id.as_deref(),
        }
    }
}

fn client(common: &CommonArgs) -> Client {
    Client::new(ClientConfig::new(&common.socket).timeout(common.timeout))
}

/// `tollgate check`'s exit status when the daemon answers: 0 for `allow`,
/// and one status per other verdict, so a shell script or `pam_exec` can
/// act on it (1 is any error, 2 a usage error).
pub const EXIT_DELAY: u8 = 3;
pub const EXIT_CHALLENGE: u8 = 4;
pub const EXIT_DENY: u8 = 5;
/// `tollgate unlock`'s exit status when it cleared nothing: the account had
/// no lockout or count on the route (a typo in it, or already lifted).
pub const EXIT_NOTHING_CLEARED: u8 = 6;

fn check_exit_code(decision: Decision) -> u8 {
    match decision {
        Decision::Allow => 0,
        Decision::Delay => EXIT_DELAY,
        Decision::Challenge => EXIT_CHALLENGE,
        Decision::Deny => EXIT_DENY,
    }
}

/// A client command's failure, with what to do about it when the daemon's
/// socket could not be reached (`socket`: the one the command used).
#[derive(Debug)]
pub struct CliError {
    error: ClientError,
    socket: Option<PathBuf>,
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::io::ErrorKind::{ConnectionRefused, NotFound, PermissionDenied};
        let io = match &self.error {
            ClientError::Connect { source, .. } | ClientError::Io(source) => Some(source.kind()),
            _ => None,
        };
        let Some(path) = &self.socket else { return self.error.fmt(f) };
        let path = path.display();
        match io {
            Some(NotFound) => write!(
                f,
                "no tollgate socket at {path}: is the daemon running (systemctl status tollgate)? \
                 Name another socket with --socket or TOLLGATE_SOCKET"
            ),
            Some(ConnectionRefused) => write!(
                f,
                "nothing listens on {path}: the daemon is not running (the socket was left by one that stopped; \
                 systemctl status tollgate)"
            ),
            Some(PermissionDenied) => write!(
                f,
                "not allowed to connect to {path}: the socket's mode and group ([server] socket_mode, \
                 socket_group) decide who may"
            ),
            _ => self.error.fmt(f),
        }
    }
}

impl Command {
    /// The socket a client command talks to.
    fn socket(&self) -> Option<&std::path::Path> {
        match self {
            Command::Check(a) => Some(&a.common.socket),
            Command::Report(a) => Some(&a.attempt.common.socket),
            Command::Status(c) => Some(&c.socket),
            Command::Metrics(a) => Some(&a.socket),
            Command::Lockouts(a) => Some(&a.common.socket),
            Command::Sample(a) => Some(&a.common.socket),
            Command::Unlock(a) => Some(&a.common.socket),
            Command::Ban(a) => Some(&a.common.socket),
            Command::Inspect(a) => Some(&a.common.socket),
            Command::Reload(a) => Some(&a.common.socket),
            Command::Clock { command: ClockCommand::Advance { common, .. } } => Some(&common.socket),
            _ => None,
        }
    }
}

/// Runs a client command; `Err` is one line for stderr.
pub async fn run(command: Command) -> Result<ExitCode, CliError> {
    let socket = command.socket().map(std::path::Path::to_path_buf);
    run_command(command).await.map_err(|error| CliError { error, socket })
}

async fn run_command(command: Command) -> Result<ExitCode, ClientError> {
    match command {
        Command::Serve(_) | Command::CheckConfig(_) => unreachable!("main handles serve and check-config"),
        Command::Man => {
            crate::stdout::write_bytes(&man_page()?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut <Cli as clap::CommandFactory>::command(), "tollgate", &mut script);
            crate::stdout::write_bytes(&script);
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate(_) => unreachable!("main handles simulate"),
        Command::Top(_) => unreachable!("main handles top"),
        Command::Replay(_) => unreachable!("main handles replay"),
        Command::Bench(args) => {
            let json_out = args.json;
            let r = crate::bench::run(args).await?;
            if json_out {
                outln!("{}", json(&r));
            } else {
                outln!(
                    "{} ops/s  ({} requests in {:.1} s, {} connections x {} in flight, route {})",
                    r.ops_per_s.round(),
                    r.requests,
                    r.duration_s,
                    r.connections,
                    r.in_flight,
                    r.route
                );
                outln!("latency us: p50 {}  p99 {}  p99.9 {}  max {}", r.p50_us, r.p99_us, r.p999_us, r.max_us);
                if r.offered_ops_per_s > 0.0 {
                    outln!("offered {} ops/s, paced", r.offered_ops_per_s.round());
                }
                if r.floor_requests > 0 {
                    outln!(
                        "echo floor, timed alongside: {} replies, latency us: p50 {}  p99 {}  p99.9 {}  max {}",
                        r.floor_requests,
                        r.floor_p50_us,
                        r.floor_p99_us,
                        r.floor_p999_us,
                        r.floor_max_us
                    );
                }
                outln!(
                    "refused {} (latency us: p50 {}  p99 {})  errors {}",
                    r.refused,
                    r.refused_p50_us,
                    r.refused_p99_us,
                    r.errors
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::EchoServer { socket, verdict } => {
            let _ = std::fs::remove_file(&socket);
            let listener = tokio::net::UnixListener::bind(&socket)?;
            let reply = if verdict { crate::bench::EchoReply::FixedVerdict } else { crate::bench::EchoReply::Echo };
            crate::bench::echo_server(listener, reply).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => {
            let request = Request::Check { route: &args.route, subject: args.subject() };
            let decision = print_verdict(&args.common, client(&args.common).call_versioned(&request).await?)?;
            Ok(ExitCode::from(check_exit_code(decision)))
        }
        Command::Report(args) => {
            let a = &args.attempt;
            let request =
                Request::Report { route: &a.route, subject: a.subject(), outcome: args.outcome, password_digest: None };
            print_verdict(&a.common, client(&a.common).call_versioned(&request).await?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(common) => {
            let client = client(&common);
            let full = client.status_full().await?;
            // A daemon older than version 4 has no activity to give.
            let activity = client.activity(STATUS_ACTIVITY_LISTED).await.ok();
            let (status, shared, signals) = (&full.status, &full.shared, &full.signals);
            if common.json {
                let mut value = status_json(&full);
                value["activity"] = serde_json::to_value(&activity).expect("plain data serializes");
                outln!("{value}");
            } else {
                print_status(status);
                if let Some(shared) = shared {
                    print_shared(shared);
                }
                if let Some(signals) = signals {
                    print_signals(signals, status.now_ms);
                }
                if let Some(activity) = &activity {
                    print_distributions(activity);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Metrics(args) => {
            let common = CommonArgs { socket: args.socket, json: false, timeout: args.timeout };
            let client = client(&common);
            let full = client.status_full().await?;
            let activity = client.activity(0).await.ok();
            out!(
                "{}",
                crate::metrics::prometheus(
                    &full.status,
                    full.shared.as_ref(),
                    full.signals.as_ref(),
                    activity.as_ref()
                )
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Sample(args) => {
            let (samples, seen, since_ms) = client(&args.common).samples(args.limit).await?;
            if args.common.json {
                outln!("{}", serde_json::json!({ "samples": samples, "seen": seen, "since_ms": since_ms }));
            } else {
                print_samples(&samples, seen, since_ms);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Lockouts(args) => {
            let (lockouts, total) = client(&args.common).lockouts(args.limit).await?;
            if args.common.json {
                outln!("{}", serde_json::json!({ "lockouts": lockouts, "total": total }));
            } else {
                // Every lockout is listed before the keys refused only by
                // attempts in flight (checks not yet reported), which the
                // total leaves out.
                let locked = (total as usize).min(lockouts.len());
                outln!("{total} active lockout(s){}", if total as usize > locked { " (list truncated)" } else { "" });
                for (i, l) in lockouts.iter().enumerate() {
                    if l.route == crate::bans::LISTED_ROUTE {
                        let reason = l.rule.split_once(": ").map_or(String::new(), |(_, r)| format!("  reason: {r}"));
                        let (until, left) = (at_time(l.until_ms), human_duration(l.retry_after_ms));
                        outln!("ban {}  every route  until {until}  (retry after {left}){reason}", l.key);
                        continue;
                    }
                    outln!(
                        "{}/{}  key {}  count {}{}  until {}  (retry after {})",
                        l.route,
                        l.rule,
                        l.key,
                        l.count,
                        if i >= locked { " + attempts in flight" } else { "" },
                        at_time(l.until_ms),
                        human_duration(l.retry_after_ms)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect(args) => Ok(ExitCode::from(inspect::inspect(&client(&args.common), &args).await?)),
        Command::Reload(args) => reload::reload(&client(&args.common), &args).await,
        Command::Ban(args) => bans::ban(&client(&args.common), &args).await,
        Command::Unlock(args) => {
            let (route, account) = match (args.ip, &args.route, &args.account) {
                (Some(network), ..) => return bans::unban(&client(&args.common), network, args.common.json).await,
                (None, Some(route), Some(account)) => (route, account),
                _ => unreachable!("clap requires --route and --account without --ip"),
            };
            let cleared = client(&args.common).unlock(route, account, args.source).await?;
            if args.common.json {
                outln!("{}", serde_json::json!({ "cleared": cleared }));
            } else if cleared == 0 {
                outln!("cleared nothing: {account} has no lockout or count on route {route}");
            } else {
                outln!("cleared {cleared} entr{}", if cleared == 1 { "y" } else { "ies" });
            }
            Ok(ExitCode::from(if cleared == 0 { EXIT_NOTHING_CLEARED } else { 0 }))
        }
        Command::Clock { command: ClockCommand::Advance { by, common } } => {
            let now_ms = client(&common).advance_clock(by).await?;
            if common.json {
                outln!("{}", serde_json::json!({ "now_ms": now_ms }));
            } else {
                outln!("clock now {now_ms} ms since the epoch");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
