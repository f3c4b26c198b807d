//! Memory's maintenance racing its writers, on both stores: sets, deletes,
//! rollbacks, compactions, purges that keep none or one version, and
//! forgets of the user whose runs hold some of the keys. No call may fail
//! internally; afterwards the scope's change feed must replay to what
//! `List` shows, with dense versions, and a read at each past revision
//! must answer what the replay held then (or that it was purged since).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use engram::api::convert::json_to_proto;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::{
    AsOf, ChangeKind, CompactRequest, CreateSessionRequest, DeleteRequest, ForgetUserRequest,
    GetRequest, ListRequest, PurgeRequest, PurgeScopeRequest, RollbackRequest, ScopeType,
    SetRequest, WatchRequest, WatchResponse, as_of,
};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::helpers::{Backend, TestServer, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;
const RUN: i32 = ScopeType::Execution as i32;
const SCOPE: &str = "m";
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const RUNS: [&str; 2] = ["s0", "s1"];
const SENTINEL: &str = "sentinel";

/// A key's state in the replay: version, value, deleted.
type State = BTreeMap<String, (i64, Option<prost_types::Value>, bool)>;

/// The failures no race excuses.
#[derive(Clone, Default)]
struct Failures(Arc<Mutex<Vec<String>>>);

impl Failures {
    fn check<T>(&self, what: &str, result: Result<T, tonic::Status>) {
        if let Err(status) = result
            && matches!(status.code(), Code::Internal | Code::Unknown)
        {
            let mut failures = self.0.lock().expect("failures");
            failures.push(format!("{what}: {status:?}"));
        }
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().expect("failures").clone()
    }
}

/// The scope a call goes to: mostly the namespace, every third a run's.
fn scope(i: usize) -> (i32, String) {
    if i.is_multiple_of(3) {
        (RUN, RUNS[i % 2].to_owned())
    } else {
        (NS, SCOPE.to_owned())
    }
}

async fn make_runs(server: &TestServer) {
    for id in RUNS {
        // Made again after each forget; ALREADY_EXISTS is fine.
        let _ = server
            .sessions()
            .create_session(CreateSessionRequest {
                session_id: id.into(),
                app: "app".into(),
                user: "alice".into(),
                metadata: None,
                request_id: String::new(),
            })
            .await;
    }
}

async fn writer(server: Arc<TestServer>, failures: Failures, w: usize) {
    let mut memory = server.memory();
    for i in 0..60 {
        let (scope_type, scope) = scope(i + w);
        let key = KEYS[(i * 7 + w) % KEYS.len()].to_owned();
        if (i + w).is_multiple_of(4) {
            let deleted = memory
                .delete(DeleteRequest {
                    scope_type,
                    scope,
                    key,
                    ..DeleteRequest::default()
                })
                .await;
            failures.check("delete", deleted);
        } else {
            let set = memory
                .set(SetRequest {
                    scope_type,
                    scope,
                    key,
                    value: Some(json_to_proto(&json!(format!("w{w}.{i}")))),
                    ..SetRequest::default()
                })
                .await;
            failures.check("set", set);
        }
    }
}

async fn maintainer(server: Arc<TestServer>, failures: Failures, m: usize) {
    let mut admin = MemoryAdminServiceClient::new(server.channel.clone());
    let mut memory = server.memory();
    for i in 0..30 {
        let (scope_type, scope) = scope(i + m);
        let key = KEYS[(i * 3 + m) % KEYS.len()].to_owned();
        let keep = (i % 2) as i64;
        match (i + m) % 5 {
            0 | 1 => {
                let purged = admin
                    .purge(PurgeRequest {
                        scope_type,
                        scope,
                        key,
                        keep: Some(keep),
                        dry_run: false,
                    })
                    .await;
                failures.check("purge", purged);
            }
            2 => {
                let purged = admin
                    .purge_scope(PurgeScopeRequest {
                        scope_type,
                        scope,
                        keep: Some(keep),
                        include_deleted: i.is_multiple_of(3),
                        dry_run: false,
                    })
                    .await;
                failures.check("purge scope", purged);
            }
            3 => {
                let rolled = memory
                    .rollback(RollbackRequest {
                        scope_type,
                        scope,
                        key,
                        to_version: 1,
                    })
                    .await;
                failures.check("rollback", rolled);
            }
            _ => {
                let compacted = admin
                    .compact(CompactRequest {
                        scope_type,
                        scope,
                        key,
                        ..CompactRequest::default()
                    })
                    .await;
                failures.check("compact", compacted);
            }
        }
    }
}

async fn forgetter(server: Arc<TestServer>, failures: Failures) {
    let mut data = DataServiceClient::new(server.channel.clone());
    for _ in 0..8 {
        let forgot = data
            .forget_user(ForgetUserRequest {
                app: "app".into(),
                user: "alice".into(),
                ..ForgetUserRequest::default()
            })
            .await;
        failures.check("forget", forgot);
        make_runs(&server).await;
    }
}

/// The scope's changes up to the sentinel's.
async fn feed(server: &TestServer) -> Vec<WatchResponse> {
    let mut stream = server
        .memory()
        .watch(WatchRequest {
            scope_type: NS,
            scope: SCOPE.into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let mut changes = Vec::new();
    loop {
        let change = stream.next().await.expect("a change").expect("ok");
        if change.key == SENTINEL {
            return changes;
        }
        changes.push(change);
    }
}

/// Replays the changes, checking revisions and versions on the way; the
/// state after each change.
fn replay(changes: &[WatchResponse]) -> Vec<(i64, State)> {
    let mut state = State::new();
    // The version a purge took a key to its head at: a set that moved the
    // head meanwhile goes on from it.
    let mut emptied_at: BTreeMap<String, i64> = BTreeMap::new();
    let mut last = 0;
    let mut after = Vec::with_capacity(changes.len());
    for change in changes {
        assert!(change.revision > last, "revisions in order: {changes:?}");
        last = change.revision;
        let key = change.key.clone();
        if !key.starts_with("_compaction/") {
            let current = state.get(&key).map(|s| s.0);
            let kind = ChangeKind::try_from(change.kind).expect("a kind");
            match kind {
                ChangeKind::Set | ChangeKind::Delete | ChangeKind::Compact => {
                    let dense = match current {
                        Some(v) => change.version == v + 1,
                        None => {
                            change.version == 1
                                || emptied_at.get(&key).map(|v| v + 1) == Some(change.version)
                        }
                    };
                    assert!(dense, "{key} went on at version {}", change.version);
                    let deleted = kind == ChangeKind::Delete;
                    let value = if deleted { None } else { change.value.clone() };
                    state.insert(key, (change.version, value, deleted));
                }
                ChangeKind::Purge if current == Some(change.version) => {
                    state.remove(&key);
                    emptied_at.insert(key, change.version);
                }
                _ => {}
            }
        }
        after.push((change.revision, state.clone()));
    }
    after
}

async fn maintenance_races_its_writers(backend: Backend) {
    let server = Arc::new(TestServer::spawn(backend).await);
    make_runs(&server).await;
    let failures = Failures::default();
    let mut tasks = Vec::new();
    for w in 0..4 {
        tasks.push(tokio::spawn(writer(server.clone(), failures.clone(), w)));
    }
    for m in 0..2 {
        tasks.push(tokio::spawn(maintainer(
            server.clone(),
            failures.clone(),
            m,
        )));
    }
    tasks.push(tokio::spawn(forgetter(server.clone(), failures.clone())));
    for task in tasks {
        task.await.expect("a racer");
    }
    assert_eq!(failures.all(), Vec::<String>::new());

    server
        .memory()
        .set(SetRequest {
            scope_type: NS,
            scope: SCOPE.into(),
            key: SENTINEL.into(),
            value: Some(json_to_proto(&json!("done"))),
            ..SetRequest::default()
        })
        .await
        .expect("the sentinel");
    let changes = feed(&server).await;
    let states = replay(&changes);
    let (_, last) = states.last().expect("changes");
    let listed: State = server
        .memory()
        .list(ListRequest {
            scope_type: NS,
            scope: SCOPE.into(),
            page_size: 100,
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .entries
        .into_iter()
        .filter(|e| e.key != SENTINEL)
        .map(|e| (e.key, (e.version, e.value, false)))
        .collect();
    let live: State = last
        .iter()
        .filter(|(_, (_, _, deleted))| !deleted)
        .map(|(k, s)| (k.clone(), s.clone()))
        .collect();
    assert_eq!(listed, live, "the feed replays to the scope");

    let mut memory = server.memory();
    for (revision, state) in states.iter().step_by(3) {
        for key in KEYS {
            let read = memory
                .get(GetRequest {
                    scope_type: NS,
                    scope: SCOPE.into(),
                    key: key.into(),
                    version: 0,
                    as_of: Some(AsOf {
                        point: Some(as_of::Point::Revision(*revision)),
                    }),
                })
                .await;
            let then = state.get(key);
            match read {
                Ok(found) => {
                    let entry = found.into_inner().entry.expect("an entry");
                    assert_eq!(
                        then,
                        Some(&(entry.version, entry.value, false)),
                        "{key} at revision {revision}"
                    );
                }
                Err(status) => {
                    let why = reason(&status);
                    let fits = match why.as_str() {
                        "VERSION_PURGED" => true,
                        "KEY_DELETED" => matches!(then, Some((_, _, true))),
                        "KEY_NOT_FOUND" => then.is_none(),
                        _ => false,
                    };
                    assert!(
                        fits,
                        "{key} at revision {revision}: {why}, the replay held {then:?}"
                    );
                }
            }
        }
    }
}

on_both_stores!(maintenance_races_its_writers);
