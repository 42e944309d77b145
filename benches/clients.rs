//! Check round trips per second through each client's runner, from one
//! loop and from 16, beside the same language's raw socket (one
//! pre-encoded frame written, one reply frame read, nothing decoded): what
//! each client costs over the socket. `cargo bench --bench clients` (all)
//! or `-- python go` (some), in about four minutes; docs/performance.md has
//! the table.
//!
//! The daemon is the release build, on a route with one rate rule far
//! above what the machine can send, so every check is allowed and does
//! the same work.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/conformance/runner.rs"]
mod runner;

use std::path::Path;
use std::process::Command;

use serde_json::json;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CONFIG: &str = "[routes.bench.rules.flood]\nkind = \"rate\"\nkey = [\"prefix\"]\nlimit = 1000000000\n";
/// How long each measure runs, how many of each are taken (the median
/// is shown), the warm-up before them, and the loops of the parallel one.
const MILLIS: u64 = 2000;
const ROUNDS: usize = 3;
const WARM_UP_MILLIS: u64 = 500;
const LOOPS: u64 = 16;

fn main() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let daemon = common::TestDaemon::start_with(Some(CONFIG), false);
    println!("| client | loops | checks/s | raw socket checks/s | client / raw |");
    println!("|-|-|-|-|-|");
    for name in ["rust", "python", "go", "node", "java"] {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let mut runner = match runner::Runner::start(name, runner_command(name)) {
            Ok(runner) => runner,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let open = json!({ "op": "open", "socket": daemon.socket.display().to_string(), "timeout_ms": 1000 });
        runner.call(&open).expect("open");
        for loops in [1, LOOPS] {
            let mut rate = |raw: bool, millis: u64| {
                let request = json!({
                    "op": "bench", "route": "bench", "subject": { "peer": "198.51.100.7" },
                    "threads": loops, "millis": millis, "raw": raw,
                });
                let reply = runner.call(&request).expect("bench");
                let (calls, took) = (reply["calls"].as_u64().unwrap(), reply["millis"].as_u64().unwrap().max(1));
                calls as f64 * 1000.0 / took as f64
            };
            // Warmed up (a JIT, a pool, the daemon's tables), then the two
            // measured in turn, ROUNDS times each: the medians.
            rate(true, WARM_UP_MILLIS);
            rate(false, WARM_UP_MILLIS);
            let (mut raw, mut client) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                raw.push(rate(true, MILLIS));
                client.push(rate(false, MILLIS));
            }
            let (raw, client) = (median(raw), median(client));
            println!("| {name} | {loops} | {client:.0} | {raw:.0} | {:.2} |", client / raw);
        }
    }
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn runner_command(name: &str) -> Command {
    if name == "rust" {
        // The Rust runner is the example, built here in release.
        let status = Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet", "--example", "conformance_runner"])
            .current_dir(ROOT)
            .status()
            .expect("cargo");
        assert!(status.success(), "the Rust runner did not build");
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| format!("{ROOT}/target"));
        Command::new(Path::new(&target).join("release/examples/conformance_runner"))
    } else {
        let mut command = Command::new("bash");
        command.arg(Path::new(ROOT).join("clients").join(name).join("conformance.sh"));
        command
    }
}
