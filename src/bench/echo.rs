//! `tollgate echo-server`: the daemon's read, batch and write loop with
//! nothing behind it, so that `tollgate bench` can measure the floors the
//! daemon's own figures are read against.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use crate::codec::{self, FRAME_HEADER_BYTES};
use crate::protocol::{Decision, ErrorCode, Reason, Response, Verdict};

/// What the echo server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoReply {
    /// Each frame's own bytes: the transport floor.
    Echo,
    /// Each request decoded and answered with one fixed `allow` verdict (or
    /// its decode error): the transport and codec without the limiter.
    FixedVerdict,
}

/// The floors: a server that reads length-prefixed frames and answers each
/// with the daemon's read/batch/write loop and nothing else (`Echo`), or
/// with the daemon's codec as well (`FixedVerdict`). `tollgate bench --raw`
/// against the first measures the socket alone; `tollgate bench` against
/// the second, the socket and codec; the daemon's figure over these says
/// what the limiter's own work costs.
pub async fn echo_server(listener: UnixListener, reply: EchoReply) -> std::io::Result<()> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let mut out = Vec::with_capacity(4096);
            let mut filled = 0;
            let allow = Response::Verdict(Verdict {
                decision: Decision::Allow,
                retry_after_ms: 0,
                delay_ms: 0,
                limit: 10,
                remaining: 9,
                reset_ms: 100,
                reason: Reason::Allowed,
                rule: "source_rate".into(),
            });
            loop {
                let n = match stream.read(&mut buf[filled..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                filled += n;
                let mut at = 0;
                while let Ok(Some(end)) = codec::frame_len(&buf[at..filled], codec::REQUEST_PAYLOAD_BYTES_MAX) {
                    if reply == EchoReply::FixedVerdict {
                        match codec::decode_request(&buf[at + FRAME_HEADER_BYTES..at + end]) {
                            Ok((id, _)) => codec::encode_response(id, &allow, &mut out),
                            Err(e) => codec::encode_response(
                                e.id.unwrap_or(0),
                                &Response::error(ErrorCode::Malformed, e.error.to_string()),
                                &mut out,
                            ),
                        }
                    }
                    at += end;
                }
                let answer = if reply == EchoReply::Echo { &buf[..at] } else { &out[..] };
                if !answer.is_empty() && stream.write_all(answer).await.is_err() {
                    return;
                }
                out.clear();
                buf.copy_within(at..filled, 0);
                filled -= at;
            }
        });
    }
}
