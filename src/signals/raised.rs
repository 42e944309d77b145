//! Flags raised: by a detector or an IPv6 widening, held in a bounded
//! table, listed for `status`, and expired.

use super::*;

/// A raised flag, with what `status` shows of it.
#[derive(Clone, Debug)]
pub(super) struct Raised {
    pub(super) bits: u16,
    pub(super) until_us: u64,
    /// The end the request path was given, which it enforces by itself
    /// (the thread may stall): within `lag_us` of `until_us` (`extend`).
    pub(super) published_us: u64,
}

/// A flag's published end may lag its own by this share of its length, so
/// that a flag its detector keeps firing is published again once in a
/// while (every 3.75 minutes at the default hour) rather than at every
/// report. So a flag ends between 15/16 of its length and its length after
/// its detector last fired.
pub(super) const PUBLISH_LAG_DIVISOR: u64 = 16;

impl Raised {
    /// Moves the flag's end to `until_us` if later; true when the request
    /// path must be given the new end: without it, it stops enforcing the
    /// flag at the first end it was given while the attack goes on.
    pub(super) fn extend(&mut self, until_us: u64, lag_us: u64) -> bool {
        self.until_us = self.until_us.max(until_us);
        if self.until_us <= self.published_us.saturating_add(lag_us) {
            return false;
        }
        self.published_us = self.until_us;
        true
    }
}

#[derive(Clone, Debug)]
pub(super) struct Shown {
    pub(super) detector: &'static str,
    pub(super) subject: String,
    pub(super) estimate: u32,
    pub(super) threshold: u32,
    pub(super) since_us: u64,
    pub(super) until_us: u64,
}

impl Signals {
    /// Raises (or extends) `detector`'s flag on `digest` when `found`
    /// carries the estimate that crossed its threshold.
    pub(super) fn raise_on(&mut self, detector: Detector, space: Space, digest: u64, found: Option<u32>, now_us: u64) {
        let Some(estimate) = found else { return };
        if self.config.mode(detector) == DetectorMode::Off {
            return;
        }
        let until_us = now_us + self.config.flag_ttl_us;
        let bit = detector.bit() as u16;
        let newly = self.set_flag(flag_key(space, digest), bit, until_us, self.config.flag_ttl_us);
        if newly {
            self.counts[detector as usize].raised_total += 1;
            let subject = match space {
                Space::Prefix => self.prefix_label(digest),
                Space::Account => format!("acct:{digest:016x}"),
                Space::Password => format!("pw:{digest:016x}"),
                Space::Tenant => format!("tenant:{digest:016x}"),
            };
            let threshold = self.config.threshold(detector);
            tracing::warn!(
                target: "tollgate::signals",
                detector = detector.name(),
                subject = %subject,
                estimate,
                threshold,
                mode = self.config.mode(detector).name(),
                "flag raised"
            );
            self.show(Shown { detector: detector.name(), subject, estimate, threshold, since_us: now_us, until_us });
        }
    }

    pub(super) fn widen(&mut self, bit: u16, digest: u64, found: Option<u32>, threshold: u32, now_us: u64) {
        let Some(estimate) = found else { return };
        let until_us = now_us + self.config.ipv6_widening.hold_us;
        if self.set_flag(flag_key(Space::Prefix, digest), bit, until_us, self.config.ipv6_widening.hold_us) {
            self.counts[WIDENING].raised_total += 1;
            let subject = self.prefix_label(digest);
            tracing::warn!(
                target: "tollgate::signals",
                prefix = %subject,
                distinct_64s = estimate,
                threshold,
                mode = self.config.ipv6_widening.mode.name(),
                "widened"
            );
            self.show(Shown { detector: "ipv6_widening", subject, estimate, threshold, since_us: now_us, until_us });
        }
    }

    pub(super) fn prefix_label(&self, digest: u64) -> String {
        [&self.narrow, &self.wide, &self.blocks56]
            .iter()
            .find_map(|f| match f.label(digest) {
                Some(Label::Prefix(p)) => Some(p.to_string()),
                _ => None,
            })
            .unwrap_or_else(|| format!("prefix:{digest:016x}"))
    }

    pub(super) fn show(&mut self, shown: Shown) {
        if self.recent.len() == RECENT_FLAGS_SHOWN {
            self.recent.pop_back();
        }
        self.recent.push_front(shown);
    }

    /// True if `bit` was not already raised on `key`.
    pub(super) fn set_flag(&mut self, key: u64, bit: u16, until_us: u64, length_us: u64) -> bool {
        if let Some(flag) = self.raised.get_mut(&key) {
            let newly = flag.bits & bit == 0;
            flag.bits |= bit;
            let later = flag.extend(until_us, length_us / PUBLISH_LAG_DIVISOR);
            self.changed |= newly || later;
            return newly;
        }
        if self.raised.len() >= self.config.flags_max {
            // Of a few sampled, a detector's flag ending soonest makes room
            // before any widening (a flood of fresh flags must not un-widen
            // the block it comes from); sampled, since a scan of the table
            // per new flag would slow the thread under exactly that flood.
            let len = self.raised.len() as u64;
            let samples: [usize; EVICTION_SAMPLES] = std::array::from_fn(|_| (self.next_random() % len) as usize);
            let widened = |i: usize| self.raised[i].bits & (WIDEN_48 | WIDEN_56) != 0;
            let i = samples.into_iter().min_by_key(|&i| (widened(i), self.raised[i].until_us)).expect("samples");
            self.raised.swap_remove_index(i);
            self.flags_dropped += 1;
        }
        self.raised.insert(key, Raised { bits: bit, until_us, published_us: until_us });
        self.next_expiry_us = self.next_expiry_us.min(until_us);
        self.changed = true;
        true
    }

    pub(super) fn expire_flags(&mut self, now_us: u64, epoch: u64, per_48: u32, per_56: u32) {
        let mut expired = Vec::new();
        for (key, flag) in self.raised.iter_mut() {
            if flag.until_us > now_us {
                continue;
            }
            // A widened block stays widened while half its threshold of
            // /64s still fail (hysteresis: no flapping at the threshold).
            // The key is the digest salted: salting again unsalts it.
            let digest = flag_key(Space::Prefix, *key);
            let still = |family: &Family, threshold: u32| {
                family.get(digest).is_some_and(|e| {
                    let mut failed = e.failed.clone();
                    failed.roll(epoch);
                    failed.count() * 2 >= threshold
                })
            };
            let keep_48 = flag.bits & WIDEN_48 != 0 && still(&self.blocks, per_48);
            let keep_56 = flag.bits & WIDEN_56 != 0 && still(&self.blocks56, per_56);
            if keep_48 || keep_56 {
                let bits = (if keep_48 { WIDEN_48 } else { 0 }) | (if keep_56 { WIDEN_56 } else { 0 });
                self.changed |= flag.bits != bits;
                flag.bits = bits;
                flag.until_us = now_us + self.sub_us;
                self.changed |= flag.extend(flag.until_us, 0);
            } else {
                expired.push(*key);
            }
        }
        for key in expired {
            if let Some(flag) = self.raised.swap_remove(&key) {
                tracing::info!(target: "tollgate::signals", bits = flag.bits, "flag cleared");
            }
            self.changed = true;
        }
        self.next_expiry_us = self.raised.values().map(|r| r.until_us).min().unwrap_or(u64::MAX);
    }
}
