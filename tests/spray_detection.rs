//! Spray detection against the targets, on generated traffic run
//! through the real limiter and the real signals engine (`tollgate
//! simulate`, in-process). Every figure is exact for its seed: the
//! detectors decide in the sketches' exact range, and the traffic is drawn
//! from seeded generators. Each pinned figure says where it comes from.

use tollgate::sim::{run, Mix, Scenario, SimReport};
use tollgate::Config;

fn simulate(mixes: &[Mix]) -> SimReport {
    run(&Config::default(), &Scenario::of(mixes))
}

fn attack(report: &SimReport, mix: Mix) -> &tollgate::sim::AttackReport {
    report.attacks.iter().find(|a| a.mix == mix.name()).expect("the attack ran")
}

/// Nobody legitimate on a device their account knows is ever delayed,
/// challenged or refused, and the targeted owner never is.
fn assert_no_known_device_bothered(report: &SimReport) {
    let l = &report.legit;
    assert_eq!(l.fp_humans_known_device, 0, "{l:?}");
    assert_eq!(l.refused_humans_known_device, 0, "{l:?}");
    assert_eq!(l.owner_known_refused, 0, "{l:?}");
    assert_eq!(report.events_dropped, 0);
}

#[test]
fn the_legitimate_mixes_alone_bother_nobody() {
    // 22,000 people behind 4 addresses (10% typo, 227 stale mail clients
    // retrying every minute), a university /64 with shared kiosks, and
    // 40,000 phones behind carrier NAT: 14 hours of a Monday.
    let report = simulate(&[Mix::Office, Mix::University, Mix::Mobile]);
    assert_no_known_device_bothered(&report);
    let l = &report.legit;
    assert_eq!((l.fp_humans_unknown_device, l.fp_humans_signals, l.fp_machines), (0, 0, 0), "{l:?}");
    assert_eq!(l.humans, 22_000 + 3_000 + 40_000);
    assert!(report.raised.iter().all(|(_, n)| *n == 0), "no flag at all: {:?}", report.flagged);
}

#[test]
fn a_one_password_spray_from_a_24_is_flagged_within_200_attempts() {
    let report = simulate(&[Mix::Office, Mix::Spray24]);
    let spray = attack(&report, Mix::Spray24);
    // The password axis: 20 distinct accounts on one tag raise the flag on
    // the 20th report; the 21st check is the first to meet it.
    assert_eq!(spray.detected_at, Some(21), "{spray:?}");
    assert_eq!(spray.reached_password_check, 20);
    assert_no_known_device_bothered(&report);
    assert_eq!(report.legit.fp_humans_unknown_device, 0);
}

#[test]
fn a_spray_from_rotating_residential_addresses_is_flagged_within_1000_attempts() {
    let report = simulate(&[Mix::Office, Mix::SprayResidential]);
    let spray = attack(&report, Mix::SprayResidential);
    // Every address new, so no source axis can see it: the password axis
    // does, exactly as from one /24.
    assert_eq!(spray.detected_at, Some(21), "{spray:?}");
    assert_no_known_device_bothered(&report);
}

#[test]
fn with_flags_published_every_64_reports_the_targets_still_hold() {
    let mut scenario = Scenario::of(&[Mix::Office, Mix::Spray24, Mix::Targeted]);
    scenario.publish_lag = 64;
    let report = run(&Config::default(), &scenario);
    let spray = attack(&report, Mix::Spray24).detected_at.expect("flagged");
    let targeted = attack(&report, Mix::Targeted).detected_at.expect("flagged");
    assert!(spray <= 200 && targeted <= 100, "spray {spray}, targeted {targeted}");
    assert_no_known_device_bothered(&report);
}

#[test]
fn ipv6_rotation_inside_a_48_is_widened_within_100_attempts_and_held_to_one_budget() {
    let report = simulate(&[Mix::Office, Mix::V6Rotation]);
    let rotation = attack(&report, Mix::V6Rotation);
    // 16 failing /56s widen the /48 (a fresh /64 every attempt, spread
    // over 256 /56s, so no /56's threshold of 8 is reached first).
    assert_eq!(rotation.detected_at, Some(16), "{rotation:?}");
    assert_eq!(rotation.detector.as_deref(), Some("ipv6_widening"));
    // After widening the block is one source: the login rate's budget for
    // one prefix (600 a minute, burst 300) bounds it for the hour.
    let allowed = rotation.allowed_after_widening.expect("attempts after widening");
    assert!(allowed <= 600 * 60 + 300, "{allowed} allowed");
    assert!(rotation.reached_password_check < 1_000, "{rotation:?}");
    assert_no_known_device_bothered(&report);
}

#[test]
fn a_targeted_attack_on_one_account_is_flagged_within_100_and_its_owner_is_never_refused() {
    let report = simulate(&[Mix::Office, Mix::Targeted]);
    let targeted = attack(&report, Mix::Targeted);
    // 8 distinct failing prefixes raise the account's flag on the 8th
    // report; the 9th check meets it.
    assert_eq!(targeted.detected_at, Some(9), "{targeted:?}");
    assert_eq!(targeted.reached_password_check, 8);
    assert_no_known_device_bothered(&report);
    // The owner's one login from a new phone, while the account is
    // flagged, is challenged: the one person the flag bothers, by design.
    assert_eq!(report.legit.fp_humans_unknown_device, 1, "{:?}", report.legit);
}

#[test]
fn credential_stuffing_is_flagged_per_address_and_bothers_nobody_legitimate() {
    let report = simulate(&[Mix::Office, Mix::Stuffing]);
    let stuffing = attack(&report, Mix::Stuffing);
    // Distinct passwords leave only the source axis: each of 2,000
    // addresses is challenged after its 10th account. The weak axis, as
    // docs/design/spray-detection.md §6.4 says: about 20,000 attempts
    // reach a password check before every address is flagged.
    assert!(stuffing.detected_at.is_some());
    assert!(stuffing.reached_password_check <= 2_000 * 11, "{stuffing:?}");
    assert_no_known_device_bothered(&report);
    assert_eq!(report.legit.fp_humans_unknown_device, 0);
}

#[test]
fn every_attack_at_once_on_every_legitimate_mix() {
    let report = simulate(&[
        Mix::Office,
        Mix::University,
        Mix::Mobile,
        Mix::Spray24,
        Mix::SprayResidential,
        Mix::Stuffing,
        Mix::V6Rotation,
        Mix::Targeted,
    ]);
    for mix in [Mix::Spray24, Mix::SprayResidential, Mix::V6Rotation, Mix::Targeted] {
        assert!(attack(&report, mix).detected_at.is_some_and(|d| d <= 200), "{:?}", attack(&report, mix));
    }
    assert_no_known_device_bothered(&report);
    // Only the owner's new phone: no one else on an unknown device meets a flag.
    assert_eq!(report.legit.fp_humans_unknown_device, 1, "{:?}", report.legit);
}

#[test]
fn a_prefix_flood_stays_within_the_caps_and_the_spray_inside_it_is_still_flagged() {
    let mut raw = Config::parse(
        "[signals]\nprefixes_max = 65536\nwide_prefixes_max = 65536\nblocks_max = 65536\naccounts_max = 65536\n\
         passwords_max = 65536\n",
    )
    .expect("parses");
    raw.socket = None;
    let config = Config::build(raw).expect("valid");
    let mut scenario = Scenario::of(&[Mix::Flood, Mix::Spray24]);
    scenario.flood_prefixes = 200_000;
    let report = run(&config, &scenario);
    for family in &report.memory {
        assert!(family.entries <= family.entries_max, "{family:?}");
    }
    let narrow = report.memory.iter().find(|f| f.name == "narrow_prefixes").expect("listed");
    assert!(narrow.evicted > 0, "the flood overflowed the cap: {narrow:?}");
    assert_eq!(attack(&report, Mix::Spray24).detected_at, Some(21));
    // Bounded per subject: the tables' bytes over the subjects they track.
    let per_subject = report.tracked_bytes / report.tracked.max(1);
    assert!(per_subject < 400, "{per_subject} bytes per tracked subject");
}
