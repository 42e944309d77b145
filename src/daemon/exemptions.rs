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

/// One line per exemption a reload removes, adds or re-reasons. No uid: a
/// reload is a SIGHUP, and the signal iterator does not say who sent it
/// (`systemctl reload`'s caller and the file's writer are in the system's
/// own logs); `by = "reload"` says how it changed.
pub(super) fn audit_changes(before: &[Exemption], after: &[Exemption]) {
    let changes = changes(before, after);
    for e in changes.removed {
        tracing::info!(target: LOG_TARGET, prefix = %e.prefix, reason = %e.reason, by = "reload", "exemption removed");
    }
    for e in changes.added {
        tracing::info!(target: LOG_TARGET, prefix = %e.prefix, reason = %e.reason, by = "reload", "exemption added");
    }
    for (old, new) in changes.reasons {
        tracing::info!(target: LOG_TARGET, prefix = %new.prefix, reason = %new.reason, was = %old.reason,
            by = "reload", "exemption reason changed");
    }
}
