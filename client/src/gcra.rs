//! GCRA (generic cell rate algorithm): a rate limit whose whole state per key
//! is one theoretical arrival time (TAT). Checked and updated in one step
//! under the caller's lock, so parallel requests can never both see room that
//! only one of them may use.
//!
//! Our own code because it is the product's core and tiny. This is the
//! decision alone, shared by the daemon's tables and by the client's static
//! budgets (which keep one TAT per route while the daemon is unreachable).

/// Limits of one rate rule: `burst` requests at once, refilled at one request
/// per `interval_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraSpec {
    pub interval_us: u64,
    pub burst: u32,
}

impl GcraSpec {
    /// `limit` requests per `period_us` sustained, `burst` at once.
    pub fn new(limit: u32, period_us: u64, burst: u32) -> GcraSpec {
        assert!(limit > 0 && burst > 0 && period_us > 0, "validated by config");
        GcraSpec { interval_us: period_us.div_ceil(limit as u64).max(1), burst }
    }

    fn tolerance_us(self) -> u64 {
        // Saturating: a day-long interval times a huge burst would wrap.
        self.interval_us.saturating_mul(self.burst as u64)
    }
}

/// The answer of one GCRA step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcraDecision {
    pub allowed: bool,
    /// Requests that could still be made right now.
    pub remaining: u32,
    /// When refused: how long until this request would be allowed.
    pub retry_after_us: u64,
    /// How long until the key is back to a full burst.
    pub reset_us: u64,
}

/// Decides one request against a TAT. Returns the decision and the new TAT
/// (unchanged when refused, or when `spend` is false).
pub fn decide(spec: GcraSpec, tat_us: Option<u64>, now_us: u64, spend: bool) -> (GcraDecision, u64) {
    // Signed and wide: `tat − tolerance` may lie before the epoch when the
    // burst spans more time than has passed, and must not saturate.
    let now = now_us as i128;
    let interval = spec.interval_us as i128;
    let tolerance = spec.tolerance_us() as i128;
    let tat = (tat_us.unwrap_or(now_us).max(now_us)) as i128;
    let new_tat = tat + interval;
    let allow_at = new_tat - tolerance;
    if allow_at > now {
        // Refused means `now − (tat − tolerance) < interval`: no whole
        // request is left.
        let decision = GcraDecision {
            allowed: false,
            remaining: 0,
            retry_after_us: (allow_at - now) as u64,
            reset_us: (tat - now) as u64,
        };
        return (decision, tat as u64);
    }
    let after = if spend { new_tat } else { tat };
    // Allowed means `0 <= now − allow_at <= tolerance − interval`, which
    // fits a u64: a 64-bit division, not a 128-bit one (a call into the
    // compiler's runtime on every check).
    let room = (now - allow_at) as u64;
    let decision = GcraDecision {
        allowed: true,
        remaining: (room / spec.interval_us).min(u32::MAX as u64) as u32,
        retry_after_us: 0,
        reset_us: (after - now) as u64,
    };
    (decision, after.min(u64::MAX as i128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000;

    #[test]
    fn a_burst_then_one_per_interval() {
        let spec = GcraSpec::new(60, 60 * SECOND, 3);
        let (mut tat, now) = (None, 1_000 * SECOND);
        for remaining in [2, 1, 0] {
            let (d, after) = decide(spec, tat, now, true);
            assert_eq!((d.allowed, d.remaining), (true, remaining));
            tat = Some(after);
        }
        let (refused, after) = decide(spec, tat, now, true);
        assert_eq!((refused.allowed, refused.retry_after_us), (false, SECOND));
        assert_eq!(Some(after), tat, "a refusal spends nothing");
        assert!(decide(spec, tat, now + SECOND, true).0.allowed);
    }
}
