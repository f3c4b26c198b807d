//! Retention declared per scope, on both stores: a preview stores nothing,
//! each rule (keep the newest N, drop what is older than an age but a key's
//! newest, drop deleted keys past a grace) deletes what it says and nothing
//! else, the audit trail records each run and is never touched, and the
//! server's own scheduler applies a declared policy.

use engram::api::convert::json_to_proto;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{
    ApplyRetentionRequest, ChangeKind, DeleteRequest, GetCompactionLogRequest, GetRetentionRequest,
    HistoryRequest, RetentionPolicy, ScopeType, SetRequest, SetRetentionRequest, WatchRequest,
};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;

async fn write(client: &mut MemoryServiceClient<Channel>, scope: &str, key: &str, n: usize) {
    for i in 0..n {
        client
            .set(SetRequest {
                scope_type: NS,
                scope: scope.into(),
                key: key.into(),
                value: Some(json_to_proto(&json!(i))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
}

async fn versions(client: &mut MemoryServiceClient<Channel>, scope: &str, key: &str) -> Vec<i64> {
    let stream = client
        .history(HistoryRequest {
            scope_type: NS,
            scope: scope.into(),
            key: key.into(),
            from_version: 0,
        })
        .await;
    let Ok(stream) = stream else {
        return Vec::new();
    };
    stream
        .into_inner()
        .map(|item| item.expect("version").entry.expect("entry").version)
        .collect()
        .await
}

fn policy(keep: Option<i64>, max_age_nanos: i32, grace_nanos: i32) -> RetentionPolicy {
    let nanos = |n: i32| {
        (n > 0).then_some(prost_types::Duration {
            seconds: 0,
            nanos: n,
        })
    };
    RetentionPolicy {
        keep_versions: keep,
        max_age: nanos(max_age_nanos),
        tombstone_grace: nanos(grace_nanos),
    }
}

fn set_policy(scope: &str, policy: RetentionPolicy, dry_run: bool) -> SetRetentionRequest {
    SetRetentionRequest {
        scope_type: NS,
        scope: scope.into(),
        policy: Some(policy),
        dry_run,
    }
}

fn apply(scope: &str, dry_run: bool) -> ApplyRetentionRequest {
    ApplyRetentionRequest {
        scope_type: NS,
        scope: scope.into(),
        dry_run,
    }
}

async fn each_rule_deletes_what_it_says(backend: Backend) {
    // The scheduler stays off: this test applies policies itself.
    let server = TestServer::spawn_with(backend, |s| s.retention_interval_secs = Some(0)).await;
    let mut client = server.memory();
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    write(&mut client, "ret", "a", 4).await;
    write(&mut client, "ret", "b", 2).await;
    client
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "ret".into(),
            key: "b".into(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete b");

    // Nothing declared yet.
    let err = admin
        .get_retention(GetRetentionRequest {
            scope_type: NS,
            scope: "ret".into(),
        })
        .await
        .expect_err("no policy");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::NotFound, "RETENTION_NOT_FOUND".into())
    );
    let err = admin
        .set_retention(set_policy("ret", policy(Some(0), 0, 0), false))
        .await
        .expect_err("keep 0");
    assert_eq!(bad_fields(&err), ["policy.keep_versions"]);
    let mut forever = policy(None, 0, 0);
    forever.max_age = Some(prost_types::Duration {
        seconds: i64::MAX / 2,
        nanos: 0,
    });
    let err = admin
        .set_retention(set_policy("ret", forever, false))
        .await
        .expect_err("too old to mean anything");
    assert_eq!(bad_fields(&err), ["policy.max_age"]);

    // A preview stores nothing and deletes nothing.
    let preview = admin
        .set_retention(set_policy("ret", policy(Some(2), 0, 0), true))
        .await
        .expect("preview")
        .into_inner();
    assert_eq!((preview.versions_to_delete, preview.keys_to_affect), (3, 2));
    assert!(preview.retention.is_none());
    assert_eq!(versions(&mut client, "ret", "a").await, [1, 2, 3, 4]);

    // Keep the newest two versions of each key (tombstones count).
    let declared = admin
        .set_retention(set_policy("ret", policy(Some(2), 0, 0), false))
        .await
        .expect("declare")
        .into_inner()
        .retention
        .expect("retention");
    assert_eq!(
        declared.policy.as_ref().and_then(|p| p.keep_versions),
        Some(2)
    );
    let dry = admin
        .apply_retention(apply("ret", true))
        .await
        .expect("dry run")
        .into_inner();
    assert_eq!((dry.versions_deleted, dry.keys_affected), (3, 2));
    assert!(dry.record.is_none());
    let done = admin
        .apply_retention(apply("ret", false))
        .await
        .expect("apply")
        .into_inner();
    assert_eq!((done.versions_deleted, done.keys_affected), (3, 2));
    let record = done.record.expect("audited");
    assert_eq!(
        (record.operation.as_str(), record.keep),
        ("retention", Some(2))
    );
    assert_eq!(versions(&mut client, "ret", "a").await, [3, 4]);
    assert_eq!(versions(&mut client, "ret", "b").await, [2, 3]);
    let ran = admin
        .get_retention(GetRetentionRequest {
            scope_type: NS,
            scope: "ret".into(),
        })
        .await
        .expect("get")
        .into_inner()
        .retention
        .expect("retention");
    assert_eq!(ran.last_versions_deleted, 3);
    assert!(ran.last_run_time.is_some());

    // Older than an age: every version but each key's newest.
    admin
        .set_retention(set_policy("ret", policy(None, 1_000, 0), false))
        .await
        .expect("max age");
    admin
        .apply_retention(apply("ret", false))
        .await
        .expect("apply");
    assert_eq!(versions(&mut client, "ret", "a").await, [4]);
    assert_eq!(
        versions(&mut client, "ret", "b").await,
        [3],
        "the tombstone stays"
    );

    // A deleted key past its grace goes entirely; a live one stays.
    admin
        .set_retention(set_policy("ret", policy(None, 0, 1_000), false))
        .await
        .expect("grace");
    let done = admin
        .apply_retention(apply("ret", false))
        .await
        .expect("apply")
        .into_inner();
    assert_eq!((done.versions_deleted, done.keys_affected), (1, 1));
    assert!(versions(&mut client, "ret", "b").await.is_empty());
    assert_eq!(versions(&mut client, "ret", "a").await, [4]);

    // The audit trail is never purged: three runs, three records.
    let log = admin
        .get_compaction_log(GetCompactionLogRequest {
            scope_type: NS,
            scope: "ret".into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await
        .expect("log")
        .into_inner()
        .records;
    let operations: Vec<&str> = log.iter().map(|r| r.operation.as_str()).collect();
    assert_eq!(operations, ["retention", "retention", "retention"]);

    // A policy with no rule removes the declaration.
    let removed = admin
        .set_retention(set_policy("ret", policy(None, 0, 0), false))
        .await
        .expect("remove")
        .into_inner();
    assert!(removed.retention.is_none());
    let err = admin
        .apply_retention(apply("ret", false))
        .await
        .expect_err("gone");
    assert_eq!(reason(&err), "RETENTION_NOT_FOUND");
}

/// The server applies a declared policy on its own.
async fn the_scheduler_applies_policies(backend: Backend) {
    let server = TestServer::spawn_with(backend, |s| s.retention_interval_secs = Some(1)).await;
    let mut client = server.memory();
    write(&mut client, "sched", "k", 3).await;
    let mut changes = client
        .watch(WatchRequest {
            scope_type: NS,
            scope: "sched".into(),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    MemoryAdminServiceClient::new(server.channel.clone())
        .set_retention(set_policy("sched", policy(Some(1), 0, 0), false))
        .await
        .expect("declare");
    // The run shows in the change feed: the purge, then its audit record.
    let purge = changes.next().await.expect("a change").expect("ok");
    assert_eq!(
        (purge.kind, purge.key.as_str(), purge.versions_deleted),
        (ChangeKind::Purge as i32, "k", 2)
    );
    assert_eq!(versions(&mut client, "sched", "k").await, [3]);
}

on_both_stores!(
    each_rule_deletes_what_it_says,
    the_scheduler_applies_policies
);
