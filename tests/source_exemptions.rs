//! `[[source.exemptions]]` against real daemons on the manual clock: an
//! exempt office skips the per-source rules (and its source's spray flags)
//! but never the account ceiling; a neighbour is refused as before; a
//! header names an exempt address only through a trusted proxy; a reload
//! adds and removes exemptions with an audit line each; `check-config`
//! refuses a typo that would exempt too much; `status` lists them.

mod common;

use common::*;
use tollgate::protocol::{Decision, Outcome, Subject};

const OFFICE: &str = "203.0.113.7";
const NEIGHBOUR: &str = "203.0.114.7";
/// A tight source rate, so that 50 attempts from one address would be
/// refused by it were the address not exempt.
const TIGHT_SOURCE_RATE: &str = "\n[routes.login.rules.source_rate]\nlimit = 20\nburst = 20\nperiod_secs = 60\n";
const EXEMPT_OFFICE: &str =
    "\n[[source.exemptions]]\nprefix = \"203.0.113.0/24\"\nreason = \"office egress\"\n\n[[source.exemptions]]\n\
     prefix = \"2001:db8:77::/48\"\nreason = \"monitoring probe\"\n";

fn from<'a>(peer: &str, account: &'a str) -> Subject<'a> {
    subject(peer, account)
}

/// Every exemption `status --json` lists: (prefix, reason, checks).
fn listed(daemon: &TestDaemon) -> Vec<(String, String, u64)> {
    let status = daemon.cli_json(&["status"]);
    status["exemptions"]
        .as_array()
        .expect("status lists exemptions")
        .iter()
        .map(|e| {
            (e["prefix"].as_str().unwrap().into(), e["reason"].as_str().unwrap().into(), e["checks"].as_u64().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_office_skips_the_rules_it_shares_but_never_an_accounts() {
    let daemon = TestDaemon::start_with(Some(&format!("{EXEMPT_OFFICE}{TIGHT_SOURCE_RATE}")), true);
    let client = daemon.client();
    // What the whole office shares; `source_failures` is (account, prefix),
    // one person's, and is not skipped.
    let per_source = ["source_rate"];

    // 50 people in the office each mistype their password once: more
    // attempts than the source rate allows, and more distinct failing
    // accounts than narrow_spray's threshold (10). Spray detection is on.
    for i in 0..50 {
        let account = format!("user{i}");
        let check = verdict(client.check("login", &from(OFFICE, &account)).await);
        assert_eq!(check.decision, Decision::Allow, "check {i}: {check:?}");
        assert!(!per_source.contains(&&*check.rule), "a skipped rule claims the verdict: {check:?}");
        let report = verdict(client.report("login", &from(OFFICE, &account), Outcome::Failure).await);
        assert_eq!(report.decision, Decision::Allow, "report {i}: {report:?}");
    }
    // Spray detection flags the office's address (50 accounts failing, no
    // success): its source flag does not refuse an exempt source.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = daemon.cli_json(&["status"]);
        let flagged = status["signals"]["flagged"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["detector"] == "narrow_spray" && f["subject"].as_str().unwrap().starts_with("203.0.113.7"));
        if flagged {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the office was never flagged: {status}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let check = verdict(client.check("login", &from(OFFICE, "user50")).await);
    assert_eq!(check.decision, Decision::Allow, "{check:?}");

    // One account failing from the office: (account, prefix) is one
    // person's rule and is not skipped, so alice is locked from the office
    // at 5 as from anywhere, and nobody else behind it is; the account
    // ceiling is not skipped either.
    for n in 1..=5 {
        let check = verdict(client.check("login", &from(OFFICE, "alice")).await);
        assert_eq!(check.decision, Decision::Allow, "alice's check after {} failures: {check:?}", n - 1);
        verdict(client.report("login", &from(OFFICE, "alice"), Outcome::Failure).await);
    }
    let locked = verdict(client.check("login", &from(OFFICE, "alice")).await);
    assert_eq!((locked.decision, &*locked.rule), (Decision::Deny, "source_failures"), "{locked:?}");
    let colleague = verdict(client.check("login", &from(OFFICE, "user51")).await);
    assert_eq!(colleague.decision, Decision::Allow, "{colleague:?}");

    // The neighbour /24 is not exempt: its fifth failure locks (bob,
    // prefix), and its source rate refuses the 21st check.
    for _ in 0..5 {
        verdict(client.report("login", &from(NEIGHBOUR, "bob"), Outcome::Failure).await);
    }
    let bob = verdict(client.check("login", &from(NEIGHBOUR, "bob")).await);
    assert_eq!((bob.decision, &*bob.rule), (Decision::Deny, "source_failures"), "{bob:?}");
    let mut refused = None;
    for i in 0..25 {
        let check = verdict(client.check("login", &from(NEIGHBOUR, &format!("n{i}"))).await);
        if check.decision != Decision::Allow {
            refused = Some((i, check));
            break;
        }
    }
    let (i, check) = refused.expect("the neighbour's source rate refuses");
    assert_eq!(&*check.rule, "source_rate", "{check:?}");
    assert!((19..=20).contains(&i), "refused at check {i} (bob's took one)");

    // The IPv6 probe's whole /48 is exempt, its neighbour /48 is not.
    let probe = verdict(client.check("login", &from("2001:db8:77:1::9", "p")).await);
    assert!(!per_source.contains(&&*probe.rule), "{probe:?}");

    // `status` lists each exemption with the checks it exempted: the
    // office's 51 and a colleague's, alice's 6, the probe's one.
    let exemptions = listed(&daemon);
    assert_eq!(
        exemptions,
        vec![
            ("203.0.113.0/24".into(), "office egress".into(), 52 + 5 + 1),
            ("2001:db8:77::/48".into(), "monitoring probe".into(), 1),
        ]
    );
    let out = daemon.cli(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("source exemptions") && text.contains("203.0.113.0/24") && text.contains("office egress"));
    let metrics = String::from_utf8(daemon.cli(&["metrics"]).stdout).unwrap();
    assert!(
        metrics.contains(&format!(
            "tollgate_source_exempted_checks_total{{prefix=\"203.0.113.0/24\",reason=\"office egress\"}} {}",
            52 + 5 + 1
        )),
        "{metrics}"
    );
    assert!(!metrics.contains("tollgate_limit{name=\"source.exemption"), "an exemption is not a bound");

    // `inspect` says why a per-source rule does not apply.
    let inspection = daemon.cli_json(&["inspect", "--route", "login", "--ip", OFFICE, "--account", "carol"]);
    let rules = inspection["rules"].as_array().unwrap();
    let skipped =
        |name: &str| rules.iter().find(|r| r["name"] == name).unwrap()["skipped"].as_str().unwrap().to_string();
    assert_eq!(skipped("source_rate"), "exempt source (203.0.113.0/24)");
    assert_eq!(skipped("source_failures"), "", "one person's rule is never exempt");
    assert_eq!(skipped("account_failures"), "");

    // The journal says which were in force from the start.
    let log = daemon.log();
    let in_force: Vec<&str> = log.lines().filter(|l| l.contains("exemption in force")).collect();
    assert_eq!(in_force.len(), 2, "{log}");
    assert!(in_force[0].contains("203.0.113.0/24") && in_force[0].contains("office egress"), "{}", in_force[0]);
}

/// Red team: X-Forwarded-For names the client only through a trusted proxy.
/// Sent straight to the auth server, or through the proxy with the real
/// client to its right, a claimed exempt address exempts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_for_header_claims_an_exemption_only_through_a_trusted_proxy() {
    let direct = TestDaemon::start_with(Some(&format!("{EXEMPT_OFFICE}{TIGHT_SOURCE_RATE}")), true);
    let refused_at = |daemon: &TestDaemon, peer: &'static str, header: &'static str| {
        let client = daemon.client();
        async move {
            for i in 0..30 {
                let account = format!("a{i}");
                let s = Subject { forwarded_for: Some(header), ..subject(peer, &account) };
                let v = verdict(client.check("login", &s).await);
                if v.decision != Decision::Allow {
                    assert_eq!(&*v.rule, "source_rate", "{v:?}");
                    return Some(i);
                }
            }
            None
        }
    };
    // No trusted proxies: the header is ignored; the attacker is its peer.
    assert_eq!(refused_at(&direct, "198.51.100.9", OFFICE).await, Some(20));
    assert_eq!(listed(&direct)[0].2, 0, "nothing exempted");

    let behind = "\n[source]\ntrusted_proxies = [\"10.0.0.0/8\"]\n";
    let proxied = TestDaemon::start_with(Some(&format!("{behind}{EXEMPT_OFFICE}{TIGHT_SOURCE_RATE}")), true);
    // The proxy appends the real client: the right-most untrusted hop wins.
    assert_eq!(refused_at(&proxied, "10.0.0.2", "203.0.113.7, 198.51.100.9").await, Some(20));
    // A malformed header falls back to the proxy, which is not exempt
    // (validation refuses an exemption overlapping a trusted proxy).
    assert_eq!(refused_at(&proxied, "10.0.0.3", "203.0.113.7, not-an-address").await, Some(20));
    // The office itself, through the proxy, is exempt.
    assert_eq!(refused_at(&proxied, "10.0.0.4", OFFICE).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_and_removes_exemptions_with_an_audit_line_each() {
    let base = format!("{TIGHT_SOURCE_RATE}{COUNTING_RULES_ONLY}");
    let daemon = TestDaemon::start_with(Some(&base), true);
    let client = daemon.client();
    let spend = |tag: &'static str| {
        let client = &client;
        async move {
            let mut allowed = 0;
            for i in 0..25 {
                let account = format!("{tag}{i}");
                if verdict(client.check("login", &from(OFFICE, &account)).await).decision == Decision::Allow {
                    allowed += 1;
                }
            }
            allowed
        }
    };
    assert_eq!(spend("a").await, 20, "not exempt yet");
    assert!(listed(&daemon).is_empty());

    daemon.reload_with(&format!("{EXEMPT_OFFICE}{base}"));
    assert_eq!(spend("b").await, 25, "exempt after the reload, without a restart");
    let log = daemon.log();
    let added: Vec<&str> = log.lines().filter(|l| l.contains("exemption added")).collect();
    assert_eq!(added.len(), 2, "{log}");
    assert!(added[0].contains("203.0.113.0/24") && added[0].contains("office egress"), "{}", added[0]);
    assert!(added[1].contains("2001:db8:77::/48") && added[1].contains("monitoring probe"), "{}", added[1]);
    // Each names who sent the SIGHUP (this test process), as the kernel says.
    let (uid, pid) = (nix::unistd::getuid().as_raw(), std::process::id());
    let sender = format!("by_uid={uid} by_pid={pid}");
    assert!(added.iter().all(|l| l.contains(&sender)), "{added:?} should name {sender}");

    // The probe goes, the office's reason changes: one line each.
    let office_only = "\n[[source.exemptions]]\nprefix = \"203.0.113.0/24\"\nreason = \"office egress, 2nd floor\"\n";
    daemon.reload_with(&format!("{office_only}{base}"));
    let log = daemon.log();
    let removed: Vec<&str> = log.lines().filter(|l| l.contains("exemption removed")).collect();
    assert_eq!(removed.len(), 1, "{log}");
    assert!(removed[0].contains("2001:db8:77::/48") && removed[0].contains("monitoring probe"));
    assert!(log.lines().any(|l| l.contains("exemption reason changed") && l.contains("2nd floor")), "{log}");
    assert_eq!(listed(&daemon), vec![("203.0.113.0/24".into(), "office egress, 2nd floor".into(), 25)]);

    // A file with a too-wide exemption is refused whole: the office stays.
    daemon.reload_with(&format!("\n[[source.exemptions]]\nprefix = \"0.0.0.0/0\"\nreason = \"oops\"\n{base}"));
    assert_eq!(listed(&daemon).len(), 1);
    assert!(daemon.cli_json(&["status"])["last_reload_error"].as_str().unwrap().contains("wider than /8"));

    daemon.reload_with(&base);
    assert!(daemon.log().lines().any(|l| l.contains("exemption removed") && l.contains("203.0.113.0/24")));
    assert!(listed(&daemon).is_empty());
    daemon.advance("2m");
    assert_eq!(spend("c").await, 20, "the per-source rules again");
}

#[test]
fn check_config_refuses_a_too_wide_prefix_and_an_empty_reason_listing_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    let state = dir.path().join("state.redb");
    std::fs::write(
        &config,
        format!(
            "state = \"{}\"\n[[source.exemptions]]\nprefix = \"10.0.0.0/7\"\nreason = \"typo\"\n\n\
             [[source.exemptions]]\nprefix = \"2001:db8::/20\"\nreason = \"too wide too\"\n\n\
             [[source.exemptions]]\nprefix = \"203.0.113.0/24\"\nreason = \"\"\n\n\
             [[source.exemptions]]\nprefix = \"198.51.100.0/24\"\n\n\
             [[source.exemptions]]\nprefix = \"192.0.2.300/32\"\nreason = \"bad address\"\n",
            state.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN).args(["check-config", "--config"]).arg(&config).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    for needle in [
        "source.exemptions[0].prefix: 10.0.0.0/7 is wider than /8",
        "source.exemptions[1].prefix: 2001:db8::/20 is wider than /32",
        "source.exemptions[2].reason: required and not empty",
        "source.exemptions[3].reason: required and not empty",
        "source.exemptions[4].prefix: `192.0.2.300/32` is not a CIDR",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
    assert!(!state.exists(), "check-config creates nothing");
}
