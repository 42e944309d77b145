//! `tollgate inspect`: an account's standing on each rule of a route, as a
//! check would find it, without changing anything (admin).

use std::net::IpAddr;

use clap::Args;

use super::{CommonArgs, EXIT_DENY};
use crate::client::{Client, ClientError};
use crate::format::{at_time, human_duration};
use crate::protocol::{InspectedRule, Inspection, Subject};
use crate::stdout::outln;

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Route (rule set) whose rules are read.
    #[arg(long, default_value = "login")]
    pub route: String,
    /// The account to look up (sent to the daemon, never logged by it).
    #[arg(long)]
    pub account: String,
    /// The source address, for the rules keyed on it (they are skipped without it).
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// The device's identifier, for known-device rules and the device's own keys.
    #[arg(long)]
    pub device: Option<String>,
    /// The tenant, for rules keyed on it.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The OAuth client id, for rules keyed on it.
    #[arg(long)]
    pub client_id: Option<String>,
}

impl InspectArgs {
    fn subject(&self) -> Subject<'_> {
        Subject {
            peer: self.ip,
            forwarded_for: None,
            account: Some(&self.account),
            device: self.device.as_deref(),
            tenant: self.tenant.as_deref(),
            client_id: self.client_id.as_deref(),
        }
    }
}

/// Asks, prints, and returns the exit status: `EXIT_DENY` when an
/// enforcing rule would refuse a check now (the status `check` gives a
/// deny), so a script can test "is it locked" without parsing.
pub(super) async fn inspect(client: &Client, args: &InspectArgs) -> Result<u8, ClientError> {
    let inspection = client.inspect(&args.route, &args.subject()).await?;
    if args.common.json {
        outln!("{}", serde_json::to_value(&inspection).expect("plain data serializes"));
    } else {
        print_inspection(&inspection);
    }
    let refused = inspection.rules.iter().any(|r| r.refuses && !r.monitor);
    Ok(if refused { EXIT_DENY } else { 0 })
}

fn print_inspection(inspection: &Inspection) {
    let device = match inspection.device.as_str() {
        "" => String::new(),
        known => format!(", device {known}"),
    };
    outln!("route {} at {}{device}", inspection.route, at_time(inspection.now_ms));
    if inspection.shared {
        outln!("shared store: global rules (marked *) show this host's view only");
    }
    let width = inspection.rules.iter().map(|r| r.name.len() + usize::from(r.global)).max().unwrap_or(0);
    for rule in &inspection.rules {
        let name = format!("{}{}", rule.name, if rule.global { "*" } else { "" });
        outln!("{}", format!("  {name:<width$}  {:<8}  {}", rule.kind, describe(rule)).trim_end());
    }
}

/// One rule's standing in words: its state, its figures, and when a
/// refusal ends as `lockouts` says it.
fn describe(rule: &InspectedRule) -> String {
    if !rule.skipped.is_empty() {
        return format!("skipped ({})", rule.skipped);
    }
    let state = match rule.kind.as_str() {
        _ if !rule.refuses => "ok",
        "failures" if rule.locked => "locked",
        "failures" => "full",
        "rate" => "spent",
        "ban" => "banned",
        _ => "flagged",
    };
    let mut text = format!("{state:<7}");
    if rule.monitor {
        text += " (monitor)";
    }
    match rule.kind.as_str() {
        "failures" => {
            text += &format!(
                "  failures {}/{}  in flight {}  left {}",
                rule.failures, rule.limit, rule.in_flight, rule.remaining
            )
        }
        "rate" => text += &format!("  left {}/{}", rule.remaining, rule.limit),
        _ if !rule.flagged_by.is_empty() => text += &format!("  by {}", rule.flagged_by),
        _ => {}
    }
    if rule.until_ms > 0 {
        text += &format!("  until {} (retry after {})", at_time(rule.until_ms), human_duration(rule.retry_after_ms));
    }
    text
}
