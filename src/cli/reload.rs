//! `tollgate reload --pid PID`: what the unit's `ExecReload=` runs. It
//! signals the daemon and waits for the daemon's own answer, so
//! `systemctl reload` fails when the daemon refused the new files (a
//! class file unreadable at that moment, a config changed between the
//! check and the signal), not only when `check-config` did. Debian 12's
//! systemd (252) predates `Type=notify-reload`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use super::CommonArgs;
use crate::client::{Client, ClientError};
use crate::stdout::outln;

#[derive(Debug, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The daemon's process id (`$MAINPID` in the unit).
    #[arg(long)]
    pub pid: i32,
    /// How long to wait for the daemon to report the reload.
    #[arg(long, default_value = "10s", value_parser = crate::format::parse_duration)]
    pub wait: Duration,
}

/// How often the daemon's reload counters are read while waiting.
const POLL: Duration = Duration::from_millis(50);

pub async fn reload(client: &Client, args: &ReloadArgs) -> Result<ExitCode, ClientError> {
    let before = client.status().await?;
    let pid = nix::unistd::Pid::from_raw(args.pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| ClientError::Io(std::io::Error::other(format!("signalling process {}: {e}", args.pid))))?;
    let deadline = Instant::now() + args.wait;
    loop {
        tokio::time::sleep(POLL).await;
        let now = client.status().await?;
        if now.reload_failures > before.reload_failures {
            let why = now.last_reload_error.unwrap_or_else(|| "no reason given".to_string());
            eprintln!("tollgate: the daemon refused the reload and keeps its running configuration: {why}");
            return Ok(ExitCode::FAILURE);
        }
        if now.reloads > before.reloads {
            outln!("reloaded");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            eprintln!("tollgate: the daemon did not report the reload within {:?}", args.wait);
            return Ok(ExitCode::FAILURE);
        }
    }
}
