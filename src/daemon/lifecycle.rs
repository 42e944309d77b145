//! `tollgate serve`, step by step: read the configuration, open the state
//! file under its key, restore the tables, listen, serve until a signal, and
//! save everything on the way out.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use tokio::net::UnixListener;

use super::Daemon;
use crate::access::Access;
use crate::classes::{ClassFileError, ClassTable};
use crate::cli::{CheckConfigArgs, ServeArgs};
use crate::clock::Clock;
use crate::config::{Config, ConfigError, CONFIG_PATH_DEFAULT};
use crate::keys::KeyDeriver;
use crate::limiter::Limiter;
use crate::notify::{self, Notifier};
use crate::server;
use crate::store::{Durable, StoreStats};

/// The target of the start and stop lines: the binary's, where they were
/// logged before start-up moved here (see `super::LOG_TARGET`).
pub(super) const START_LOG_TARGET: &str = "tollgate";

/// Exit code for an invalid configuration (sysexits EX_CONFIG).
const EXIT_CONFIG: u8 = 78;

/// Runs `tollgate serve` to its end: the process's exit code.
pub fn serve(args: ServeArgs) -> ExitCode {
    init_logging();
    let config = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match start(args, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `tollgate check-config`: the file read and validated as `serve`
/// would, and its class file loaded, every problem printed at once; nothing
/// is started, created or written.
pub fn check_config(args: &CheckConfigArgs) -> ExitCode {
    let serve = ServeArgs { config: args.config.clone(), ..ServeArgs::default() };
    let path = args.config.clone().unwrap_or_else(|| CONFIG_PATH_DEFAULT.into());
    let config = match load_config(&serve) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = load_classes(&config) {
        eprintln!("tollgate: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let source = if path.exists() { path.display().to_string() } else { "the built-in defaults".into() };
    crate::stdout::outln!(
        "{source}: valid ({} routes; socket {}, state {})",
        config.routes.len(),
        config.socket.display(),
        config.state.display()
    );
    ExitCode::SUCCESS
}

/// `TOLLGATE_LOG_FORMAT=json`: one JSON object a line, for log shippers;
/// anything else (or unset) is the text format.
const LOG_FORMAT_ENV: &str = "TOLLGATE_LOG_FORMAT";

fn init_logging() {
    let format = std::env::var(LOG_FORMAT_ENV).unwrap_or_default();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // By default a failed log write is reported with `eprintln!`, which
        // panics when stderr cannot be written (a full disk under the log):
        // that killed the state writer and snapshot threads while the
        // daemon kept answering. A lost log line must cost only itself.
        .log_internal_errors(false);
    if format == "json" {
        builder.json().init();
        return;
    }
    builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    if !format.is_empty() && format != "text" {
        tracing::warn!(target: START_LOG_TARGET, value = %format, "{LOG_FORMAT_ENV} is json or text; logging as text");
    }
}

/// The configuration file (when there is one) over the built-in defaults,
/// with the command line's paths winning over the file's.
pub fn load_config(args: &ServeArgs) -> Result<Config, ConfigError> {
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (CONFIG_PATH_DEFAULT.into(), false),
    };
    let mut raw = Config::read_raw(&path, required)?;
    raw.socket = args.socket.clone().or(raw.socket);
    raw.state = args.state.clone().or(raw.state);
    raw.secret = args.secret.clone().or(raw.secret);
    Config::build(raw).map_err(|errors| ConfigError::Invalid { path, errors })
}

fn load_classes(config: &Config) -> Result<ClassTable, ClassFileError> {
    match &config.class_file {
        Some(path) => ClassTable::load(path),
        None => Ok(ClassTable::default()),
    }
}

fn start(args: ServeArgs, config: Config) -> anyhow::Result<()> {
    // Past a file-size limit (RLIMIT_FSIZE) a write should fail like a full
    // disk, with an error the writer reports and retries, not kill the
    // daemon: SIGXFSZ gets a handler instead of its default action, before
    // the state file is first written.
    signal_hook::flag::register(signal_hook::consts::SIGXFSZ, Arc::new(AtomicBool::new(false)))?;
    // Stop and reload signals are caught from here on and held until the
    // signal thread reads them: a SIGTERM that arrives while the state file
    // is opened or the socket bound stops the daemon cleanly (after its
    // start-up) instead of killing it by the default action.
    let signals = SignalsInfo::<WithOrigin>::new([SIGTERM, SIGINT, SIGHUP])?;
    let clock = if args.manual_clock { Clock::manual() } else { Clock::System };
    // A daemon already answering on the socket: refused before anything is
    // created (a secret and a state file of its own, beside another's).
    // Under socket activation systemd holds the socket, which is ours.
    if std::env::var_os("LISTEN_FDS").is_none() && std::os::unix::net::UnixStream::connect(&config.socket).is_ok() {
        anyhow::bail!("cannot listen on {}: it is in use by a running daemon", config.socket.display());
    }
    let (secret, store, loaded) = super::state_file::open_state(&config, args.discard_corrupt_state)?;
    let key_derivation = store.key_derivation();
    let stats = Arc::new(StoreStats::default());
    let (journal, writer) = store.start_writer(stats.clone());
    // Spray detection runs even while `[signals]` is off, idle, so that a
    // reload can turn it on.
    let signals_config = config
        .signals
        .clone()
        .unwrap_or_else(|| Config::default().signals.expect("built-in defaults have spray detection on"));
    let keys = KeyDeriver::with_derivation(&secret, key_derivation);
    let (link, pump) = crate::signals::pump::channel(&signals_config, &keys);
    let limiter =
        Limiter::new(&config, Arc::new(load_classes(&config)?), keys, journal).with_signals(Some(link.clone()));
    let hosts_learned = loaded.hosts_learned;
    let restored = super::state_file::restore(&limiter, loaded, clock.now_us());
    let access = Access::resolve(&config.server, nix::unistd::geteuid().as_raw())?;
    let (activity_link, observer, activity_queue) = crate::activity::channel(&config.activity, clock.now_us());
    let observing = super::Observing { link: activity_link.clone(), observer: observer.clone() };
    let mut daemon = Daemon::new(limiter, clock.clone(), config.clone(), access, stats, observing);
    if let (Some(store), Some(hosts)) = (daemon.shared(), hosts_learned) {
        if store.config.hosts == 0 {
            store.remember_hosts(hosts);
            daemon.set_hosts(hosts);
            tracing::info!(target: START_LOG_TARGET, hosts, "hosts sharing the limits as last learned from the store (state file)");
        }
    }
    {
        let clock = clock.clone();
        std::thread::Builder::new()
            .name("tollgate-activity".into())
            .spawn(move || crate::activity::run(activity_queue, observer, activity_link, || clock.now_us()))?;
    }
    daemon.set_spray(super::Spray { engine: pump.engine(), link });
    if let Some(log_config) = &config.decision_log {
        let log = crate::decision_log::DecisionLog::start(
            log_config,
            clock.clone(),
            secret.digests_fingerprint(key_derivation),
        )
        .map_err(|e| anyhow::anyhow!("decision log {}: {e}", log_config.path.display()))?;
        tracing::info!(target: START_LOG_TARGET, path = %log_config.path.display(), "decision log on");
        daemon.set_decision_log(log);
    }
    daemon.open_files_max = raise_open_file_limit(&config);
    // Lives as long as the process: the limiter's link keeps it fed.
    std::thread::Builder::new().name("tollgate-spray".into()).spawn(move || pump.run(|| clock.now_us()))?;
    daemon.audit_exemptions_at_start();
    let daemon = Arc::new(daemon);
    // Opened now, while descriptors are plentiful, and kept: a watchdog ping
    // must not need a new descriptor (see `notify`).
    let notifier = open_notifier();

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    join_shared_store(
        &runtime,
        &daemon,
        &config,
        crate::shared::store_fingerprint(secret.fingerprint(), key_derivation),
    )?;
    let (listener, our_socket) = listen(&runtime, &config)?;
    // The metrics listener: bound now, so a port in use stops the start.
    let metrics = match &config.metrics {
        Some(at) => {
            let bound = runtime
                .block_on(async { super::scrape::bind(at) })
                .map_err(|e| anyhow::anyhow!("metrics listener {at:?}: {e}"))?;
            runtime.spawn(super::scrape::serve(bound, daemon.clone()));
            Some(at.clone())
        }
        None => None,
    };
    let (stopped, signals) = handle_signals(daemon.clone(), args, signals)?;
    let maintenance = Maintenance::spawn(daemon.clone(), Duration::from_millis(config.snapshot_interval_ms))?;
    tracing::info!(target: START_LOG_TARGET,
        socket = %config.socket.display(),
        state = %config.state.display(),
        restored = restored.rows.restored,
        expired = restored.rows.expired,
        redated = restored.rows.redated,
        overflow_cells = restored.rows.cells,
        known_devices = restored.known_devices,
        bans = restored.bans,
        damaged_rows = restored.damaged_rows,
        manual_clock = daemon.clock.is_manual(),
        key_derivation = key_derivation.number(),
        "tollgate listening"
    );
    // Ready: listening, state loaded. Then keep systemd's watchdog fed from
    // the event loop itself, so a wedged loop gets the daemon restarted.
    send_notification(&notifier, "READY=1\nSTATUS=serving\n");
    if let (Some(period), Some(notifier)) = (notify::watchdog_period(), notifier.clone()) {
        runtime.spawn(feed_watchdog(notifier, period));
    }
    if let Some(at) = &metrics {
        tracing::info!(target: START_LOG_TARGET, listen = ?at, "metrics listener on");
    }
    runtime.block_on(server::run(listener, daemon.clone(), async {
        let _ = stopped.await;
    }));
    send_notification(&notifier, "STOPPING=1\n");

    maintenance.stop();
    signals.close();
    daemon.stop_decision_log();
    let failed = save_all(&daemon);
    writer.stop();
    if our_socket.is_some() && server::socket_identity(&config.socket) == our_socket {
        let _ = std::fs::remove_file(&config.socket);
    }
    if failed > 0 {
        anyhow::bail!("{failed} shard(s) of counters could not be saved at stop");
    }
    tracing::info!(target: START_LOG_TARGET, "stopped; counters saved");
    Ok(())
}

/// Shared mode: connects to the store before listening (a store joined
/// with another secret or key derivation stops the start with the
/// reason), then keeps a supervisor running for the daemon's life.
fn join_shared_store(
    runtime: &tokio::runtime::Runtime,
    daemon: &Arc<Daemon>,
    config: &Config,
    fingerprint: String,
) -> anyhow::Result<()> {
    let Some(shared) = &config.shared else { return Ok(()) };
    let host_id = host_id(&config.socket);
    runtime.block_on(super::shared::join_at_start(daemon, &fingerprint, &host_id)).map_err(anyhow::Error::msg)?;
    runtime.spawn(super::shared::supervise(daemon.clone(), fingerprint, host_id));
    tracing::info!(target: START_LOG_TARGET, url = %shared.url, state = daemon.shared().map_or("", |s| s.state().name()), "shared store");
    Ok(())
}

/// One id per daemon that stays the same across its restarts, so the
/// store counts a restarted host once (`[shared] hosts = 0` learns the
/// count): the host name, and a digest of the socket path (two daemons on
/// one machine have two sockets) and the machine id, so that machines
/// cloned with one host name (and a machine id made at first boot, as
/// images leave it) still count as many. Both read where the shipped
/// unit's sandbox leaves them: `gethostname`, not /proc/sys (hidden by
/// `ProcSubset=pid`, as the boot id is), and /etc. A digest: no path is
/// written to the store.
fn host_id(socket: &std::path::Path) -> String {
    let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    let machine = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_default();
    host_id_of(&host, socket, machine.trim())
}

fn host_id_of(host: &str, socket: &std::path::Path, machine: &str) -> String {
    use std::hash::Hasher;
    let mut hash = siphasher::sip::SipHasher13::new();
    hash.write(socket.as_os_str().as_encoded_bytes());
    hash.write(machine.as_bytes());
    format!("{host}:{:016x}", hash.finish())
}

/// Raises the open-file limit as far as allowed and warns when it is below
/// what `connections_max` needs; returns the limit for `status` (0 if
/// unknown).
fn raise_open_file_limit(config: &Config) -> u64 {
    match server::raise_open_file_limit() {
        Ok(files) => {
            let needed = config.server.connections_max as u64 + crate::config::FILES_RESERVED_COUNT;
            if files.soft < needed {
                tracing::warn!(target: START_LOG_TARGET,
                    "open-file limit {} (hard {}) is below connections_max {} + {} reserved = {needed}: \
                     connections past it wait in the backlog; raise LimitNOFILE= or lower server.connections_max",
                    files.soft,
                    files.hard,
                    config.server.connections_max,
                    crate::config::FILES_RESERVED_COUNT,
                );
            } else if files.soft != files.soft_before {
                tracing::info!(target: START_LOG_TARGET, from = files.soft_before, to = files.soft, "open-file limit raised");
            }
            files.soft
        }
        Err(e) => {
            tracing::warn!(target: START_LOG_TARGET, error = %e, "cannot read the open-file limit");
            0
        }
    }
}

fn open_notifier() -> Option<Arc<Notifier>> {
    match Notifier::from_env() {
        Ok(n) => n.map(Arc::new),
        Err(e) => {
            tracing::warn!(target: START_LOG_TARGET, error = %e, "NOTIFY_SOCKET unusable; the service manager will not hear from us");
            None
        }
    }
}

fn send_notification(notifier: &Option<Arc<Notifier>>, message: &str) {
    if let Some(n) = notifier {
        if let Err(e) = n.send(message) {
            tracing::warn!(target: START_LOG_TARGET, error = %e, message = message.trim_end(), "notify failed");
        }
    }
}

/// Pings systemd's watchdog twice per period, as sd_watchdog_enabled(3)
/// advises, from the event loop itself.
async fn feed_watchdog(notifier: Arc<Notifier>, period: Duration) {
    let mut tick = tokio::time::interval(period / 2);
    loop {
        tick.tick().await;
        // Not logged: a failure repeats every tick, and systemd's own
        // message about the missed watchdog says it.
        let _ = notifier.send("WATCHDOG=1\n");
    }
}

/// The listening socket: the one systemd passes (socket activation: fd 3,
/// whose file systemd owns), or one we bind. Also returns our socket file's
/// identity, so that at stop we remove only a file we made.
fn listen(runtime: &tokio::runtime::Runtime, config: &Config) -> anyhow::Result<(UnixListener, Option<(u64, u64)>)> {
    if let Some(std_listener) = listenfd::ListenFd::from_env().take_unix_listener(0)? {
        std_listener.set_nonblocking(true)?;
        let _guard = runtime.enter();
        return Ok((UnixListener::from_std(std_listener)?, None));
    }
    let group = match &config.server.socket_group {
        Some(name) => Some(
            name.parse::<u32>()
                .ok()
                .or_else(|| crate::access::group_id(name))
                .with_context(|| format!("server.socket_group: no such group `{name}`"))?,
        ),
        None => None,
    };
    let listener = runtime
        .block_on(server::bind(&config.socket, config.server.socket_mode, group))
        .with_context(|| format!("cannot listen on {}", config.socket.display()))?;
    Ok((listener, server::socket_identity(&config.socket)))
}

/// Reads the signals caught since `signals` was made: SIGHUP reloads;
/// SIGTERM or SIGINT resolves the returned receiver, which stops the server.
/// Close the handle to end the thread.
fn handle_signals(
    daemon: Arc<Daemon>,
    args: ServeArgs,
    mut signals: SignalsInfo<WithOrigin>,
) -> anyhow::Result<(tokio::sync::oneshot::Receiver<()>, signal_hook::iterator::Handle)> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let handle = signals.handle();
    std::thread::Builder::new().name("tollgate-signals".into()).spawn(move || {
        for origin in signals.forever() {
            let signal = origin.signal;
            if signal == SIGHUP {
                // Read and validate everything before touching the running
                // configuration; a bad file changes nothing. The sender (the
                // kernel gives its pid and uid) is named in the audit lines.
                let sender = origin.process.map(|p| super::Sender { pid: p.pid, uid: p.uid });
                let loaded = load_config(&args).map_err(|e| e.to_string()).and_then(|config| {
                    let classes = load_classes(&config).map_err(|e| e.to_string())?;
                    Ok((config, Arc::new(classes)))
                });
                daemon.reload(loaded, sender);
                continue;
            }
            tracing::info!(target: START_LOG_TARGET, signal, "stopping");
            let _ = stop_tx.send(());
            break;
        }
    })?;
    Ok((stop_rx, handle))
}

/// The writes that bring the state file up to date: a whole rewrite when
/// an earlier write failed (the file may lack changes since dropped from
/// the queue), otherwise a snapshot of what changed.
fn writes_due(daemon: &Daemon, now_us: u64) -> (Vec<Durable>, bool) {
    let limiter = daemon.limiter.load();
    if daemon.store_stats.needs_rewrite.load(Ordering::Acquire) {
        (vec![limiter.rewrite(now_us)], true)
    } else {
        (limiter.snapshot(now_us, true), false)
    }
}

/// The final save at stop; returns how many writes failed.
fn save_all(daemon: &Daemon) -> usize {
    let now_us = daemon.clock.now_us();
    let (mut writes, _) = writes_due(daemon, now_us);
    writes.extend(daemon.limiter.load().save_store_counts(now_us));
    let mut failed = 0;
    for write in writes {
        if let Err(e) = write.wait_blocking() {
            tracing::error!(target: START_LOG_TARGET, error = %e, "final snapshot incomplete");
            failed += 1;
        }
    }
    failed
}

/// The snapshot thread: every `snapshot_interval_ms`, brings the state file
/// up to date and sweeps expired entries out of the tables.
struct Maintenance {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Maintenance {
    fn spawn(daemon: Arc<Daemon>, interval: Duration) -> std::io::Result<Maintenance> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("tollgate-snapshot".into()).spawn(move || {
            let mut tick = 0u64;
            while !stopping.load(Ordering::Acquire) {
                // Parked, not slept: a stop unparks it at once.
                std::thread::park_timeout(interval);
                if stopping.load(Ordering::Acquire) {
                    break;
                }
                let now = daemon.clock.now_us();
                let (writes, rewrite) = writes_due(&daemon, now);
                // Waiting for the commit bounds what is queued for the disk
                // to one snapshot, however fast keys churn.
                for write in writes {
                    if let Err(e) = write.wait_blocking() {
                        if rewrite {
                            tracing::warn!(target: START_LOG_TARGET, error = %e, "state file still not writable; will try again");
                        } else {
                            tracing::warn!(target: START_LOG_TARGET, error = %e, "snapshot not written; will retry");
                        }
                    }
                }
                if rewrite {
                    continue;
                }
                daemon.limiter.load().sweep(tick, now);
                tick += 1;
            }
        })?;
        Ok(Maintenance { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::host_id_of;
    use std::path::Path;

    /// A restart keeps the id; a clone with the same host name and socket
    /// path is another host by its machine id. Before, clones counted as
    /// one host, and each held a degraded share sized for fewer hosts.
    #[test]
    fn clones_with_one_host_name_and_socket_are_told_apart_by_their_machine_id() {
        let socket = Path::new("/run/tollgate/tollgate.sock");
        let (machine, clone) = ("6a1d4c0e93f44c53b39b5e3b0f6f7c01", "0b7e2f551c1a4d0e8f3c2a9d6e4b8c12");
        let id = host_id_of("auth-1", socket, machine);
        assert_eq!(id, host_id_of("auth-1", socket, machine), "the same daemon restarted");
        assert_ne!(id, host_id_of("auth-1", socket, clone), "a clone");
        assert_ne!(id, host_id_of("auth-1", Path::new("/run/tollgate/b.sock"), machine), "a second daemon here");
        assert!(id.starts_with("auth-1:"), "the host name stays readable: {id}");
    }

    /// Under the shipped unit's `ProcSubset=pid` /proc/sys is hidden: the
    /// id must not come from there, or every host's name reads empty and
    /// all count as one.
    #[test]
    fn the_host_id_names_this_host_without_reading_proc_sys() {
        let name = nix::unistd::gethostname().expect("a host name").to_string_lossy().into_owned();
        let id = super::host_id(Path::new("/run/tollgate/tollgate.sock"));
        assert!(!name.is_empty() && id.starts_with(&format!("{name}:")), "{id}");
        let source = include_str!("lifecycle.rs");
        let body =
            &source[source.find("fn host_id(").expect("host_id")..source.find("fn host_id_of(").expect("host_id_of")];
        assert!(!body.contains("/proc"), "{body}");
    }
}
