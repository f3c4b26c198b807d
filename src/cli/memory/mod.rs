//! `engram memory ...`: scoped memory and its maintenance from a shell.
//!
//! [`keys`] holds the commands that call `MemoryService` (reading, writing
//! and following keys), [`admin`] those that call `MemoryAdminService`
//! (purges, compaction, retention, the audit log, reindexing), and [`show`]
//! the JSON shapes of what they print, which the search command and the
//! MCP tools print too.

mod admin;
mod keys;
mod show;

pub use show::entry_json;
pub(crate) use show::{record_json, retention_json, scope_type_name};

use super::{CliError, CliResult, ClientArgs, connect};
use crate::proto;

#[derive(Debug, clap::Args)]
pub struct MemoryCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ScopeTypeArg {
    Namespace,
    Flow,
    Execution,
}

impl ScopeTypeArg {
    pub(crate) fn to_proto(self) -> proto::ScopeType {
        match self {
            ScopeTypeArg::Namespace => proto::ScopeType::Namespace,
            ScopeTypeArg::Flow => proto::ScopeType::Flow,
            ScopeTypeArg::Execution => proto::ScopeType::Execution,
        }
    }
}

/// The typed scope a command works in.
#[derive(Debug, Clone, clap::Args)]
pub struct ScopeArgs {
    /// The scope, e.g. customer_profiles
    #[arg(long, env = "ENGRAM_SCOPE")]
    scope: String,

    /// The scope type
    #[arg(long, value_enum, env = "ENGRAM_SCOPE_TYPE", default_value_t = ScopeTypeArg::Namespace)]
    scope_type: ScopeTypeArg,
}

impl ScopeArgs {
    fn proto(&self) -> (i32, String) {
        (self.scope_type.to_proto() as i32, self.scope.clone())
    }
}

/// A point in the past: a revision of the change feed (as `memory watch`
/// prints them), an RFC 3339 time, or a duration ago (`90s`, `30m`, `2h`,
/// `7d`; a bare number is a revision), which becomes the time that long
/// before now. An error names `flag`.
pub(crate) fn as_of(flag: &str, text: Option<&str>) -> CliResult<Option<proto::AsOf>> {
    text.map(point)
        .transpose()
        .map_err(|why| CliError::usage(format!("{flag}: {why}")))
}

/// A point as [`as_of`] reads it, without the flag's name: clap reads
/// `--as-of` with it, so a bad point is refused by its flag, with exit
/// code 2, before any call.
pub(crate) fn point(text: &str) -> Result<proto::AsOf, String> {
    use proto::as_of::Point;
    if let Ok(revision) = text.parse::<i64>() {
        return Ok(proto::AsOf {
            point: Some(Point::Revision(revision)),
        });
    }
    let ago = text.starts_with(|c: char| c.is_ascii_digit())
        && text.ends_with(|c: char| c.is_ascii_alphabetic())
        && !text.contains(['-', ':']);
    let time = if ago {
        let age = super::sessions::parse_age(text)?;
        let then = chrono::TimeDelta::from_std(age)
            .ok()
            .and_then(|age| chrono::Utc::now().checked_sub_signed(age))
            .ok_or_else(|| format!("{text} ago is before any time"))?;
        crate::api::convert::timestamp(then)
    } else {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| crate::api::convert::timestamp(t.to_utc()))
            .map_err(|err| {
                // Why the time was refused, only for what looks like one.
                let why = if text.starts_with(|c: char| c.is_ascii_digit()) {
                    format!(": {err}")
                } else {
                    String::new()
                };
                format!(
                    "{text:?} is not a revision (42), an RFC 3339 time \
                     (2026-11-23T12:00:00Z) or a duration ago (30m, 2h, 7d){why}"
                )
            })?
    };
    Ok(proto::AsOf {
        point: Some(Point::Time(time)),
    })
}

/// The subcommands, by the service they call; `--help` lists them in this
/// order.
#[derive(Debug, clap::Subcommand)]
enum Command {
    #[command(flatten)]
    Keys(keys::KeyCommand),
    #[command(flatten)]
    Admin(admin::AdminCommand),
}

impl MemoryCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        match self.command {
            Command::Keys(command) => keys::run(channel, output, command).await,
            Command::Admin(command) => admin::run(channel, output, command).await,
        }
    }
}
