//! What `status` shows of spray detection: each family's fill and bytes,
//! each detector's flags, and the recent flags.

use super::*;

impl Signals {
    pub fn status(&self, events_dropped: u64, now_us: u64) -> SignalsStatus {
        let c = &self.config;
        let mut families: Vec<SignalFamilyStatus> = self
            .families()
            .iter()
            .map(|f| SignalFamilyStatus {
                name: f.name.into(),
                entries: f.len() as u64,
                entries_max: f.entries_max as u64,
                heap_bytes: f.heap_bytes as u64,
                evicted: f.evicted,
            })
            .collect();
        families.push(SignalFamilyStatus {
            name: "tenants".into(),
            entries: self.tenants.len() as u64,
            entries_max: c.tenants_max as u64,
            heap_bytes: 0,
            evicted: self.tenants_evicted,
        });
        let active =
            |bit: u16| self.raised.values().filter(|r| r.bits & bit != 0 && r.until_us > now_us).count() as u32;
        let mut detectors: Vec<DetectorStatus> = Detector::ALL
            .into_iter()
            .map(|d| DetectorStatus {
                name: d.name().into(),
                mode: c.mode(d).name().into(),
                threshold: c.threshold(d),
                raised_total: self.counts[d as usize].raised_total,
                active: active(d.bit() as u16),
            })
            .collect();
        detectors.push(DetectorStatus {
            name: "ipv6_widening".into(),
            mode: c.ipv6_widening.mode.name().into(),
            threshold: c.ipv6_widening.per_48,
            raised_total: self.counts[WIDENING].raised_total,
            active: active(WIDEN_48 | WIDEN_56),
        });
        SignalsStatus {
            window_ms: c.window_us / 1000,
            sub_windows: SUB_WINDOWS as u32,
            queue_max: c.queue_max as u32,
            events_total: self.events,
            events_dropped,
            sketch_bytes: self.sketch_bytes() as u64,
            sketch_bytes_max: c.sketch_bytes_max as u64,
            flags: self.raised.len() as u32,
            flags_max: c.flags_max as u32,
            flags_dropped: self.flags_dropped,
            families,
            detectors,
            flagged: self
                .recent
                .iter()
                .map(|s| FlaggedSubject {
                    detector: s.detector.into(),
                    subject: s.subject.clone(),
                    estimate: s.estimate,
                    threshold: s.threshold,
                    since_ms: s.since_us / 1000,
                    until_ms: s.until_us / 1000,
                })
                .collect(),
        }
    }

    /// Bytes the tables hold (inline and heap), for the memory report.
    pub fn bytes(&self) -> (u64, u64) {
        let entries: usize = self.families().iter().map(|f| f.len()).sum();
        let inline: usize = self.families().iter().map(|f| f.table_bytes()).sum();
        (entries as u64, (inline + self.sketch_bytes()) as u64)
    }

    pub(super) fn sketch_bytes(&self) -> usize {
        self.families().iter().map(|f| f.heap_bytes).sum()
    }
}
