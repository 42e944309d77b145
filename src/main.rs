//! `tollgate serve` starts the daemon (`daemon::serve`); every other
//! subcommand is a client of it (`cli::run`). The request path starts in
//! `server::run`; `lib.rs` maps the modules.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use tollgate::cli::{self, Cli, Command};
use tollgate::daemon;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = match cli.command {
        Command::Serve(args) => return daemon::serve(args),
        Command::CheckConfig(args) => return daemon::check_config(&args),
        // Not a client of the daemon: its errors are the output's, not a connection's.
        Command::Man => return cli::print_man_page(),
        // The limiter on a simulated clock, in-process: no daemon to ask.
        Command::Simulate(args) => return cli::simulate(&args),
        // A loop of its own that waits for keys between ticks.
        Command::Top(args) => return cli::top(&args),
        // The decision log through a candidate configuration, in-process.
        Command::Replay(args) => return cli::replay(&args),
        command => command,
    };
    // The load generator and the echo server want every core; the CLI's one
    // request, one thread.
    let runtime = if matches!(command, Command::Bench(_) | Command::EchoServer { .. }) {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    }
    .expect("tokio runtime");
    match runtime.block_on(cli::run(command)) {
        Ok(code) => code,
        Err(e) => {
            cli::print_error(&e);
            ExitCode::FAILURE
        }
    }
}
