//! Imports raced: by other imports of the same file, and by writes of the
//! records a file holds. An import is applied whole or refused whole, and
//! a refusal says why (the record differs, or it was written while the
//! import ran), never an internal error.

use std::collections::HashMap;

use engram::api::convert::json_to_proto;
use engram::proto::{CreateSessionRequest, ExportRequest, GetRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use crate::helpers::{Backend, LOCK_WAITS, TestServer, holding, reason, release, until_reads};
use crate::on_both_stores;
use crate::transfer::{export, header, import, records, seed, session_line};

/// Six imports of one export at once into an empty tenant end as they
/// would one after another: each succeeds, every record is imported by
/// exactly one of them and found in place by the others, and the tenant
/// exports as the source did.
async fn imports_of_one_file_at_once(backend: Backend) {
    let source = TestServer::spawn(backend).await;
    seed(&source).await;
    let lines = export(&source.channel, ExportRequest::default()).await;
    let mut in_file: HashMap<String, i64> = HashMap::new();
    for record in records(&lines) {
        let kind = record["kind"].as_str().expect("kind").to_owned();
        *in_file.entry(kind).or_default() += 1;
    }

    let target = TestServer::spawn(backend).await;
    let imports: Vec<_> = (0..6)
        .map(|_| {
            let channel = target.channel.clone();
            let lines = lines.clone();
            tokio::spawn(async move { import(&channel, &lines).await })
        })
        .collect();
    let mut imported: HashMap<String, i64> = HashMap::new();
    for task in imports {
        let response = task.await.expect("import task").expect("import");
        for (kind, n) in &response.imported {
            *imported.entry(kind.clone()).or_default() += n;
        }
        for (kind, total) in &in_file {
            let this = response.imported.get(kind).copied().unwrap_or(0)
                + response.unchanged.get(kind).copied().unwrap_or(0);
            assert_eq!(this, *total, "every {kind} read once per import");
        }
    }
    assert_eq!(imported, in_file, "each record imported once in all");
    assert_eq!(
        records(&export(&target.channel, ExportRequest::default()).await),
        records(&lines)
    );
}

/// An import of sessions races `CreateSession`s of the same ids, made one
/// after another from the file's end, with other creation times: they
/// meet in the middle. The import either stores all its sessions or is
/// refused whole, because one differs (`ALREADY_EXISTS`,
/// `IMPORT_CONFLICT`) or was made between the import's read of it and its
/// write (`ABORTED`, `SOURCE_CHANGED`; on Postgres that was an `INTERNAL`
/// duplicate key).
async fn an_import_racing_writes_of_its_records(backend: Backend) {
    const ROUNDS: usize = 10;
    const SESSIONS: usize = 300;
    let server = TestServer::spawn(backend).await;
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for round in 0..ROUNDS {
        let ids: Vec<String> = (0..SESSIONS).map(|i| format!("r{round}-{i}")).collect();
        let mut lines = vec![header(2)];
        lines.extend(ids.iter().map(|id| session_line(id)));
        let channel = server.channel.clone();
        let imported = tokio::spawn(async move { import(&channel, &lines).await });
        let mut sessions = server.sessions();
        let mut created = 0;
        for id in ids.iter().rev() {
            let made = sessions
                .create_session(CreateSessionRequest {
                    session_id: id.clone(),
                    app: "app".into(),
                    user: "alice".into(),
                    ..CreateSessionRequest::default()
                })
                .await;
            match made {
                Ok(_) => created += 1,
                Err(err) => assert_eq!(err.code(), Code::AlreadyExists, "{err:?}"),
            }
        }
        let outcome = match imported.await.expect("import task") {
            Ok(response) => {
                assert_eq!(created, 0, "the import made every session first");
                assert_eq!(response.imported.get("session"), Some(&(SESSIONS as i64)));
                "imported".to_owned()
            }
            Err(err) => {
                let why = (err.code(), reason(&err));
                assert!(
                    why == (Code::AlreadyExists, "IMPORT_CONFLICT".to_owned())
                        || why == (Code::Aborted, "SOURCE_CHANGED".to_owned()),
                    "{err:?}"
                );
                assert_eq!(created, SESSIONS, "refused whole: {err:?}");
                reason(&err)
            }
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    // Which outcomes come is the scheduler's; that each is one of these
    // is the claim.
    assert_eq!(outcomes.values().sum::<usize>(), ROUNDS, "{outcomes:?}");
}

on_both_stores!(
    imports_of_one_file_at_once,
    an_import_racing_writes_of_its_records,
);

/// Version 2 of `key` in namespace `i`, as a file's line.
fn memory_line(key: &str) -> String {
    json!({"kind": "memory_version", "scope_type": "namespace", "scope": "i", "key": key,
           "version": 2, "value": "imported", "deleted": false,
           "create_time": "2026-11-23T10:00:00Z"})
    .to_string()
}

/// Writers take memory heads in key order, and so does an import of an
/// export, whose memory lines are in key order; a file in another order
/// takes them in its own. Here the import has moved `e` and waits for
/// `a`, which the test's own transaction holds (as a group of sets would)
/// before it goes on to `e`. Postgres breaks the deadlock by failing the
/// import, which used to answer `INTERNAL`; it is refused as raced
/// (`ABORTED`, `SOURCE_CHANGED`: import again), with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_deadlocked_by_a_writer_is_refused_as_raced() {
    let server = TestServer::spawn(Backend::Postgres).await;
    for key in ["a", "e"] {
        server
            .memory()
            .set(SetRequest {
                scope_type: ScopeType::Namespace as i32,
                scope: "i".into(),
                key: key.into(),
                value: Some(json_to_proto(&json!("stored"))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
    let lines = vec![header(2), memory_line("e"), memory_line("a")];
    let mut db = server.db_connection("the test").await;
    let mut writer = holding(
        &server.db.url,
        "SELECT 1 FROM memory_heads WHERE key = 'a' FOR NO KEY UPDATE",
    )
    .await;
    // The writer looks for a deadlock long after the import does, so the
    // import is the one Postgres fails.
    sqlx::query("SET deadlock_timeout = '60s'")
        .execute(&mut writer)
        .await
        .expect("set the writer's deadlock_timeout");
    let channel = server.channel.clone();
    let importing = tokio::spawn(async move { import(&channel, &lines).await });
    until_reads(&mut db, LOCK_WAITS, 1, "the import waits for a").await;
    sqlx::query("UPDATE memory_heads SET update_time = update_time WHERE key = 'e'")
        .execute(&mut writer)
        .await
        .expect("the writer takes e once the import is refused");
    release(writer, "ROLLBACK").await;
    let err = importing
        .await
        .expect("the import's task")
        .expect_err("the import is refused");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::Aborted, "SOURCE_CHANGED".to_owned()),
        "{err:?}"
    );
    for key in ["a", "e"] {
        let entry = server
            .memory()
            .get(GetRequest {
                scope_type: ScopeType::Namespace as i32,
                scope: "i".into(),
                key: key.into(),
                version: 0,
                as_of: None,
            })
            .await
            .expect("get")
            .into_inner()
            .entry
            .expect("an entry");
        assert_eq!(entry.version, 1, "{key} as it was");
    }
}
