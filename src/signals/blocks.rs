//! How a block (an IPv6 source's /56, an IPv4 /24 or IPv6 /48) is judged:
//! a flag on it falls on every address in it, so besides its distinct
//! failed accounts it needs failures from many of its parts (`pairs`), and
//! its failure share is taken over what its parts fail below their own
//! flags (`hidden`), so that neither one part's hundreds of failures nor an
//! attacker's own logins decide it. The sums live in the `shares` family.

use super::family::{self, Label, Tracked};
use super::Signals;
use crate::source::Prefix;

impl Signals {
    /// Counts a failure of `part` (holding `part.1` distinct failed
    /// accounts in the window) towards `block`, which is judged on two sums
    /// over its parts failing in the window: `pairs`, each part's accounts
    /// capped at `accounts_per_source_max`, so its flag needs failures from
    /// many parts; and `hidden`, capped at `hidden_cap`, what a part can
    /// fail without its own flag, which its failure share is taken over, so
    /// neither one part's hundreds of failures nor an attacker's own logins
    /// outweigh what the rest fail. Each part's elements `(part, 1..=cap)`
    /// are counted again at its first failure of each sub-window (`fresh`)
    /// and whenever its newest was missing from the block's sub-window (a
    /// new account, or sums cleared by a reload or an eviction), so a part
    /// failing in the window counts in full whatever its order or pace; in
    /// between, only its newest.
    pub(super) fn spread(
        &mut self,
        block: (u64, Prefix),
        part: (u64, u32),
        fresh: bool,
        hidden_cap: u32,
        epoch: u64,
        now_us: u64,
    ) -> Spread {
        let caps = [self.config.wide_spray.accounts_per_source_max, hidden_cap];
        let mut sums = [0u32; 2];
        for (sum, (cap, salt)) in sums.iter_mut().zip(caps.into_iter().zip([0, HIDDEN_SALT])) {
            let key = block.0 ^ salt;
            let label = Label::Prefix(block.1);
            let top = part.1.clamp(1, cap);
            let element = |j: u32| family::mix64(part.0 ^ u64::from(j).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let before = self.shares.get(key).map_or(0, |e| e.failed.count_in(epoch));
            let entry = self.shares.fail(key, label, epoch, element(top), now_us);
            *sum = entry.failed.count();
            // Refresh when the part is fresh, or when its newest element was
            // missing from the entry's sub-window (new top, or lost sums).
            if fresh || entry.failed.count_in(epoch) > before {
                for j in 1..top {
                    *sum = self.shares.fail(key, label, epoch, element(j), now_us).failed.count();
                }
            }
        }
        Spread { pairs: sums[0], hidden: sums[1] }
    }

    /// What a /56 can fail without its own flag: its /64s' pairs below
    /// `narrow_spray`'s threshold (two /64s failing 9 and a third 1: 19).
    pub(super) fn hidden_max_56(&self) -> u32 {
        let t = self.config.narrow_spray.threshold.saturating_sub(1);
        let c = self.config.wide_spray.accounts_per_source_max.max(1);
        ((t / c) * t + t % c).max(self.hidden_max())
    }

    /// The accounts a part can fail without its own flag (at least the
    /// pairs' cap).
    pub(super) fn hidden_max(&self) -> u32 {
        self.config.narrow_spray.threshold.saturating_sub(1).max(self.config.wide_spray.accounts_per_source_max)
    }
}

/// What a block is judged on besides its own accounts (see `spread`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Spread {
    pub(super) pairs: u32,
    pub(super) hidden: u32,
}

/// The `shares` entry of a block's `hidden` sum is keyed by the block's
/// digest with this flipped in.
const HIDDEN_SALT: u64 = 0x5A5A_5A5A_5A5A_5A5A;

/// A block's judgement: its accounts and its parts' capped accounts
/// (`pairs`) at the threshold, and a failure share, taken over `hidden`,
/// at or above the gate.
pub(super) fn judge_block(
    block: &Tracked,
    spread: Spread,
    detector: &crate::config::DetectorConfig,
    success_weight: u32,
) -> Option<u32> {
    let count = block.failed.count();
    let share = block.failure_share_of(spread.hidden, success_weight);
    let spread_enough = spread.pairs >= detector.threshold;
    (count >= detector.threshold && spread_enough && share >= detector.failure_share_min).then_some(count)
}
