//! `tollgate man` prints a man page made from the clap definitions: it must
//! name every command, so a new subcommand cannot be left out of it.

use std::process::Command;

use clap::CommandFactory;
use tollgate::cli::Cli;

/// Every visible command as the page names it, nested ones included:
/// `serve`, ..., `clock advance`.
fn command_paths(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let path = format!("{prefix}{}", sub.get_name());
        out.push(path.clone());
        command_paths(sub, &format!("{path} "), out);
    }
}

#[test]
fn the_man_page_names_every_subcommand() {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("man").output().expect("run tollgate man");
    let page = String::from_utf8(output.stdout).expect("roff is UTF-8");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "tollgate man failed: {}\n{stderr}", output.status);
    assert!(page.contains(".TH tollgate 1"), "not a roff man page:\n{page}");

    let mut commands = Vec::new();
    command_paths(&Cli::command(), "", &mut commands);
    assert!(commands.len() >= 10, "too few commands found: {commands:?}");
    let missing: Vec<&String> =
        commands.iter().filter(|c| !page.contains(&format!(".SH \"TOLLGATE {}\"", c.to_uppercase()))).collect();
    assert!(missing.is_empty(), "the man page has no section for {missing:?}; page:\n{page}");
    // The top-level list names each first-level command too (roff escapes `-`).
    for c in commands.iter().filter(|c| !c.contains(' ')) {
        let listed = format!("tollgate\\-{}", c.replace('-', "\\-"));
        assert!(page.contains(&listed), "the command list lacks `{c}`; page:\n{page}");
    }
    // The sections an operator looks for, with what they must say.
    for (section, says) in [
        (".SH \"EXIT STATUS\"", "78"),
        (".SH ENVIRONMENT", "TOLLGATE_LOG"),
        (".SH FILES", "/var/lib/tollgate/state.redb"),
        (".SH SIGNALS", "SIGHUP"),
        (".SH \"SEE ALSO\"", "systemctl(1)"),
    ] {
        let at = page.find(section).unwrap_or_else(|| panic!("no {section} in the page:\n{page}"));
        assert!(page[at..].contains(says), "{section} does not say {says}");
        assert!(page[..at].ends_with('\n'), "{section} starts a line");
    }
    // `man` is listed like any command, so `--help` shows where the page is.
    assert!(page.contains("TOLLGATE MAN"), "the page documents `man`:\n{page}");
}

/// Every flag and argument of every command has help text, a closed set
/// lists its values, and `man` is listed in `--help`: what `--help` and
/// the man page show is all an operator has at the terminal.
#[test]
fn every_flag_has_help_and_closed_sets_list_their_values() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version") {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} --{id}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "tollgate", &mut missing);
    assert!(missing.is_empty(), "flags without help: {missing:#?}");

    let report = Cli::command().find_subcommand("report").expect("report").clone();
    let outcome = report.get_arguments().find(|a| a.get_id() == "outcome").expect("--outcome");
    let values: Vec<String> = outcome.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
    assert_eq!(values, ["success", "failure"]);

    let help = Command::new(env!("CARGO_BIN_EXE_tollgate")).arg("--help").output().expect("run tollgate --help");
    assert!(String::from_utf8_lossy(&help.stdout).contains("  man "), "man is listed in --help");
}

/// `tollgate completions <shell>` completes every first-level command in
/// bash, zsh and fish (what the Debian package installs), and the bash
/// script parses.
#[test]
fn completions_name_every_command_and_the_bash_script_parses() {
    let mut commands = Vec::new();
    command_paths(&Cli::command(), "", &mut commands);
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["completions", shell]).output().unwrap();
        assert!(output.status.success(), "{shell}: {}", String::from_utf8_lossy(&output.stderr));
        let script = String::from_utf8(output.stdout).unwrap();
        for c in commands.iter().filter(|c| !c.contains(' ')) {
            assert!(script.contains(c.as_str()), "{shell} completions lack `{c}`");
        }
        if shell == "bash" {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tollgate.bash");
            std::fs::write(&path, &script).unwrap();
            let parsed = Command::new("bash").arg("-n").arg(&path).status().unwrap();
            assert!(parsed.success(), "bash -n refuses the completion script");
        }
    }
    let refused = Command::new(env!("CARGO_BIN_EXE_tollgate")).args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(2), "an unknown shell is a usage error");
}
