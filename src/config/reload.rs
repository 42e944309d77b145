//! What a reload applies and what it keeps: a few settings are set up once,
//! at start (the socket, state and secret paths, the key derivation,
//! `[server]`, `[activity]`,
//! `[metrics]`, spray detection's queue), so a reloaded file's values for
//! them are replaced by the running ones and named in the reload's warning.

use super::Config;

impl Config {
    /// Carries over from `running` what a reload does not apply: the
    /// socket, state and secret paths, `key_derivation`,
    /// `snapshot_interval_ms`, `[server]`,
    /// `[activity]`, `[metrics]` and `signals.queue_max` (each set up once,
    /// at start). Returns the names of
    /// those this file changes, for the reload's warning. (`[shared]` and
    /// `[decision_log]` are not carried over: a reload changing them is
    /// refused.)
    pub fn keep_what_needs_a_restart(&mut self, running: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        let mut keep = |name: &'static str, differs: bool| {
            if differs {
                changed.push(name);
            }
        };
        keep("socket", self.socket != running.socket);
        keep("state", self.state != running.state);
        keep("secret", self.secret != running.secret);
        keep("key_derivation", self.key_derivation != running.key_derivation);
        keep("snapshot_interval_ms", self.snapshot_interval_ms != running.snapshot_interval_ms);
        keep("[server]", self.server != running.server);
        keep("[activity]", self.activity != running.activity);
        keep("[metrics]", self.metrics != running.metrics);
        self.metrics.clone_from(&running.metrics);
        // Spray detection's queue is made at start; its other limits apply.
        if let (Some(new), Some(old)) = (&mut self.signals, &running.signals) {
            keep("signals.queue_max", new.queue_max != old.queue_max);
            new.queue_max = old.queue_max;
        }
        self.socket.clone_from(&running.socket);
        self.state.clone_from(&running.state);
        self.secret.clone_from(&running.secret);
        self.key_derivation = running.key_derivation;
        self.snapshot_interval_ms = running.snapshot_interval_ms;
        self.server.clone_from(&running.server);
        self.activity.clone_from(&running.activity);
        changed
    }
}
