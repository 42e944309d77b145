use super::*;
use crate::config::Config;
use std::net::IpAddr;

const T0: u64 = 1_893_456_000 * 1_000_000; // a UTC midnight

fn observer() -> Observer {
    let mut config = Config::default().activity;
    config.recent_max = 3;
    Observer::new(config, T0, 1)
}

fn refused(at_us: u64, address: &str, reason: Reason) -> Event {
    let network: IpAddr = address.parse().unwrap();
    Event::Refused(Box::new(Refused {
        at_us,
        rule: Arc::from("login/source_failures"),
        op: "check",
        decision: if reason.is_monitored() { Decision::Allow } else { Decision::Deny },
        reason,
        retry_after_ms: 1000,
        prefix: Some(Prefix { network, len: 32 }),
        class: Some(SourceClass::Hosting),
        account: Some(0xabcd),
        device: Some(0x1234),
        known_device: true,
    }))
}

#[test]
fn refusals_rank_prefixes_and_the_ring_keeps_the_newest() {
    let mut o = observer();
    for i in 0..5 {
        o.ingest(refused(T0 + i, "192.0.2.1", Reason::TooManyFailures));
    }
    o.ingest(refused(T0 + 9, "192.0.2.2", Reason::RateLimited));
    let view = o.view(10, T0 + 10);
    let top: Vec<(&str, &str, u64)> =
        view.top_refused_prefixes.iter().map(|p| (p.prefix.as_str(), p.class.as_str(), p.refusals)).collect();
    assert_eq!(top, vec![("192.0.2.1/32", "hosting", 5), ("192.0.2.2/32", "hosting", 1)]);
    // recent_max 3: the newest three, newest first.
    let recent: Vec<(u64, &str)> = view.recent_refusals.iter().map(|r| (r.at_ms, r.prefix.as_str())).collect();
    assert_eq!(recent.len(), 3);
    assert_eq!(recent[0].1, "192.0.2.2/32");
    assert_eq!(
        (view.recent_refusals[0].route.as_str(), view.recent_refusals[0].rule.as_str()),
        ("login", "source_failures")
    );
    assert_eq!(o.view(1, T0 + 10).top_refused_prefixes.len(), 1, "the request's limit holds");
}

#[test]
fn would_be_refusals_go_to_the_sample_not_to_the_refusals() {
    let mut o = observer();
    o.ingest(refused(T0, "192.0.2.1", Reason::MonitorTooManyFailures));
    let view = o.view(10, T0);
    assert!(view.top_refused_prefixes.is_empty() && view.recent_refusals.is_empty());
    let (samples, seen, _) = o.samples(10);
    assert_eq!(seen, 1);
    let s = &samples[0];
    assert_eq!(
        (s.account.as_str(), s.device.as_str(), s.known_device),
        ("acct:000000000000abcd", "dev:0000000000001234", true)
    );
    assert_eq!((s.prefix.as_str(), s.class.as_str(), s.op.as_str()), ("192.0.2.1/32", "hosting", "check"));
}

#[test]
fn the_top_lists_cover_two_windows_then_forget() {
    let mut o = observer();
    let window_us = o.config().top_window_ms * 1000;
    o.ingest(Event::Failure { at_us: T0, sample: 1, account: 7 });
    o.ingest(Event::Failure { at_us: T0 + window_us, sample: 1, account: 7 });
    assert_eq!(o.view(10, T0 + window_us).top_failing_accounts[0].failures, 2, "this window and the last");
    o.roll(T0 + 2 * window_us);
    assert_eq!(o.view(10, T0).top_failing_accounts[0].failures, 1, "the first window is gone");
    o.roll(T0 + 5 * window_us);
    assert!(o.view(10, T0).top_failing_accounts.is_empty(), "two idle windows: nothing is recent");
}

#[test]
fn a_day_ends_into_yesterday() {
    let mut o = observer();
    for (account, attempts) in [(1u64, 1), (2, 2), (3, 8)] {
        for _ in 0..attempts {
            o.ingest(Event::Attempt { at_us: T0 + 5, sample: account });
        }
    }
    for _ in 0..3 {
        o.ingest(Event::Failure { at_us: T0 + 6, sample: 3, account: 33 });
    }
    let today = o.view(10, T0 + 7).distributions;
    assert_eq!(today.len(), 2, "today's attempts and failures");
    assert_eq!((today[0].name.as_str(), today[0].day.as_str()), ("attempts", "today"));
    assert_eq!((today[0].accounts, today[0].p50, today[0].max), (3, 2, 8));
    assert_eq!((today[1].accounts, today[1].max), (1, 3));
    o.roll(T0 + DAY_US + 1);
    let after = o.view(10, T0 + DAY_US + 1).distributions;
    let yesterday: Vec<_> = after.iter().filter(|d| d.day == "yesterday").collect();
    assert_eq!(yesterday.len(), 2);
    assert_eq!((yesterday[0].accounts, yesterday[0].max), (3, 8));
    assert_eq!(after.iter().find(|d| d.day == "today").unwrap().accounts, 0);
    // A late event from yesterday does not turn the day back.
    o.ingest(Event::Attempt { at_us: T0 + 9, sample: 4 });
    assert_eq!(o.view(10, T0 + DAY_US + 2).distributions[0].day_start_ms, (T0 + DAY_US) / 1000);
}

/// Red team: the request path filters checks by the sample the thread last
/// published. On a new day the sample starts whole (shift 0), but until the
/// thread rolls (up to its drain interval later) the day before's shift
/// filtered out the first attempts of accounts outside it, and an account
/// never joins late: their day's counts were short.
#[test]
fn a_new_days_first_attempts_are_in_its_sample_before_the_thread_rolls() {
    let mut config = Config::default().activity;
    config.accounts_sampled_max = 4;
    let (link, observer, _rx) = channel(&config, T0);
    let hash = |n: u64| n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut o = observer.lock().unwrap();
    for n in 0..256 {
        o.ingest(Event::Attempt { at_us: T0, sample: hash(n) });
    }
    assert!(o.today.shift() > 0, "the sample halved");
    link.publish(&o.today);
    let outside = (0..).map(hash).find(|&h| !link.in_sample(h, T0)).expect("an account outside today's sample");
    assert!(link.in_sample(outside, T0 + DAY_US), "the next day's sample starts whole");
    // And the thread, rolling to that day, counts it.
    o.ingest(Event::Attempt { at_us: T0 + DAY_US, sample: outside });
    assert_eq!(o.today.len(), 1);
}

/// Red team: the reservoir's generator is splitmix64, whose choices
/// `samples` shows to anyone who can connect; its seed must not be key
/// material of the account sample's keyed hash.
#[test]
fn the_reservoirs_seed_is_not_the_sample_key() {
    let (link, observer, _rx) = channel(&Config::default().activity, T0);
    let seed = observer.lock().unwrap().samples.seed();
    assert_ne!(seed, link.sample_key.0);
    assert_ne!(seed, link.sample_key.1);
}
