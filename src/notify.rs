//! systemd's notify protocol (READY=1, WATCHDOG=1, STOPPING=1), over one
//! datagram socket opened at start and kept.
//!
//! Why not the sd-notify crate (0.4): its `notify` opens a new socket per
//! message, so once the descriptor table is full (a flood of connections
//! at the open-file limit) every watchdog ping fails with EMFILE and
//! systemd kills a daemon that is serving fine. A socket opened at start
//! needs no descriptor per ping. It also does not know abstract socket
//! names (`@name`), which systemd uses in some set-ups.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The service manager's notify socket, opened once.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    address: SocketAddr,
}

impl Notifier {
    /// The socket `NOTIFY_SOCKET` names; `Ok(None)` when not run by a
    /// service manager that wants notifications.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            Some(path) if !path.is_empty() => Notifier::open(&path).map(Some),
            _ => Ok(None),
        }
    }

    /// A socket for `path`, read as systemd does: a leading `@` names an
    /// abstract socket (Linux), anything else a file.
    pub fn open(path: &OsStr) -> io::Result<Notifier> {
        let address = match path.as_bytes().strip_prefix(b"@") {
            Some(name) => abstract_address(name)?,
            None => SocketAddr::from_pathname(path)?,
        };
        Ok(Notifier { socket: UnixDatagram::unbound()?, address })
    }

    /// Sends one message: newline-separated `KEY=value` assignments. Never
    /// blocks for long: the manager reads its socket promptly, and a full
    /// queue is an error the caller may ignore (the next ping retries).
    pub fn send(&self, message: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(message.as_bytes(), &self.address)?;
        if sent != message.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "notify message cut short"));
        }
        Ok(())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_address(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "abstract socket names exist only on Linux"))
}

/// The watchdog period systemd asks for (`WATCHDOG_USEC`), if it applies to
/// this process: as `sd_watchdog_enabled` reads it, `WATCHDOG_PID`, when
/// set, must name us.
pub fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        if pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let manager = UnixDatagram::bind(&path).unwrap();
        Notifier::open(path.as_os_str()).unwrap().send("WATCHDOG=1\n").unwrap();
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1\n");

        let name = format!("tollgate-notify-test-{}", std::process::id());
        let manager = UnixDatagram::bind_addr(&abstract_address(name.as_bytes()).unwrap()).unwrap();
        Notifier::open(OsStr::new(&format!("@{name}"))).unwrap().send("READY=1\n").unwrap();
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\n");
    }
}
