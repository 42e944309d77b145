//! A client's conformance runner as a child process, spoken to a JSON
//! line at a time (docs/clients.md, "The runner").

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::Value;

/// How long a runner may take to answer one request: far above any
/// deadline a scenario sets or a bench runs, so only a hung runner trips it.
const REPLY_WAIT: Duration = Duration::from_secs(60);

pub struct Runner {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Runner {
    pub fn start(name: &str, mut command: Command) -> Result<Runner, String> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}'s runner did not start: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Runner { name: name.to_string(), child, stdin, lines })
    }

    /// Sends one request and reads its one reply.
    pub fn call(&mut self, request: &Value) -> Result<Value, String> {
        writeln!(self.stdin, "{request}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("{}'s runner stopped reading ({e}) at {request}", self.name))?;
        let line = self
            .lines
            .recv_timeout(REPLY_WAIT)
            .map_err(|_| format!("{}'s runner gave no reply line within {REPLY_WAIT:?} to {request}", self.name))?;
        serde_json::from_str(&line).map_err(|e| format!("{}'s runner wrote {line:?}, not JSON: {e}", self.name))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
