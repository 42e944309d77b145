//! The flags the request path reads: one immutable table, published by the
//! signals thread through an `ArcSwap`, probed with at most a few hash
//! lookups and no lock. An empty table (the normal state) costs one atomic
//! load and a branch.

use std::collections::HashMap;

use crate::classes::SourceClass;
use crate::config::{Detector, DetectorSet};
use crate::expiring::DigestBuildHasher;

/// What a flag key names; each space salts its digests so that an account
/// digest and a prefix digest can never meet in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Prefix,
    Account,
    Password,
    Tenant,
}

impl Space {
    fn salt(self) -> u64 {
        match self {
            Space::Prefix => 0x243F_6A88_85A3_08D3,
            Space::Account => 0x1319_8A2E_0370_7344,
            Space::Password => 0xA409_3822_299F_31D0,
            Space::Tenant => 0x082E_FA98_EC4E_6C89,
        }
    }
}

/// The key of `digest` in `space`.
pub fn flag_key(space: Space, digest: u64) -> u64 {
    digest ^ space.salt()
}

/// Bits of a published flag beyond the detectors' (`Detector::bit`): the
/// IPv6 block it names is widened.
pub const WIDEN_48: u16 = 1 << 8;
pub const WIDEN_56: u16 = 1 << 9;

/// The first 8 bytes of a 16-byte digest: what the signals key on.
pub fn digest64(digest: &[u8; 16]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 of 16 bytes"))
}

#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub bits: u16,
    pub until_us: u64,
}

#[derive(Debug, Default)]
pub struct FlagTable {
    /// Keyed by salted digests: their bits are the hash.
    map: HashMap<u64, Flag, DigestBuildHasher>,
    /// Detector bits whose flags are enforced (the rest are monitored), and
    /// the widening bits when widening is enforced.
    pub enforced: u16,
    /// Classes (bit = `SourceClass as u8`) never widened.
    pub never_widen: u8,
}

impl FlagTable {
    pub fn new(map: HashMap<u64, Flag, DigestBuildHasher>, enforced: u16, never_widen: &[SourceClass]) -> FlagTable {
        FlagTable { map, enforced, never_widen: never_widen.iter().fold(0, |m, c| m | 1 << *c as u8) }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The bits flagged on `digest` in `space` at `now_us`.
    pub fn probe(&self, space: Space, digest: u64, now_us: u64) -> u16 {
        match self.map.get(&flag_key(space, digest)) {
            Some(flag) if flag.until_us > now_us => flag.bits,
            _ => 0,
        }
    }

    /// Whether an address of `class` may be widened.
    pub fn widens(&self, class: Option<SourceClass>) -> bool {
        class.is_none_or(|c| self.never_widen & (1 << c as u8) == 0)
    }
}

/// What a check's subject has flagged, for the signal rules to act on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hits {
    /// Detectors whose flags cover this subject.
    pub detectors: DetectorSet,
    /// Of those, the ones enforced.
    pub enforced: DetectorSet,
}

impl Hits {
    pub fn add(&mut self, table: &FlagTable, bits: u16, relevant: DetectorSet) {
        let found = (bits as u8) & relevant;
        self.detectors |= found;
        self.enforced |= found & table.enforced as u8;
    }

    /// The detector that names a refusal: the most precise first.
    pub fn leading(self, within: DetectorSet) -> Option<Detector> {
        let pick = |set: DetectorSet| {
            [
                Detector::PasswordSpray,
                Detector::AccountDistributed,
                Detector::NarrowSpray,
                Detector::WideSpray,
                Detector::TenantAnomaly,
            ]
            .into_iter()
            .find(|d| set & within & d.bit() != 0)
        };
        pick(self.enforced).or_else(|| pick(self.detectors))
    }
}
