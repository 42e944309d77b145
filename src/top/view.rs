//! `tollgate top`'s screen: a snapshot and its rates as lines of text, in
//! pages that each fit an 80x24 terminal. Pure: the same lines are drawn by
//! ratatui in a terminal and printed as plain text when stdout is not one.
//! Every line is cut to the width (never wrapped), every list to the rows
//! left; accounts are shown only as the daemon's digests.

use std::time::{Duration, UNIX_EPOCH};

use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::model::{Percentiles, Rates, Snapshot};
use crate::format::{bar, human_duration};
use crate::protocol::Distribution;

/// The pages, in `Tab` order; `1`..`3` jump to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// Verdict rates, latency, top refused prefixes and failing accounts, lockouts.
    Overview,
    /// Table fill against caps, monitor mode's would-be refusals, the shared
    /// store, spray detection's tables and flags.
    Tables,
    /// Attempts and failures per account per day, recent refusals.
    Accounts,
}

pub const PAGES: [Page; 3] = [Page::Overview, Page::Tables, Page::Accounts];

impl Page {
    pub fn title(self) -> &'static str {
        match self {
            Page::Overview => "overview",
            Page::Tables => "tables",
            Page::Accounts => "accounts",
        }
    }

    pub fn next(self) -> Page {
        let i = PAGES.iter().position(|&p| p == self).expect("listed");
        PAGES[(i + 1) % PAGES.len()]
    }
}

/// What one frame shows: the latest snapshot and its rates (none before the
/// first answer), and the error of the last attempt if it failed.
pub struct View<'a> {
    pub snapshot: Option<&'a Snapshot>,
    pub rates: Option<&'a Rates>,
    pub unreachable: Option<&'a str>,
    /// The refresh interval, for the footer.
    pub interval: Duration,
}

/// One line of the screen: its text and whether it is a heading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub text: String,
    pub heading: bool,
}

fn row(text: impl Into<String>) -> Row {
    Row { text: text.into(), heading: false }
}

fn heading(text: impl Into<String>) -> Row {
    Row { text: text.into(), heading: true }
}

/// At most `width` characters of `text`, control characters escaped (a
/// row may hold names a daemon sent; the terminal must not obey them).
pub fn fit(text: &str, width: usize) -> String {
    crate::stdout::printable(text).chars().take(width).collect()
}

/// Width of the account digests shown: `acct:` and 12 of the 16 hex
/// digits the daemon sends (enough to tell accounts apart on a screen).
const ACCOUNT_HEX_SHOWN: usize = 12;

/// An account as the daemon sends it (`acct:` and hex digits), cut to
/// `ACCOUNT_HEX_SHOWN` digits. Anything else is not shown: `top` prints
/// digests only, even if a daemon were to send something else.
pub fn account_digest(account: &str) -> String {
    match account.strip_prefix("acct:") {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("acct:{}", &hex[..hex.len().min(ACCOUNT_HEX_SHOWN)])
        }
        _ if account.is_empty() => "-".to_string(),
        _ => "acct:?".to_string(),
    }
}

/// A rate as a short number: `0`, `3.5`, `120`, `4.2k`.
pub fn rate(per_s: f64) -> String {
    if per_s == 0.0 {
        "0".to_string()
    } else if per_s < 100.0 {
        format!("{per_s:.1}")
    } else if per_s < 10_000.0 {
        format!("{per_s:.0}")
    } else if per_s < 10_000_000.0 {
        format!("{:.1}k", per_s / 1000.0)
    } else {
        format!("{:.1}M", per_s / 1_000_000.0)
    }
}

/// Nanoseconds as people read them, short: `850ns`, `8.2us`, `12us`,
/// `1.4ms`, `2.0s`.
pub fn latency(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 10_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else if ns < 1_000_000 {
        format!("{}us", ns / 1_000)
    } else if ns < 1_000_000_000 {
        format!("{:.1}ms", ns as f64 / 1e6)
    } else {
        format!("{:.1}s", ns as f64 / 1e9)
    }
}

/// Milliseconds since the epoch as `2030-01-01 00:03:12Z`.
fn clock(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string().replace('T', " ")
}

/// `HH:MM:SS` of a time, for the streams.
fn time_of_day(ms: u64) -> String {
    let s = clock(ms);
    s.get(11..19).unwrap_or(&s).to_string()
}

/// Every row of a page, `height` rows at most and each cut to `width`.
pub fn page_rows(view: &View<'_>, page: Page, width: usize, height: usize) -> Vec<Row> {
    let mut rows = header(view);
    if let (Some(s), Some(r)) = (view.snapshot, view.rates) {
        let room = height.saturating_sub(rows.len());
        rows.extend(match page {
            Page::Overview => overview(s, r, width, room),
            Page::Tables => tables(s, r, room),
            Page::Accounts => accounts(s, width, room),
        });
    }
    rows.truncate(height);
    rows.iter().map(|r| Row { text: fit(&r.text, width), heading: r.heading }).collect()
}

/// Every page's rows one after the other, for a stream that is not a
/// terminal (no height limit, one header).
pub fn plain_text(view: &View<'_>, width: usize) -> String {
    let mut rows = header(view);
    if let (Some(s), Some(r)) = (view.snapshot, view.rates) {
        rows.extend(overview(s, r, width, usize::MAX));
        rows.push(row(""));
        rows.extend(tables(s, r, usize::MAX));
        rows.push(row(""));
        rows.extend(accounts(s, width, usize::MAX));
    }
    let mut out = String::new();
    for r in rows {
        out += fit(&r.text, width).trim_end();
        out.push('\n');
    }
    out
}

/// The footer: the pages, the keys.
pub fn footer(page: Page, interval: Duration) -> String {
    let tabs: Vec<String> = PAGES
        .iter()
        .enumerate()
        .map(
            |(i, p)| {
                if *p == page {
                    format!("[{} {}]", i + 1, p.title())
                } else {
                    format!(" {} {} ", i + 1, p.title())
                }
            },
        )
        .collect();
    format!("{}  Tab next  q quit  every {}", tabs.join(""), humantime::format_duration(interval))
}

/// Draws `page` into the frame: the page's rows, the footer on the last line.
pub fn render(frame: &mut Frame<'_>, view: &View<'_>, page: Page) {
    let area = frame.area();
    if area.height == 0 || area.width == 0 {
        return;
    }
    let body = Rect { height: area.height - 1, ..area };
    let rows = page_rows(view, page, area.width as usize, body.height as usize);
    let lines: Vec<Line<'_>> = rows
        .into_iter()
        .map(|r| {
            let style = if r.heading { Style::default().add_modifier(Modifier::BOLD) } else { Style::default() };
            Line::styled(r.text, style)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), body);
    let foot = Rect { y: area.y + area.height - 1, height: 1, ..area };
    let text = fit(&footer(page, view.interval), area.width as usize);
    frame.render_widget(Paragraph::new(Line::styled(text, Style::default().add_modifier(Modifier::REVERSED))), foot);
}

fn header(view: &View<'_>) -> Vec<Row> {
    let mut rows = Vec::new();
    match view.snapshot {
        Some(s) => {
            let st = &s.full.status;
            let store = match &s.full.shared {
                Some(sh) if sh.degraded => format!("  store DEGRADED ({})", sh.state),
                Some(sh) => format!("  store {}", sh.state),
                None => String::new(),
            };
            let spray = if s.full.signals.is_some() { "on" } else { "off" };
            rows.push(heading(format!(
                "tollgate {}  up {}  {}  conns {}{store}  spray {spray}",
                st.version,
                human_duration(st.uptime_ms),
                clock(st.now_ms),
                st.connections
            )));
        }
        None => rows.push(heading("tollgate top: no answer from the daemon yet")),
    }
    if let Some(e) = view.unreachable {
        rows.push(heading(format!("UNREACHABLE: {e}")));
    }
    rows
}

fn latency_row(p: &Percentiles, r: &Rates) -> Row {
    if p.samples == 0 {
        return row("latency: no samples yet");
    }
    let over = if p.interval { format!("{:.1}s", r.interval_s) } else { "since start".to_string() };
    row(format!(
        "latency {over} n={}: p50 {} p90 {} p99 {} p99.9 {} max {}",
        p.samples,
        latency(p.p50_ns),
        latency(p.p90_ns),
        latency(p.p99_ns),
        latency(p.p999_ns),
        latency(p.max_ns)
    ))
}

fn overview(s: &Snapshot, r: &Rates, width: usize, room: usize) -> Vec<Row> {
    let mut rows = vec![latency_row(&r.latency, r)];
    let over = if r.since_start { "since start".to_string() } else { format!("last {:.1}s", r.interval_s) };
    rows.push(heading(format!(
        "{:<15}{:>7}{:>7}{:>7}{:>7}{:>7}{:>8}{:>7}  ({over})",
        "checks/s", "allow", "delay", "chall", "deny", "would", "fail/s", "ok/s"
    )));
    // Routes nobody has used since the daemon started share one line.
    let (used, idle): (Vec<_>, Vec<_>) = r.routes.iter().partition(|x| x.total > 0);
    for route in used {
        let c = &route.checks;
        rows.push(row(format!(
            "{:<15}{:>7}{:>7}{:>7}{:>7}{:>7}{:>8}{:>7}",
            fit(&route.name, 14),
            rate(c.allow),
            rate(c.delay),
            rate(c.challenge),
            rate(c.deny),
            rate(c.would_refuse),
            rate(route.failures),
            rate(route.successes)
        )));
    }
    if !idle.is_empty() {
        let names: Vec<&str> = idle.iter().map(|x| x.name.as_str()).collect();
        rows.push(row(format!("idle: {}", names.join(" "))));
    }
    let a = &s.activity;
    // Two columns side by side; the rest of the screen goes to lockouts,
    // at least three rows of them.
    let half = width.max(40) / 2;
    let pair_rows = room.saturating_sub(rows.len() + 1 + 4).clamp(1, 6);
    rows.push(heading(format!(
        "{:<half$}{}",
        format!("top refused prefixes ({})", human_duration(a.top_window_ms)),
        "top failing accounts"
    )));
    let left: Vec<String> = a
        .top_refused_prefixes
        .iter()
        .map(|p| {
            let class = if p.class.is_empty() { "-" } else { &p.class };
            format!("{:<24}{:<9}{:>6}", fit(&p.prefix, 23), fit(class, 8), p.refusals)
        })
        .collect();
    let right: Vec<String> =
        a.top_failing_accounts.iter().map(|x| format!("{:<20}{:>8}", account_digest(&x.account), x.failures)).collect();
    for i in 0..pair_rows.min(left.len().max(right.len()).max(1)) {
        let l = left.get(i).cloned().unwrap_or_else(|| if i == 0 { "(none)".into() } else { String::new() });
        let rt = right.get(i).cloned().unwrap_or_else(|| if i == 0 { "(none)".into() } else { String::new() });
        rows.push(row(format!("{:<half$}{rt}", fit(&l, half - 1))));
    }
    rows.push(heading(format!("{:<72}{}", "recent lockouts", "retry in")));
    if a.recent_lockouts.is_empty() {
        rows.push(row("(none)"));
    }
    for l in &a.recent_lockouts {
        rows.push(row(format!(
            "{} {:<24} {:<19} {:<17} {}",
            time_of_day(l.at_ms),
            fit(&format!("{}/{}", l.route, l.rule), 24),
            fit(&l.prefix, 19),
            account_digest(&l.account),
            human_duration(l.retry_after_ms)
        )));
    }
    rows
}

/// Most flagged subjects the tables page shows in a terminal (the plain
/// text shows all the daemon sent).
const FLAGGED_SHOWN_MAX: usize = 4;

fn tables(s: &Snapshot, r: &Rates, room: usize) -> Vec<Row> {
    let pct = |n: u64, max: u64| if max == 0 { 0.0 } else { n as f64 * 100.0 / max as f64 };
    // (monitor, fill %, row): rules in monitor mode first (their would-be
    // refusals are what an operator watches before enforcing), then the
    // fullest tables.
    let mut fill: Vec<(bool, f64, Row)> = Vec::new();
    let line = |name: &str, kind: &str, n: u64, max: u64, tail: &str| {
        row(format!(
            "{:<28}{:<9}{:>15}{:>7}  {tail}",
            fit(name, 27),
            kind,
            format!("{n}/{max}"),
            if max == 0 { "-".to_string() } else { format!("{:.1}%", pct(n, max)) }
        )
        .trim_end())
    };
    for route in &s.full.status.routes {
        for rule in &route.rules {
            let refusals = if rule.monitor {
                let per_s = r
                    .would_refuse
                    .iter()
                    .find(|w| w.route == route.name && w.rule == rule.name)
                    .map_or(0.0, |w| w.per_s);
                format!("would {} ({}/s)", rule.would_refuse, rate(per_s))
            } else {
                rule.refused.to_string()
            };
            let name = format!("{}/{}", route.name, rule.name);
            fill.push((
                rule.monitor,
                pct(rule.entries, rule.entries_max),
                line(&name, &rule.kind, rule.entries, rule.entries_max, &refusals),
            ));
        }
        if route.known_devices_max > 0 {
            let name = format!("{}/known devices", route.name);
            let (n, max) = (route.known_devices, route.known_devices_max);
            fill.push((false, pct(n, max), line(&name, "devices", n, max, "")));
        }
    }
    if let Some(sig) = &s.full.signals {
        for f in &sig.families {
            let name = format!("spray/{}", f.name);
            let tail = format!("evicted {}", f.evicted);
            fill.push((false, pct(f.entries, f.entries_max), line(&name, "family", f.entries, f.entries_max, &tail)));
        }
    }
    fill.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));

    let mut after = Vec::new();
    if let Some(sh) = &s.full.shared {
        after.push(heading(format!(
            "shared store {}  {}{}",
            sh.url,
            sh.state,
            if sh.degraded { format!("  DEGRADED for {}", human_duration(sh.degraded_for_ms)) } else { String::new() }
        )));
        after.push(row(format!(
            "hosts {} ({}), {} live  calls {}  timeouts {}  errors {}  rtt mean {}us max {}us",
            sh.hosts_in_force,
            sh.hosts_source,
            sh.hosts_live,
            sh.calls,
            sh.timeouts,
            sh.errors,
            sh.rtt_mean_us,
            sh.rtt_max_us
        )));
    }
    match &s.full.signals {
        None => after.push(heading("spray detection off")),
        Some(sig) => {
            after.push(heading(format!(
                "spray flags {}/{}  events {} (dropped {})  sketches {}/{} bytes",
                sig.flags, sig.flags_max, sig.events_total, sig.events_dropped, sig.sketch_bytes, sig.sketch_bytes_max
            )));
            let now = s.full.status.now_ms;
            let shown = if room == usize::MAX { sig.flagged.len() } else { FLAGGED_SHOWN_MAX };
            for f in sig.flagged.iter().take(shown) {
                let left = if f.until_ms > now { human_duration(f.until_ms - now) } else { "expired".to_string() };
                after.push(row(format!(
                    "flagged {:<24} {:<20} {:>6} >= {:<5} {left}",
                    fit(&flag_subject(&f.subject), 24),
                    fit(&f.detector, 20),
                    f.estimate,
                    f.threshold
                )));
            }
            if sig.flagged.is_empty() {
                after.push(row("flagged: (none)"));
            }
        }
    }
    // The activity counters' own health: events the daemon could not count.
    let a = &s.activity;
    let mut health = format!("activity events {} (dropped {})", a.events, a.events_dropped);
    if let Some(log) = &a.decision_log {
        health += &format!(
            "  decision log {} records (dropped {}, write errors {})",
            log.records_written, log.records_dropped, log.write_errors
        );
    }
    after.push(row(health));
    let mut rows =
        vec![heading(format!("{:<28}{:<9}{:>15}{:>7}  {}", "table fill", "kind", "entries/max", "fill", "refused"))];
    let fits = room.saturating_sub(rows.len() + after.len()).max(1);
    let total = fill.len();
    for (i, (_, _, r)) in fill.into_iter().enumerate() {
        if i + 1 == fits && fits < total {
            rows.push(row(format!("... {} more tables (the plain text lists all)", total - i)));
            break;
        }
        rows.push(r);
    }
    rows.extend(after);
    rows
}

/// A flagged subject: prefixes as sent, digests (`acct:`, `pw:`,
/// `tenant:`) cut like accounts.
fn flag_subject(subject: &str) -> String {
    match subject.split_once(':') {
        Some((kind @ ("acct" | "pw" | "tenant"), hex)) => {
            let digest = account_digest(&format!("acct:{hex}"));
            format!("{kind}:{}", digest.trim_start_matches("acct:"))
        }
        _ => subject.to_string(),
    }
}

/// Rows for one per-account distribution: a title, the percentiles, then
/// one bar per histogram bucket (as many as `room` allows).
pub fn distribution_rows(d: &Distribution, width: usize, room: usize) -> Vec<Row> {
    let mut rows = vec![
        heading(format!(
            "{} per account {}: ~{} accounts ({} sampled, 1 in {})",
            d.name,
            d.day,
            d.accounts,
            d.accounts_sampled,
            1u64 << d.sample_shift.min(63)
        )),
        row(format!("p50 {}  p90 {}  p99 {}  p99.9 {}  max {}", d.p50, d.p90, d.p99, d.p999, d.max)),
    ];
    let max = d.histogram.iter().map(|b| b.accounts).max().unwrap_or(0);
    let count_width = max.to_string().len().max(3);
    // "<= 12345 " + bar + " " + count
    let bar_width = width.saturating_sub(9 + 1 + count_width).max(1);
    let shown = room.saturating_sub(rows.len()).min(d.histogram.len());
    // Too many buckets for the screen: the last shown one says so.
    for (i, b) in d.histogram.iter().enumerate().take(shown) {
        if i + 1 == shown && shown < d.histogram.len() {
            rows.push(row(format!("   ... {} more buckets up to {}", d.histogram.len() - i, d.max)));
            break;
        }
        rows.push(row(format!(
            "<={:>6} {:<bar_width$} {:>count_width$}",
            b.upto,
            bar(b.accounts, max, bar_width),
            b.accounts
        )));
    }
    rows
}

fn accounts(s: &Snapshot, width: usize, room: usize) -> Vec<Row> {
    let a = &s.activity;
    let mut rows = Vec::new();
    let today = |name: &str| a.distributions.iter().find(|d| d.name == name && d.day == "today");
    match today("attempts") {
        Some(d) => {
            // Attempts first, with the room failures and refusals leave.
            let reserve = if today("failures").is_some() { 3 } else { 0 } + 3;
            rows.extend(distribution_rows(d, width, room.saturating_sub(reserve).max(3)));
        }
        None => rows.push(heading("attempts per account: not reported by this daemon")),
    }
    if let Some(d) = today("failures") {
        let left = room.saturating_sub(rows.len() + 3).max(2);
        rows.extend(distribution_rows(d, width, left));
    }
    rows.push(heading("recent refusals"));
    if a.recent_refusals.is_empty() {
        rows.push(row("(none)"));
    }
    for x in &a.recent_refusals {
        rows.push(row(format!(
            "{}  {:<24} {:<9} {:<20} {}",
            time_of_day(x.at_ms),
            fit(&format!("{}/{}", x.route, x.rule), 24),
            crate::format::json_word(&x.decision),
            fit(&x.prefix, 20),
            if x.class.is_empty() { "-" } else { &x.class }
        )));
    }
    rows
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::super::fixture;
    use super::super::model::rates;
    use super::*;

    /// The screen's rows as text (trailing blanks cut).
    fn screen(page: Page, width: u16, height: u16) -> Vec<String> {
        let (before, now) = fixture::pair(754_000);
        let r = rates(Some(&before), &now);
        let view = View { snapshot: Some(&now), rates: Some(&r), unreachable: None, interval: Duration::from_secs(1) };
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| render(f, &view, page)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| (0..width).map(|x| buffer[(x, y)].symbol()).collect::<String>().trim_end().to_string())
            .collect()
    }

    fn assert_rows(screen: &[String], expected: &[(usize, &str)]) {
        let all = screen.join("\n");
        for &(y, text) in expected {
            assert_eq!(screen[y], text, "row {y} of the screen:\n{all}");
        }
    }

    #[test]
    fn the_overview_fits_80x24_and_shows_rates_prefixes_accounts_and_lockouts() {
        let s = screen(Page::Overview, 80, 24);
        eprintln!("{}", s.join("\n"));
        assert_rows(
            &s,
            &[
                (0, "tollgate 0.1.0  up 12m 34s  2030-01-01 00:12:34Z  conns 3  spray on"),
                (1, "latency 1.0s n=164: p50 8.2us p90 12us p99 32us p99.9 98us max 98us"),
                (2, "checks/s         allow  delay  chall   deny  would  fail/s   ok/s  (last 1.0s)"),
                (3, "login              180      0      0   12.0      0    40.0    150"),
                (4, "reauth             3.0      0      0      0      0       0    3.0"),
                (5, "request           50.0      0      0      0      0       0      0"),
                (6, "idle: mfa_verify"),
                (7, "top refused prefixes (2m)               top failing accounts"),
                (8, "203.0.113.0/24          hosting      96 acct:3f9a1c07d2e4         31"),
                (9, "2001:db8:77:1::/64      -            12 acct:a05e6612f0cd          7"),
                (10, "recent lockouts                                                         retry in"),
                (11, "00:12:29 login/source_failures    203.0.113.0/24      acct:3f9a1c07d2e4 14m 55s"),
                (12, ""),
                (23, "[1 overview] 2 tables  3 accounts   Tab next  q quit  every 1s"),
            ],
        );
        assert!(s.iter().all(|l| l.chars().count() <= 80));
        assert!(!s.join("\n").contains("3f9a1c07d2e4b815"), "digests are cut to 12 hex digits");
    }

    #[test]
    fn the_tables_page_puts_monitor_rules_first_then_the_fullest() {
        let s = screen(Page::Tables, 80, 24);
        eprintln!("{}", s.join("\n"));
        assert_rows(
            &s,
            &[
                (1, "table fill                  kind         entries/max   fill  refused"),
                (2, "login/spray_signals         signal           3/65536   0.0%  would 5 (3.0/s)"),
                (3, "login/known devices         devices    40211/1000000   4.0%"),
                (4, "login/source_rate           rate       23517/1000000   2.4%  40"),
                (5, "spray/accounts              family       2950/131072   2.3%  evicted 0"),
            ],
        );
        let flagged = s.iter().position(|l| l.starts_with("flagged 203.0.113.0/24")).expect("the flag is shown");
        assert_eq!(s[flagged], "flagged 203.0.113.0/24           narrow_spray             14 >= 10    59m 20s");
    }

    #[test]
    fn the_accounts_page_draws_attempts_per_account_as_log_scaled_bars() {
        let s = screen(Page::Accounts, 80, 24);
        eprintln!("{}", s.join("\n"));
        assert_rows(
            &s,
            &[
                (1, "attempts per account today: ~2968 accounts (742 sampled, 1 in 4)"),
                (2, "p50 1  p90 3  p99 9  p99.9 31  max 212"),
            ],
        );
        let first = &s[3];
        assert!(first.starts_with("<=     1 ####"), "{first}");
        assert!(first.ends_with(" 1960"), "{first}");
        assert_eq!(first.chars().count(), 80, "the largest bucket's bar takes the whole width");
        let last = s.iter().find(|l| l.starts_with("<=   256")).expect("the last bucket");
        assert!(last.contains(" # ") || last.contains(" ## ") || last.contains("### "), "{last}");
        assert!(s.iter().any(|l| l.starts_with("00:12:32  login/source_failures    deny")));
    }

    #[test]
    fn a_short_screen_cuts_the_fill_table_and_keeps_the_store_and_spray_rows() {
        let (before, mut now) = fixture::pair(754_000);
        now.full.shared = Some(crate::protocol::SharedStatus {
            url: "redis://10.0.0.5:6379".into(),
            state: "open".into(),
            degraded: true,
            degraded_for_ms: 42_000,
            hosts_in_force: 3,
            hosts_live: 2,
            hosts_source: "learned".into(),
            ..Default::default()
        });
        let r = rates(Some(&before), &now);
        let view = View { snapshot: Some(&now), rates: Some(&r), unreachable: None, interval: Duration::from_secs(1) };
        let rows: Vec<String> = page_rows(&view, Page::Tables, 80, 12).into_iter().map(|r| r.text).collect();
        let all = rows.join("\n");
        assert_eq!(rows.len(), 12, "{all}");
        assert!(rows[0].contains("store DEGRADED (open)"), "{all}");
        assert_eq!(rows[2], "login/spray_signals         signal           3/65536   0.0%  would 5 (3.0/s)");
        assert_eq!(rows[3], "login/known devices         devices    40211/1000000   4.0%", "no trailing blanks");
        assert_eq!(rows[6], "... 6 more tables (the plain text lists all)", "{all}");
        assert_eq!(rows[7], "shared store redis://10.0.0.5:6379  open  DEGRADED for 42s");
        assert!(rows[9].starts_with("spray flags 1/65536"), "{all}");
        assert!(rows[10].starts_with("flagged 203.0.113.0/24"), "{all}");
        assert_eq!(rows[11], "activity events 4100 (dropped 0)");
    }

    #[test]
    fn only_digests_are_shown_for_accounts() {
        assert_eq!(account_digest("acct:3f9a1c07d2e4b815"), "acct:3f9a1c07d2e4");
        assert_eq!(account_digest("acct:alice"), "acct:?");
        assert_eq!(account_digest("alice@example.com"), "acct:?");
        assert_eq!(account_digest(""), "-");
        assert_eq!(flag_subject("pw:0011223344556677"), "pw:001122334455");
        assert_eq!(flag_subject("203.0.113.0/24"), "203.0.113.0/24");
    }

    #[test]
    fn the_plain_text_has_every_page_and_no_line_over_80_columns() {
        let (before, now) = fixture::pair(754_000);
        let r = rates(Some(&before), &now);
        let view = View { snapshot: Some(&now), rates: Some(&r), unreachable: None, interval: Duration::from_secs(1) };
        let text = plain_text(&view, 80);
        for wanted in ["checks/s", "recent lockouts", "table fill", "spray flags", "attempts per account today"] {
            assert!(text.contains(wanted), "{wanted} missing:\n{text}");
        }
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        let waiting = View { snapshot: None, rates: None, unreachable: Some("cannot reach"), interval: Duration::ZERO };
        assert_eq!(
            plain_text(&waiting, 80),
            "tollgate top: no answer from the daemon yet\nUNREACHABLE: cannot reach\n"
        );
    }
}
