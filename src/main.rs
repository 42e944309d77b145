//! `tollgate serve` starts the daemon; every other subcommand is a client.
//! The request path starts in `server::run`; `lib.rs` maps the modules.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::sync::watch;

use tollgate::access::Access;
use tollgate::classes::ClassTable;
use tollgate::cli::{self, Cli, Command, ServeArgs};
use tollgate::clock::Clock;
use tollgate::config::{Config, ConfigError, CONFIG_PATH_DEFAULT};
use tollgate::keys::{KeyDeriver, Secret};
use tollgate::limiter::Limiter;
use tollgate::notify::{self, Notifier};
use tollgate::server::{self, Daemon};
use tollgate::store::{OpenOptions, Store, StoreError, StoreStats};

/// Exit code for an invalid configuration (sysexits EX_CONFIG).
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Man => {
            let printed = cli::man_page().and_then(|page| std::io::Write::write_all(&mut std::io::stdout(), &page));
            if let Err(e) = printed {
                eprintln!("tollgate: error: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        command => {
            // The load generator and the echo server want every core; the
            // CLI's one request, one thread.
            let runtime = if matches!(command, Command::Bench(_) | Command::EchoServer { .. }) {
                tokio::runtime::Builder::new_multi_thread().enable_all().build()
            } else {
                tokio::runtime::Builder::new_current_thread().enable_all().build()
            }
            .expect("tokio runtime");
            match runtime.block_on(cli::run(command)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // By default a failed log write is reported with `eprintln!`, which
        // panics when stderr cannot be written (a full disk under the log):
        // that killed the state writer and snapshot threads while the
        // daemon kept answering. A lost log line must cost only itself.
        .log_internal_errors(false)
        .init();
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

fn load_config(args: &ServeArgs) -> Result<Config, ConfigError> {
    let (path, required) = match &args.config {
        Some(p) => (p.clone(), true),
        None => (CONFIG_PATH_DEFAULT.into(), false),
    };
    let mut raw = Config::read_raw(&path, required)?;
    // Flags win over the file.
    raw.socket = args.socket.clone().or(raw.socket);
    raw.state = args.state.clone().or(raw.state);
    raw.secret = args.secret.clone().or(raw.secret);
    Config::build(raw).map_err(|errors| ConfigError::Invalid { path, errors })
}

fn load_classes(config: &Config) -> Result<ClassTable, tollgate::classes::ClassFileError> {
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
    use anyhow::Context;
    if let Some(dir) = config.secret.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // A missing secret is made in memory and written only once the state
    // file has accepted it: a state file with rows made under a lost key
    // is refused, and no new key is left behind to hide the loss.
    let (secret, secret_is_new) = match Secret::load(&config.secret)? {
        Some(secret) => (secret, false),
        None => (Secret::generate(&config.secret)?, true),
    };
    let clock = if args.manual_clock { Clock::manual() } else { Clock::System };

    let options = OpenOptions {
        discard_corrupt: args.discard_corrupt_state,
        key_fingerprint: Some(secret.fingerprint()),
        key_is_new: secret_is_new,
    };
    let opened = match Store::open_with(&config.state, options) {
        Err(StoreError::KeyMismatch { path, found, .. }) if secret_is_new => anyhow::bail!(
            "secret key file {} is missing, and state file {} holds state made with a secret key (key fingerprint {found:016x}): restore the secret key file, or start with --discard-corrupt-state to move the state file aside and start empty with a new key",
            config.secret.display(),
            path.display()
        ),
        Err(StoreError::KeyMismatch { path, found, expected }) => anyhow::bail!(
            "state file {} was written with another secret key than secret key file {} holds (key fingerprints {found:016x} and {expected:016x}): restore the secret key file the state was made with, or start with --discard-corrupt-state to move the state file aside and start empty",
            path.display(),
            config.secret.display()
        ),
        other => other?,
    };
    if secret_is_new {
        secret.save(&config.secret)?;
    }
    let (store, loaded) = (opened.store, opened.loaded);
    let stats = Arc::new(StoreStats::default());
    let (journal, writer) = store.start_writer(stats.clone());
    let classes = Arc::new(load_classes(&config)?);
    let limiter = Limiter::new(&config, classes, KeyDeriver::new(&secret), journal);
    let restored = limiter.restore(loaded.entries, clock.now_us());
    let known_devices = limiter.restore_known_devices(loaded.devices, clock.now_us());
    if restored.orphaned > 0 {
        tracing::warn!(orphaned = restored.orphaned, "persisted entries name rules not configured; deleted");
    }
    if restored.refused > 0 {
        tracing::warn!(refused = restored.refused, "persisted entries not restored: their tables are full of lockouts");
    }
    let access = Access::resolve(&config.server, nix::unistd::geteuid().as_raw())?;
    let mut daemon = Daemon::new(limiter, clock, config.clone(), access, stats);
    match server::raise_open_file_limit() {
        Ok(files) => {
            daemon.open_files_max = files.soft;
            let needed = config.server.connections_max as u64 + server::FILES_RESERVED_COUNT;
            if files.soft < needed {
                tracing::warn!(
                    "open-file limit {} (hard {}) is below connections_max {} + {} reserved = {needed}: \
                     connections past it wait in the backlog; raise LimitNOFILE= or lower server.connections_max",
                    files.soft,
                    files.hard,
                    config.server.connections_max,
                    server::FILES_RESERVED_COUNT,
                );
            } else if files.soft != files.soft_before {
                tracing::info!(from = files.soft_before, to = files.soft, "open-file limit raised");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the open-file limit"),
    }
    let daemon = Arc::new(daemon);
    // Opened now, while descriptors are plentiful, and kept: a watchdog ping
    // must not need a new descriptor (see `notify`).
    let notifier = match Notifier::from_env() {
        Ok(n) => n.map(Arc::new),
        Err(e) => {
            tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; the service manager will not hear from us");
            None
        }
    };
    let notify = |message: &str| {
        if let Some(n) = &notifier {
            if let Err(e) = n.send(message) {
                tracing::warn!(error = %e, message = message.trim_end(), "notify failed");
            }
        }
    };

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Socket activation: systemd passes the listening socket as fd 3 and
    // owns its file; otherwise bind it ourselves.
    let activated = listenfd::ListenFd::from_env().take_unix_listener(0)?;
    let socket_activated = activated.is_some();
    let listener = match activated {
        Some(std_listener) => {
            std_listener.set_nonblocking(true)?;
            let _guard = runtime.enter();
            tokio::net::UnixListener::from_std(std_listener)?
        }
        None => {
            let group = match &config.server.socket_group {
                Some(name) => Some(
                    name.parse::<u32>()
                        .ok()
                        .or_else(|| tollgate::access::group_id(name))
                        .with_context(|| format!("server.socket_group: no such group `{name}`"))?,
                ),
                None => None,
            };
            runtime
                .block_on(server::bind(&config.socket, config.server.socket_mode, group))
                .with_context(|| format!("cannot listen on {}", config.socket.display()))?
        }
    };
    let our_socket = if socket_activated { None } else { server::socket_identity(&config.socket) };

    let (stop_tx, stop_rx) = watch::channel(false);
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    let signal_handle = signals.handle();
    {
        let daemon = daemon.clone();
        std::thread::Builder::new().name("tollgate-signals".into()).spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    // Read and validate everything before touching the
                    // running configuration; a bad file changes nothing.
                    daemon.reload(load_config(&args).map_err(|e| e.to_string()).and_then(|config| {
                        let classes = load_classes(&config).map_err(|e| e.to_string())?;
                        Ok((config, Arc::new(classes)))
                    }));
                    continue;
                }
                tracing::info!(signal, "stopping");
                let _ = stop_tx.send(true);
                break;
            }
        })?;
    }

    let maintenance_stop = Arc::new(AtomicBool::new(false));
    let maintenance = {
        let daemon = daemon.clone();
        let stop = maintenance_stop.clone();
        let interval = Duration::from_millis(config.snapshot_interval_ms);
        std::thread::Builder::new().name("tollgate-snapshot".into()).spawn(move || {
            let mut tick = 0u64;
            while !stop.load(Ordering::Acquire) {
                // Parked, not slept: a stop unparks it at once.
                std::thread::park_timeout(interval);
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let now = daemon.clock.now_us();
                let limiter = daemon.limiter.load();
                if daemon.store_stats.needs_rewrite.load(Ordering::Acquire) {
                    if let Err(e) = limiter.rewrite(now).wait_blocking() {
                        tracing::warn!(error = %e, "state file still not writable; will try again");
                    }
                    continue;
                }
                // Waiting for the commit bounds what is queued for the disk
                // to one snapshot, however fast keys churn.
                for write in limiter.snapshot(now, true) {
                    if let Err(e) = write.wait_blocking() {
                        tracing::warn!(error = %e, "snapshot not written; will retry");
                    }
                }
                daemon.limiter.load().sweep(tick, now);
                tick += 1;
            }
        })?
    };

    tracing::info!(
        socket = %config.socket.display(),
        state = %config.state.display(),
        restored = restored.restored,
        expired = restored.expired,
        redated = restored.redated,
        known_devices,
        damaged_rows = loaded.damaged_rows,
        manual_clock = daemon.clock.is_manual(),
        "tollgate listening"
    );
    // Ready: listening, state loaded. Then keep systemd's watchdog fed from
    // the event loop itself, so a wedged loop gets the daemon restarted.
    notify("READY=1\nSTATUS=serving\n");
    if let (Some(period), Some(notifier)) = (notify::watchdog_period(), notifier.clone()) {
        // Twice per period, as sd_watchdog_enabled(3) advises.
        let every = period / 2;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                // Not logged: a failure repeats every tick, and systemd's
                // own message about the missed watchdog says it.
                let _ = notifier.send("WATCHDOG=1\n");
            }
        });
    }
    runtime.block_on(server::run(listener, daemon.clone(), stop_rx));
    notify("STOPPING=1\n");

    maintenance_stop.store(true, Ordering::Release);
    maintenance.thread().unpark();
    let _ = maintenance.join();
    signal_handle.close();
    let mut failed = 0;
    let limiter = daemon.limiter.load();
    let now = daemon.clock.now_us();
    let writes = if daemon.store_stats.needs_rewrite.load(Ordering::Acquire) {
        vec![limiter.rewrite(now)]
    } else {
        limiter.snapshot(now, true)
    };
    for write in writes {
        if let Err(e) = write.wait_blocking() {
            tracing::error!(error = %e, "final snapshot incomplete");
            failed += 1;
        }
    }
    writer.stop();
    if our_socket.is_some() && server::socket_identity(&config.socket) == our_socket {
        let _ = std::fs::remove_file(&config.socket);
    }
    if failed > 0 {
        anyhow::bail!("{failed} shard(s) of counters could not be saved at stop");
    }
    tracing::info!("stopped; counters saved");
    Ok(())
}
