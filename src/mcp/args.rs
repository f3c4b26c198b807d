//! The MCP tools' arguments, as an LLM sees them described (the doc
//! comments become the JSON schema's descriptions), and their checks.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{Failed, MAX_PAGE};
use crate::cli::consolidation::KindArg;
use crate::cli::memory::ScopeTypeArg;
use crate::cli::search::{ModeArg, SourceArg};
use crate::proto;

/// One page of a list.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Page {
    /// The most items to return (1 to 100, default 50)
    pub(super) page_size: Option<u32>,
    /// The next_page_token of the previous page, for the page after it
    pub(super) page_token: Option<String>,
}

impl Page {
    /// The page size and token to ask for.
    pub(super) fn ask(self) -> Result<(i32, String), Failed> {
        let size = bounded("page_size", self.page_size, 50)?;
        Ok((size, self.page_token.unwrap_or_default()))
    }
}

/// The scope every memory tool names explicitly.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Scope {
    /// The scope's type: namespace (shared, long-lived), flow (one
    /// workflow's), or execution (one run's)
    pub(super) scope_type: ScopeTypeArg,
    /// The scope's name, e.g. customer_profiles
    pub(super) scope: String,
}

impl Scope {
    pub(super) fn proto(&self) -> (i32, String) {
        (self.scope_type.to_proto() as i32, self.scope.clone())
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct GetArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key, e.g. user/preferences
    pub(super) key: String,
    /// Read this version instead of the newest
    pub(super) version: Option<i64>,
    /// Read the value the key had at this point instead: a revision of the
    /// change feed (e.g. "42"), an RFC 3339 time, or a duration ago (e.g.
    /// "2h", "30m", "7d")
    pub(super) as_of: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SetArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key to write
    pub(super) key: String,
    /// The value: any JSON
    pub(super) value: Value,
    /// Write only if the key's newest version is this one (0: only if the
    /// key has no live value); a conflict fails with ABORTED
    pub(super) expected_version: Option<i64>,
    /// Makes a retry of this write safe: the same id answers with the
    /// first write's result
    pub(super) request_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct DeleteArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key to delete (a tombstone version is written; history stays)
    pub(super) key: String,
    /// Delete only if the key's newest version is this one
    pub(super) expected_version: Option<i64>,
    /// Makes a retry of this delete safe: the same id answers with the
    /// first delete's result
    pub(super) request_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RollbackArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key to roll back
    pub(super) key: String,
    /// The older version whose value becomes the newest version
    pub(super) to_version: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForgetUserArgs {
    /// The app the user belongs to
    pub(super) app: String,
    /// The user whose sessions, episodes, working memory, facts and runs'
    /// execution scopes are deleted
    pub(super) user: String,
    /// Further execution ids known to be the user's runs
    pub(super) execution_ids: Option<Vec<String>>,
    /// Count what would be deleted; delete nothing
    pub(super) dry_run: Option<bool>,
}

/// What an export covers: at most one of a scope, a session, or an app's
/// user; none is the whole tenant.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ExportArgs {
    /// A memory scope's type, with scope
    pub(super) scope_type: Option<ScopeTypeArg>,
    /// A memory scope to export
    pub(super) scope: Option<String>,
    /// A session to export, with its episodes and working memory
    pub(super) session_id: Option<String>,
    /// The app of user
    pub(super) app: Option<String>,
    /// A user of app: their sessions and facts
    pub(super) user: Option<String>,
    /// The most records to return (1 to 1000, default 200); use the
    /// `engram export` command for whole files
    pub(super) limit: Option<u32>,
}

/// Records of an export to restore.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ImportArgs {
    /// The export's records as JSON objects, its header first
    pub(super) records: Vec<Value>,
}

/// The scope a fork writes into.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Target {
    /// The new scope's type
    pub(super) target_scope_type: ScopeTypeArg,
    /// The new scope's name; it must have no keys
    pub(super) target_scope: String,
}

impl Target {
    pub(super) fn proto(&self) -> (i32, String) {
        (
            self.target_scope_type.to_proto() as i32,
            self.target_scope.clone(),
        )
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    #[serde(flatten)]
    pub(super) target: Target,
    /// Copy the state at this point: a revision of the change feed (e.g.
    /// "42"), an RFC 3339 time or a duration ago (e.g. "2h"); unset copies
    /// the state now
    pub(super) as_of: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// Only keys starting with this
    pub(super) key_prefix: Option<String>,
    /// List what was live at this point instead: a revision of the change
    /// feed (e.g. "42"), an RFC 3339 time or a duration ago (e.g. "2h")
    pub(super) as_of: Option<String>,
    #[serde(flatten)]
    pub(super) page: Page,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key whose versions to read, oldest first, tombstones included
    pub(super) key: String,
    /// Start at this version (default: the first kept)
    pub(super) from_version: Option<i64>,
    /// The most versions to return (1 to 100, default 50)
    pub(super) limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ScopesArgs {
    /// Only scopes of this type
    pub(super) scope_type: Option<ScopeTypeArg>,
    /// Only execution scopes of this flow (by name)
    pub(super) flow_name: Option<String>,
    /// Count what was live at this point instead: a revision of the change
    /// feed (e.g. "42"), an RFC 3339 time or a duration ago (e.g. "2h")
    pub(super) as_of: Option<String>,
    #[serde(flatten)]
    pub(super) page: Page,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PurgeArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key whose old versions to hard-delete
    pub(super) key: String,
    /// Keep the newest this many versions (default: delete all)
    pub(super) keep: Option<i64>,
    /// Only report what would be deleted
    pub(super) dry_run: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct PurgeScopeArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// Keep the newest this many versions of each key (default: delete all)
    pub(super) keep: Option<i64>,
    /// Also purge keys whose newest version is a tombstone
    pub(super) include_deleted: Option<bool>,
    /// Only report what would be deleted
    pub(super) dry_run: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RetentionArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// Keep the newest this many versions of each key (at least 1)
    pub(super) keep_versions: Option<i64>,
    /// Drop versions older than this many seconds, except each key's newest
    pub(super) max_age_seconds: Option<u32>,
    /// Drop deleted keys entirely once their tombstone is this many seconds old
    pub(super) tombstone_grace_seconds: Option<u32>,
    /// Only report what the policy would delete now; store nothing
    pub(super) dry_run: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ApplyRetentionArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// Only report what would be deleted
    pub(super) dry_run: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompactArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    /// The key to summarise (or give keys)
    pub(super) key: Option<String>,
    /// Several keys summarised into target_key
    pub(super) keys: Option<Vec<String>>,
    /// Where the summary goes (default: key)
    pub(super) target_key: Option<String>,
    /// Summarise the key's whole history instead of its current value
    pub(super) history: Option<bool>,
    /// What the summary should keep
    pub(super) instruction: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct LogArgs {
    #[serde(flatten)]
    pub(super) scope: Scope,
    #[serde(flatten)]
    pub(super) page: Page,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReindexArgs {
    /// Write the missing flow tags (default: only report them)
    pub(super) apply: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AppendArgs {
    /// The session (created by this call when app and user are given)
    pub(super) session_id: String,
    /// The event type, e.g. user_message, agent_response, tool_call,
    /// observation
    #[serde(rename = "type")]
    pub(super) kind: String,
    /// What happened: any JSON (a string for a message)
    pub(super) content: Value,
    /// The session's app
    pub(super) app: Option<String>,
    /// The session's user
    pub(super) user: Option<String>,
    /// The agent that produced it
    pub(super) agent: Option<String>,
    /// An id that makes a retry safe: the same id is appended once
    pub(super) id: Option<String>,
    /// A JSON object of attributes
    pub(super) metadata: Option<serde_json::Map<String, Value>>,
    /// Append only to a session that exists: a missing one is an error,
    /// not created, even with app and user
    pub(super) require_session: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RecentArgs {
    /// A user's newest episodes across sessions (or give session_id)
    pub(super) user: Option<String>,
    /// One session's newest episodes
    pub(super) session_id: Option<String>,
    /// Only this agent's
    pub(super) agent: Option<String>,
    /// Only these event types
    pub(super) types: Option<Vec<String>>,
    /// The most episodes (1 to 100, default 20)
    pub(super) limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct EpisodesArgs {
    /// The session whose log to read, in seq order
    pub(super) session_id: String,
    /// Only these event types
    pub(super) types: Option<Vec<String>>,
    /// Only episodes after this seq
    pub(super) after_seq: Option<i64>,
    #[serde(flatten)]
    pub(super) page: Page,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct EpisodeArgs {
    /// The episode id, such as one of a fact's source_episode_ids
    pub(super) id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionsArgs {
    /// Only this app's sessions
    pub(super) app: Option<String>,
    /// Only this user's sessions
    pub(super) user: Option<String>,
    #[serde(flatten)]
    pub(super) page: Page,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContextArgs {
    /// The session
    pub(super) session_id: String,
    /// How many of the newest user and agent messages (default 20)
    pub(super) max_events: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenderArgs {
    /// The session
    pub(super) session_id: String,
    /// The session's app
    pub(super) app: Option<String>,
    /// The session's user
    pub(super) user: Option<String>,
    /// What the agent works on now: the facts most relevant to it come first
    pub(super) query: Option<String>,
    /// The most facts (default 20)
    pub(super) max_facts: Option<u32>,
    /// The most recent episodes (default 10)
    pub(super) max_events: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SearchArgs {
    /// What to look for: words (any may match), "quoted phrases"
    /// (required), -words (excluded); Chinese, Japanese and Korean words
    /// match by their pairs of neighbouring characters
    pub(super) query: String,
    /// Where to look (default: everywhere)
    pub(super) sources: Option<Vec<SourceArg>>,
    /// How to match (default: hybrid with an embedder, else lexical)
    pub(super) mode: Option<ModeArg>,
    /// The most hits (1 to 100, default 10)
    pub(super) limit: Option<u32>,
    /// Memory: only this scope type
    pub(super) scope_type: Option<ScopeTypeArg>,
    /// Memory: only this scope (with scope_type)
    pub(super) scope: Option<String>,
    /// Memory: only keys starting with this
    pub(super) key_prefix: Option<String>,
    /// Memory: only scopes whose name starts with this
    pub(super) scope_prefix: Option<String>,
    /// Facts and episodes: only this app
    pub(super) app: Option<String>,
    /// Facts and episodes: only this user
    pub(super) user: Option<String>,
    /// Episodes: only this session
    pub(super) session_id: Option<String>,
    /// Episodes: only this agent
    pub(super) agent: Option<String>,
    /// Episodes: only these types
    pub(super) types: Option<Vec<String>>,
    /// Facts: only this kind
    pub(super) kind: Option<KindArg>,
    /// Only items from this time on (RFC 3339)
    pub(super) start_time: Option<String>,
    /// Only items before this time (RFC 3339)
    pub(super) end_time: Option<String>,
}

/// A page or limit from the arguments: `default` when unset, refused past
/// [`MAX_PAGE`].
pub(super) fn bounded(field: &str, value: Option<u32>, default: u32) -> Result<i32, Failed> {
    match value {
        None => Ok(default as i32),
        Some(0) => Err(Failed::argument(format!("{field} must be at least 1"))),
        Some(n) if n > MAX_PAGE => Err(Failed::argument(format!(
            "{field} must be at most {MAX_PAGE}, got {n}"
        ))),
        Some(n) => Ok(n as i32),
    }
}

/// An `as_of` argument: a revision, an RFC 3339 time or a duration ago,
/// read as the CLI's `--as-of` is.
pub(super) fn point(text: Option<String>) -> Result<Option<proto::AsOf>, Failed> {
    crate::cli::memory::as_of("as_of", text.as_deref()).map_err(|err| Failed::argument(err.message))
}
