//! The metrics listener (`[metrics] listen`): `GET /metrics` over HTTP/1
//! on a loopback address or a Unix socket, for Prometheus; the same text
//! `tollgate metrics` prints. Off by default. Written here rather than
//! with an HTTP crate: one route, one method, one response and close. The
//! request head is read within a deadline and a size cap, and scrapes run
//! a few at a time, so a slow or hostile peer holds one slot for at most
//! `SCRAPE_READ_TIMEOUT_MS` and never the request path.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::{Daemon, LOG_TARGET};
use crate::config::MetricsListen;

/// Scrapes answered at once; more wait for a slot.
pub const SCRAPES_CONCURRENTLY_MAX: usize = 4;
/// A request head longer than this is refused (a scrape's is ~200 bytes).
pub const SCRAPE_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// A request head not read whole within this is dropped; a response not
/// written within it too.
pub const SCRAPE_READ_TIMEOUT_MS: u64 = 5_000;

/// A bound listener, TCP or Unix.
pub(super) enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Binds `at` (inside the runtime). A Unix socket left by an earlier run
/// is replaced; its mode is 0660, as the daemon's own socket's default.
pub(super) fn bind(at: &MetricsListen) -> std::io::Result<Listener> {
    match at {
        MetricsListen::Tcp(addr) => {
            let std = std::net::TcpListener::bind(addr)?;
            std.set_nonblocking(true)?;
            Ok(Listener::Tcp(tokio::net::TcpListener::from_std(std)?))
        }
        MetricsListen::Unix(path) => {
            use std::os::unix::fs::{FileTypeExt, PermissionsExt};
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                std::fs::remove_file(path)?;
            }
            let listener = tokio::net::UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
            Ok(Listener::Unix(listener))
        }
    }
}

/// Answers scrapes for the daemon's life.
pub(super) async fn serve(listener: Listener, daemon: Arc<Daemon>) {
    let slots = Arc::new(Semaphore::new(SCRAPES_CONCURRENTLY_MAX));
    loop {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let daemon = daemon.clone();
        // The slot is held until the answer is written (or given up).
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(async move { answer(s, daemon, permit).await });
            }),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| {
                tokio::spawn(async move { answer(s, daemon, permit).await });
            }),
        };
        if let Err(e) = accepted {
            tracing::warn!(target: LOG_TARGET, error = %e, "metrics listener: accept failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One request: its head read within the deadline, one response, closed.
async fn answer(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    daemon: Arc<Daemon>,
    _slot: tokio::sync::OwnedSemaphorePermit,
) {
    let mut head = Vec::with_capacity(512);
    let read = tokio::time::timeout(Duration::from_millis(SCRAPE_READ_TIMEOUT_MS), async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < SCRAPE_REQUEST_BYTES_MAX {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Some(())
    })
    .await;
    let (status, body) = match read {
        Ok(Some(())) if head.len() <= SCRAPE_REQUEST_BYTES_MAX => {
            let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
            let mut words = line.split(|&b| b == b' ');
            match (words.next(), words.next()) {
                (Some(b"GET"), Some(b"/metrics")) => ("200 OK", daemon.prometheus_text().await),
                (Some(b"GET"), _) => ("404 Not Found", "only /metrics is served\n".to_string()),
                _ => ("405 Method Not Allowed", "only GET /metrics is served\n".to_string()),
            }
        }
        Ok(Some(())) => ("431 Request Header Fields Too Large", String::new()),
        _ => return,
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_millis(SCRAPE_READ_TIMEOUT_MS), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

impl Daemon {
    /// What `tollgate metrics` prints, made in the daemon: status, the
    /// store's and spray detection's, and the operator's view (made on a
    /// blocking thread, as a listing is).
    async fn prometheus_text(self: &Arc<Daemon>) -> String {
        let daemon = self.clone();
        tokio::task::spawn_blocking(move || {
            let limiter = daemon.limiter().load_full();
            let now = daemon.clock().now_us();
            // The listener is the operator's own (loopback or a socket
            // path they set), serving what `tollgate metrics` shows an admin.
            let status = daemon.status(&limiter, true);
            let shared = daemon.shared_status(&limiter);
            let signals = daemon.signals_status();
            let activity = daemon.activity(&limiter, 0, now);
            crate::metrics::prometheus(&status, shared.as_ref(), signals.as_ref(), Some(&activity))
        })
        .await
        .unwrap_or_default()
    }
}
