//! Opening the state file at start: its secret key, the key derivation a
//! new file takes (with `[shared]`, the store's hosts'), and its rows put
//! back in the tables.

use std::time::Duration;

use anyhow::Context;

use super::lifecycle::START_LOG_TARGET;
use crate::config::Config;
use crate::keys::{Derivation, Secret};
use crate::limiter::{Limiter, Restored};
use crate::store::{Loaded, OpenOptions, Store, StoreError};

/// Opens the state file under the secret key it was made with. A missing
/// secret is made in memory and written only once the state file has
/// accepted it: a state file with rows made under a lost key is refused,
/// and no new key is left behind to hide the loss.
pub(super) fn open_state(config: &Config, discard_corrupt: bool) -> anyhow::Result<(Secret, Store, Loaded)> {
    if let Some(dir) = config.secret.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let (secret, secret_is_new) = match Secret::load(&config.secret)? {
        Some(secret) => (secret, false),
        None => (Secret::generate(&config.secret)?, true),
    };
    // With `[shared]`, a file made now (missing, or moved aside by the
    // flag) takes the store's hosts' derivation unless one is set.
    let new_file_derivation = match (config.key_derivation, &config.shared) {
        (None, Some(shared)) => {
            let missing =
                matches!(std::fs::metadata(&config.state), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
            if missing {
                Some(store_derivation(shared, secret.fingerprint())?)
            } else if discard_corrupt {
                // The file may be sound and stay: no reason to stop here
                // (the join refuses what this would have).
                store_derivation(shared, secret.fingerprint())
                    .inspect_err(|e| tracing::warn!(target: START_LOG_TARGET, error = %e, "shared store"))
                    .ok()
            } else {
                None
            }
        }
        _ => None,
    };
    let options = OpenOptions {
        discard_corrupt,
        key_fingerprint: Some(secret.fingerprint()),
        key_is_new: secret_is_new,
        key_derivation: config.key_derivation,
        new_file_derivation,
    };
    let opened = match Store::open_with(&config.state, options) {
        Err(StoreError::KeyMismatch { path, found, .. }) if secret_is_new => anyhow::bail!(
            "secret key file {} is missing, and state file {} holds state made with a secret key (key fingerprint {found:016x}): restore the secret key file, or start with --discard-corrupt-state to move the state file aside and start empty with a new key",
            config.secret.display(),
            path.display()
        ),
        Err(StoreError::KeyMismatch { path, found, expected }) => anyhow::bail!(
            "state file {} was written with another secret key than secret key file {} holds (key fingerprints {found:016x} and {expected:016x}): restore the secret key file the state was made with, or start with --discard-corrupt-state to move the state file aside and start empty",
            path.display(),
            config.secret.display()
        ),
        other => other?,
    };
    if secret_is_new {
        secret.save(&config.secret)?;
    }
    Ok((secret, opened.store, opened.loaded))
}

/// How long a host about to make a state file keeps asking a store it
/// cannot reach for its hosts' key derivation, and how often.
const STORE_DERIVATION_ASKED_FOR_MS: u64 = 5_000;
const STORE_DERIVATION_ASK_EVERY_MS: u64 = 500;

/// With `[shared]` and no `key_derivation`, a state file to be made takes
/// the derivation the store's hosts use, read (never written) before it
/// is made: a host added to a running deployment then names accounts as
/// they do. A store holding none (a new deployment) gives the newest;
/// right after a flush, before the running hosts write theirs back
/// (within a heartbeat), that guess may be refused at the join, which
/// says what to set. A store holding another secret's stops the start,
/// before a file or a secret is written. A store that cannot be reached
/// is asked again for a while (a host booted before it), then leaves the
/// newest, with a warning: the host starts degraded, as any host does
/// then, and is refused when it connects if the others differ.
fn store_derivation(shared: &crate::config::SharedConfig, secret_fingerprint: u64) -> anyhow::Result<Derivation> {
    use crate::shared::ProbeError;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let store = crate::shared::SharedStore::new(shared.clone());
    let learned = runtime.block_on(async {
        store.start();
        let asking_since = tokio::time::Instant::now();
        loop {
            match store.derivation_in_use(secret_fingerprint).await {
                Ok(Some(derivation)) => return Ok(derivation),
                Ok(None) => return Ok(Derivation::NEWEST),
                // A host started just before its store (boot order): ask
                // again for a while before starting on a guess.
                Err(ProbeError::Unreachable(_))
                    if asking_since.elapsed() < Duration::from_millis(STORE_DERIVATION_ASKED_FOR_MS) =>
                {
                    tokio::time::sleep(Duration::from_millis(STORE_DERIVATION_ASK_EVERY_MS)).await;
                }
                Err(e) => return Err(e),
            }
        }
    });
    drop(store);
    // Nothing of the peek may hold the start (a resolver's lookup).
    runtime.shutdown_timeout(Duration::from_millis(shared.connect_timeout_ms));
    match learned {
        Ok(derivation) => Ok(derivation),
        Err(ProbeError::Refused(why)) => Err(anyhow::anyhow!(why)),
        Err(e) => {
            tracing::warn!(target: START_LOG_TARGET, error = %e, key_derivation = Derivation::NEWEST.number(),
                "cannot learn the shared store's key derivation; a new state file takes the newest (if the other hosts use another, this host is refused when it connects: set key_derivation)");
            Ok(Derivation::NEWEST)
        }
    }
}

/// What start-up put back in the tables, for the "listening" line.
pub(super) struct Restoration {
    pub(super) rows: Restored,
    pub(super) known_devices: usize,
    pub(super) bans: usize,
    pub(super) damaged_rows: usize,
}

/// Puts the state file's rows back in the tables.
pub(super) fn restore(limiter: &Limiter, loaded: Loaded, now_us: u64) -> Restoration {
    let mut rows = limiter.restore(loaded.entries, now_us);
    limiter.restore_cells(loaded.cells, now_us, &mut rows);
    let known_devices = limiter.restore_known_devices(loaded.devices, now_us);
    let bans = limiter.restore_bans(loaded.bans, now_us);
    if rows.orphaned > 0 {
        tracing::warn!(target: START_LOG_TARGET, orphaned = rows.orphaned, "persisted entries name rules not configured; deleted");
    }
    if rows.spilled > 0 {
        tracing::warn!(target: START_LOG_TARGET, spilled = rows.spilled, "persisted entries found their tables full of lockouts; counted in the overflow sketches");
    }
    Restoration { rows, known_devices, bans, damaged_rows: loaded.damaged_rows }
}
