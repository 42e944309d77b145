use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::flags::{flag_key, Space, WIDEN_48, WIDEN_56};
use super::*;
use crate::config::Config;
use crate::source::prefix_of;

const T0: u64 = 1_900_000_000_000_000;
const SECOND: u64 = 1_000_000;

fn config() -> SignalsConfig {
    Config::default().signals.expect("on by default")
}

fn digest(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A prefix and a stand-in digest for it (the engine only needs them to
/// be distinct and stable).
fn keyed(prefix: Prefix) -> (u64, Prefix) {
    let bytes = prefix.to_bytes();
    let high = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let low = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let tail = u64::from(bytes[16]) * 31 + u64::from(bytes[17]);
    (digest(high ^ digest(low ^ digest(tail))), prefix)
}

fn event(address: IpAddr, account: u64, outcome: Outcome, now_us: u64) -> ReportEvent {
    let v6 = address
        .is_ipv6()
        .then(|| V6Blocks { block56: keyed(prefix_of(address, 32, 56)), net64: keyed(prefix_of(address, 32, 64)).0 });
    ReportEvent {
        now_us,
        outcome,
        repeated: false,
        known_device: false,
        class: None,
        account: Some(digest(account)),
        narrow: keyed(prefix_of(address, 32, 64)),
        wide: keyed(prefix_of(address, 24, 48)),
        v6,
        tenant: 1,
        tenant_weight: 1,
        password: None,
    }
}

fn v4(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

fn published(signals: &mut Signals, space: Space, digest: u64) -> u16 {
    signals.snapshot().probe(space, digest, T0 + 10 * SECOND)
}

#[test]
fn a_source_is_flagged_at_the_threshold_of_distinct_failed_accounts_not_before() {
    let mut s = Signals::new(&config());
    let source = v4(0xCB00_7101);
    for account in 0..9 {
        s.ingest_report(&event(source, account, Outcome::Failure, T0));
        s.ingest_report(&event(source, account, Outcome::Failure, T0)); // a repeat of an account adds nothing
    }
    let narrow = keyed(prefix_of(source, 32, 64)).0;
    assert_eq!(published(&mut s, Space::Prefix, narrow), 0, "9 distinct accounts < 10");
    s.ingest_report(&event(source, 9, Outcome::Failure, T0));
    assert_ne!(published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16, 0);
}

#[test]
fn an_office_failing_among_its_successes_is_not_a_spray() {
    let mut s = Signals::new(&config());
    let office = v4(0xC633_640A);
    // One typo first, so the successes that follow are counted.
    s.ingest_report(&event(office, 0, Outcome::Failure, T0));
    for account in 0..500 {
        s.ingest_report(&event(office, account, Outcome::Success, T0 + SECOND));
    }
    // 60 typos among 500 successes: a share of 0.11.
    for account in 0..60 {
        s.ingest_report(&event(office, account, Outcome::Failure, T0 + 2 * SECOND));
    }
    let narrow = keyed(prefix_of(office, 32, 64)).0;
    assert_eq!(published(&mut s, Space::Prefix, narrow), 0);
}

#[test]
fn repeats_and_known_devices_feed_no_detector() {
    let mut s = Signals::new(&config());
    let source = v4(0xCB00_7102);
    for account in 0..50 {
        let mut e = event(source, account, Outcome::Failure, T0);
        e.repeated = account % 2 == 0;
        e.known_device = account % 2 == 1;
        e.password = Some(7);
        s.ingest_report(&e);
    }
    assert!(s.snapshot().is_empty(), "no flag from the owners' own failures");
    assert_eq!(s.narrow.len(), 0);
}

#[test]
fn one_password_on_many_accounts_is_flagged_and_one_account_retrying_is_not() {
    let mut s = Signals::new(&config());
    for n in 0..100u32 {
        let mut e = event(v4(0x0B00_0007 + (n << 8)), 1, Outcome::Failure, T0);
        e.password = Some(99);
        s.ingest_report(&e);
    }
    assert_eq!(published(&mut s, Space::Password, 99), 0, "one account, however many sources");
    for account in 0..19 {
        let mut e = event(v4(0x0C00_0007 + ((account as u32) << 8)), 100 + account, Outcome::Failure, T0);
        e.password = Some(42);
        s.ingest_report(&e);
    }
    assert_eq!(published(&mut s, Space::Password, 42), 0, "19 accounts");
    let mut e = event(v4(0x0D00_0007), 200, Outcome::Failure, T0);
    e.password = Some(42);
    s.ingest_report(&e);
    assert_ne!(published(&mut s, Space::Password, 42) & Detector::PasswordSpray.bit() as u16, 0, "20 accounts");
}

#[test]
fn an_account_failing_from_eight_prefixes_is_flagged() {
    let mut s = Signals::new(&config());
    for n in 0..7u32 {
        s.ingest_report(&event(v4(0x0E00_0001 + n), 5, Outcome::Failure, T0));
    }
    assert_eq!(published(&mut s, Space::Account, digest(5)), 0);
    s.ingest_report(&event(v4(0x0E00_0001 + 7), 5, Outcome::Failure, T0));
    assert_ne!(published(&mut s, Space::Account, digest(5)) & Detector::AccountDistributed.bit() as u16, 0);
}

fn in_48(n: u64, host: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from((0x2001_0db8_aa00u128 << 80) | (n as u128) << 64 | host as u128))
}

#[test]
fn one_64_never_widens_its_block_however_often_it_fails() {
    let mut s = Signals::new(&config());
    for account in 0..10_000 {
        s.ingest_report(&event(in_48(1, account), account, Outcome::Failure, T0));
    }
    let block = keyed(prefix_of(in_48(1, 0), 24, 48)).0;
    assert_eq!(published(&mut s, Space::Prefix, block) & (WIDEN_48 | WIDEN_56), 0);
    assert_eq!(s.widenings_total(), 0);
}

#[test]
fn sixteen_failing_56s_widen_the_48_and_it_calms_down_later() {
    let mut s = Signals::new(&config());
    // One /64 in each of 16 /56s: only the /48 collects them.
    for n in 0..15u64 {
        s.ingest_report(&event(in_48(n << 8, 1), n, Outcome::Failure, T0));
    }
    let block = keyed(prefix_of(in_48(0, 0), 24, 48)).0;
    assert_eq!(published(&mut s, Space::Prefix, block) & WIDEN_48, 0, "15 /56s");
    s.ingest_report(&event(in_48(15 << 8, 1), 15, Outcome::Failure, T0));
    assert_ne!(published(&mut s, Space::Prefix, block) & WIDEN_48, 0, "16 /56s");
    // An hour and a window later, with nothing failing, it is un-widened.
    let later = T0 + 2 * 3_600 * SECOND;
    s.tick(later);
    assert_eq!(s.snapshot().probe(Space::Prefix, block, later), 0);
}

#[test]
fn one_56_failing_from_all_its_64s_widens_itself_never_the_48_around_it() {
    // A customer's /56 inside an ISP's /48: 256 /64s failing widen the /56
    // (the customer's own budget) and leave the other customers alone.
    let mut s = Signals::new(&config());
    for n in 0..256u64 {
        s.ingest_report(&event(in_48(0x4200 | n, 1), n, Outcome::Failure, T0));
    }
    let block48 = keyed(prefix_of(in_48(0, 0), 24, 48)).0;
    let block56 = keyed(prefix_of(in_48(0x4200, 0), 32, 56)).0;
    assert_eq!(published(&mut s, Space::Prefix, block48) & WIDEN_48, 0);
    assert_ne!(published(&mut s, Space::Prefix, block56) & WIDEN_56, 0);
}

#[test]
fn eight_failing_64s_in_one_56_widen_the_56() {
    let mut s = Signals::new(&config());
    for n in 0..8u64 {
        s.ingest_report(&event(in_48(n, 1), n, Outcome::Failure, T0));
    }
    let block = keyed(prefix_of(in_48(0, 0), 32, 56)).0;
    assert_ne!(published(&mut s, Space::Prefix, block) & WIDEN_56, 0);
}

#[test]
fn a_never_widened_class_is_not_widened() {
    let mut s = Signals::new(&config());
    for n in 0..64u64 {
        let mut e = event(in_48(n << 8, 1), n, Outcome::Failure, T0);
        e.class = Some(SourceClass::Mobile);
        s.ingest_report(&e);
    }
    assert_eq!(s.widenings_total(), 0);
}

#[test]
fn a_flag_lasts_its_ttl_and_a_monitored_detector_is_published_unenforced() {
    let mut c = config();
    c.narrow_spray.mode = DetectorMode::Monitor;
    let mut s = Signals::new(&c);
    let source = v4(0xCB00_7103);
    for account in 0..10 {
        s.ingest_report(&event(source, account, Outcome::Failure, T0));
    }
    let narrow = keyed(prefix_of(source, 32, 64)).0;
    let table = s.snapshot();
    assert_ne!(table.probe(Space::Prefix, narrow, T0) & Detector::NarrowSpray.bit() as u16, 0);
    assert_eq!(table.enforced & Detector::NarrowSpray.bit() as u16, 0, "monitor: raised, not enforced");
    let expiry = T0 + c.flag_ttl_us;
    assert_eq!(table.probe(Space::Prefix, narrow, expiry), 0, "the request path reads the expiry itself");
    s.tick(expiry);
    assert!(s.snapshot().is_empty());
}

#[test]
fn a_tenant_failing_far_above_its_baseline_is_flagged_once_warm() {
    let c = config();
    let mut s = Signals::new(&c);
    let sub = c.window_us / sketch::SUB_WINDOWS as u64;
    // A day of ordinary traffic: 5% failures, 100 outcomes a sub-window.
    let warm_subs = (c.tenant_anomaly.warmup_hours as u64 * 3_600 * SECOND).div_ceil(sub) + 1;
    for i in 0..warm_subs {
        for n in 0..100u64 {
            let outcome = if n < 5 { Outcome::Failure } else { Outcome::Success };
            let mut e = event(v4(0x0A00_0001), n, outcome, T0 + i * sub + n);
            e.known_device = true;
            s.ingest_report(&e);
        }
    }
    assert_eq!(published(&mut s, Space::Tenant, 1), 0);
    // Then 200 failures in a row.
    let start = T0 + warm_subs * sub;
    for n in 0..200u64 {
        let mut e = event(v4(0x0A00_0001), n, Outcome::Failure, start + n);
        e.known_device = true;
        s.ingest_report(&e);
    }
    let table = s.snapshot();
    assert_ne!(table.probe(Space::Tenant, 1, start) & Detector::TenantAnomaly.bit() as u16, 0);
    assert_eq!(table.enforced & Detector::TenantAnomaly.bit() as u16, 0, "monitor mode by default");
}

#[test]
fn the_sketch_budget_holds_under_dense_entries() {
    let mut c = config();
    c.sketch_bytes_max = 1 << 16;
    let mut s = Signals::new(&c);
    // Sources each failing 300 accounts: every one dense.
    for source in 0..200u32 {
        for account in 0..300 {
            s.ingest_report(&event(v4(0x2000_0000 + (source << 8)), account, Outcome::Failure, T0));
        }
        assert!(s.sketch_bytes() <= c.sketch_bytes_max, "{} bytes", s.sketch_bytes());
    }
    assert!(s.families().iter().map(|f| f.evicted).sum::<u64>() > 0);
}

#[test]
fn flag_keys_of_different_spaces_never_meet() {
    assert_ne!(flag_key(Space::Account, 5), flag_key(Space::Prefix, 5));
    assert_ne!(flag_key(Space::Password, 5), flag_key(Space::Tenant, 5));
}

/// Red team: a full tenants table made every event naming a new tenant
/// scan all of it. Eviction samples now: a flood of invented tenants keeps
/// the table at its cap and evicts one per new tenant.
#[test]
fn a_flood_of_new_tenants_stays_at_the_cap() {
    let mut c = config();
    c.tenants_max = 64;
    let mut s = Signals::new(&c);
    for i in 0..10_000u64 {
        let mut e = event(v4(0xCB00_7101), i % 5, Outcome::Success, T0 + i);
        e.tenant = 1 << 40 | i;
        s.ingest_report(&e);
        assert!(s.tenants.len() <= 64);
    }
    assert_eq!(s.tenants_evicted, 10_000 - 64);
}

/// Red team: the failure-share gate counts distinct *succeeding accounts*,
/// so an attacker with a few accounts of its own (free sign-up) dilutes
/// it. One failure, then its 30 accounts log in, then 28 more victims: 29
/// distinct failed accounts, three times `narrow_spray`'s threshold, at a
/// share of 29/59 < 0.5. With distinct passwords (stuffing) the password
/// axis sees nothing either. Still open for one address; the same owned
/// accounts no longer serve every address the attacker has (next test).
#[test]
#[ignore = "a known gap, documented in docs/operations.md (Spray detection): owned accounts dilute the failure-share gate"]
fn thirty_owned_accounts_hide_a_stuffing_run_from_the_source_axes() {
    let mut s = Signals::new(&config());
    let source = v4(0xCB00_7101);
    s.ingest_report(&event(source, 1_000, Outcome::Failure, T0));
    for owned in 0..30 {
        s.ingest_report(&event(source, 5_000 + owned, Outcome::Success, T0 + SECOND));
    }
    for victim in 1_001..1_029 {
        s.ingest_report(&event(source, victim, Outcome::Failure, T0 + 2 * SECOND));
    }
    let narrow = keyed(prefix_of(source, 32, 64)).0;
    let count = s.narrow.get(narrow).map(|e| e.failed.count());
    assert_eq!(count, Some(29));
    assert_ne!(
        published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16,
        0,
        "29 distinct accounts failed from one address (threshold 10), not flagged"
    );
}

/// Successes are counted from one account in `success_sample`, each
/// weighing that many: 8,000 people logging in from one office address
/// leave about 1,000 accounts in its entry, and the failure share its 600
/// typos make is within a few points of the exact 0.07.
/// `people` distinct accounts log in from `office`, then `typos` others
/// fail once from it; the office's narrow digest.
fn office_logs_in(s: &mut Signals, office: IpAddr, people: u64, typos: u64) -> u64 {
    for account in 0..people {
        s.ingest_report(&event(office, account, Outcome::Success, T0));
    }
    for account in 0..typos {
        s.ingest_report(&event(office, 100_000 + account, Outcome::Failure, T0 + SECOND));
    }
    keyed(prefix_of(office, 32, 64)).0
}

#[test]
fn successes_count_from_a_sample_of_accounts_each_weighing_the_rate() {
    let c = config();
    assert_eq!(c.success_sample, 8);
    let mut s = Signals::new(&c);
    let narrow = office_logs_in(&mut s, v4(0xC633_640B), 8_000, 600);
    let entry = s.narrow.get(narrow).expect("tracked");
    let sampled = f64::from(entry.succeeded.count());
    assert!((sampled - 1_000.0).abs() < 150.0, "{sampled} accounts in the sample, not about 1,000");
    let share = entry.failure_share(c.success_sample);
    assert!((share - 600.0 / 8_600.0).abs() < 0.02, "share {share}");
    assert_eq!(published(&mut s, Space::Prefix, narrow), 0, "an office's typos among its successes");
    // In or out wherever it logs in: one account is sampled from every address or none.
    let sampled_accounts: Vec<u64> = (0..1_000).filter(|a| in_success_sample(digest(*a), 8)).collect();
    assert!((90..=160).contains(&sampled_accounts.len()), "{} of 1,000", sampled_accounts.len());
    assert!((0..1_000).all(|a| in_success_sample(digest(a), 1)), "1 counts every success");
}

/// A success outside the sample still counts in its tenant's ratio,
/// weighted; a tenant's ratio is of outcomes, drawn per report.
#[test]
fn a_tenant_counts_sampled_successes_at_their_weight() {
    let mut s = Signals::new(&config());
    s.ingest(&SignalEvent::TenantSuccess { now_us: T0, tenant: 1, weight: 8 });
    let mut e = event(v4(0x0A00_0001), 1, Outcome::Success, T0);
    e.tenant_weight = 0;
    s.ingest_report(&e);
    s.ingest_report(&event(v4(0x0A00_0001), 2, Outcome::Failure, T0));
    let tenant = &s.tenants[&1];
    let slot = (T0 / s.sub_us % SUB_WINDOWS as u64) as usize;
    assert_eq!((tenant.succeeded[slot], tenant.failed[slot]), (8, 1));
    let drawn = (0..80_000u64).filter(|n| tenant_draw(digest(*n), T0 + n, 8)).count();
    assert!((9_000..=11_000).contains(&drawn), "{drawn} of 80,000 drawn at one in 8");
}

#[test]
fn success_sample_is_bounded_and_one_counts_every_success() {
    for bad in ["0", "1025"] {
        let raw = Config::parse(&format!("[signals]\nsuccess_sample = {bad}\n")).expect("parses");
        let errors = format!("{:#}", Config::build(raw).expect_err("out of range"));
        assert!(errors.contains("signals.success_sample: must be 1..=1024"), "{errors}");
    }
    let raw = Config::parse("[signals]\nsuccess_sample = 1\n").expect("parses");
    let c = Config::build(raw).expect("valid").signals.expect("on");
    let mut s = Signals::new(&c);
    let office = v4(0xC633_640C);
    for account in 0..100 {
        s.ingest_report(&event(office, account, Outcome::Success, T0));
    }
    let narrow = keyed(prefix_of(office, 32, 64)).0;
    assert_eq!(s.narrow.get(narrow).map(|e| e.succeeded.count()), Some(100));
}

/// The owned accounts' dilution is capped per account: logged into from
/// a ninth address in the window, they count for nothing there, so the
/// attacker's ninth address failing 28 victims is flagged. Before the cap,
/// 30 accounts hid the failures of all 2,000 addresses a stuffing run had.
#[test]
fn owned_accounts_dilute_only_their_first_few_addresses() {
    let mut c = config();
    c.success_sample = 1;
    assert_eq!(c.success_sources_max, 8);
    owned_accounts_then_victims_flag_the_ninth_address(&c);
}

/// At each of 12 addresses in turn: one failure, the attacker's 30 own
/// accounts log in, 28 victims fail. Addresses past the eighth are flagged.
fn owned_accounts_then_victims_flag_the_ninth_address(c: &SignalsConfig) {
    let mut s = Signals::new(c);
    for address in 0..12u32 {
        let source = v4(0xCB00_7200 + address);
        let at = T0 + u64::from(address) * SECOND;
        s.ingest_report(&event(source, 1_000_000 + u64::from(address), Outcome::Failure, at));
        for owned in 0..30 {
            s.ingest_report(&event(source, 5_000 + owned, Outcome::Success, at));
        }
        for victim in 0..28 {
            s.ingest_report(&event(source, u64::from(address) * 100 + victim, Outcome::Failure, at));
        }
        let narrow = keyed(prefix_of(source, 32, 64)).0;
        let flagged = published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16 != 0;
        assert_eq!(flagged, address >= 8, "address {address}: flagged {flagged}");
    }
}

/// Red team: the cap's memory is the owned account's entry in the
/// `accounts` table, an entry that only succeeded, the first a full table
/// evicts. A stuffing run fails more distinct accounts an hour than the
/// table holds (131,072 by default; 64 here), so its own victims push its
/// owned accounts' entries out, and every address it has is again one of
/// their first eight.
#[test]
fn a_full_accounts_table_still_caps_where_owned_accounts_dilute() {
    let mut c = config();
    c.success_sample = 1;
    c.accounts_max = 64;
    owned_accounts_then_victims_flag_the_ninth_address(&c);
}

/// Red team: a reload changing `success_sample` judged the successes
/// already counted at the old rate at the new weight. From 8 to 1 (an
/// operator counting every success to look into a borderline source), the
/// eighth of an office's successes in its sample weighed 1 each, its share
/// rose from 0.17 to about 0.6, and its next typo flagged it.
#[test]
fn a_reload_changing_the_success_sample_does_not_flag_an_office() {
    let c = config();
    let mut s = Signals::new(&c);
    let office = v4(0xC633_640D);
    let narrow = office_logs_in(&mut s, office, 1_000, 200);
    assert_eq!(published(&mut s, Space::Prefix, narrow), 0, "a share of 0.17");
    let mut every = c.clone();
    every.success_sample = 1;
    s.reconfigure(&every);
    s.ingest_report(&event(office, 100_200, Outcome::Failure, T0 + 2 * SECOND));
    assert_eq!(published(&mut s, Space::Prefix, narrow), 0, "the same office, reloaded");
}

/// Red team: a `mobile` source counts against `success_sources_max` by its
/// wide prefix (a phone hops addresses in its carrier's pool), but its
/// successes dilute each narrow prefix it logs in from. Through mobile
/// proxies (each exit a /64 of a carrier's /48, never widened) one owned
/// account dilutes every /64 of 8 carrier /48s: 30 accounts again hide a
/// stuffing run's failures at every exit it has.
#[test]
#[ignore = "a known gap: a mobile carrier's pool counts once against success_sources_max, each of its /64s dilutes"]
fn owned_accounts_dilute_every_64_of_a_mobile_carriers_pool() {
    let mut c = config();
    c.success_sample = 1;
    let mut s = Signals::new(&c);
    let mut flagged = 0;
    for exit in 0..12u64 {
        let source = in_48(exit, 1);
        let at = T0 + exit * SECOND;
        let mobile = |mut e: ReportEvent| {
            e.class = Some(SourceClass::Mobile);
            e
        };
        s.ingest_report(&mobile(event(source, 1_000_000 + exit, Outcome::Failure, at)));
        for owned in 0..30 {
            s.ingest_report(&mobile(event(source, 5_000 + owned, Outcome::Success, at)));
        }
        for victim in 0..28 {
            s.ingest_report(&mobile(event(source, exit * 100 + victim, Outcome::Failure, at)));
        }
        let narrow = keyed(prefix_of(source, 32, 64)).0;
        if published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16 != 0 {
            flagged += 1;
        }
    }
    assert_eq!(flagged, 4, "12 exits, 8 of them diluted");
}

/// Red team: which accounts are sampled is fixed by the secret, so a small
/// shared source that drew few of its people is flagged every hour. 400
/// labs, each 15 people logging in and 10 of them mistyping once on the
/// lab's machines (a share of 0.4, under the gate): at most a fifth may be
/// flagged (42% counting the sample as it fell; about 13% now).
#[test]
fn small_labs_are_seldom_flagged_for_the_sample_they_drew() {
    let mut s = Signals::new(&config());
    let mut flagged = 0;
    for lab in 0..400u32 {
        let source = v4(0x0A64_0000 + lab);
        let people = u64::from(lab) * 100;
        for person in 0..15 {
            s.ingest_report(&event(source, people + person, Outcome::Success, T0));
        }
        for person in 0..10 {
            s.ingest_report(&event(source, people + 50 + person, Outcome::Failure, T0 + SECOND));
        }
        let narrow = keyed(prefix_of(source, 32, 64)).0;
        if published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16 != 0 {
            flagged += 1;
        }
    }
    assert!(flagged <= 80, "{flagged} of 400 labs flagged");
}

/// `status` and the published flags, compared as text: what two engines
/// fed the same events must agree on.
fn observed(s: &mut Signals, now_us: u64) -> String {
    s.tick(now_us);
    let status = s.status(0, now_us);
    let flags = s.snapshot();
    format!("{status:?} {:?}", (flags.len(), flags.enforced))
}

#[test]
fn ingesting_in_batches_with_prefetching_counts_exactly_what_one_by_one_does() {
    // Small tables, so the stream evicts all the time; IPv4 and IPv6
    // sources, passwords, successes sampled and not, repeats.
    let mut c = config();
    (c.prefixes_max, c.wide_prefixes_max, c.accounts_max, c.passwords_max, c.blocks_max) = (500, 50, 400, 40, 60);
    let (mut batched, mut single) = (Signals::new(&c), Signals::new(&c));
    let mut events = Vec::new();
    for i in 0..20_000u64 {
        let r = digest(i);
        let address = if r.is_multiple_of(3) {
            // Across 256 /48s, 16 /56s in each, 4 /64s in each /56.
            let (net48, net56, net64) = (u128::from(r >> 8 & 0xFF), u128::from(r >> 16 & 0xF), u128::from(r >> 20 & 3));
            IpAddr::V6(Ipv6Addr::from(0x2001_0db8u128 << 96 | net48 << 80 | net56 << 72 | net64 << 64 | 1))
        } else {
            v4(0x0A00_0000 | (r >> 20) as u32 & 0xF_FFFF)
        };
        let outcome = if r.is_multiple_of(4) { Outcome::Success } else { Outcome::Failure };
        let mut e = event(address, r >> 40 & 0x3FF, outcome, T0 + i * 100_000);
        e.password = (outcome == Outcome::Failure).then_some(r >> 50 & 0x3F);
        e.repeated = r.is_multiple_of(29);
        events.push(SignalEvent::Report(e));
        if r.is_multiple_of(5) {
            events.push(SignalEvent::TenantSuccess { now_us: T0 + i * 100_000, tenant: r & 3, weight: 8 });
        }
    }
    for (n, chunk) in events.chunks(256).enumerate() {
        batched.ingest_all(chunk);
        chunk.iter().for_each(|e| single.ingest(e));
        if n % 10 == 0 {
            let now = T0 + (n as u64 * 256 + 255) * 50_000;
            assert_eq!(observed(&mut batched, now), observed(&mut single, now));
        }
    }
    let evicted: Vec<_> = batched.families().iter().map(|f| (f.name, f.len(), f.evicted)).collect();
    assert!(batched.families().iter().all(|f| f.evicted > 0), "every table was full: {evicted:?}");
    assert_eq!(batched.bytes(), single.bytes());
}

/// A flag its detector keeps firing stays published past its first hour:
/// the request path is given each later end, not only the first.
#[test]
fn a_flag_kept_alive_by_its_detector_stays_enforced_while_the_attack_goes_on() {
    let mut s = Signals::new(&config());
    let source = v4(0xCB00_7102);
    let narrow = keyed(prefix_of(source, 32, 64)).0;
    let minute = 60 * SECOND;
    let mut table = s.snapshot();
    // Ten accounts in the first ten minutes, then one more every minute
    // for three hours: the flag's detector fires at every one.
    for n in 0..190u64 {
        let now = T0 + n * minute;
        s.tick(now);
        s.ingest_report(&event(source, n, Outcome::Failure, now));
        if s.changed() {
            table = s.snapshot();
        }
        if n >= 10 {
            assert_ne!(table.probe(Space::Prefix, narrow, now + SECOND), 0, "flag published at minute {n}");
        }
    }
    // Once the failures stop, the flag ends an hour after the last.
    let end = T0 + 189 * minute + 3_600 * SECOND;
    s.tick(end + SECOND);
    assert!(s.changed());
    assert_eq!(s.snapshot().probe(Space::Prefix, narrow, end + SECOND), 0);
}

/// One phone hopping its carrier's NAT addresses is one subscriber: its
/// failures, however many addresses they come from, never flag the
/// carrier's /24 (as `account_distributed` counts it by its /24 too).
#[test]
fn one_phone_hopping_carrier_addresses_never_flags_the_carriers_24() {
    let mut s = Signals::new(&config());
    for n in 0..72u32 {
        let mut e = event(v4(0x6440_0000 + n % 18), u64::from(n), Outcome::Failure, T0 + u64::from(n) * SECOND);
        e.class = Some(SourceClass::Mobile);
        s.ingest_report(&e);
    }
    let wide = keyed(prefix_of(v4(0x6440_0000), 24, 48)).0;
    assert_eq!(published(&mut s, Space::Prefix, wide), 0);
}

/// Each address of a /24 failing the same four "burner" accounts first,
/// then five fresh ones (nine, below its own flag): the /24 counts every
/// address's four pairs and every fresh account, so it is flagged.
#[test]
fn a_spray_whose_addresses_start_with_shared_accounts_still_flags_the_24() {
    let mut s = Signals::new(&config());
    let mut fresh = 100;
    for host in 0..16u32 {
        let address = v4(0xCB00_7200 + host);
        for burner in 0..4 {
            s.ingest_report(&event(address, burner, Outcome::Failure, T0));
        }
        for _ in 0..5 {
            fresh += 1;
            s.ingest_report(&event(address, fresh, Outcome::Failure, T0));
        }
    }
    let wide = keyed(prefix_of(v4(0xCB00_7200), 24, 48)).0;
    assert_ne!(published(&mut s, Space::Prefix, wide) & Detector::WideSpray.bit() as u16, 0);
}

/// A /24 whose addresses each keep their hour at 5 to 9 failed accounts
/// (five in one quarter, four two quarters later, again and again), with
/// 12 fresh addresses joining every hour: every address counts its four
/// pairs while it fails in the window, not only in its first hour, so the
/// /24 is flagged once 13 addresses fail together.
#[test]
fn a_spray_rolling_each_address_through_its_hours_is_flagged() {
    let mut s = Signals::new(&config());
    let quarter = 900 * SECOND;
    let wide = keyed(prefix_of(v4(0xCB00_7400), 24, 48)).0;
    let mut account = 0;
    let mut flagged_at = None;
    'spray: for half in 0..16u64 {
        let now = T0 + half * 2 * quarter;
        let active = 12 * (half / 2 + 1) as u32;
        for host in 0..active {
            // Joining addresses start with five, then alternate.
            let joined = u64::from(host / 12) * 2;
            let accounts = if (half - joined).is_multiple_of(2) { 5 } else { 4 };
            for _ in 0..accounts {
                account += 1;
                s.ingest_report(&event(v4(0xCB00_7400 + host), account, Outcome::Failure, now));
            }
            if s.snapshot().probe(Space::Prefix, wide, now) & Detector::WideSpray.bit() as u16 != 0 {
                flagged_at = Some(half);
                break 'spray;
            }
        }
    }
    assert!(flagged_at.is_some_and(|half| half <= 2), "flagged at half-hour {flagged_at:?}");
}

/// A busy /24 (198.51.112.0/24): 200 customers log in three times each,
/// 46 of them after one typo.
fn busy_24(s: &mut Signals) {
    for host in 0..200u32 {
        let address = v4(0xC633_7000 + host);
        let account = u64::from(host);
        if host < 46 {
            s.ingest_report(&event(address, account, Outcome::Failure, T0));
        }
        for _ in 0..3 {
            s.ingest_report(&event(address, account, Outcome::Success, T0));
        }
    }
}

/// A busy /24: 200 customers log in, 46 of them mistype once, and one
/// address fails 400 accounts (the address is flagged on its own). The
/// /24's pairs reach 50 and its failed accounts outnumber its successes,
/// but that address's count only its four pairs against the successes,
/// so the flag never falls on the neighbours.
#[test]
fn one_address_failing_many_accounts_among_busy_neighbours_never_flags_their_24() {
    let mut s = Signals::new(&config());
    busy_24(&mut s);
    let culprit = v4(0xC633_70F0);
    for account in 0..400 {
        s.ingest_report(&event(culprit, 100_000 + account, Outcome::Failure, T0));
    }
    let wide = keyed(prefix_of(culprit, 24, 48)).0;
    let narrow = keyed(prefix_of(culprit, 32, 64)).0;
    assert_ne!(published(&mut s, Space::Prefix, narrow) & Detector::NarrowSpray.bit() as u16, 0);
    assert_eq!(published(&mut s, Space::Prefix, wide) & Detector::WideSpray.bit() as u16, 0);
}

/// Eight /24s, each with 64 addresses failing 9 accounts apiece (none
/// flagged alone), and 300 accounts of the attacker's own logged into
/// from each: the /24's share is taken over what its addresses fail
/// unflagged (9 each), not over its pairs (4 each), so the owned logins
/// do not hide the spray. (Red team, round 5.)
#[test]
fn owned_accounts_logged_into_from_eight_24s_do_not_hide_a_spray_through_them() {
    let mut s = Signals::new(&config());
    let mut victim = 1_000_000u64;
    let mut flagged = 0;
    for block in 0..8u32 {
        let base = 0x2D00_0000 + (block << 8);
        let at = T0 + u64::from(block) * 60 * SECOND;
        for owned in 0..300u64 {
            s.ingest_report(&event(v4(base + (owned % 64) as u32), owned, Outcome::Success, at));
        }
        for host in 0..64u32 {
            for _ in 0..9 {
                victim += 1;
                s.ingest_report(&event(v4(base + host), victim, Outcome::Failure, at + SECOND));
            }
        }
        let wide = keyed(prefix_of(v4(base), 24, 48)).0;
        flagged += usize::from(published(&mut s, Space::Prefix, wide) & Detector::WideSpray.bit() as u16 != 0);
    }
    assert_eq!(flagged, 8, "every /24 is flagged");
}

/// A reload that changes `success_sample` forgets a busy /24's successes:
/// its sums start over with them, so the neighbours' typos from before
/// the reload cannot be weighed against no successes. (Red team, round 5.)
#[test]
fn a_reload_forgets_a_blocks_sums_with_its_successes() {
    let c = config();
    let mut s = Signals::new(&c);
    busy_24(&mut s);
    let mut reloaded = c.clone();
    reloaded.success_sample = 4;
    s.reconfigure(&reloaded);
    let culprit = v4(0xC633_70F0);
    for account in 0..50 {
        s.ingest_report(&event(culprit, 100_000 + account, Outcome::Failure, T0 + SECOND));
    }
    let wide = keyed(prefix_of(culprit, 24, 48)).0;
    assert_eq!(published(&mut s, Space::Prefix, wide) & Detector::WideSpray.bit() as u16, 0);
}

fn flagged(s: &mut Signals, address: IpAddr, v4_len: u8, v6_len: u8, detector: Detector) -> bool {
    let key = keyed(prefix_of(address, v4_len, v6_len)).0;
    published(s, Space::Prefix, key) & detector.bit() as u16 != 0
}

/// A /56 fails 19 accounts without its own flag (two /64s × 9, one × 1:
/// pairs 9 < 10), so its /48 weighs it at 19, not at a /64's 9: 13 such
/// /56s fail 247 accounts, and 14 sampled owned accounts (≈112) logged in
/// from the /48 do not hide them, as they would not from a /24's 13
/// addresses (117). (Red team, round 6.)
#[test]
fn owned_accounts_do_not_hide_a_48_spray_through_its_56s() {
    let mut s = Signals::new(&config());
    let owned: Vec<u64> = (0..).filter(|a| in_success_sample(digest(*a), 8)).take(14).collect();
    for a in &owned {
        s.ingest_report(&event(in_48(15 << 8, 1), *a, Outcome::Success, T0));
    }
    let mut victim = 1_000_000u64;
    for n in 0..13u64 {
        for (net, accounts) in [(0u64, 9), (1, 9), (2, 1)] {
            for _ in 0..accounts {
                victim += 1;
                s.ingest_report(&event(in_48((n << 8) | net, 1), victim, Outcome::Failure, T0 + SECOND));
            }
        }
    }
    for n in 0..13u64 {
        assert!(!flagged(&mut s, in_48(n << 8, 1), 32, 56, Detector::NarrowSpray), "no /56 flag");
        assert!(!flagged(&mut s, in_48(n << 8, 1), 32, 64, Detector::NarrowSpray), "no /64 flag");
    }
    let block = keyed(prefix_of(in_48(0, 0), 24, 48)).0;
    assert_eq!(published(&mut s, Space::Prefix, block) & WIDEN_48, 0, "13 /56s do not widen");
    assert!(flagged(&mut s, in_48(0, 0), 24, 48, Detector::WideSpray));
}

/// A reload that changes the caps clears the sums; a part failing again
/// in the same sub-window, whose newest element the cleared entry lacks,
/// counts in full again at once. (Red team, round 6.)
#[test]
fn after_a_reload_clears_the_sums_parts_failing_again_count_in_full() {
    let c = config();
    let mut s = Signals::new(&c);
    let base = 0xCB00_7600u32;
    let mut account = 0;
    for host in 0..20 {
        for _ in 0..2 {
            account += 1;
            s.ingest_report(&event(v4(base + host), account, Outcome::Failure, T0));
        }
    }
    assert!(!flagged(&mut s, v4(base), 24, 48, Detector::WideSpray), "40 accounts");
    let mut reloaded = c.clone();
    reloaded.wide_spray.accounts_per_source_max = 5;
    s.reconfigure(&reloaded);
    for host in 0..20 {
        account += 1;
        s.ingest_report(&event(v4(base + host), account, Outcome::Failure, T0 + 60 * SECOND));
    }
    assert!(flagged(&mut s, v4(base), 24, 48, Detector::WideSpray), "60 accounts, 60 pairs");
}

proptest::proptest! {
    /// A block's sums against a model: in each sub-window a part counts
    /// elements 1..=k, k the most accounts it showed there (capped), so
    /// each sum is, over its parts, the largest k in the window's
    /// sub-windows. Whatever order the failures come in, fresh or not.
    #[test]
    fn a_blocks_sums_count_each_parts_largest_top_in_the_window(
        failures in proptest::collection::vec((0u64..2, 0u64..5, 1u32..25, proptest::bool::ANY), 1..120)
    ) {
        use super::sketch::SUB_WINDOWS;
        let mut s = Signals::new(&config());
        let cap = s.config.wide_spray.accounts_per_source_max;
        let hidden_cap = 20;
        let block = keyed(prefix_of(v4(0x0A00_0000), 24, 48));
        let mut model: std::collections::BTreeMap<u64, std::collections::HashMap<u64, [u32; 2]>> = Default::default();
        let mut epoch = 0;
        for (advance, part, accounts, fresh) in failures {
            epoch += advance;
            let spread = s.spread(block, (digest(1000 + part), accounts), fresh, hidden_cap, epoch, T0);
            let tops = model.entry(epoch).or_default().entry(part).or_default();
            tops[0] = tops[0].max(accounts.clamp(1, cap));
            tops[1] = tops[1].max(accounts.clamp(1, hidden_cap));
            let mut largest: std::collections::HashMap<u64, [u32; 2]> = Default::default();
            for parts in model.range(epoch.saturating_sub(SUB_WINDOWS as u64 - 1)..=epoch).map(|(_, p)| p) {
                for (part, top) in parts {
                    let l = largest.entry(*part).or_default();
                    (l[0], l[1]) = (l[0].max(top[0]), l[1].max(top[1]));
                }
            }
            let sums = largest.values().fold([0, 0], |a, l| [a[0] + l[0], a[1] + l[1]]);
            proptest::prop_assert_eq!([spread.pairs, spread.hidden], sums);
        }
    }
}
