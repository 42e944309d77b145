//! `tollgate man`: the page made from the clap definitions, so it cannot
//! drift from `--help`, and the sections clap does not make.

use super::{print_error, Cli};

/// The man page, made from the clap definitions so it cannot drift
/// from `--help`: the top-level page (which lists every command), then each
/// command's synopsis and options as a section of its own.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    fn commands(cmd: &clap::Command, path: &str, page: &mut Vec<u8>) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = format!("{path} {}", sub.get_name());
            let man = clap_mangen::Man::new(sub.clone().bin_name(&name));
            let mut part = Vec::new();
            man.render_synopsis_section(&mut part)?;
            man.render_options_section(&mut part)?;
            // One page: each command's headings become a section and a subsection.
            let part = String::from_utf8_lossy(&part)
                .replacen(".SH SYNOPSIS", &format!(".SH \"{}\"", name.to_uppercase()), 1)
                .replacen(".SH OPTIONS", ".SS Options", 1);
            page.extend_from_slice(part.as_bytes());
            commands(sub, &name, page)?;
        }
        Ok(())
    }
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone()).render(&mut page)?;
    commands(&cmd, "tollgate", &mut page)?;
    if !page.ends_with(b"\n") {
        page.push(b'\n');
    }
    page.extend_from_slice(MAN_SECTIONS.as_bytes());
    Ok(page)
}

/// The page's sections clap does not make (roff). Names only pages a
/// Debian system with systemd has.
const MAN_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
0
Success; for \fBcheck\fR, the verdict is allow.
.TP
1
An error: the daemon could not be reached or refused the request; \fBserve\fR could not start or stopped on an error; \fBreload\fR: the daemon refused the new files (it keeps the running ones).
.TP
2
A usage error (an unknown flag or a bad value).
.TP
3, 4
\fBcheck\fR only: the verdict is delay or challenge.
.TP
5
\fBcheck\fR: the verdict is deny; \fBinspect\fR: an enforcing rule would refuse a check now (0 when none would).
.TP
6
\fBunlock\fR only: nothing was cleared (the account had no lockout or count on the route; with \fB\-\-ip\fR, that exact network was not banned).
.TP
78
\fBserve\fR: the configuration or class file is invalid (every problem is printed).
.SH ENVIRONMENT
.TP
TOLLGATE_SOCKET
The daemon's socket, for every command (\fB\-\-socket\fR wins); default /run/tollgate/tollgate.sock.
.TP
TOLLGATE_LOG
\fBserve\fR's log filter, e.g. \fBinfo\fR (the default), \fBwarn\fR or \fBtollgate::shared=debug\fR.
.TP
TOLLGATE_LOG_FORMAT
\fBserve\fR's log lines: \fBjson\fR (one object a line, for log shippers) or \fBtext\fR (the default).
.TP
NOTIFY_SOCKET, WATCHDOG_USEC, LISTEN_FDS
Set by systemd: readiness and watchdog notifications, and socket activation.
.SH FILES
.TP
/etc/tollgate/tollgate.toml
The configuration, read when \fBserve\fR has no \fB\-\-config\fR (built-in defaults without it).
.TP
/var/lib/tollgate/state.redb
The state file: lockouts, counters, known devices (keyed digests only), and the operator's bans (networks as written).
.TP
/var/lib/tollgate/secret
The secret key every digest is keyed with (mode 0600; losing it forgets every lockout).
.TP
/run/tollgate/tollgate.sock
The socket clients and the CLI connect to.
.SH SIGNALS
.TP
SIGHUP
Reload the configuration and class file; an invalid file keeps the running one (see \fBstatus\fR).
.TP
SIGTERM, SIGINT
Stop: answer the requests in flight (up to shutdown_grace_ms), write the state file, exit 0.
.SH "SEE ALSO"
systemctl(1), journalctl(1), systemd.service(5)
"#;

/// `tollgate man`: the page on stdout, or one plain error line.
pub fn print_man_page() -> std::process::ExitCode {
    match man_page() {
        Ok(page) => {
            crate::stdout::write_bytes(&page);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            print_error(&e);
            std::process::ExitCode::FAILURE
        }
    }
}
