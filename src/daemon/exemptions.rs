//! The audit lines of `[[source.exemptions]]`: those in force at start, and
//! each one a reload removes, adds or gives a new reason. A prefix is
//! configuration (a network the operator wrote down), not an identifier of
//! a person, so it is logged as written, not digested. Uncapped, as
//! unlocks are: a file holds at most `EXEMPTIONS_MAX` of them.

use super::{Daemon, LOG_TARGET};
use crate::exemptions::{changes, Exemption};
use crate::unpoisoned::Unpoisoned;

impl Daemon {
    /// One line per exemption a starting daemon applies, so that the log
    /// says which were in force from the first request.
    pub(crate) fn audit_exemptions_at_start(&self) {
        for e in &self.config.locked().exemptions {
            tracing::info!(target: LOG_TARGET, prefix = %e.prefix, reason = %e.reason, "exemption in force");
        }
    }
}

/// One line per exemption a reload removes, adds or re-reasons, naming the
/// uid and pid that sent the SIGHUP (`by_uid`, `by_pid`; absent when the
/// kernel did not say). `systemctl reload` runs the unit's `ExecReload=`
/// as the service's user, so the human behind it is in systemd's own log.
pub(super) fn audit_changes(before: &[Exemption], after: &[Exemption], sender: Option<super::Sender>) {
    let (by_uid, by_pid) = (sender.map(|s| s.uid), sender.map(|s| s.pid));
    let changes = changes(before, after);
    for e in changes.removed {
        tracing::info!(target: LOG_TARGET, prefix = %e.prefix, reason = %e.reason, by = "reload", by_uid, by_pid,
            "exemption removed");
    }
    for e in changes.added {
        tracing::info!(target: LOG_TARGET, prefix = %e.prefix, reason = %e.reason, by = "reload", by_uid, by_pid,
            "exemption added");
    }
    for (old, new) in changes.reasons {
        tracing::info!(target: LOG_TARGET, prefix = %new.prefix, reason = %new.reason, was = %old.reason,
            by = "reload", by_uid, by_pid, "exemption reason changed");
    }
}
