//! `tollgate top`: the operator's live view of a running daemon. Each tick
//! asks for `status` and `activity` over one connection (`fetch`), derives
//! rates from the last two answers (`model.rs`) and draws them
//! (`view.rs`): with ratatui in a terminal, as plain text otherwise, or
//! once as one JSON object with `--once --json`. It only reads: it sends
//! no request that changes the daemon.

#[cfg(test)]
mod fixture;
mod model;
mod view;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::client::{Client, ClientConfig, ClientError};
use crate::config::SOCKET_PATH_DEFAULT;

use crate::stdout::{out, outln};
use model::{rates, Rates, Snapshot};
use view::{plain_text, Page, View};

/// The refresh interval when none is given: about once a second, as
/// `top(1)` does; rates are averaged over it.
const INTERVAL_DEFAULT: &str = "1s";
/// The shortest interval accepted: the daemon answers `activity` with
/// every list it keeps, so a viewer is not allowed to ask in a busy loop.
const INTERVAL_MIN: Duration = Duration::from_millis(100);
/// The longest: a day is already no live view, and a far longer one
/// overflows the clock reading it is added to (a panic, not a message).
const INTERVAL_MAX: Duration = Duration::from_secs(86_400);
/// Entries per list when none is given: what an 80x24 screen shows and a
/// few more for the plain text and JSON.
const LIMIT_DEFAULT: u32 = 10;
/// The width of plain-text output (stdout not a terminal): the 80 columns
/// the screen is designed for.
const PLAIN_WIDTH: usize = 80;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The daemon's socket.
    #[arg(long, env = "TOLLGATE_SOCKET", default_value = SOCKET_PATH_DEFAULT)]
    pub socket: PathBuf,
    /// How often to ask the daemon and redraw; rates are averaged over it.
    #[arg(long, default_value = INTERVAL_DEFAULT, value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one snapshot and exit (rates since the daemon started).
    #[arg(long)]
    pub once: bool,
    /// With --once: print one JSON object, {"status": .., "activity": ..}.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Entries in each list (top prefixes, accounts, lockouts, refusals).
    #[arg(long, default_value_t = LIMIT_DEFAULT)]
    pub limit: u32,
    /// How long to wait for each answer.
    #[arg(long, default_value = "2s", value_parser = crate::format::parse_duration)]
    pub timeout: Duration,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = crate::format::parse_duration(text)?;
    if d < INTERVAL_MIN {
        return Err(format!("`{text}` is shorter than {}", humantime::format_duration(INTERVAL_MIN)));
    }
    if d > INTERVAL_MAX {
        return Err(format!("`{text}` is longer than {}", humantime::format_duration(INTERVAL_MAX)));
    }
    Ok(d)
}

/// `tollgate top`: runs on its own current-thread runtime, because the
/// live view blocks between ticks waiting for a key.
pub fn run(args: &TopArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let client = Client::new(ClientConfig::new(&args.socket).timeout(args.timeout));
    let started = Instant::now();
    let fetch = |runtime: &tokio::runtime::Runtime| runtime.block_on(fetch(&client, args.limit, started));
    let result = if args.once {
        once(args, fetch(&runtime))
    } else if std::io::stdout().is_terminal() {
        live(args, || fetch(&runtime))
    } else {
        plain(args, || fetch(&runtime))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One tick's two requests, over the client's one pooled connection.
async fn fetch(client: &Client, limit: u32, started: Instant) -> Result<Snapshot, ClientError> {
    let full = client.status_full().await?;
    let activity = client.activity(limit).await?;
    Ok(Snapshot { full, activity, taken: started.elapsed() })
}

/// An error a retry will not fix: a daemon that speaks an older protocol
/// (or refuses the request) will give the same answer next second.
fn is_permanent(e: &ClientError) -> bool {
    matches!(e, ClientError::Protocol(_) | ClientError::Daemon(_))
}

/// `--once`: one snapshot, as JSON or text; any error ends it.
fn once(args: &TopArgs, snapshot: Result<Snapshot, ClientError>) -> Result<(), ClientError> {
    let snapshot = snapshot?;
    if args.json {
        let value = serde_json::json!({
            "status": crate::format::status_json(&snapshot.full),
            "activity": snapshot.activity,
        });
        outln!("{value}");
    } else {
        let rates = rates(None, &snapshot);
        let view = View { snapshot: Some(&snapshot), rates: Some(&rates), unreachable: None, interval: args.interval };
        out!("{}", plain_text(&view, PLAIN_WIDTH));
    }
    Ok(())
}

/// stdout is not a terminal: a text snapshot every interval, separated by
/// a blank line, until the reader goes away. An unreachable daemon is
/// reported and retried; a daemon that cannot answer ends it.
fn plain(args: &TopArgs, mut fetch: impl FnMut() -> Result<Snapshot, ClientError>) -> Result<(), ClientError> {
    let mut last: Option<Snapshot> = None;
    loop {
        let tick = Instant::now();
        let text = match fetch() {
            Ok(now) => {
                let rates = rates(last.as_ref(), &now);
                let view =
                    View { snapshot: Some(&now), rates: Some(&rates), unreachable: None, interval: args.interval };
                let text = plain_text(&view, PLAIN_WIDTH);
                last = Some(now);
                text
            }
            Err(e) if is_permanent(&e) => return Err(e),
            Err(e) => format!("UNREACHABLE: {e}\n"),
        };
        let mut out = std::io::stdout().lock();
        match writeln!(out, "{text}").and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`): that is the end, not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            // Not the daemon's connection: a full disk, say.
            Err(e) => crate::stdout::stop(&e),
        }
        drop(out);
        std::thread::sleep(args.interval.saturating_sub(tick.elapsed()));
    }
}

/// How long a stop (SIGTERM, SIGHUP) may go unheeded by the live view's
/// loop before the watchdog ends the process itself.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Ends the process when its terminal is gone or a stop went unheeded.
/// crossterm's `event::poll` never returns once its input reads end of
/// file (a closed pty: an ssh session or a tmux server gone): it reads
/// `0` bytes in a loop, at full CPU, and the loop below never sees the
/// SIGHUP flag. A hung-up terminal has nothing left to restore, so this
/// thread exits the process instead.
fn watch_for_a_dead_terminal(stop: Arc<AtomicBool>) {
    use std::os::fd::AsFd;
    let _ = std::thread::Builder::new().name("top-watchdog".into()).spawn(move || {
        let mut stopped_at: Option<Instant> = None;
        loop {
            std::thread::sleep(SIGNAL_CHECK);
            let stdin = std::io::stdin();
            let mut fds = [nix::poll::PollFd::new(stdin.as_fd(), nix::poll::PollFlags::empty())];
            let hung_up = nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).is_ok()
                && fds[0].revents().is_some_and(|r| {
                    r.intersects(
                        nix::poll::PollFlags::POLLHUP | nix::poll::PollFlags::POLLERR | nix::poll::PollFlags::POLLNVAL,
                    )
                });
            if stop.load(Ordering::Relaxed) {
                let since = *stopped_at.get_or_insert_with(Instant::now);
                if since.elapsed() >= STOP_GRACE {
                    ratatui::restore();
                    std::process::exit(0);
                }
            }
            if hung_up {
                std::process::exit(0);
            }
        }
    });
}

/// How long the live view waits for a key before it looks at the
/// signal flags again: a SIGTERM or SIGHUP (the ssh session went away)
/// ends it within this, with the terminal restored.
const SIGNAL_CHECK: Duration = Duration::from_millis(200);

/// The live view: redraws after every tick and every key; `q`, `Esc` or
/// Ctrl-C quits, `Tab` or `1`..`3` turn pages. The terminal is restored on
/// the way out, on an error, on SIGTERM or SIGHUP, and (ratatui's hook) on
/// a panic.
fn live(args: &TopArgs, mut fetch: impl FnMut() -> Result<Snapshot, ClientError>) -> Result<(), ClientError> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(signal, stop.clone())?;
    }
    watch_for_a_dead_terminal(stop.clone());
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> Result<(), ClientError> {
        let mut page = Page::Overview;
        let mut last: Option<Snapshot> = None;
        let mut shown: Option<Rates> = None;
        let mut unreachable: Option<String> = None;
        let mut next_tick = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + args.interval;
                match fetch() {
                    Ok(now) => {
                        shown = Some(rates(last.as_ref(), &now));
                        last = Some(now);
                        unreachable = None;
                    }
                    Err(e) if is_permanent(&e) => return Err(e),
                    Err(e) => unreachable = Some(e.to_string()),
                }
            }
            let view = View {
                snapshot: last.as_ref(),
                rates: shown.as_ref(),
                unreachable: unreachable.as_deref(),
                interval: args.interval,
            };
            terminal.draw(|frame| view::render(frame, &view, page))?;
            if event::poll(next_tick.saturating_duration_since(Instant::now()).min(SIGNAL_CHECK))? {
                match event::read()? {
                    Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                        KeyCode::Tab | KeyCode::Right => page = page.next(),
                        KeyCode::Char(c @ '1'..='3') => page = view::PAGES[c as usize - '1' as usize],
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        Ok(())
    })();
    ratatui::restore();
    result
}
