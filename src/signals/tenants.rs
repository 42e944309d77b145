//! The tenant anomaly detector's state: each tenant's (or route's) exact
//! outcome counts per sub-window and the baseline failure ratio they move.

use super::*;

/// A tenant unseen this long is forgotten, baseline and all.
pub(super) const TENANT_IDLE_US: u64 = 24 * 3_600_000_000;

/// Outcomes a sub-window needs before it moves a tenant's baseline.
pub(super) const TENANT_OUTCOMES_MIN: u32 = 20;

/// A tenant's exact outcome counts per sub-window and its baseline ratio.
#[derive(Clone, Debug, Default)]
pub(super) struct Tenant {
    pub(super) failed: [u32; SUB_WINDOWS],
    pub(super) succeeded: [u32; SUB_WINDOWS],
    pub(super) epoch: u64,
    pub(super) baseline: f64,
    /// Sub-windows folded into the baseline.
    pub(super) baseline_subs: u32,
    pub(super) touched_us: u64,
}

impl Tenant {
    pub(super) fn roll(&mut self, epoch: u64, alpha: f64) {
        while self.epoch < epoch {
            let slot = (self.epoch % SUB_WINDOWS as u64) as usize;
            let (f, s) = (self.failed[slot], self.succeeded[slot]);
            if f + s >= TENANT_OUTCOMES_MIN {
                let ratio = f as f64 / (f + s) as f64;
                self.baseline =
                    if self.baseline_subs == 0 { ratio } else { self.baseline + alpha * (ratio - self.baseline) };
                self.baseline_subs += 1;
            }
            self.epoch += 1;
            let next = (self.epoch % SUB_WINDOWS as u64) as usize;
            self.failed[next] = 0;
            self.succeeded[next] = 0;
            if epoch - self.epoch > SUB_WINDOWS as u64 {
                // A long silence: nothing left to fold.
                self.failed = [0; SUB_WINDOWS];
                self.succeeded = [0; SUB_WINDOWS];
                self.epoch = epoch;
            }
        }
    }
}

/// Whether a success counts in its tenant's ratio, as `every` successes:
/// one in `every`, drawn from the report's keyed digests (`keyed`: its
/// source's and account's) and its time. A tenant's ratio counts outcomes,
/// not distinct accounts, so its sample is of events, not of accounts (an
/// account-keyed sample would weigh one busy mail client's retries at 0 or
/// at `every` times over). Without the secret no sender can predict the
/// draw, so none can time its successes in or out of the count; with it
/// the simulator's runs stay exact.
pub fn tenant_draw(keyed: u64, now_us: u64, every: u32) -> bool {
    every <= 1 || family::mix64(family::mix64(keyed) ^ now_us).is_multiple_of(u64::from(every))
}

impl Signals {
    pub(super) fn count_tenant(&mut self, digest: u64, outcome: Outcome, weight: u32, now_us: u64, epoch: u64) {
        let alpha = (self.sub_us as f64 / (self.config.tenant_anomaly.baseline_hours as f64 * 3.6e9)).min(1.0);
        if !self.tenants.contains_key(&digest) && self.tenants.len() >= self.config.tenants_max {
            // The tenant seen longest ago of a few sampled goes: a scan of
            // the whole table per new tenant would let a flood of invented
            // tenants (where the auth server takes them from user input)
            // slow the thread until it drops events.
            let len = self.tenants.len() as u64;
            let samples: [usize; EVICTION_SAMPLES] = std::array::from_fn(|_| (self.next_random() % len) as usize);
            let i = samples.into_iter().min_by_key(|&i| self.tenants[i].touched_us).expect("samples");
            self.tenants.swap_remove_index(i);
            self.tenants_evicted += 1;
        }
        let tenant = self.tenants.entry(digest).or_insert_with(|| Tenant { epoch, ..Tenant::default() });
        tenant.roll(epoch, alpha);
        tenant.touched_us = now_us;
        let slot = (epoch % SUB_WINDOWS as u64) as usize;
        match outcome {
            Outcome::Failure => tenant.failed[slot] = tenant.failed[slot].saturating_add(weight),
            Outcome::Success => tenant.succeeded[slot] = tenant.succeeded[slot].saturating_add(weight),
        }
        let t = &self.config.tenant_anomaly;
        if t.mode == DetectorMode::Off {
            return;
        }
        let failed: u32 = tenant.failed.iter().sum();
        let succeeded: u32 = tenant.succeeded.iter().sum();
        let ratio = failed as f64 / (failed + succeeded).max(1) as f64;
        let warm = tenant.baseline_subs as u64 * self.sub_us >= t.warmup_hours as u64 * 3_600_000_000;
        let anomalous = warm
            && failed >= t.failures_min
            && ratio >= tenant.baseline * t.ratio_factor
            && ratio >= tenant.baseline + t.ratio_margin;
        let found = anomalous.then_some(failed);
        self.raise_on(Detector::TenantAnomaly, Space::Tenant, digest, found, now_us);
    }
}
