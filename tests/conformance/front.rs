//! What the kit puts in front of a client besides a plain daemon: a front
//! that passes frames to a real daemon but speaks only up to
//! `version_max` (answering newer versions as a daemon of that age does:
//! a version-1 `unsupported_version` error) and can be frozen (replies
//! held, as a daemon stalled by a burst holds them); and a silent socket
//! that accepts and never answers.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::client::codec;
use tollgate::client::protocol::{ErrorCode, Response};

pub struct Front {
    pub socket: PathBuf,
    frozen: Arc<AtomicBool>,
    _dir: tempfile::TempDir,
}

impl Front {
    pub fn start(daemon: &Path, version_max: u8) -> Front {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("front.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let (daemon, held) = (daemon.to_path_buf(), frozen.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let (daemon, held) = (daemon.clone(), held.clone());
                std::thread::spawn(move || {
                    let _ = relay(client, &daemon, version_max, &held);
                });
            }
        });
        Front { socket, frozen, _dir: dir }
    }

    pub fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }
}

/// One client connection, a frame at a time: a request in a version the
/// front does not speak is refused here; any other goes to the daemon, and
/// its reply back once the front is not frozen.
fn relay(mut client: UnixStream, daemon: &Path, version_max: u8, frozen: &AtomicBool) -> std::io::Result<()> {
    let mut upstream = UnixStream::connect(daemon)?;
    loop {
        let frame = read_frame(&mut client)?;
        let payload = &frame[codec::FRAME_HEADER_BYTES..];
        if payload.len() >= 9 && payload[0] > version_max {
            let id = u64::from_le_bytes(payload[1..9].try_into().unwrap());
            let why =
                format!("protocol version {} is not supported (this daemon speaks 1 to {version_max})", payload[0]);
            let mut reply = Vec::new();
            codec::encode_response(id, &Response::error(ErrorCode::UnsupportedVersion, why), &mut reply);
            client.write_all(&reply)?;
            continue;
        }
        upstream.write_all(&frame)?;
        let reply = read_frame(&mut upstream)?;
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        client.write_all(&reply)?;
    }
}

fn read_frame(stream: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut frame = vec![0u8; codec::FRAME_HEADER_BYTES];
    stream.read_exact(&mut frame)?;
    let length = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
    frame.resize(codec::FRAME_HEADER_BYTES + length, 0);
    stream.read_exact(&mut frame[codec::FRAME_HEADER_BYTES..])?;
    Ok(frame)
}

/// Accepts connections, reads whatever comes, answers nothing.
pub struct Silent {
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Silent {
    pub fn start() -> Silent {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            for mut client in listener.incoming().map_while(Result::ok) {
                std::thread::spawn(move || std::io::copy(&mut client, &mut std::io::sink()));
            }
        });
        Silent { socket, _dir: dir }
    }
}
