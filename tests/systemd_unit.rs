//! The shipped systemd unit keeps its sandboxing, and (where the machine has
//! `systemd-analyze`) systemd itself accepts it.
//!
//! A missing or changed hardening key fails this test everywhere. Only the
//! `systemd-analyze verify` part is skipped, with a "skipped: <reason>" line,
//! when the tool is absent or cannot run in this environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const UNIT_PATH: &str = "systemd/tollgate.service";
const DROP_IN_PATH: &str = "systemd/shared-store.conf.example";
const EXEC_PATH: &str = "/usr/bin/tollgate";
const VERIFY_TIMEOUT: Duration = Duration::from_secs(60);

/// (section, key, value) for every assignment, in file order.
fn parse_unit(text: &str) -> Vec<(String, String, String)> {
    parse_unit_file(UNIT_PATH, text)
}

fn parse_unit_file(name: &str, text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("{name}: not an assignment: {line:?}"));
        assert!(!value.ends_with('\\'), "{name}: keep assignments on one line: {line:?}");
        entries.push((section.clone(), key.trim().to_string(), value.trim().to_string()));
    }
    entries
}

fn unit_text() -> String {
    repo_file(UNIT_PATH)
}

fn repo_file(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every value assigned to `key` in [Service].
fn service_values<'a>(entries: &'a [(String, String, String)], key: &str) -> Vec<&'a str> {
    entries.iter().filter(|(s, k, _)| s == "Service" && k == key).map(|(_, _, v)| v.as_str()).collect()
}

/// Keys that must each be assigned exactly once in [Service], with this value.
const REQUIRED: &[(&str, &str)] = &[
    // Descriptors for connections_max (at most 65536) and the daemon's own
    // files: systemd's soft default of 1024 is below the default
    // connections_max plus those, and at the limit accept fails.
    ("LimitNOFILE", "131072"),
    ("User", "tollgate"),
    ("Group", "tollgate"),
    ("RuntimeDirectory", "tollgate"),
    ("RuntimeDirectoryMode", "0750"),
    ("StateDirectory", "tollgate"),
    ("StateDirectoryMode", "0700"),
    ("Restart", "on-failure"),
    ("KillSignal", "SIGTERM"),
    ("TimeoutStopSec", "15"),
    ("UMask", "0077"),
    ("NoNewPrivileges", "yes"),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("PrivateNetwork", "yes"),
    ("RestrictAddressFamilies", "AF_UNIX"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("ProcSubset", "pid"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"),
    // A filtered call fails with EPERM (an error the daemon reports), not SIGSYS.
    ("SystemCallErrorNumber", "EPERM"),
    // The socket file of tollgate.socket lives in the runtime directory:
    // removing it with the service would strand the listening socket.
    ("RuntimeDirectoryPreserve", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    // sd_notify readiness and a watchdog fed from the event loop.
    ("Type", "notify"),
    ("NotifyAccess", "main"),
    ("WatchdogSec", "10s"),
];

/// Keys the daemon does not support yet; setting them would mislead.
const ABSENT: &[&str] = &[];

#[test]
fn unit_keeps_its_hardening() {
    let entries = parse_unit(&unit_text());
    let mut problems = Vec::new();
    for &(key, want) in REQUIRED {
        match service_values(&entries, key).as_slice() {
            [] => problems.push(format!("{key}= is missing (want {key}={want})")),
            [got] if *got == want => {}
            [got] => problems.push(format!("{key}={got}, want {key}={want}")),
            many => problems.push(format!("{key}= is set {} times ({many:?}), want once: {key}={want}", many.len())),
        }
    }
    for &key in ABSENT {
        if !service_values(&entries, key).is_empty() {
            problems.push(format!("{key}= must not be set"));
        }
    }
    // A list setting: the allow list, then the deny list, in that order
    // (a later `~` list subtracts from the earlier allow list).
    let filters = service_values(&entries, "SystemCallFilter");
    if filters != ["@system-service", "~@privileged @resources"] {
        problems
            .push(format!("SystemCallFilter= is {filters:?}, want [\"@system-service\", \"~@privileged @resources\"]"));
    }
    // A reload checks the files first, so `systemctl reload` fails on an
    // invalid one (and the daemon is not signalled); then `tollgate reload`
    // sends SIGHUP and exits with the daemon's answer, so a file refused at
    // that moment fails the reload as well.
    let reload = service_values(&entries, "ExecReload");
    if reload != ["/usr/bin/tollgate check-config", "/usr/bin/tollgate reload --pid $MAINPID"] {
        problems.push(format!("ExecReload= is {reload:?}, want check-config, then tollgate reload"));
    }
    assert!(problems.is_empty(), "{UNIT_PATH}:\n  {}", problems.join("\n  "));
}

#[test]
fn unit_execs_tollgate_serve() {
    let entries = parse_unit(&unit_text());
    let exec = service_values(&entries, "ExecStart");
    assert_eq!(exec.len(), 1, "{UNIT_PATH}: want exactly one ExecStart=, found {exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(words.first(), Some(&EXEC_PATH), "{UNIT_PATH}: ExecStart={} must run {EXEC_PATH}", exec[0]);
    assert_eq!(words.get(1), Some(&"serve"), "{UNIT_PATH}: ExecStart={} must invoke `tollgate serve`", exec[0]);
}

#[test]
fn sysusers_declares_the_tollgate_user() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/tollgate.sysusers");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .unwrap_or_else(|| panic!("{} declares nothing", path.display()));
    assert_eq!(line, r#"u tollgate - "tollgate rate limiter" /var/lib/tollgate"#);
}

enum Run {
    Finished {
        success: bool,
        code: Option<i32>,
        stderr: String,
    },
    /// The tool could not be started or did not finish: an environment problem.
    Unavailable(String),
}

fn systemd_analyze_verify(unit: &Path) -> Run {
    let child = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(unit)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Run::Unavailable("systemd-analyze is not installed".into())
        }
        Err(e) => return Run::Unavailable(format!("systemd-analyze cannot be started: {e}")),
    };
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > VERIFY_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Run::Unavailable(format!("systemd-analyze verify did not finish within {VERIFY_TIMEOUT:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Run::Unavailable(format!("waiting for systemd-analyze: {e}")),
        }
    }
    let output = child.wait_with_output().expect("collecting systemd-analyze output");
    Run::Finished {
        success: output.status.success(),
        code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The unit's text with ExecStart and ExecReload pointing at the binary
/// cargo built, so `verify` can check that the commands exist and are
/// executable.
fn with_built_binary(text: &str, binary: &Path) -> String {
    let binary = binary.to_str().expect("binary path is UTF-8");
    assert!(!binary.contains(char::is_whitespace), "binary path {binary:?} has whitespace");
    let mut text = text.to_string();
    for key in ["ExecStart", "ExecReload"] {
        let from = format!("{key}={EXEC_PATH} ");
        assert!(text.contains(&from), "{UNIT_PATH}: no `{from}` line to rewrite");
        text = text.replace(&from, &format!("{key}={binary} "));
    }
    text
}

/// First a trivial unit: if even that does not verify, the environment
/// (not the unit) is the problem, and the caller skips. `Err` is the reason.
fn verify_works_here(dir: &Path, binary: &Path) -> Result<(), String> {
    let baseline = dir.join("tollgate-baseline-probe.service");
    std::fs::write(&baseline, format!("[Service]\nType=oneshot\nExecStart={} --version\n", binary.display()))
        .expect("writing the probe unit");
    match systemd_analyze_verify(&baseline) {
        Run::Unavailable(reason) => Err(reason),
        Run::Finished { success: false, code, stderr } => {
            Err(format!("systemd-analyze verify fails even on a trivial unit here (exit {code:?}): {}", stderr.trim()))
        }
        Run::Finished { success: true, .. } => Ok(()),
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tollgate"));
    let dir = tempfile::tempdir().expect("temporary directory");
    if let Err(reason) = verify_works_here(dir.path(), &binary) {
        println!("skipped: {reason}");
        return;
    }

    let unit = dir.path().join("tollgate.service");
    std::fs::write(&unit, with_built_binary(&unit_text(), &binary)).expect("writing the unit copy");
    match systemd_analyze_verify(&unit) {
        Run::Unavailable(reason) => println!("skipped: {reason}"),
        Run::Finished { success, code, stderr } => {
            assert!(success, "systemd-analyze verify {UNIT_PATH} exited {code:?}:\n{stderr}");
            // systemd only warns (exit 0) about an unknown key or a value it
            // cannot parse, naming the file and line: treat those as failures.
            let unit_name = unit.to_string_lossy();
            let warnings: Vec<&str> =
                stderr.lines().filter(|l| l.contains(&*unit_name) || l.starts_with("tollgate.service:")).collect();
            assert!(warnings.is_empty(), "systemd-analyze verify warns about {UNIT_PATH}:\n{}", warnings.join("\n"));
            println!("systemd-analyze verify {UNIT_PATH}: ok");
        }
    }
}

/// The only keys the shared-store drop-in may set: it opens the network the
/// store needs (or, for a Unix-socket store, the redis group) and leaves the
/// rest of the sandbox as shipped.
const DROP_IN_ALLOWED: &[&str] = &[
    "PrivateNetwork",
    "RestrictAddressFamilies",
    "IPAddressDeny",
    "IPAddressAllow",
    "LoadCredential",
    "SupplementaryGroups",
];

#[test]
fn shared_store_drop_in_opens_only_the_network() {
    let entries = parse_unit_file(DROP_IN_PATH, &repo_file(DROP_IN_PATH));
    let mut problems = Vec::new();
    for (section, key, value) in &entries {
        if section != "Service" {
            problems.push(format!("[{section}] {key}={value}: a drop-in for the sandbox belongs in [Service]"));
        } else if !DROP_IN_ALLOWED.contains(&key.as_str()) {
            problems.push(format!("{key}={value} is outside the keys a store needs ({DROP_IN_ALLOWED:?})"));
        }
    }
    // Leaving the namespace without a deny-all would open every peer.
    let values = |key| service_values(&entries, key);
    if values("PrivateNetwork") == ["no"] && values("IPAddressDeny") != ["any"] {
        problems.push(format!("PrivateNetwork=no needs IPAddressDeny=any, found {:?}", values("IPAddressDeny")));
    }
    for families in values("RestrictAddressFamilies") {
        if !families.split_whitespace().any(|f| f == "AF_UNIX") {
            problems.push(format!("RestrictAddressFamilies={families} drops AF_UNIX, the daemon's own socket"));
        }
    }
    assert!(problems.is_empty(), "{DROP_IN_PATH}:\n  {}", problems.join("\n  "));

    // The drop-in is opt-in: the unit as shipped stays off the network.
    let unit = parse_unit(&unit_text());
    assert_eq!(service_values(&unit, "PrivateNetwork"), ["yes"], "{UNIT_PATH}");
    assert_eq!(service_values(&unit, "RestrictAddressFamilies"), ["AF_UNIX"], "{UNIT_PATH}");
}

#[test]
fn systemd_analyze_verify_accepts_the_shared_store_drop_in() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_tollgate"));
    let dir = tempfile::tempdir().expect("temporary directory");
    if let Err(reason) = verify_works_here(dir.path(), &binary) {
        println!("skipped: {reason}");
        return;
    }

    // verify puts the unit's directory on the load path, so the drop-in is
    // found where systemd would find it under /etc/systemd/system.
    let unit = dir.path().join("tollgate.service");
    std::fs::write(&unit, with_built_binary(&unit_text(), &binary)).expect("writing the unit copy");
    let drop_in_dir = dir.path().join("tollgate.service.d");
    std::fs::create_dir(&drop_in_dir).unwrap();
    let drop_in = drop_in_dir.join("shared-store.conf");
    std::fs::write(&drop_in, repo_file(DROP_IN_PATH)).expect("writing the drop-in copy");
    match systemd_analyze_verify(&unit) {
        Run::Unavailable(reason) => println!("skipped: {reason}"),
        Run::Finished { success, code, stderr } => {
            assert!(success, "systemd-analyze verify with {DROP_IN_PATH} exited {code:?}:\n{stderr}");
            let names = [drop_in.to_string_lossy().into_owned(), unit.to_string_lossy().into_owned()];
            let warnings: Vec<&str> = stderr
                .lines()
                .filter(|l| names.iter().any(|n| l.contains(n.as_str())) || l.starts_with("shared-store.conf:"))
                .collect();
            assert!(warnings.is_empty(), "systemd-analyze verify warns about {DROP_IN_PATH}:\n{}", warnings.join("\n"));
            println!("systemd-analyze verify {UNIT_PATH} + {DROP_IN_PATH}: ok");
        }
    }
}
