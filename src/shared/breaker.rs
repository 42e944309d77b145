//! When to stop asking the store. Pure: the time is passed in.
//!
//! Closed: requests go to the store, each waiting at most the timeout.
//! `breaker_failures` failures in a row open it: then nothing waits, global
//! rules are answered on this host, and the supervisor probes with a
//! doubling delay. A probe that connects, loads the script and joins moves
//! it to Recovering (lockouts taken meanwhile are written back) and then
//! Closed. Refused: the store belongs to hosts keyed with another secret;
//! the host probes at the longest delay, and leaves it only through a
//! probe that joins (the record was removed, or this host's fingerprint
//! took it back: `SharedStore::assert_fingerprint`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    Recovering,
    Refused,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::Recovering => "recovering",
            State::Refused => "refused",
        }
    }

    pub(super) fn from_u8(v: u8) -> State {
        match v {
            0 => State::Closed,
            1 => State::Open,
            2 => State::Recovering,
            _ => State::Refused,
        }
    }

    pub(super) fn to_u8(self) -> u8 {
        self as u8
    }
}

#[derive(Debug)]
pub struct Breaker {
    pub state: State,
    failures_in_a_row: u32,
    failures_to_open: u32,
    probe_delay_min_us: u64,
    probe_delay_max_us: u64,
    probe_delay_us: u64,
    next_probe_us: u64,
}

impl Breaker {
    /// A breaker that starts open: nothing is known of the store until the
    /// first probe.
    pub fn new(failures_to_open: u32, probe_delay_min_us: u64, probe_delay_max_us: u64) -> Breaker {
        Breaker {
            state: State::Open,
            failures_in_a_row: 0,
            failures_to_open: failures_to_open.max(1),
            probe_delay_min_us,
            probe_delay_max_us: probe_delay_max_us.max(probe_delay_min_us),
            probe_delay_us: probe_delay_min_us,
            next_probe_us: 0,
        }
    }

    /// A call answered: the failures in a row start again.
    pub fn succeeded(&mut self) {
        self.failures_in_a_row = 0;
    }

    /// A call failed (timeout, I/O, a store that cannot serve). True if
    /// this failure opened the breaker.
    pub fn failed(&mut self, now_us: u64) -> bool {
        self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
        if self.state == State::Closed && self.failures_in_a_row >= self.failures_to_open {
            self.state = State::Open;
            self.probe_delay_us = self.probe_delay_min_us;
            self.next_probe_us = now_us + self.probe_delay_us;
            return true;
        }
        false
    }

    /// When the next probe is due, while open.
    pub fn next_probe_us(&self) -> u64 {
        self.next_probe_us
    }

    /// A probe failed: wait twice as long for the next (up to the cap), so
    /// a store that stays away is not hammered by every host.
    pub fn probe_failed(&mut self, now_us: u64) {
        if self.state == State::Recovering {
            self.state = State::Open;
        }
        if self.state == State::Refused {
            self.next_probe_us = now_us + self.probe_delay_max_us;
            return;
        }
        self.next_probe_us = now_us + self.probe_delay_us;
        self.probe_delay_us = (self.probe_delay_us * 2).min(self.probe_delay_max_us);
    }

    /// A probe connected and joined: write back, then close.
    pub fn probe_succeeded(&mut self) {
        if matches!(self.state, State::Open | State::Refused) {
            self.state = State::Recovering;
        }
    }

    pub fn recovered(&mut self) {
        if self.state == State::Recovering {
            self.state = State::Closed;
            self.failures_in_a_row = 0;
            self.probe_delay_us = self.probe_delay_min_us;
        }
    }

    /// The store records another secret: probe again at the longest delay.
    pub fn refuse(&mut self, now_us: u64) {
        self.state = State::Refused;
        self.next_probe_us = now_us + self.probe_delay_max_us;
    }
}

/// A run of late request calls. It begins at a late call and ends only
/// when the store answers a call in time `busy_max` or more after the
/// run's last late call: quiet gaps do not end it, so a frozen store's
/// sparse calls make one run that grows old. A store late at a stretch
/// for longer than `busy_max` is lost or overloaded, not busy with a
/// burst, but to a check in a burst on its keys while the
/// store still replies (`replying`, `SharedStore::lateness`). Pure: the time
/// is passed in.
#[derive(Debug, Default)]
pub struct LateRun {
    start_us: u64,
    /// 0: no run.
    last_us: u64,
}

/// Whether a store that has owed a reply since `owing_since_us` (the
/// first batch sent after its last reply, late or not; 0 none) is there:
/// it has owed one for less than `busy_max_us`. A late check in a burst
/// on its keys is then busy however old its run (`SharedStore::lateness`),
/// so bursts spaced closer than `busy_max` (one run, grown old) are each
/// held exactly, not answered on the shares (5 + 3 x 2 tried, not 5). A
/// frozen store is lost `busy_max` after the first batch sent after its
/// last reply (a reply clears batches still in flight too); an idle one
/// owes nothing, so a burst after a quiet second finds it there (measured
/// by its last reply, that burst's first late checks were failures and
/// opened the breaker).
/// Lone late checks are not excused by it: a store kept late for longer
/// is lost to them, so its breaker can open and the shares count what
/// they admit.
pub fn replying(now_us: u64, busy_max_us: u64, owing_since_us: u64) -> bool {
    busy_max_us > 0 && (owing_since_us == 0 || now_us.saturating_sub(owing_since_us) < busy_max_us)
}

impl LateRun {
    /// A call is late at `now_us`: whether its run is younger than
    /// `busy_max_us`.
    pub fn late(&mut self, now_us: u64, busy_max_us: u64) -> bool {
        if self.last_us == 0 {
            self.start_us = now_us;
        }
        self.last_us = now_us.max(1);
        now_us.saturating_sub(self.start_us) < busy_max_us
    }

    /// A call was answered in time at `now_us`.
    pub fn answered(&mut self, now_us: u64, busy_max_us: u64) {
        if self.last_us != 0 && now_us.saturating_sub(self.last_us) >= busy_max_us {
            self.last_us = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst's late calls are young for busy_max; a store late at a
    /// stretch for longer is not, quiet gaps or not, until it answers in
    /// time busy_max after its last late call.
    #[test]
    fn a_run_of_late_calls_is_young_for_busy_max_and_ends_only_with_a_timely_answer() {
        let mut run = LateRun::default();
        let max = 500;
        assert!(run.late(1_000, max));
        run.answered(1_200, max);
        assert!(run.late(1_499, max), "an answer amid the burst does not end its run");
        assert!(!run.late(1_500, max), "the run has lasted busy_max");
        assert!(!run.late(9_000, max), "a quiet gap without an answer does not end it (a frozen store)");
        run.answered(9_499, max);
        assert!(!run.late(9_600, max), "an answer sooner than busy_max after the last late call does not end it");
        run.answered(10_100, max);
        assert!(run.late(10_200, max), "an answer busy_max after the last late call ended it: a new run");
        assert!(!LateRun::default().late(0, 0), "busy_max 0: never busy");
    }

    /// A store owing a reply for less than busy_max is there; one that
    /// left a batch unanswered for busy_max (frozen) is not; an idle one
    /// owes none.
    #[test]
    fn a_store_is_replying_until_it_owes_a_reply_for_busy_max() {
        assert!(replying(1_600, 500, 1_300), "owed for 300");
        assert!(!replying(1_800, 500, 1_300), "owed for 500: a frozen store");
        assert!(replying(100_000, 500, 0), "owes none: idle, however long");
        assert!(!replying(10, 0, 0), "busy_max 0: never");
        assert!(replying(1_000, 500, 1_001), "owed from after now (a race)");
    }

    #[test]
    fn opens_after_the_failures_in_a_row_and_only_then() {
        let mut b = Breaker::new(3, 100, 1000);
        b.probe_succeeded();
        b.recovered();
        assert_eq!(b.state, State::Closed);
        assert!(!b.failed(10));
        assert!(!b.failed(11));
        b.succeeded();
        assert!(!b.failed(12));
        assert!(!b.failed(13));
        assert!(b.failed(14));
        assert_eq!(b.state, State::Open);
        assert_eq!(b.next_probe_us(), 114);
    }

    #[test]
    fn probes_back_off_to_the_cap_and_close_after_recovery() {
        let mut b = Breaker::new(1, 100, 350);
        assert_eq!(b.state, State::Open);
        b.probe_failed(0);
        assert_eq!(b.next_probe_us(), 100);
        b.probe_failed(100);
        assert_eq!(b.next_probe_us(), 300);
        b.probe_failed(300);
        assert_eq!(b.next_probe_us(), 650);
        b.probe_failed(650);
        assert_eq!(b.next_probe_us(), 1000, "capped at 350");
        b.probe_succeeded();
        assert_eq!(b.state, State::Recovering);
        b.recovered();
        assert_eq!(b.state, State::Closed);
        assert!(b.failed(2000), "one failure opens a breaker of 1");
        assert_eq!(b.next_probe_us(), 2100, "the delay starts again from the minimum");
    }

    /// Refused holds through failed probes and calls, probing at the
    /// longest delay, until a probe joins.
    #[test]
    fn refused_probes_at_the_longest_delay_until_a_probe_joins() {
        let mut b = Breaker::new(1, 100, 350);
        b.refuse(1000);
        assert_eq!((b.state, b.next_probe_us()), (State::Refused, 1350));
        b.recovered();
        assert!(!b.failed(1100), "a failed call opens nothing");
        b.probe_failed(1400);
        assert_eq!((b.state, b.next_probe_us()), (State::Refused, 1750), "no doubling: already the longest");
        b.probe_succeeded();
        b.recovered();
        assert_eq!(b.state, State::Closed);
    }
}
