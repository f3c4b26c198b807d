//! `MemoryAdminService` on both stores: purge and its `keep` rules,
//! purge-scope, dry runs, the audit trail, compaction in each mode, the
//! fence against concurrent writes, summarizer failures, and reindex.

use std::sync::Arc;

use engram::api::convert::json_to_proto;
use engram::context::CallerContext;
use engram::error::{Error, Reason};
use engram::memory::admin::{CompactCommand, MemoryAdmin, Sources};
use engram::memory::{Key, Scope, ScopeName, ScopeType as Type};
use engram::ports::{Database, Store};
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    AsOf, CompactRequest, DeleteRequest, GetCompactionLogRequest, GetRequest, HistoryRequest,
    ListRequest, ListScopesRequest, PurgeRequest, PurgeScopeRequest, ReindexRequest, ScopeType,
    SetRequest, SourceMode, as_of,
};
use engram::summarizer::{Summarizer, SummarizerError, Summary, SummaryRequest};
use futures::future::BoxFuture;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, TestServer, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

fn delete(scope: &str, key: &str) -> DeleteRequest {
    DeleteRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        ..DeleteRequest::default()
    }
}

pub(crate) fn purge(scope: &str, key: &str, keep: Option<i64>, dry_run: bool) -> PurgeRequest {
    PurgeRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        keep,
        dry_run,
    }
}

fn admin(server: &TestServer) -> MemoryAdminServiceClient<Channel> {
    MemoryAdminServiceClient::new(server.channel.clone())
}

async fn versions(server: &TestServer, scope: &str, key: &str) -> Vec<(i64, bool)> {
    let request = HistoryRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        from_version: 0,
    };
    let mut stream = match server.memory().history(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) if status.code() == Code::NotFound => return Vec::new(),
        Err(status) => panic!("history: {status}"),
    };
    let mut out = Vec::new();
    while let Some(item) = stream.message().await.expect("item") {
        let entry = item.entry.expect("entry");
        out.push((entry.version, entry.deleted));
    }
    out
}

async fn log(server: &TestServer, scope: &str) -> Vec<engram::proto::CompactionRecord> {
    admin(server)
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: scope.to_owned(),
            ..GetCompactionLogRequest::default()
        })
        .await
        .expect("log")
        .into_inner()
        .records
}

async fn purge_keeps_the_newest_versions(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    for i in 1..=3 {
        memory.set(set("ns", "k", json!(i))).await.expect("set");
    }
    memory.delete(delete("ns", "k")).await.expect("delete");
    memory.set(set("ns", "k", json!(5))).await.expect("set");
    let mut admin = admin(&server);

    // A dry run reports and changes nothing.
    let dry = admin
        .purge(purge("ns", "k", Some(2), true))
        .await
        .expect("dry run")
        .into_inner();
    assert_eq!(
        (
            dry.versions_deleted,
            dry.keys_affected,
            dry.record.is_none()
        ),
        (3, 1, true)
    );
    assert_eq!(versions(&server, "ns", "k").await.len(), 5);
    assert!(log(&server, "ns").await.is_empty());

    // keep=2: the tombstone counts as one of the two kept.
    let done = admin
        .purge(purge("ns", "k", Some(2), false))
        .await
        .expect("purge")
        .into_inner();
    assert_eq!((done.versions_deleted, done.keys_affected), (3, 1));
    assert_eq!(
        versions(&server, "ns", "k").await,
        vec![(4, true), (5, false)]
    );
    let record = done.record.expect("audit record");
    assert_eq!(record.operation, "purge");
    assert_eq!((record.scope_type, record.scope.as_str()), (NS, "ns"));
    assert_eq!(
        (record.versions_deleted, record.keys_affected, record.keep),
        (3, 1, Some(2))
    );
    assert_eq!(record.source_keys, vec!["k"]);
    assert!(record.audit_key.starts_with("_compaction/"));

    // Nothing to delete: no record.
    let none = admin
        .purge(purge("ns", "k", Some(10), false))
        .await
        .expect("purge")
        .into_inner();
    assert_eq!((none.versions_deleted, none.record.is_none()), (0, true));

    // keep unset: every version, the current one too; the key is gone.
    let all = admin
        .purge(purge("ns", "k", None, false))
        .await
        .expect("purge all")
        .into_inner();
    assert_eq!(all.versions_deleted, 2);
    assert_eq!(all.record.expect("record").keep, None);
    let err = memory
        .get(GetRequest {
            scope_type: NS,
            scope: "ns".to_owned(),
            key: "k".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("gone");
    assert_eq!(reason(&err), "KEY_NOT_FOUND");
    let again = memory
        .set(set("ns", "k", json!("new")))
        .await
        .expect("set")
        .into_inner();
    assert_eq!(
        again.entry.expect("entry").version,
        1,
        "a purged key starts over"
    );

    // Two records, newest first.
    let records = log(&server, "ns").await;
    assert_eq!(
        records.iter().map(|r| r.keep).collect::<Vec<_>>(),
        vec![None, Some(2)]
    );

    let err = admin
        .purge(purge("ns", "_compaction/x", None, false))
        .await
        .expect_err("audit key");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "RESERVED_KEY")
    );
    let err = admin
        .purge(purge("ns", "k", Some(-1), false))
        .await
        .expect_err("negative keep");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = admin
        .purge(PurgeRequest {
            scope_type: ScopeType::Unspecified as i32,
            ..purge("ns", "k", None, false)
        })
        .await
        .expect_err("no scope type");
    assert_eq!(err.code(), Code::InvalidArgument);
}

async fn purge_scope_spares_tombstones_and_the_audit_trail(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    for i in 0..3 {
        memory.set(set("s", "live", json!(i))).await.expect("set");
    }
    memory.set(set("s", "dead", json!(1))).await.expect("set");
    memory.delete(delete("s", "dead")).await.expect("delete");
    memory
        .set(set("other", "live", json!(1)))
        .await
        .expect("set");
    memory
        .set(set("other", "live", json!(2)))
        .await
        .expect("set");
    let mut admin = admin(&server);
    let scope_purge = |keep, include_deleted, dry_run| PurgeScopeRequest {
        scope_type: NS,
        scope: "s".to_owned(),
        keep,
        include_deleted,
        dry_run,
    };

    let dry = admin
        .purge_scope(scope_purge(Some(1), true, true))
        .await
        .expect("dry")
        .into_inner();
    assert_eq!((dry.versions_deleted, dry.keys_affected), (3, 2));
    assert_eq!(versions(&server, "s", "live").await.len(), 3);

    let first = admin
        .purge_scope(scope_purge(Some(1), false, false))
        .await
        .expect("purge")
        .into_inner();
    assert_eq!((first.versions_deleted, first.keys_affected), (2, 1));
    assert_eq!(versions(&server, "s", "live").await, vec![(3, false)]);
    assert_eq!(
        versions(&server, "s", "dead").await.len(),
        2,
        "tombstoned keys need include_deleted"
    );

    let second = admin
        .purge_scope(scope_purge(Some(1), true, false))
        .await
        .expect("purge")
        .into_inner();
    assert_eq!((second.versions_deleted, second.keys_affected), (1, 1));
    assert_eq!(second.record.expect("record").source_keys, vec!["dead"]);
    assert_eq!(versions(&server, "s", "dead").await, vec![(2, true)]);

    // Everything, tombstones included: the audit trail survives.
    let all = admin
        .purge_scope(scope_purge(None, true, false))
        .await
        .expect("purge all")
        .into_inner();
    assert_eq!((all.versions_deleted, all.keys_affected), (2, 2));
    let listed = memory
        .list(ListRequest {
            scope_type: NS,
            scope: "s".to_owned(),
            include_reserved: true,
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert!(
        listed
            .entries
            .iter()
            .all(|e| e.key.starts_with("_compaction/"))
    );
    let records = log(&server, "s").await;
    assert_eq!(records.len(), 3);
    assert_eq!(
        records
            .iter()
            .map(|r| r.versions_deleted)
            .collect::<Vec<_>>(),
        vec![2, 1, 2],
        "newest first"
    );
    // Another scope is untouched.
    assert_eq!(versions(&server, "other", "live").await.len(), 2);

    // Paging through the log.
    let page = admin
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: "s".to_owned(),
            page_size: 2,
            page_token: String::new(),
        })
        .await
        .expect("page")
        .into_inner();
    assert_eq!(page.records.len(), 2);
    let rest = admin
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: "s".to_owned(),
            page_size: 2,
            page_token: page.next_page_token,
        })
        .await
        .expect("page")
        .into_inner();
    assert_eq!((rest.records.len(), rest.next_page_token.as_str()), (1, ""));
    assert_eq!(rest.records[0].audit_key, records[2].audit_key);
}

async fn compact_in_each_mode(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    memory
        .set(set(
            "c",
            "notes",
            json!("The deploy failed on Monday. Lunch was pizza."),
        ))
        .await
        .expect("set");
    memory
        .set(set(
            "c",
            "notes",
            json!("The deploy key expired, so the deploy failed again."),
        ))
        .await
        .expect("set");
    memory
        .set(set(
            "c",
            "decisions",
            json!({"rotate": "deploy key", "owner": "ops"}),
        ))
        .await
        .expect("set");
    let mut admin = admin(&server);

    // CURRENT, one key: the summary becomes the key's next version.
    let current = admin
        .compact(CompactRequest {
            scope_type: NS,
            scope: "c".to_owned(),
            key: "notes".to_owned(),
            ..CompactRequest::default()
        })
        .await
        .expect("compact")
        .into_inner();
    let entry = current.entry.expect("entry");
    assert_eq!((entry.key.as_str(), entry.version), ("notes", 3));
    assert_eq!(
        current
            .sources
            .iter()
            .map(|s| (s.key.as_str(), s.version))
            .collect::<Vec<_>>(),
        vec![("notes", 2)]
    );
    let record = current.record.expect("record");
    assert_eq!(record.operation, "compact");
    assert_eq!(
        (record.target_key.as_str(), record.target_version),
        ("notes", 3)
    );
    assert_eq!(
        (record.source_keys.clone(), record.source_versions.clone()),
        (vec!["notes".to_owned()], vec![2])
    );
    assert_eq!(record.source_mode, SourceMode::Current as i32);
    assert_eq!(record.model, "engram-extractive-v1");

    // HISTORY: every non-deleted version of the key, into another key.
    let history = admin
        .compact(CompactRequest {
            scope_type: NS,
            scope: "c".to_owned(),
            key: "notes".to_owned(),
            source_mode: SourceMode::History as i32,
            target_key: "notes/summary".to_owned(),
            instruction: "what failed".to_owned(),
            max_tokens: 40,
            ..CompactRequest::default()
        })
        .await
        .expect("compact history")
        .into_inner();
    assert_eq!(
        history
            .sources
            .iter()
            .map(|s| s.version)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let summary = history.entry.expect("entry");
    assert_eq!(
        (summary.key.as_str(), summary.version),
        ("notes/summary", 1)
    );
    let text = match summary.value.and_then(|v| v.kind) {
        Some(prost_types::value::Kind::StringValue(text)) => text,
        other => panic!("summary is text, got {other:?}"),
    };
    assert!(text.contains("deploy"), "{text}");
    let record = history.record.expect("record");
    assert_eq!(
        (record.source_mode, record.instruction.as_str()),
        (SourceMode::History as i32, "what failed")
    );

    // Several keys into a target; the sources are untouched.
    let many = admin
        .compact(CompactRequest {
            scope_type: NS,
            scope: "c".to_owned(),
            keys: vec!["notes".to_owned(), "decisions".to_owned()],
            target_key: "digest".to_owned(),
            ..CompactRequest::default()
        })
        .await
        .expect("compact keys")
        .into_inner();
    assert_eq!(many.record.expect("record").source_versions, vec![3, 1]);
    // A value that is not text is read as compact JSON with its keys in
    // order, whatever text the store keeps it as (Postgres's jsonb has
    // its own spacing and order), so both stores summarise the same text.
    let digest = match many.entry.and_then(|e| e.value).and_then(|v| v.kind) {
        Some(prost_types::value::Kind::StringValue(text)) => text,
        other => panic!("the digest is text, got {other:?}"),
    };
    assert!(
        digest.contains(r#"{"owner":"ops","rotate":"deploy key"}"#),
        "{digest}"
    );
    assert_eq!(versions(&server, "c", "decisions").await, vec![(1, false)]);

    // Three compactions, three records, newest first.
    let records = log(&server, "c").await;
    assert_eq!(
        records
            .iter()
            .map(|r| r.target_key.as_str())
            .collect::<Vec<_>>(),
        vec!["digest", "notes/summary", "notes"]
    );

    let bad = |request: CompactRequest| {
        let mut admin = admin.clone();
        async move {
            admin
                .compact(request)
                .await
                .expect_err("invalid compaction")
        }
    };
    let base = CompactRequest {
        scope_type: NS,
        scope: "c".to_owned(),
        ..CompactRequest::default()
    };
    let err = bad(CompactRequest {
        keys: vec!["notes".to_owned()],
        ..base.clone()
    })
    .await;
    assert_eq!(err.code(), Code::InvalidArgument, "keys need a target");
    let err = bad(CompactRequest {
        key: "notes".to_owned(),
        keys: vec!["decisions".to_owned()],
        target_key: "x".to_owned(),
        ..base.clone()
    })
    .await;
    assert_eq!(err.code(), Code::InvalidArgument, "key and keys together");
    let err = bad(CompactRequest {
        keys: vec!["notes".to_owned(), "decisions".to_owned()],
        target_key: "x".to_owned(),
        source_mode: SourceMode::History as i32,
        ..base.clone()
    })
    .await;
    assert_eq!(err.code(), Code::InvalidArgument, "history of several keys");
    let err = bad(CompactRequest {
        key: "notes".to_owned(),
        target_key: "_compaction/x".to_owned(),
        ..base.clone()
    })
    .await;
    assert_eq!(reason(&err), "RESERVED_KEY");
    let err = bad(CompactRequest {
        key: "missing".to_owned(),
        ..base
    })
    .await;
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::NotFound, "KEY_NOT_FOUND")
    );
}

/// A summarizer that waits for the test to let it finish, or fails.
struct Gated {
    started: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
    fail: bool,
}

impl Summarizer for Gated {
    fn summarize(
        &self,
        request: SummaryRequest,
    ) -> BoxFuture<'_, Result<Summary, SummarizerError>> {
        Box::pin(async move {
            self.started.notify_one();
            self.release.notified().await;
            if self.fail {
                return Err(SummarizerError("model overloaded (HTTP 529)".to_owned()));
            }
            Ok(Summary {
                text: format!("{} sources", request.sources.len()),
                model: "gated".to_owned(),
            })
        })
    }
}

async fn fenced_compaction<S: Store>(store: S, fail: bool) -> (Result<(), Error>, S) {
    let scope = Scope {
        scope_type: Type::Namespace,
        name: ScopeName::parse("scope", "fence").expect("scope"),
    };
    let key = Key::parse("key", "notes").expect("key");
    let memory =
        engram::memory::Memory::new(store.clone(), engram::config::Config::defaults().limits);
    let ctx = CallerContext::default();
    let write = || engram::memory::WriteRequest {
        selector: engram::memory::ScopeSelector::explicit(scope.clone()),
        key: key.clone(),
        expected_version: None,
        request_id: None,
    };
    memory
        .set(&ctx, write(), json!("first"))
        .await
        .expect("set");
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let admin = MemoryAdmin::new(
        store.clone(),
        engram::config::Config::defaults().limits,
        Arc::new(Gated {
            started: started.clone(),
            release: release.clone(),
            fail,
        }),
    );
    let command = CompactCommand {
        scope: scope.clone(),
        sources: Sources::One {
            key: key.clone(),
            history: false,
        },
        target_key: Some(Key::parse("key", "summary").expect("key")),
        instruction: String::new(),
        model: String::new(),
        max_tokens: 0,
    };
    let compaction = tokio::spawn({
        let ctx = ctx.clone();
        async move { admin.compact(&ctx, command).await.map(|_| ()) }
    });
    started.notified().await;
    if !fail {
        // A write lands while the summary is being made.
        memory
            .set(&ctx, write(), json!("second"))
            .await
            .expect("concurrent set");
    }
    release.notify_one();
    let result = compaction.await.expect("compaction task");
    (result, store)
}

async fn compaction_is_fenced_and_failures_write_nothing(backend: Backend) {
    let db = crate::helpers::TestDb::new(backend).await;
    let check = |result: Result<(), Error>, want: Reason| match result {
        Err(err) => assert_eq!(err.reason(), want, "{err}"),
        Ok(()) => panic!("expected {want:?}"),
    };
    let (fenced, failed) = match backend {
        Backend::Sqlite => {
            let store = db.sqlite_store().await;
            store.migrate().await.expect("migrate");
            let (fenced, store) = fenced_compaction(store, false).await;
            let (failed, _) = fenced_compaction(store, true).await;
            (fenced, failed)
        }
        Backend::Postgres => {
            let store = db.pg_store().await;
            store.migrate().await.expect("migrate");
            let (fenced, store) = fenced_compaction(store, false).await;
            let (failed, _) = fenced_compaction(store, true).await;
            (fenced, failed)
        }
    };
    check(fenced, Reason::SourceChanged);
    check(failed, Reason::SummarizerUnavailable);
    // Neither wrote a summary or an audit record.
    let server = TestServer::start(db, |_| {}).await;
    let err = server
        .memory()
        .get(GetRequest {
            scope_type: NS,
            scope: "fence".to_owned(),
            key: "summary".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect_err("no summary");
    assert_eq!(reason(&err), "KEY_NOT_FOUND");
    assert!(log(&server, "fence").await.is_empty());
}

async fn reindex_backfills_flow_tags(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let exec = |scope: &str| SetRequest {
        scope_type: ScopeType::Execution as i32,
        ..set(scope, "step", json!(1))
    };
    // Detached writes into executions nobody has described yet.
    server.memory().set(exec("exec-a")).await.expect("set");
    server.memory().set(exec("exec-b")).await.expect("set");
    // exec-a then writes from inside its flow (into a namespace), which
    // tells the server which flow it belongs to.
    let mut in_flow = server.memory_as(&[
        ("engram-execution-id", "exec-a"),
        ("engram-flow-id", "flow-1"),
        ("engram-flow-name", "research"),
    ]);
    in_flow
        .set(set("shared", "k", json!(1)))
        .await
        .expect("in-flow set");
    // A detached write into a known execution is tagged at once.
    let tagged = server
        .memory()
        .set(exec("exec-a"))
        .await
        .expect("set")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(
        (tagged.flow_id.as_str(), tagged.flow_name.as_str()),
        ("flow-1", "research")
    );

    let mut admin = admin(&server);
    let dry = admin
        .reindex(ReindexRequest { apply: false })
        .await
        .expect("dry")
        .into_inner();
    assert_eq!(
        (dry.versions_scanned, dry.tags_added, dry.applied),
        (2, 1, false)
    );
    assert_eq!(dry.issues.len(), 1);
    assert!(dry.issues[0].contains("exec-b"), "{:?}", dry.issues);
    let history = versions_tags(&server, "exec-a").await;
    assert_eq!(
        history,
        vec![String::new(), "research".to_owned()],
        "a dry run changes nothing"
    );

    let applied = admin
        .reindex(ReindexRequest { apply: true })
        .await
        .expect("apply")
        .into_inner();
    assert_eq!((applied.tags_added, applied.applied), (1, true));
    assert_eq!(
        versions_tags(&server, "exec-a").await,
        vec!["research".to_owned(), "research".to_owned()]
    );
    let again = admin
        .reindex(ReindexRequest { apply: true })
        .await
        .expect("again")
        .into_inner();
    assert_eq!(
        (again.versions_scanned, again.tags_added),
        (1, 0),
        "idempotent; exec-b stays unknown"
    );

    // ListScopes can now find every execution scope of the flow, now and
    // at a point (which reads the scopes another way).
    let now = Some(AsOf {
        point: Some(as_of::Point::Time(std::time::SystemTime::now().into())),
    });
    for as_of in [None, now] {
        for request in [
            ListScopesRequest {
                flow_name: "research".to_owned(),
                as_of,
                ..ListScopesRequest::default()
            },
            ListScopesRequest {
                scope_type: ScopeType::Execution as i32,
                flow_id: "flow-1".to_owned(),
                as_of,
                ..ListScopesRequest::default()
            },
        ] {
            let scopes = server
                .memory()
                .list_scopes(request)
                .await
                .expect("scopes")
                .into_inner();
            assert_eq!(
                scopes
                    .scopes
                    .iter()
                    .map(|s| s.scope.as_str())
                    .collect::<Vec<_>>(),
                vec!["exec-a"]
            );
        }
    }
    let none = server
        .memory()
        .list_scopes(ListScopesRequest {
            flow_name: "other".to_owned(),
            ..ListScopesRequest::default()
        })
        .await
        .expect("scopes")
        .into_inner();
    assert!(none.scopes.is_empty());
}

async fn versions_tags(server: &TestServer, execution: &str) -> Vec<String> {
    let mut stream = server
        .memory()
        .history(HistoryRequest {
            scope_type: ScopeType::Execution as i32,
            scope: execution.to_owned(),
            key: "step".to_owned(),
            from_version: 0,
        })
        .await
        .expect("history")
        .into_inner();
    let mut tags = Vec::new();
    while let Some(item) = stream.message().await.expect("item") {
        tags.push(item.entry.expect("entry").flow_name);
    }
    tags
}

/// A compaction reads at most about 2 MiB of sources: the summarizer gets
/// them in one request and the answer carries them back in one message.
/// Past that it is refused before anything is written; within it, large
/// sources are summarised and returned.
async fn compaction_sources_are_bounded(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    let big = |n: usize| json!(format!("note {n}: {}", "word ".repeat(120 * 1024)));
    for n in 0..5 {
        memory.set(set("big", "notes", big(n))).await.expect("set");
    }
    memory.set(set("big", "other", big(9))).await.expect("set");
    let mut admin = admin(&server);
    let history = CompactRequest {
        scope_type: NS,
        scope: "big".to_owned(),
        key: "notes".to_owned(),
        source_mode: SourceMode::History as i32,
        target_key: "notes/summary".to_owned(),
        ..CompactRequest::default()
    };
    let err = admin
        .compact(history)
        .await
        .expect_err("five versions of 600 KiB");
    assert_eq!(
        (err.code(), crate::helpers::reason(&err)),
        (Code::FailedPrecondition, "SOURCES_TOO_LARGE".to_owned())
    );
    assert!(
        err.message().contains("more than 2 MiB"),
        "{}",
        err.message()
    );
    assert!(log(&server, "big").await.is_empty(), "nothing was written");

    let two = admin
        .compact(CompactRequest {
            scope_type: NS,
            scope: "big".to_owned(),
            keys: vec!["notes".to_owned(), "other".to_owned()],
            target_key: "digest".to_owned(),
            ..CompactRequest::default()
        })
        .await
        .expect("two values of 600 KiB")
        .into_inner();
    assert_eq!(
        two.sources
            .iter()
            .map(|e| (e.key.as_str(), e.version))
            .collect::<Vec<_>>(),
        [("notes", 5), ("other", 1)]
    );
}

on_both_stores!(
    compaction_sources_are_bounded,
    purge_keeps_the_newest_versions,
    purge_scope_spares_tombstones_and_the_audit_trail,
    compact_in_each_mode,
    compaction_is_fenced_and_failures_write_nothing,
    reindex_backfills_flow_tags,
);
