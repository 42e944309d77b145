//! The conformance kit (docs/clients.md): every client, the Rust one
//! included, runs its own tests and then the scenarios of
//! `tests/conformance/scenarios.json` through its runner against a real
//! daemon, and computes digests and tags for inputs the kit compares with
//! the Rust client's. A client whose toolchain is missing fails with the
//! command that installs it (`scripts/test.sh`); none is skipped.
//!
//! Its own harness (`harness = false`): the same binary is the Rust
//! client's runner when `TOLLGATE_CONFORMANCE_RUNNER` is set, so the Rust
//! runner is built with the test. `cargo test --test client_conformance --
//! python` runs one client's cases.

mod common;
mod conformance;
#[path = "../examples/conformance_runner.rs"]
mod conformance_runner;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use conformance::{run_scenario, Runner, Scenario};

const RUNNER_ENV: &str = "TOLLGATE_CONFORMANCE_RUNNER";
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The clients: a name, the toolchain command it needs, and whether it
/// has its own tests and runner under `clients/<name>/` (Rust's are the
/// client crate's tests and this binary).
const CLIENTS: [(&str, &str); 5] =
    [("rust", "cargo"), ("python", "python3"), ("go", "go"), ("node", "node"), ("java", "javac")];

fn main() {
    if std::env::var_os(RUNNER_ENV).is_some() {
        return conformance_runner::main();
    }
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if std::env::args().any(|a| a == "--list") {
        return; // nothing listed: the cases are made at run time
    }
    let scenarios = Scenario::load(&Path::new(ROOT).join("tests/conformance/scenarios.json"));
    let started = Instant::now();
    // One client at a time: their own tests hold deadlines of tens of
    // milliseconds, which four toolchains building at once on two cores
    // would make fail for the load alone.
    let results: Vec<(String, Result<(), String>)> = CLIENTS
        .iter()
        .filter(|(name, _)| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())))
        .flat_map(|&(name, tool)| run_client(name, tool, &scenarios))
        .collect();
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    for (name, result) in &results {
        println!("test {name} ... {}", if result.is_ok() { "ok" } else { "FAILED" });
    }
    for (name, result) in &failed {
        println!("\n---- {name} ----\n{}", result.as_ref().unwrap_err());
    }
    println!(
        "\ntest result: {}. {} passed; {} failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        results.len() - failed.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    if !failed.is_empty() {
        std::process::exit(101);
    }
}

/// A client's cases: its own tests, the digests, then each scenario.
fn run_client(name: &str, tool: &str, scenarios: &[Scenario]) -> Vec<(String, Result<(), String>)> {
    let dir = Path::new(ROOT).join("clients").join(name);
    let mut results = Vec::new();
    if name != "rust" {
        if which(tool).is_none() {
            let missing = format!("`{tool}` is not installed: run `bash scripts/test.sh`, which installs it");
            results.push((format!("{name}::toolchain"), Err(missing)));
            return results;
        }
        // The kit runs even when the client's own tests fail: each says
        // something the other may not.
        results.push((format!("{name}::own_tests"), own_tests(&dir)));
    }
    let mut runner = match Runner::start(name, runner_command(name, &dir)) {
        Ok(runner) => runner,
        Err(e) => {
            results.push((format!("{name}::runner"), Err(e)));
            return results;
        }
    };
    results.push((format!("{name}::digests"), conformance::digests(&mut runner)));
    for scenario in scenarios {
        results.push((format!("{name}::{}", scenario.name), run_scenario(&mut runner, scenario)));
    }
    results
}

fn runner_command(name: &str, dir: &Path) -> Command {
    if name == "rust" {
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command.env(RUNNER_ENV, "1");
        command
    } else {
        let mut command = Command::new("bash");
        command.arg(dir.join("conformance.sh"));
        command
    }
}

fn own_tests(dir: &Path) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(dir.join("test.sh"))
        .current_dir(dir)
        .output()
        .map_err(|e| format!("{}/test.sh: {e}", dir.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{}/test.sh exited {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|p| p.is_file())
}
