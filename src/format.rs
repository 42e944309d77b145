//! How the CLI and `tollgate top` write values for people (durations,
//! instants, log-scaled bars) and for scripts (JSON words, `status`'s
//! JSON), and read durations from flags: one module both use, so neither
//! imports the other.

use std::time::Duration;

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("`{text}`: {e} (try 500ms, 30s, 15m, 1h)"))
}

pub fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serializes")
}

/// A unit enum's JSON name without the quotes (`deny`, `rate_limited`).
pub fn json_word<T: serde::Serialize>(value: &T) -> String {
    json(value).trim_matches('"').to_string()
}

/// What `status --json` prints (and `top --once --json` under `status`):
/// `shared` and `signals` are null without the store or with spray
/// detection off, so scripts can tell that from "an old CLI" by the key's
/// presence.
pub fn status_json(full: &crate::client::FullStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(&full.status).expect("plain data serializes");
    value["shared"] = serde_json::to_value(&full.shared).expect("plain data serializes");
    value["signals"] = serde_json::to_value(&full.signals).expect("plain data serializes");
    value["exemptions"] = exemptions(&full.status.limits)
        .map(|(prefix, reason, checks)| serde_json::json!({ "prefix": prefix, "reason": reason, "checks": checks }))
        .collect();
    value
}

/// `[[source.exemptions]]` as `status` lists them among its named values
/// (PROTOCOL.md): (prefix, reason, checks exempted).
pub fn exemptions(limits: &[crate::protocol::NamedLimit]) -> impl Iterator<Item = (&str, &str, u64)> {
    limits.iter().filter_map(|l| {
        let (prefix, reason) = crate::exemptions::parse_status_name(&l.name)?;
        Some((prefix, reason, l.value))
    })
}

/// A duration as people read it: `850 ms`, `45s`, `20m 14s`, `2d 3h`
/// (whole seconds rounded up, so a wait is never shown shorter than it is;
/// at most the two largest units).
pub fn human_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms} ms");
    }
    let secs = ms.div_ceil(1000);
    let parts = [(secs / 86_400, "d"), (secs / 3600 % 24, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    let first = parts.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    parts[first..]
        .iter()
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An instant on the daemon's clock, in RFC 3339 (UTC, whole seconds).
pub fn at_time(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A log-scaled bar: `accounts` of `max` as up to `width` `#`s. Any
/// nonzero count gets at least one, the largest gets all of them; a
/// count ten times another's gets a visibly longer bar, not ten times one.
pub fn bar(accounts: u64, max: u64, width: usize) -> String {
    if accounts == 0 || max == 0 || width == 0 {
        return String::new();
    }
    let len = ((accounts.min(max) as f64 + 1.0).ln() / (max as f64 + 1.0).ln() * width as f64).ceil() as usize;
    "#".repeat(len.clamp(1, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_read_them_and_never_shorter() {
        assert_eq!(human_duration(0), "0 ms");
        assert_eq!(human_duration(850), "850 ms");
        assert_eq!(human_duration(1000), "1s");
        assert_eq!(human_duration(1001), "2s", "rounded up: a wait is never shown shorter");
        assert_eq!(human_duration(1_213_714), "20m 14s");
        assert_eq!(human_duration(900_000), "15m");
        assert_eq!(human_duration(3_600_000), "1h");
        assert_eq!(human_duration(3_660_000), "1h 1m");
        assert_eq!(human_duration(2 * 86_400_000 + 3 * 3_600_000 + 5_000), "2d 3h");
    }

    #[test]
    fn bars_are_log_scaled_never_empty_for_a_count_and_never_over_the_width() {
        assert_eq!(bar(0, 100, 40), "");
        assert_eq!(bar(100, 100, 40).len(), 40);
        assert_eq!(bar(1, 1_000_000, 40).len(), 3, "ln 2 / ln 1e6 of 40, rounded up");
        assert!(!bar(1, u64::MAX, 40).is_empty(), "a nonzero count always shows");
        let lens: Vec<usize> = [1u64, 10, 100, 1000, 10_000].iter().map(|&n| bar(n, 10_000, 40).len()).collect();
        assert!(lens.windows(2).all(|w| w[0] < w[1]), "{lens:?}");
        // Each tenfold adds about the same length: a log scale.
        // (The first step is shorter: the scale is of count + 1, so that 1 shows.)
        let steps: Vec<usize> = lens.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(steps[1..].iter().all(|&d| (8..=11).contains(&d)), "{steps:?}");
        assert_eq!(bar(500, 100, 40).len(), 40, "never over the width");
    }
}
