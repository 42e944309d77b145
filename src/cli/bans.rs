//! `tollgate ban` and the `--ip` form of `tollgate unlock`: an operator's
//! ban of a source network, and its lifting.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

use super::{CommonArgs, EXIT_NOTHING_CLEARED};
use crate::client::{Client, ClientError};
use crate::format::{at_time, human_duration};
use crate::stdout::outln;

#[derive(Debug, Args)]
pub struct BanArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The network to ban, e.g. 203.0.113.0/24 or 2001:db8::/48 (an address alone is a /32 or /128); at most a /8 or /32 wide.
    #[arg(long, value_parser = parse_network)]
    pub ip: IpNet,
    /// How long, e.g. 30m, 2h, 7d (at most a year). Banning a banned network again replaces its ban.
    #[arg(long = "for", value_parser = parse_ban_duration)]
    pub duration: Duration,
    /// Why, for the audit line and `lockouts` (at most 200 bytes).
    #[arg(long, default_value = "", value_parser = parse_reason)]
    pub reason: String,
}

/// A network as `ban` and `unlock --ip` take it, checked here first so a
/// typo is refused with the daemon's words before anything is sent.
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    crate::exemptions::parse_network(text, "ban")
}

/// `--for`, within a ban's bounds (the daemon checks them too).
fn parse_ban_duration(text: &str) -> Result<Duration, String> {
    let duration = crate::format::parse_duration(text)?;
    let for_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    crate::bans::check_terms(for_ms, "").map_err(|e| e.to_string())?;
    Ok(duration)
}

/// `--reason`, within a ban's bounds (the daemon checks them too).
fn parse_reason(text: &str) -> Result<String, String> {
    crate::bans::check_terms(1, text.trim()).map_err(|e| e.to_string())?;
    Ok(text.trim().to_string())
}

pub async fn ban(client: &Client, args: &BanArgs) -> Result<ExitCode, ClientError> {
    let (until_ms, replaced) =
        client.ban(args.ip.addr(), args.ip.prefix_len(), args.duration, args.reason.trim()).await?;
    if args.common.json {
        outln!("{}", serde_json::json!({ "network": args.ip.to_string(), "until_ms": until_ms, "replaced": replaced }));
    } else {
        let millis = u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX);
        outln!(
            "banned {} until {} (for {}){}",
            args.ip,
            at_time(until_ms),
            human_duration(millis),
            if replaced { ", replacing its earlier ban" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `unlock --ip NETWORK`: lifts the ban on exactly that network.
pub async fn unban(client: &Client, network: IpNet, json: bool) -> Result<ExitCode, ClientError> {
    let cleared = client.unban(network.addr(), network.prefix_len()).await?;
    if json {
        outln!("{}", serde_json::json!({ "cleared": cleared }));
    } else if cleared == 0 {
        outln!(
            "cleared nothing: {network} is not banned (a ban is lifted by its exact network; see `tollgate lockouts`)"
        );
    } else {
        outln!("lifted the ban on {network}");
    }
    Ok(ExitCode::from(if cleared == 0 { EXIT_NOTHING_CLEARED } else { 0 }))
}
