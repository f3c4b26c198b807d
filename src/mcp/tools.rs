//! The MCP tools: each one gRPC call (or a bounded read of a stream), its
//! arguments described for an LLM, its answer in the CLI's JSON shapes.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::args::{
    AppendArgs, ApplyRetentionArgs, CompactArgs, ContextArgs, DeleteArgs, EpisodeArgs,
    EpisodesArgs, ExportArgs, ForgetUserArgs, ForkArgs, GetArgs, HistoryArgs, ImportArgs, ListArgs,
    LogArgs, PurgeArgs, PurgeScopeArgs, RecentArgs, ReindexArgs, RenderArgs, RetentionArgs,
    RollbackArgs, ScopesArgs, SearchArgs, SessionsArgs, SetArgs, bounded, point,
};
use super::{Engram, Failed, Reply, ok};
use crate::api::convert::json_to_proto;
use crate::cli::consolidation::KindArg;
use crate::cli::memory::{entry_json, record_json};
use crate::cli::search::{ModeArg, SourceArg, hit_json, timestamp};
use crate::cli::sessions::{episode_json, session_json};
use crate::paging;
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::search_service_client::SearchServiceClient;
use crate::proto::session_service_client::SessionServiceClient;

/// What a purge (of a key or a scope) answers.
fn purged(
    versions_deleted: i64,
    keys_affected: i64,
    record: Option<&proto::CompactionRecord>,
) -> Reply {
    ok(json!({
        "versions_deleted": versions_deleted,
        "keys_affected": keys_affected,
        "record": record.map(record_json),
    }))
}

#[tool_router(vis = "pub(super)")]
impl Engram {
    #[tool(
        description = "Read a memory key's current value (or one version) in a scope. \
                       Fails with NOT_FOUND when the key has no live value.",
        annotations(read_only_hint = true)
    )]
    async fn memory_get(&self, Parameters(args): Parameters<GetArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let entry = self
            .memory()
            .get(proto::GetRequest {
                scope_type,
                scope,
                key: args.key,
                version: args.version.unwrap_or(0),
                as_of: point(args.as_of)?,
            })
            .await?
            .into_inner()
            .entry;
        ok(json!({ "entry": entry.as_ref().map(entry_json) }))
    }

    #[tool(
        description = "Write a new version of a memory key. Pass expected_version to write \
                       only if nobody wrote since you read (compare-and-set).",
        annotations(read_only_hint = false, destructive_hint = false)
    )]
    async fn memory_set(&self, Parameters(args): Parameters<SetArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let entry = self
            .memory()
            .set(proto::SetRequest {
                scope_type,
                scope,
                key: args.key,
                value: Some(json_to_proto(&args.value)),
                expected_version: args.expected_version,
                request_id: args.request_id.unwrap_or_default(),
            })
            .await?
            .into_inner()
            .entry;
        ok(json!({ "entry": entry.as_ref().map(entry_json) }))
    }

    #[tool(
        description = "Delete a memory key: writes a tombstone version; its history stays \
                       readable.",
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn memory_delete(&self, Parameters(args): Parameters<DeleteArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let entry = self
            .memory()
            .delete(proto::DeleteRequest {
                scope_type,
                scope,
                key: args.key,
                expected_version: args.expected_version,
                request_id: args.request_id.unwrap_or_default(),
            })
            .await?
            .into_inner()
            .entry;
        ok(json!({ "entry": entry.as_ref().map(entry_json) }))
    }

    #[tool(
        description = "Write a new version of a key holding an older version's value (this \
                       also restores a deleted key); recorded in the scope's audit trail.",
        annotations(destructive_hint = false)
    )]
    async fn memory_rollback(&self, Parameters(args): Parameters<RollbackArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let done = self
            .memory()
            .rollback(proto::RollbackRequest {
                scope_type,
                scope,
                key: args.key,
                to_version: args.to_version,
            })
            .await?
            .into_inner();
        ok(json!({
            "entry": done.entry.as_ref().map(entry_json),
            "audit_key": done.audit_key,
        }))
    }

    #[tool(
        description = "Copy a scope's live entries (now, or as_of a revision or time) into a \
                       new, empty scope, e.g. to replay a run against the memory it saw; \
                       recorded in the new scope's audit trail.",
        annotations(destructive_hint = false)
    )]
    async fn memory_fork(&self, Parameters(args): Parameters<ForkArgs>) -> Reply {
        let (source_scope_type, source_scope) = args.scope.proto();
        let (target_scope_type, target_scope) = args.target.proto();
        let done = self
            .memory()
            .fork_scope(proto::ForkScopeRequest {
                source_scope_type,
                source_scope,
                target_scope_type,
                target_scope,
                as_of: point(args.as_of)?,
            })
            .await?
            .into_inner();
        ok(json!({
            "keys_copied": done.keys_copied,
            "revision": done.revision,
            "audit_key": done.audit_key,
        }))
    }

    #[tool(
        description = "List a scope's live entries in key order, one page at a time.",
        annotations(read_only_hint = true)
    )]
    async fn memory_list(&self, Parameters(args): Parameters<ListArgs>) -> Reply {
        let (page_size, page_token) = args.page.ask()?;
        let (scope_type, scope) = args.scope.proto();
        let page = self
            .memory()
            .list(proto::ListRequest {
                scope_type,
                scope,
                key_prefix: args.key_prefix.unwrap_or_default(),
                page_size,
                page_token,
                include_reserved: false,
                as_of: point(args.as_of)?,
            })
            .await?
            .into_inner();
        ok(json!({
            "entries": page.entries.iter().map(entry_json).collect::<Vec<_>>(),
            "purged_keys": page.purged_keys,
            "next_page_token": page.next_page_token,
        }))
    }

    #[tool(
        description = "Read a key's versions oldest first, tombstones included. When more \
                       remain, next_from_version says where to continue.",
        annotations(read_only_hint = true)
    )]
    async fn memory_history(&self, Parameters(args): Parameters<HistoryArgs>) -> Reply {
        let limit = bounded("limit", args.limit, 50)? as usize;
        let (scope_type, scope) = args.scope.proto();
        let mut stream = self
            .memory()
            .history(proto::HistoryRequest {
                scope_type,
                scope,
                key: args.key,
                from_version: args.from_version.unwrap_or(0),
            })
            .await?
            .into_inner();
        // At most `limit` versions and about a page's bytes of them.
        let (mut versions, mut bytes) = (Vec::new(), 0);
        let mut next_from_version = None;
        while let Some(item) = stream.next().await {
            let Some(entry) = item?.entry else { continue };
            let version = entry_json(&entry);
            bytes += paging::json_weight(&version);
            if versions.len() == limit || paging::overflows(bytes, versions.len()) {
                next_from_version = Some(entry.version);
                break;
            }
            versions.push(version);
        }
        ok(json!({ "versions": versions, "next_from_version": next_from_version }))
    }

    #[tool(
        description = "List memory scopes with their live entry counts.",
        annotations(read_only_hint = true)
    )]
    async fn memory_scopes(&self, Parameters(args): Parameters<ScopesArgs>) -> Reply {
        let (page_size, page_token) = args.page.ask()?;
        let page = self
            .memory()
            .list_scopes(proto::ListScopesRequest {
                scope_type: args.scope_type.map_or(0, |t| t.to_proto() as i32),
                page_size,
                page_token,
                flow_id: String::new(),
                flow_name: args.flow_name.unwrap_or_default(),
                as_of: point(args.as_of)?,
            })
            .await?
            .into_inner();
        let scopes: Vec<Value> = page
            .scopes
            .iter()
            .map(|summary| {
                json!({
                    "scope_type": crate::cli::memory::scope_type_name(summary.scope_type),
                    "scope": summary.scope,
                    "entry_count": summary.entry_count,
                    "purged_count": summary.purged_count,
                })
            })
            .collect();
        ok(json!({ "scopes": scopes, "next_page_token": page.next_page_token }))
    }

    #[tool(
        description = "Admin: delete everything about one user of one app (sessions, \
                       episodes, working memory, facts, their runs' memory), leaving an \
                       audit skeleton without content. Irreversible; try dry_run first.",
        annotations(destructive_hint = true)
    )]
    async fn forget_user(&self, Parameters(args): Parameters<ForgetUserArgs>) -> Reply {
        let done = self
            .data()
            .forget_user(proto::ForgetUserRequest {
                app: args.app,
                user: args.user,
                execution_ids: args.execution_ids.unwrap_or_default(),
                dry_run: args.dry_run.unwrap_or(false),
            })
            .await?
            .into_inner();
        ok(crate::cli::data::forgotten_json(&done))
    }

    #[tool(
        description = "Export memory, sessions, episodes, working memory, facts and rules \
                       as JSON records (the engram.export format, header first, an `end` record \
                       last): the whole tenant, or one scope, session or app user. Returns at \
                       most `limit` records (and about 2 MiB of them) and says whether there \
                       were more; a truncated export has no `end` record and does not import.",
        annotations(read_only_hint = true)
    )]
    async fn data_export(&self, Parameters(args): Parameters<ExportArgs>) -> Reply {
        let limit = match args.limit {
            None => 200,
            Some(n @ 1..=1000) => n as usize,
            Some(_) => return Err(Failed::argument("limit must be 1 to 1000")),
        };
        let scope_type = match (&args.scope, args.scope_type) {
            (Some(_), None) => proto::ScopeType::Namespace as i32,
            (_, Some(scope_type)) => scope_type.to_proto() as i32,
            (None, None) => 0,
        };
        let mut stream = self
            .data()
            .export(proto::ExportRequest {
                scope_type,
                scope: args.scope.unwrap_or_default(),
                session_id: args.session_id.unwrap_or_default(),
                app: args.app.unwrap_or_default(),
                user: args.user.unwrap_or_default(),
            })
            .await?
            .into_inner();
        // At most `limit` records and about a page's bytes of them (one
        // at least): an export of large values is not all held, nor all
        // handed to the assistant.
        let (mut records, mut bytes) = (Vec::new(), 0);
        let mut truncated = false;
        'chunks: while let Some(chunk) = stream.next().await {
            for line in chunk?.lines {
                bytes += line.len();
                if records.len() == limit || paging::overflows(bytes, records.len()) {
                    truncated = true;
                    break 'chunks;
                }
                let record: Value = serde_json::from_str(&line).map_err(|err| {
                    Failed::argument(format!("the server sent a bad line: {err}"))
                })?;
                records.push(record);
            }
        }
        ok(json!({ "records": records, "truncated": truncated }))
    }

    #[tool(
        description = "Admin: restore exported records (header first, `end` last, as \
                       data_export gives them) into this tenant, all \
                       or nothing. Records already stored and identical are left unchanged; \
                       a record that differs refuses the whole import.",
        annotations(destructive_hint = false)
    )]
    async fn data_import(&self, Parameters(args): Parameters<ImportArgs>) -> Reply {
        let lines = args.records.iter().map(Value::to_string).collect();
        let done = self
            .data()
            .import(tokio_stream::iter([proto::ImportRequest { lines }]))
            .await?
            .into_inner();
        ok(json!({
            "imported": done.imported,
            "unchanged": done.unchanged,
            "lines": done.lines,
        }))
    }

    #[tool(
        description = "Admin: hard-delete all but the newest `keep` versions of a key. \
                       Irreversible; try dry_run first.",
        annotations(destructive_hint = true)
    )]
    async fn memory_purge(&self, Parameters(args): Parameters<PurgeArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let done = self
            .admin_client()
            .purge(proto::PurgeRequest {
                scope_type,
                scope,
                key: args.key,
                keep: args.keep,
                dry_run: args.dry_run.unwrap_or(false),
            })
            .await?
            .into_inner();
        purged(
            done.versions_deleted,
            done.keys_affected,
            done.record.as_ref(),
        )
    }

    #[tool(
        description = "Admin: purge every key of a scope down to `keep` versions. \
                       Irreversible; try dry_run first.",
        annotations(destructive_hint = true)
    )]
    async fn memory_purge_scope(&self, Parameters(args): Parameters<PurgeScopeArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let done = self
            .admin_client()
            .purge_scope(proto::PurgeScopeRequest {
                scope_type,
                scope,
                keep: args.keep,
                include_deleted: args.include_deleted.unwrap_or(false),
                dry_run: args.dry_run.unwrap_or(false),
            })
            .await?
            .into_inner();
        purged(
            done.versions_deleted,
            done.keys_affected,
            done.record.as_ref(),
        )
    }

    #[tool(
        description = "Admin: declare how much history a scope keeps (keep_versions, \
                       max_age_seconds, tombstone_grace_seconds; none of them removes the \
                       policy). The server applies it at once and then on an interval, \
                       audited. dry_run previews what it would delete now.",
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn memory_retention(&self, Parameters(args): Parameters<RetentionArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let seconds = |s: Option<u32>| {
            s.map(|s| prost_types::Duration {
                seconds: s.into(),
                nanos: 0,
            })
        };
        let done = self
            .admin_client()
            .set_retention(proto::SetRetentionRequest {
                scope_type,
                scope,
                policy: Some(proto::RetentionPolicy {
                    keep_versions: args.keep_versions,
                    max_age: seconds(args.max_age_seconds),
                    tombstone_grace: seconds(args.tombstone_grace_seconds),
                }),
                dry_run: args.dry_run.unwrap_or(false),
            })
            .await?
            .into_inner();
        ok(json!({
            "retention": done.retention.as_ref().map(crate::cli::memory::retention_json),
            "versions_to_delete": done.versions_to_delete,
            "keys_to_affect": done.keys_to_affect,
        }))
    }

    #[tool(
        description = "Admin: apply a scope's retention policy now (dry_run previews).",
        annotations(destructive_hint = true)
    )]
    async fn memory_retention_apply(
        &self,
        Parameters(args): Parameters<ApplyRetentionArgs>,
    ) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let done = self
            .admin_client()
            .apply_retention(proto::ApplyRetentionRequest {
                scope_type,
                scope,
                dry_run: args.dry_run.unwrap_or(false),
            })
            .await?
            .into_inner();
        purged(
            done.versions_deleted,
            done.keys_affected,
            done.record.as_ref(),
        )
    }

    #[tool(
        description = "Admin: summarise entries into a new version of a target key, with an \
                       audit record.",
        annotations(destructive_hint = false)
    )]
    async fn memory_compact(&self, Parameters(args): Parameters<CompactArgs>) -> Reply {
        let (scope_type, scope) = args.scope.proto();
        let source_mode = if args.history.unwrap_or(false) {
            proto::SourceMode::History
        } else {
            proto::SourceMode::Current
        };
        let done = self
            .admin_client()
            .compact(proto::CompactRequest {
                scope_type,
                scope,
                key: args.key.unwrap_or_default(),
                keys: args.keys.unwrap_or_default(),
                source_mode: source_mode as i32,
                target_key: args.target_key.unwrap_or_default(),
                instruction: args.instruction.unwrap_or_default(),
                model: String::new(),
                max_tokens: 0,
            })
            .await?
            .into_inner();
        ok(json!({
            "entry": done.entry.as_ref().map(entry_json),
            "record": done.record.as_ref().map(record_json),
        }))
    }

    #[tool(
        description = "Admin: a scope's maintenance audit trail (purges, compactions), newest \
                       first.",
        annotations(read_only_hint = true)
    )]
    async fn memory_compaction_log(&self, Parameters(args): Parameters<LogArgs>) -> Reply {
        let (page_size, page_token) = args.page.ask()?;
        let (scope_type, scope) = args.scope.proto();
        let page = self
            .admin_client()
            .get_compaction_log(proto::GetCompactionLogRequest {
                scope_type,
                scope,
                page_size,
                page_token,
            })
            .await?
            .into_inner();
        ok(json!({
            "records": page.records.iter().map(record_json).collect::<Vec<_>>(),
            "next_page_token": page.next_page_token,
        }))
    }

    #[tool(
        description = "Admin: find execution-scoped versions missing their flow tags; with \
                       apply, write them.",
        annotations(idempotent_hint = true)
    )]
    async fn memory_reindex(&self, Parameters(args): Parameters<ReindexArgs>) -> Reply {
        let done = self
            .admin_client()
            .reindex(proto::ReindexRequest {
                apply: args.apply.unwrap_or(false),
            })
            .await?
            .into_inner();
        ok(json!({
            "versions_scanned": done.versions_scanned,
            "tags_added": done.tags_added,
            "issues": done.issues,
            "applied": done.applied,
        }))
    }

    #[tool(
        description = "Append an event to a session's log. A session that does not exist yet \
                       is created when app and user are given (unless require_session is \
                       true). Give an id to make a retry safe.",
        annotations(destructive_hint = false)
    )]
    async fn episode_append(&self, Parameters(args): Parameters<AppendArgs>) -> Reply {
        let metadata = match args.metadata {
            Some(metadata) => match json_to_proto(&Value::Object(metadata)).kind {
                Some(prost_types::value::Kind::StructValue(metadata)) => Some(metadata),
                _ => None,
            },
            None => None,
        };
        let done = EpisodeServiceClient::new(self.conn.clone())
            .append_episode(proto::AppendEpisodeRequest {
                session_id: args.session_id,
                app: args.app.unwrap_or_default(),
                user: args.user.unwrap_or_default(),
                episode: Some(proto::NewEpisode {
                    id: args.id.unwrap_or_default(),
                    agent: args.agent.unwrap_or_default(),
                    r#type: args.kind,
                    content: Some(json_to_proto(&args.content)),
                    metadata,
                    source_node: String::new(),
                    timestamp: None,
                }),
                require_session: args.require_session.unwrap_or(false),
            })
            .await?
            .into_inner();
        ok(json!({
            "episode": done.episode.as_ref().map(episode_json),
            "replayed": done.replayed,
        }))
    }

    #[tool(
        description = "A user's (or one session's) newest episodes, newest first.",
        annotations(read_only_hint = true)
    )]
    async fn episodes_recent(&self, Parameters(args): Parameters<RecentArgs>) -> Reply {
        let episodes = EpisodeServiceClient::new(self.conn.clone())
            .recent(proto::RecentRequest {
                user: args.user.unwrap_or_default(),
                session_id: args.session_id.unwrap_or_default(),
                agent: args.agent.unwrap_or_default(),
                limit: bounded("limit", args.limit, 20)?,
                types: args.types.unwrap_or_default(),
            })
            .await?
            .into_inner()
            .episodes;
        ok(json!({ "episodes": episodes.iter().map(episode_json).collect::<Vec<_>>() }))
    }

    #[tool(
        description = "A session's log in seq order, one page at a time.",
        annotations(read_only_hint = true)
    )]
    async fn episodes_list(&self, Parameters(args): Parameters<EpisodesArgs>) -> Reply {
        let (page_size, page_token) = args.page.ask()?;
        let page = EpisodeServiceClient::new(self.conn.clone())
            .list_episodes(proto::ListEpisodesRequest {
                session_id: args.session_id,
                types: args.types.unwrap_or_default(),
                after_seq: args.after_seq.unwrap_or(0),
                page_size,
                page_token,
            })
            .await?
            .into_inner();
        ok(json!({
            "episodes": page.episodes.iter().map(episode_json).collect::<Vec<_>>(),
            "next_page_token": page.next_page_token,
        }))
    }

    #[tool(
        description = "One episode by its id, with its session and seq: follows a fact's \
                       source_episode_ids back to what was said.",
        annotations(read_only_hint = true)
    )]
    async fn episode_get(&self, Parameters(args): Parameters<EpisodeArgs>) -> Reply {
        let episode = EpisodeServiceClient::new(self.conn.clone())
            .get_episode(proto::GetEpisodeRequest { id: args.id })
            .await?
            .into_inner()
            .episode;
        ok(json!({ "episode": episode.as_ref().map(episode_json) }))
    }

    #[tool(
        description = "List sessions, newest first, optionally of one app or user.",
        annotations(read_only_hint = true)
    )]
    async fn sessions_list(&self, Parameters(args): Parameters<SessionsArgs>) -> Reply {
        let (page_size, page_token) = args.page.ask()?;
        let page = SessionServiceClient::new(self.conn.clone())
            .list_sessions(proto::ListSessionsRequest {
                app: args.app.unwrap_or_default(),
                user: args.user.unwrap_or_default(),
                page_size,
                page_token,
            })
            .await?
            .into_inner();
        ok(json!({
            "sessions": page.sessions.iter().map(session_json).collect::<Vec<_>>(),
            "next_page_token": page.next_page_token,
        }))
    }

    #[tool(
        description = "A session's recent conversation as text (\"User: …\" / \"Assistant: …\" \
                       lines, oldest first), ready for a prompt.",
        annotations(read_only_hint = true)
    )]
    async fn session_context(&self, Parameters(args): Parameters<ContextArgs>) -> Reply {
        let built = EpisodeServiceClient::new(self.conn.clone())
            .build_context(proto::BuildContextRequest {
                session_id: args.session_id,
                max_events: args.max_events.map_or(0, |n| n.min(i32::MAX as u32) as i32),
            })
            .await?
            .into_inner();
        ok(json!({ "context": built.context, "events_used": built.events_used }))
    }

    #[tool(
        description = "Render a session's working memory as its MEMORY block (goal, todos, \
                       facts, recent activity) and the memory instructions, for a prompt.",
        annotations(read_only_hint = true)
    )]
    async fn memory_render(&self, Parameters(args): Parameters<RenderArgs>) -> Reply {
        let clamp = |n: Option<u32>| n.map_or(0, |n| n.min(i32::MAX as u32) as i32);
        let rendered = self
            .working()
            .render_memory_block(proto::RenderMemoryBlockRequest {
                session_id: args.session_id,
                app: args.app.unwrap_or_default(),
                user: args.user.unwrap_or_default(),
                max_facts: clamp(args.max_facts),
                max_events: clamp(args.max_events),
                query: args.query.unwrap_or_default(),
            })
            .await?
            .into_inner();
        ok(json!({
            "memory_block": rendered.memory_block,
            "instructions": rendered.instructions,
        }))
    }

    #[tool(
        description = "Find memory entries, facts and episodes by what they say, best first, \
                       each with a snippet (matched words marked **so**).",
        annotations(read_only_hint = true)
    )]
    async fn search(&self, Parameters(args): Parameters<SearchArgs>) -> Reply {
        let time = |field: &str, text: Option<String>| {
            timestamp(field, text.as_deref()).map_err(|err| Failed::argument(err.message))
        };
        let request = proto::SearchRequest {
            query: args.query,
            sources: args
                .sources
                .unwrap_or_default()
                .into_iter()
                .map(SourceArg::to_proto)
                .collect(),
            mode: args.mode.map_or(0, ModeArg::to_proto),
            limit: bounded("limit", args.limit, 10)?,
            scope_type: args.scope_type.map_or(0, |t| t.to_proto() as i32),
            scope: args.scope.unwrap_or_default(),
            key_prefix: args.key_prefix.unwrap_or_default(),
            scope_prefix: args.scope_prefix.unwrap_or_default(),
            app: args.app.unwrap_or_default(),
            user: args.user.unwrap_or_default(),
            session_id: args.session_id.unwrap_or_default(),
            agent: args.agent.unwrap_or_default(),
            types: args.types.unwrap_or_default(),
            kind: args.kind.map_or(0, KindArg::to_proto),
            start_time: time("start_time", args.start_time)?,
            end_time: time("end_time", args.end_time)?,
            following_episodes: 0,
        };
        let hits = SearchServiceClient::new(self.conn.clone())
            .search(request)
            .await?
            .into_inner()
            .hits;
        ok(json!({ "hits": hits.iter().map(hit_json).collect::<Vec<_>>() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_bounded() {
        assert_eq!(bounded("limit", None, 20).ok(), Some(20));
        assert_eq!(bounded("limit", Some(100), 20).ok(), Some(100));
        assert!(bounded("limit", Some(101), 20).is_err());
        assert!(bounded("limit", Some(0), 20).is_err());
    }
}
