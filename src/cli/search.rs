//! `engram search "…"`: recall from a shell, best hits first.

use serde_json::json;

use super::consolidation::{KindArg, fact_json};
use super::memory::{ScopeTypeArg, entry_json};
use super::sessions::episode_json;
use super::{CliError, CliResult, ClientArgs, Output, connect, print_json, print_table, time};
use crate::proto;
use crate::proto::search_hit::Item;
use crate::proto::search_service_client::SearchServiceClient;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SourceArg {
    Memory,
    Facts,
    Episodes,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ModeArg {
    Lexical,
    Semantic,
    Hybrid,
}

impl SourceArg {
    pub(crate) fn to_proto(self) -> i32 {
        match self {
            SourceArg::Memory => proto::SearchSource::Memory as i32,
            SourceArg::Facts => proto::SearchSource::Facts as i32,
            SourceArg::Episodes => proto::SearchSource::Episodes as i32,
        }
    }
}

impl ModeArg {
    pub(crate) fn to_proto(self) -> i32 {
        match self {
            ModeArg::Lexical => proto::SearchMode::Lexical as i32,
            ModeArg::Semantic => proto::SearchMode::Semantic as i32,
            ModeArg::Hybrid => proto::SearchMode::Hybrid as i32,
        }
    }
}

/// Find memory entries, facts and episodes by what they say: words (any
/// may match), "quoted phrases" (required), -words (excluded). Prints a
/// table of score, source, item and snippet (matches marked **so**).
#[derive(Debug, clap::Args)]
pub struct SearchCommand {
    #[command(flatten)]
    client: ClientArgs,

    /// What to look for (may start with a -word)
    #[arg(allow_hyphen_values = true)]
    query: String,

    /// Where to look (repeatable; default: everywhere)
    #[arg(long = "source", value_enum)]
    sources: Vec<SourceArg>,

    /// How to match (default: hybrid with an embedder, else lexical)
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,

    /// The most hits (1 to 100)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i32).range(0..))]
    limit: i32,

    /// Memory: only this scope type
    #[arg(long, value_enum)]
    scope_type: Option<ScopeTypeArg>,

    /// Memory: only this scope (with --scope-type)
    #[arg(long, default_value = "", hide_default_value = true)]
    scope: String,

    /// Memory: only keys starting with this
    #[arg(long, default_value = "", hide_default_value = true)]
    key_prefix: String,

    /// Memory: only scopes whose name starts with this
    #[arg(long, default_value = "", hide_default_value = true)]
    scope_prefix: String,

    /// Facts and episodes: only this app
    #[arg(long, default_value = "", hide_default_value = true)]
    app: String,

    /// Facts and episodes: only this user
    #[arg(long, default_value = "", hide_default_value = true)]
    user: String,

    /// Episodes: only this session
    #[arg(long, default_value = "", hide_default_value = true)]
    session_id: String,

    /// Episodes: only this agent
    #[arg(long, default_value = "", hide_default_value = true)]
    agent: String,

    /// Episodes: only these types (repeatable)
    #[arg(long = "type")]
    types: Vec<String>,

    /// Facts: only this kind
    #[arg(long, value_enum)]
    kind: Option<KindArg>,

    /// Episodes: also show up to this many episodes following each episode
    /// hit in its session (0 to 3)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..))]
    following: i32,

    /// Only items from this time on (RFC 3339)
    #[arg(long)]
    since: Option<String>,

    /// Only items from before this time (RFC 3339)
    #[arg(long)]
    until: Option<String>,
}

pub(crate) fn timestamp(
    flag: &str,
    text: Option<&str>,
) -> CliResult<Option<prost_types::Timestamp>> {
    text.map(|text| {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|t| crate::api::convert::timestamp(t.to_utc()))
            .map_err(|err| CliError::usage(format!("{flag}: not an RFC 3339 time: {err}")))
    })
    .transpose()
}

fn source_name(n: i32) -> &'static str {
    match proto::SearchSource::try_from(n) {
        Ok(proto::SearchSource::Memory) => "memory",
        Ok(proto::SearchSource::Facts) => "facts",
        Ok(proto::SearchSource::Episodes) => "episodes",
        _ => "unspecified",
    }
}

/// What a hit is, in a few words: `scope/key@version`, a fact id, a
/// session's episode.
fn item_name(item: Option<&Item>) -> String {
    match item {
        Some(Item::Entry(e)) => format!("{}/{}@{}", e.scope, e.key, e.version),
        Some(Item::Fact(f)) => f.id.clone(),
        Some(Item::Episode(e)) => {
            format!("{}#{} {}", e.session_id, e.seq, time(e.timestamp.as_ref()))
        }
        None => String::new(),
    }
}

pub(crate) fn hit_json(hit: &proto::SearchHit) -> serde_json::Value {
    let item = match &hit.item {
        Some(Item::Entry(e)) => json!({"entry": entry_json(e)}),
        Some(Item::Fact(f)) => json!({"fact": fact_json(f)}),
        Some(Item::Episode(e)) => json!({"episode": episode_json(e)}),
        None => json!({}),
    };
    json!({
        "score": hit.score,
        "source": source_name(hit.source),
        "snippet": hit.snippet,
        "item": item,
    })
}

impl SearchCommand {
    pub async fn run(self) -> CliResult {
        let request = proto::SearchRequest {
            query: self.query,
            sources: self
                .sources
                .iter()
                .map(|source| source.to_proto())
                .collect(),
            mode: self.mode.map_or(0, ModeArg::to_proto),
            limit: self.limit,
            scope_type: self
                .scope_type
                .map_or(proto::ScopeType::Unspecified, ScopeTypeArg::to_proto)
                as i32,
            scope: self.scope,
            key_prefix: self.key_prefix,
            scope_prefix: self.scope_prefix,
            app: self.app,
            user: self.user,
            session_id: self.session_id,
            agent: self.agent,
            types: self.types,
            kind: self.kind.map_or(0, KindArg::to_proto),
            start_time: timestamp("--since", self.since.as_deref())?,
            end_time: timestamp("--until", self.until.as_deref())?,
            following_episodes: self.following,
        };
        let channel = connect(&self.client).await?;
        let hits = SearchServiceClient::new(channel)
            .search(request)
            .await?
            .into_inner()
            .hits;
        match self.client.output() {
            Output::Json => print_json(&json!({
                "hits": hits.iter().map(hit_json).collect::<Vec<_>>(),
            })),
            // A table for people; when nothing matched, a line saying so
            // on stderr rather than a header over nothing.
            Output::Text if hits.is_empty() => eprintln!("no hits"),
            Output::Text => {
                // Scores right-aligned among themselves.
                let scores: Vec<String> =
                    hits.iter().map(|hit| format!("{:.3}", hit.score)).collect();
                let width = scores.iter().map(String::len).max().unwrap_or(0);
                let rows: Vec<[String; 4]> = hits
                    .iter()
                    .zip(&scores)
                    .map(|(hit, score)| {
                        [
                            format!("{score:>width$}"),
                            source_name(hit.source).to_owned(),
                            item_name(hit.item.as_ref()),
                            hit.snippet.replace('\n', " "),
                        ]
                    })
                    .collect();
                print_table(["SCORE", "SOURCE", "ITEM", "SNIPPET"], &rows);
            }
        }
        Ok(())
    }
}
