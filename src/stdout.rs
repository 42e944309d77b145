//! The CLI's standard output. A reader may stop early (`tollgate status |
//! head -1`); Rust ignores SIGPIPE, so every later write fails with EPIPE,
//! and `println!` would panic on it. The CLI's reports go through `outln!`
//! and `out!` instead: a closed pipe ends the process quietly and
//! successfully, as `cat` or ripgrep end; any other write error (a full
//! disk) ends it with one line. Putting SIGPIPE back to its default would
//! also do, but needs unsafe code, which this crate keeps out.
//!
//! Everything written here is also made printable: names in a decision
//! log, a state file or a daemon's reply are not ours to trust, and a
//! control character among them (an escape sequence that clears the
//! screen or retitles the terminal) is shown escaped, never sent to the
//! terminal. Only line feeds and tabs pass.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};

/// `text` with every control character but a line feed and a tab written
/// as its escape (`\u{1b}`), so that output made from untrusted bytes
/// cannot drive the terminal it is shown on.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    let passes = |c: char| !c.is_control() || c == '\n' || c == '\t';
    if text.chars().all(passes) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if passes(c) {
            out.push(c);
        } else {
            out.extend(c.escape_unicode());
        }
    }
    Cow::Owned(out)
}

/// What `outln!` and `out!` call: `args`, then a newline if `newline`.
pub(crate) fn write(args: fmt::Arguments<'_>, newline: bool) {
    let text = match args.as_str() {
        Some(fixed) => Cow::Borrowed(fixed),
        None => Cow::Owned(args.to_string()),
    };
    let mut stdout = io::stdout().lock();
    let written =
        stdout
            .write_all(printable(&text).as_bytes())
            .and_then(|()| if newline { stdout.write_all(b"\n") } else { Ok(()) });
    if let Err(e) = written {
        drop(stdout);
        stop(&e);
    }
}

/// Writes `bytes` whole and flushes them, as `write`.
pub(crate) fn write_bytes(bytes: &[u8]) {
    if let Err(e) = try_write_bytes(bytes) {
        stop(&e);
    }
}

/// Writes `bytes` whole and flushes them, for a caller that has more to
/// say after a failed write (`tollgate replay`'s damage, on stderr and in
/// its exit status). Bytes that are not UTF-8 are shown as U+FFFD.
pub(crate) fn try_write_bytes(bytes: &[u8]) -> io::Result<()> {
    let text = String::from_utf8_lossy(bytes);
    let mut stdout = io::stdout().lock();
    stdout.write_all(printable(&text).as_bytes()).and_then(|()| stdout.flush())
}

/// The one line a write error other than a closed pipe ends with.
pub(crate) fn error_line(e: &io::Error) -> String {
    format!("cannot write to standard output: {e}")
}

/// Ends the process after a failed write to standard output.
pub(crate) fn stop(e: &io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        // The reader has all it wanted.
        std::process::exit(0);
    }
    eprintln!("tollgate: error: {}", error_line(e));
    std::process::exit(1)
}

/// `println!` for the CLI's output: a reader that went away ends the
/// process quietly (see the module's comment).
macro_rules! outln {
    () => {
        crate::stdout::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        crate::stdout::write(format_args!($($arg)*), true)
    };
}

/// `print!` for the CLI's output, as `outln!`.
macro_rules! out {
    ($($arg:tt)*) => {
        crate::stdout::write(format_args!($($arg)*), false)
    };
}

pub(crate) use {out, outln};

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_and_lines_and_tabs_pass() {
        assert_eq!(printable("route\tlogin\n"), "route\tlogin\n");
        assert!(matches!(printable("plain é"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(printable("a\u{1b}[2Jb\u{7}\r\u{9b}c\u{7f}"), "a\\u{1b}[2Jb\\u{7}\\u{d}\\u{9b}c\\u{7f}");
    }
}
