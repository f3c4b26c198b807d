//! `DataService.Export` and `Import`: a data set with every kind of record
//! goes from one store to the other and back with identical exports (but
//! for the header); importing a file again changes nothing; a malformed
//! line, a conflict or a stream broken halfway imports nothing; imports
//! go into the importer's tenant and need an admin; a selection exports
//! only what it names.

use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::auth::hash_token;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AppendEpisodeRequest, CacheContentRequest, CreateRuleRequest, CreateSessionRequest,
    CreateTaskRequest, DeleteRequest, EndSessionRequest, ExportRequest, GetRequest,
    GetSessionRequest, ImportRequest, ImportResponse, PurgeRequest, RememberRequest,
    RunRuleRequest, ScopeType, SetGoalRequest, SetRequest, TailEpisodesRequest, WatchRequest,
};
use serde_json::{Value, json};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::consolidation::{episode, rule};
use crate::helpers::{Backend, Metadata, TestServer, bad_fields, reason};
use crate::on_both_stores;

const NAMESPACE: i32 = ScopeType::Namespace as i32;
const EXECUTION: i32 = ScopeType::Execution as i32;

/// Writes a data set with every kind of record an export holds.
pub(crate) async fn seed(server: &TestServer) {
    let mut memory = server.memory();
    let set = |key: &str, value: Value| SetRequest {
        scope_type: NAMESPACE,
        scope: "team".into(),
        key: key.into(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    };
    for (key, value) in [
        ("style", json!({"tone": "dry", "max": 1.5})),
        ("style", json!({"tone": "warm", "tags": ["a", "b"]})),
        ("deploy", json!("blue/green on src/auth/validate.ts")),
        ("deploy", json!(null)),
        ("deploy", json!(42)),
    ] {
        memory.set(set(key, value)).await.expect("set");
    }
    memory
        .delete(DeleteRequest {
            scope_type: NAMESPACE,
            scope: "team".into(),
            key: "style".into(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    // Versions 1 of each key go, and the purge leaves an audit record.
    MemoryAdminServiceClient::new(server.channel.clone())
        .purge(PurgeRequest {
            scope_type: NAMESPACE,
            scope: "team".into(),
            key: "deploy".into(),
            keep: Some(2),
            dry_run: false,
        })
        .await
        .expect("purge");
    server
        .memory_as(&[
            ("engram-execution-id", "run-1"),
            ("engram-flow-id", "flow-a"),
            ("engram-flow-name", "nightly"),
        ])
        .set(SetRequest {
            scope_type: EXECUTION,
            scope: "run-1".into(),
            key: "plan".into(),
            value: Some(json_to_proto(&json!({"step": 1}))),
            ..SetRequest::default()
        })
        .await
        .expect("set in a run");

    let mut episodes = server.episodes();
    for (session, user, id, text) in [
        ("s1", "alice", "e1", "alice deploys on fridays"),
        ("s1", "alice", "e2", "alice prefers dry humour"),
        ("s2", "bob", "e3", "bob reviews the plan"),
    ] {
        let mut new = episode(id, "observation", json!({"learn": true}));
        new.content = Some(json_to_proto(&json!({"text": text})));
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: session.into(),
                app: "bot".into(),
                user: user.into(),
                episode: Some(new),
                require_session: false,
            })
            .await
            .expect("append");
    }
    server
        .sessions()
        .end_session(EndSessionRequest {
            session_id: "s2".into(),
            ..EndSessionRequest::default()
        })
        .await
        .expect("end");

    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    working
        .set_goal(SetGoalRequest {
            session_id: "s1".into(),
            goal: "ship the release".into(),
            ..SetGoalRequest::default()
        })
        .await
        .expect("goal");
    working
        .create_task(CreateTaskRequest {
            session_id: "s1".into(),
            subject: "write notes".into(),
            ..CreateTaskRequest::default()
        })
        .await
        .expect("task");
    working
        .cache_content(CacheContentRequest {
            session_id: "s1".into(),
            path: "notes.md".into(),
            content: "# notes\nship it".into(),
            ..CacheContentRequest::default()
        })
        .await
        .expect("cache");
    working
        .remember(RememberRequest {
            session_id: "s1".into(),
            content: "alice prefers dry humour".into(),
            ..RememberRequest::default()
        })
        .await
        .expect("remember");

    let mut rules = ConsolidationServiceClient::new(server.channel.clone());
    rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("learn", "metadata.learn:*", true)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect("rule");
    rules
        .run_rule(RunRuleRequest {
            rule_id: "learn".into(),
            dry_run: false,
            max_episodes: 0,
        })
        .await
        .expect("run");
}

pub(crate) async fn export(channel: &Channel, request: ExportRequest) -> Vec<String> {
    let mut stream = DataServiceClient::new(channel.clone())
        .export(request)
        .await
        .expect("export")
        .into_inner();
    let mut lines = Vec::new();
    while let Some(chunk) = stream.next().await {
        lines.extend(chunk.expect("chunk").lines);
    }
    lines
}

/// The records of an export, without the header (which names the tenant
/// and the time) and the end line (checked to count the lines before it).
pub(crate) fn records(lines: &[String]) -> Vec<Value> {
    let header: Value = serde_json::from_str(&lines[0]).expect("header");
    assert_eq!(header["kind"], "header");
    assert_eq!(header["format"], "engram.export");
    assert_eq!(header["version"], 4);
    let (end, lines) = lines.split_last().expect("an end line");
    let end: Value = serde_json::from_str(end).expect("end");
    assert_eq!(end, json!({"kind": "end", "lines": lines.len()}));
    lines[1..]
        .iter()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

type Authed = InterceptedService<Channel, Metadata>;

pub(crate) async fn import(
    channel: &Channel,
    lines: &[String],
) -> Result<ImportResponse, tonic::Status> {
    let client = DataServiceClient::with_interceptor(channel.clone(), Metadata::new(&[]));
    import_with(client, lines).await
}

async fn import_with(
    mut client: DataServiceClient<Authed>,
    lines: &[String],
) -> Result<ImportResponse, tonic::Status> {
    // Several messages, so staging runs more than once.
    let chunks: Vec<ImportRequest> = lines
        .chunks(4)
        .map(|chunk| ImportRequest {
            lines: chunk.to_vec(),
        })
        .collect();
    client
        .import(tokio_stream::iter(chunks))
        .await
        .map(|r| r.into_inner())
}

fn kinds(records: &[Value]) -> Vec<&str> {
    let mut kinds: Vec<&str> = records.iter().filter_map(|r| r["kind"].as_str()).collect();
    kinds.dedup();
    kinds
}

fn the_other(backend: Backend) -> Backend {
    match backend {
        Backend::Sqlite => Backend::Postgres,
        Backend::Postgres => Backend::Sqlite,
    }
}

/// From this store to the other and back: every export equal.
async fn round_trip_across_stores(backend: Backend) {
    let source = TestServer::spawn(backend).await;
    seed(&source).await;
    let original = export(&source.channel, ExportRequest::default()).await;
    let exported = records(&original);
    assert_eq!(
        kinds(&exported),
        [
            "execution",
            "memory_version",
            "session",
            "episode",
            "working_memory",
            "task",
            "cached_file",
            "fact",
            "fact_version",
            "fact_source",
            "rule"
        ]
    );
    // What the data set was written to hold.
    let deploy: Vec<&Value> = exported
        .iter()
        .filter(|r| r["kind"] == "memory_version" && r["key"] == "deploy")
        .collect();
    assert_eq!(
        deploy
            .iter()
            .map(|r| r["version"].as_i64())
            .collect::<Vec<_>>(),
        [Some(2), Some(3)],
        "version 1 was purged"
    );
    assert!(
        exported
            .iter()
            .any(|r| r["kind"] == "memory_version" && r["key"] == "style" && r["deleted"] == true),
        "the tombstone is exported"
    );
    assert!(
        exported.iter().any(|r| r["kind"] == "memory_version"
            && r["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("_compaction/"))),
        "the purge's audit record is exported"
    );
    let run = exported
        .iter()
        .find(|r| r["kind"] == "memory_version" && r["scope"] == "run-1")
        .expect("the run's memory");
    assert_eq!(
        (&run["flow_id"], &run["flow_name"]),
        (&json!("flow-a"), &json!("nightly"))
    );
    let learn = exported
        .iter()
        .find(|r| r["kind"] == "rule")
        .expect("the rule");
    assert_eq!(learn["watermark_episode"], "e3");
    assert_eq!(learn["episodes_promoted"], 3);

    let target = TestServer::spawn(the_other(backend)).await;
    let imported = import(&target.channel, &original).await.expect("import");
    assert_eq!(imported.lines, original.len() as i64);
    assert_eq!(imported.imported["memory_version"], 7);
    assert_eq!(imported.imported["episode"], 3);
    assert!(imported.unchanged.is_empty(), "{:?}", imported.unchanged);
    let moved = export(&target.channel, ExportRequest::default()).await;
    assert_eq!(
        records(&moved),
        exported,
        "the other store exports the same"
    );

    // The imported data is live: reads, the tail and the change feed see it.
    let got = target
        .memory()
        .get(GetRequest {
            scope_type: NAMESPACE,
            scope: "team".into(),
            key: "deploy".into(),
            ..GetRequest::default()
        })
        .await
        .expect("get")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(got.version, 3);
    // And searchable at its current versions only (the tombstoned key and
    // the purged version's words are not found).
    let hits = crate::search::search(&target, crate::search::memory_query("deploy")).await;
    assert_eq!(crate::search::names(&hits), ["memory:team/deploy@3"]);
    for gone in ["warm", "validate"] {
        let hits = crate::search::search(&target, crate::search::memory_query(gone)).await;
        assert!(hits.is_empty(), "{gone}: {hits:?}");
    }
    let mut tail = target
        .episodes()
        .tail_episodes(TailEpisodesRequest {
            session_id: "s1".into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    let first = tail.next().await.expect("an episode").expect("ok");
    assert_eq!(first.episode.map(|e| e.id), Some("e1".to_owned()));
    let mut watch = target
        .memory()
        .watch(WatchRequest {
            scope_type: NAMESPACE,
            scope: "team".into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let change = watch.next().await.expect("a change").expect("ok");
    // Revisions are issued in the file's order.
    let first_in_team = exported
        .iter()
        .find(|r| r["kind"] == "memory_version" && r["scope"] == "team")
        .expect("team");
    assert!(change.revision > 0);
    assert_eq!(json!(change.key), first_in_team["key"]);

    // Importing again changes nothing.
    let again = import(&target.channel, &original)
        .await
        .expect("import again");
    assert!(again.imported.is_empty(), "{:?}", again.imported);
    assert_eq!(again.unchanged["memory_version"], 7);
    assert_eq!(
        records(&export(&target.channel, ExportRequest::default()).await),
        exported
    );

    // And back into a fresh store of the first kind.
    let back = TestServer::spawn(backend).await;
    import(&back.channel, &moved).await.expect("import back");
    assert_eq!(
        records(&export(&back.channel, ExportRequest::default()).await),
        exported
    );
}

/// A malformed line, a conflict or a broken stream imports nothing.
async fn a_failed_import_leaves_nothing(backend: Backend) {
    let source = TestServer::spawn(backend).await;
    seed(&source).await;
    let lines = export(&source.channel, ExportRequest::default()).await;
    let target = TestServer::spawn(backend).await;
    let session_exists = |id: &'static str| {
        let mut sessions = target.sessions();
        async move {
            match sessions
                .get_session(GetSessionRequest {
                    session_id: id.into(),
                    ..GetSessionRequest::default()
                })
                .await
            {
                Ok(_) => true,
                Err(err) if err.code() == Code::NotFound => false,
                Err(err) => panic!("get session: {err}"),
            }
        }
    };

    // A malformed line near the end (the last before the end line):
    // named, and nothing is imported.
    let mut broken = lines.clone();
    let at = broken.len() - 2;
    broken[at] = broken[at].replace("\"kind\":\"rule\"", "\"kind\":\"rule\",\"colour\":1");
    let err = import(&target.channel, &broken)
        .await
        .expect_err("malformed");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::InvalidArgument, "IMPORT_MALFORMED".into())
    );
    assert_eq!(bad_fields(&err), [format!("line {}", at + 1)]);
    assert!(err.message().contains("colour"), "{}", err.message());
    assert!(!session_exists("s1").await);

    // A line that is not JSON (here cut short) says so.
    let mut cut = lines.clone();
    let comma = cut[2].find(',').expect("a record of several fields");
    cut[2].truncate(comma);
    let err = import(&target.channel, &cut).await.expect_err("cut short");
    assert_eq!(bad_fields(&err), ["line 3"]);
    assert!(
        err.message()
            .starts_with("line 3: is not JSON: EOF while parsing"),
        "{}",
        err.message()
    );

    // A file cut short at a line's end (an export that broke, a partial
    // copy) has no end line: refused, naming where it should be, and
    // nothing is imported.
    for kept in [lines.len() - 1, lines.len() / 2] {
        let err = import(&target.channel, &lines[..kept])
            .await
            .expect_err("cut short");
        assert_eq!(bad_fields(&err), [format!("line {}.kind", kept + 1)]);
        assert!(
            err.message().contains("the file ends before its end line"),
            "{}",
            err.message()
        );
        assert!(!session_exists("s1").await);
    }
    // An end line that miscounts (a line taken out), or lines after it.
    let mut miscounted = lines.clone();
    miscounted.remove(2);
    let err = import(&target.channel, &miscounted)
        .await
        .expect_err("miscounted");
    assert_eq!(
        bad_fields(&err),
        [format!("line {}.lines", miscounted.len())]
    );
    assert!(
        err.message().contains(&format!(
            "says {} lines came before it, but {} did",
            lines.len() - 1,
            lines.len() - 2
        )),
        "{}",
        err.message()
    );
    let mut twice = lines.clone();
    twice.push(lines[2].clone());
    let err = import(&target.channel, &twice)
        .await
        .expect_err("after the end");
    assert_eq!(bad_fields(&err), [format!("line {}.kind", twice.len())]);
    assert!(!session_exists("s1").await);

    let mut no_header = lines.clone();
    no_header.remove(0);
    let err = import(&target.channel, &no_header)
        .await
        .expect_err("no header");
    assert_eq!(bad_fields(&err), ["line 1.kind"]);

    let mut bad_field = lines.clone();
    bad_field[1] = bad_field[1].replace("\"execution_id\":\"run-1\"", "\"execution_id\":\"run 1\"");
    let err = import(&target.channel, &bad_field)
        .await
        .expect_err("bad id");
    assert_eq!(bad_fields(&err), ["line 2.execution_id"]);

    // A stream broken halfway: the lines sent were staged, and none shows.
    let (sender, receiver) = tokio::sync::mpsc::channel::<ImportRequest>(1);
    let mut client = DataServiceClient::new(target.channel.clone());
    let call = tokio::spawn(async move {
        client
            .import(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await
    });
    sender
        .send(ImportRequest {
            lines: lines[..lines.len() / 2].to_vec(),
        })
        .await
        .expect("send");
    staged_lines_appear(&target).await;
    call.abort();
    let _ = call.await;
    drop(sender);
    assert!(!session_exists("s1").await);

    // A conflict: one record differs from the stored one.
    import(&target.channel, &lines).await.expect("import");
    let mut changed = lines.clone();
    let session = changed
        .iter()
        .position(|l| l.contains("\"kind\":\"session\"") && l.contains("\"id\":\"s2\""))
        .expect("s2");
    changed[session] = changed[session].replace("\"app\":\"bot\"", "\"app\":\"other\"");
    let err = import(&target.channel, &changed)
        .await
        .expect_err("conflict");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::AlreadyExists, "IMPORT_CONFLICT".into())
    );
    assert!(
        err.message().starts_with(&format!("line {}:", session + 1)),
        "{}",
        err.message()
    );
    // A new session in the refused file is not imported either.
    let mut with_new = changed.clone();
    with_new.push(with_new[session].replace("\"id\":\"s2\"", "\"id\":\"s9\""));
    import(&target.channel, &with_new)
        .await
        .expect_err("conflict");
    assert!(!session_exists("s9").await);
}

/// Waits until the target store holds staged import lines: the broken
/// import got as far as staging before it was cut.
async fn staged_lines_appear(server: &TestServer) {
    let count = "SELECT count(*) FROM import_lines";
    loop {
        let n: i64 = match server.db.backend {
            Backend::Sqlite => {
                let mut conn =
                    <sqlx::SqliteConnection as sqlx::Connection>::connect(&server.db.url)
                        .await
                        .expect("open");
                sqlx::query_scalar(count)
                    .fetch_one(&mut conn)
                    .await
                    .expect("count")
            }
            Backend::Postgres => {
                let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
                    .await
                    .expect("connect");
                sqlx::query_scalar(count)
                    .fetch_one(&mut conn)
                    .await
                    .expect("count")
            }
        };
        if n > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Imports need an admin and land in the importer's tenant; a selection
/// exports what it names.
async fn imports_respect_tenants_and_selections(backend: Backend) {
    let tokens = format!(
        "{} acme admin\n{} acme\n{} globex admin",
        hash_token("acme-admin"),
        hash_token("acme-user"),
        hash_token("globex-admin")
    );
    let server = TestServer::spawn_with(backend, |s| {
        s.tokens = Some(tokens);
        s.max_value_bytes = Some(1024);
    })
    .await;
    let bearer = |token: &str| Metadata::new(&[("authorization", &format!("Bearer {token}"))]);
    let acme = DataServiceClient::with_interceptor(server.channel.clone(), bearer("acme-admin"));
    let globex =
        DataServiceClient::with_interceptor(server.channel.clone(), bearer("globex-admin"));
    let acme_user =
        DataServiceClient::with_interceptor(server.channel.clone(), bearer("acme-user"));

    // A small file, written by hand as a user would.
    let lines: Vec<String> = [
        json!({"kind": "header", "format": "engram.export", "version": 1, "tenant": "elsewhere",
               "selection": "tenant", "export_time": "2026-11-23T10:00:00Z"}),
        json!({"kind": "memory_version", "scope_type": "namespace", "scope": "team", "key": "k",
               "version": 1, "value": {"v": 1}, "deleted": false,
               "create_time": "2026-11-23T10:00:00Z"}),
        json!({"kind": "session", "id": "s1", "app": "bot", "user": "alice", "metadata": {},
               "create_time": "2026-11-23T10:00:00Z", "update_time": "2026-11-23T10:00:01Z",
               "end_time": null, "last_seq": 1, "episode_count": 1, "episodes_evicted": 0}),
        json!({"kind": "episode", "session_id": "s1", "seq": 1, "id": "e1", "app": "bot",
               "user": "alice", "agent": "a", "type": "observation", "content": "hi",
               "metadata": {}, "timestamp": "2026-11-23T10:00:01Z",
               "create_time": "2026-11-23T10:00:01Z", "fingerprint": "00ff"}),
    ]
    .iter()
    .map(Value::to_string)
    .collect();

    let err = import_with(acme_user, &lines)
        .await
        .expect_err("not an admin");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::PermissionDenied, "ADMIN_REQUIRED".into())
    );
    let done = import_with(globex.clone(), &lines).await.expect("import");
    assert_eq!(done.imported.values().sum::<i64>(), 3);

    let export_as = |mut client: DataServiceClient<_>, request: ExportRequest| async move {
        let mut stream = client.export(request).await.expect("export").into_inner();
        let mut lines = Vec::new();
        while let Some(chunk) = stream.next().await {
            lines.extend(chunk.expect("chunk").lines);
        }
        records(&lines)
    };
    // Acme sees nothing of it; Globex sees all of it.
    assert!(
        export_as(acme.clone(), ExportRequest::default())
            .await
            .is_empty()
    );
    let theirs = export_as(globex.clone(), ExportRequest::default()).await;
    assert_eq!(theirs.len(), 3);

    // Selections.
    let session = export_as(
        globex.clone(),
        ExportRequest {
            session_id: "s1".into(),
            ..ExportRequest::default()
        },
    )
    .await;
    assert_eq!(kinds(&session), ["session", "episode"]);
    let scope = export_as(
        globex.clone(),
        ExportRequest {
            scope_type: NAMESPACE,
            scope: "team".into(),
            ..ExportRequest::default()
        },
    )
    .await;
    assert_eq!(kinds(&scope), ["memory_version"]);
    let nobody = export_as(
        globex.clone(),
        ExportRequest {
            app: "bot".into(),
            user: "bob".into(),
            ..ExportRequest::default()
        },
    )
    .await;
    assert!(nobody.is_empty());
    let alice = export_as(
        globex,
        ExportRequest {
            app: "bot".into(),
            user: "alice".into(),
            ..ExportRequest::default()
        },
    )
    .await;
    assert_eq!(kinds(&alice), ["session", "episode"]);

    // A value larger than --max-value-bytes is refused, as a Set would be.
    let big = [
        lines[0].clone(),
        json!({"kind": "memory_version", "scope_type": "namespace", "scope": "team",
               "key": "big", "version": 1, "value": "x".repeat(2048), "deleted": false,
               "create_time": "2026-11-23T10:00:00Z"})
        .to_string(),
    ];
    let err = import_with(acme.clone(), &big)
        .await
        .expect_err("too large");
    assert_eq!(reason(&err), "IMPORT_MALFORMED");
    assert_eq!(bad_fields(&err), ["line 2.value"]);

    // An episode whose session is nowhere is refused by line.
    let orphan = [lines[0].clone(), lines[3].clone()];
    let err = import_with(acme, &orphan).await.expect_err("orphan");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::FailedPrecondition, "IMPORT_CONFLICT".into())
    );
    assert!(err.message().starts_with("line 2:"), "{}", err.message());
}

/// An export is the tenant at one moment however long its client takes to
/// read it: what is purged, started and appended meanwhile is not half in
/// the file, and the file imports whole. Exports take turns (a quarter of
/// the pool: one here), and one waiting for its turn sees the tenant as it
/// is when the turn comes.
async fn an_export_is_one_moment_of_the_tenant(backend: Backend) {
    let source = TestServer::spawn_with(backend, |s| s.db_max_connections = Some(4)).await;
    let mut memory = source.memory();
    // More versions than a page of the export (500), 16 KiB each: the
    // stream's buffers hold a few MB, so the server is still reading the
    // key's versions when its client pauses.
    let big = "x".repeat(16 * 1024);
    const VERSIONS: i64 = 600;
    for i in 1..=VERSIONS {
        memory
            .set(SetRequest {
                scope_type: NAMESPACE,
                scope: "moment".into(),
                key: "k".into(),
                value: Some(json_to_proto(&json!({"i": i, "pad": big}))),
                ..SetRequest::default()
            })
            .await
            .expect("set");
    }
    let mut episodes = source.episodes();
    let append = |session: &str, id: &str| AppendEpisodeRequest {
        session_id: session.into(),
        app: "bot".into(),
        user: "alice".into(),
        episode: Some(episode(id, "observation", json!({}))),
        require_session: false,
    };
    for id in ["e1", "e2"] {
        episodes
            .append_episode(append("s1", id))
            .await
            .expect("append");
    }

    let mut stream = DataServiceClient::new(source.channel.clone())
        .export(ExportRequest::default())
        .await
        .expect("export")
        .into_inner();
    let mut lines = Vec::new();
    for _ in 0..2 {
        let chunk = stream.next().await.expect("a chunk").expect("chunk");
        lines.extend(chunk.lines);
    }
    let mut waiting = DataServiceClient::new(source.channel.clone())
        .export(ExportRequest::default())
        .await
        .expect("export")
        .into_inner();
    let early = tokio::time::timeout(Duration::from_millis(300), waiting.next()).await;
    assert!(
        early.is_err(),
        "a second export began beside the first: {early:?}"
    );
    // While the export is read: most of the key purged, an episode
    // appended, a session started.
    MemoryAdminServiceClient::new(source.channel.clone())
        .purge(PurgeRequest {
            scope_type: NAMESPACE,
            scope: "moment".into(),
            key: "k".into(),
            keep: Some(10),
            dry_run: false,
        })
        .await
        .expect("purge");
    episodes
        .append_episode(append("s1", "e3"))
        .await
        .expect("append");
    episodes
        .append_episode(append("s2", "e4"))
        .await
        .expect("append");
    while let Some(chunk) = stream.next().await {
        lines.extend(chunk.expect("chunk").lines);
    }

    let exported = records(&lines);
    let of =
        |kind: &str| -> Vec<&Value> { exported.iter().filter(|r| r["kind"] == kind).collect() };
    let versions: Vec<i64> = of("memory_version")
        .iter()
        .filter(|r| r["key"] == "k")
        .filter_map(|r| r["version"].as_i64())
        .collect();
    assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>());
    let sessions: Vec<(&Value, &Value)> = of("session")
        .iter()
        .map(|r| (&r["id"], &r["last_seq"]))
        .collect();
    assert_eq!(sessions, [(&json!("s1"), &json!(2))]);
    let ids: Vec<&Value> = of("episode").iter().map(|r| &r["id"]).collect();
    assert_eq!(ids, [&json!("e1"), &json!("e2")]);

    let target = TestServer::spawn(backend).await;
    import(&target.channel, &lines)
        .await
        .expect("the export imports whole");
    // Every line applied, though they are read back a couple of MB at a
    // time: the target exports the same 600 versions.
    let imported = records(&export(&target.channel, ExportRequest::default()).await);
    let versions: Vec<i64> = imported
        .iter()
        .filter(|r| r["kind"] == "memory_version" && r["key"] == "k")
        .filter_map(|r| r["version"].as_i64())
        .collect();
    assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>());

    let mut later = Vec::new();
    while let Some(chunk) = waiting.next().await {
        later.extend(chunk.expect("chunk").lines);
    }
    let later = records(&later);
    let versions: Vec<i64> = later
        .iter()
        .filter(|r| r["kind"] == "memory_version" && r["key"] == "k")
        .filter_map(|r| r["version"].as_i64())
        .collect();
    assert_eq!(versions, (VERSIONS - 9..=VERSIONS).collect::<Vec<_>>());
    let ids: Vec<&Value> = later
        .iter()
        .filter(|r| r["kind"] == "episode")
        .map(|r| &r["id"])
        .collect();
    assert_eq!(
        ids,
        [&json!("e1"), &json!("e2"), &json!("e3"), &json!("e4")]
    );
}

const T0: &str = "2026-11-23T10:00:00Z";

fn line(record: Value) -> String {
    record.to_string()
}

pub(crate) fn header(version: u32) -> String {
    line(
        json!({"kind": "header", "format": "engram.export", "version": version,
                "tenant": "elsewhere", "selection": "tenant", "export_time": T0}),
    )
}

pub(crate) fn session_line(id: &str) -> String {
    line(
        json!({"kind": "session", "id": id, "app": "app", "user": "alice",
                "metadata": {}, "create_time": T0, "update_time": T0, "end_time": null,
                "last_seq": 0, "episode_count": 0, "episodes_evicted": 0}),
    )
}

fn fact_head(id: &str, version: i64) -> Value {
    json!({"kind": "fact", "id": id, "app": "app", "user": "alice",
           "fact_kind": "semantic", "subject": "alice", "predicate": "notes",
           "version": version, "deleted": false, "create_time": T0, "update_time": T0,
           "sources": ["e1"]})
}

fn fact_version(version: i64, content: Value) -> Value {
    json!({"version": version, "deleted": false, "subject": "alice", "predicate": "notes",
           "object": format!("note {version}"), "content": content, "confidence": 0.5,
           "source": "remember", "source_episode_ids": ["e1"], "channels": [],
           "create_time": T0})
}

/// Imports `lines`, which must be refused as a conflict
/// (`FAILED_PRECONDITION`, `IMPORT_CONFLICT`); returns the message.
async fn conflict(channel: &Channel, lines: Vec<String>) -> String {
    let err = import(channel, &lines).await.expect_err("refused");
    assert_eq!(
        (err.code(), reason(&err)),
        (Code::FailedPrecondition, "IMPORT_CONFLICT".into()),
        "{err:?}"
    );
    err.message().to_owned()
}

/// The kinds of an export's records and how many of each, in order.
fn runs(records: &[Value]) -> Vec<(String, usize)> {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for kind in records.iter().filter_map(|r| r["kind"].as_str()) {
        match runs.last_mut() {
            Some((last, n)) if last == kind => *n += 1,
            _ => runs.push((kind.to_owned(), 1)),
        }
    }
    runs
}

/// What grows without bound has a line per item: a version 1 file, with
/// tasks, files and versions inside their owners' lines, is still read,
/// and exported again with a line for each; a fact whose versions pass
/// what one message carries moves whole; and a file whose items do not
/// follow their owners is refused by line.
async fn items_have_lines_of_their_own(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let old = vec![
        header(1),
        session_line("s1"),
        line(
            json!({"kind": "working_memory", "session_id": "s1", "goal": "ship",
            "next_task": 1, "update_time": T0,
            "tasks": [{"number": 1, "subject": "write", "description": "the docs",
                       "status": "pending", "create_time": T0, "update_time": T0}],
            "cache": [{"path": "a.txt", "content": "hello", "bytes": 5,
                       "update_time": T0}]}),
        ),
        line({
            let mut fact = fact_head("f1", 2);
            fact["versions"] = json!([
                fact_version(1, json!("quartz")),
                fact_version(2, json!("zephyr"))
            ]);
            fact
        }),
    ];
    let imported = import(&server.channel, &old)
        .await
        .expect("a version 1 file");
    assert_eq!(imported.imported["working_memory"], 1);
    assert_eq!(imported.imported["fact"], 1);
    let exported = records(&export(&server.channel, ExportRequest::default()).await);
    assert_eq!(
        runs(&exported),
        [
            ("session".to_owned(), 1),
            ("working_memory".to_owned(), 1),
            ("task".to_owned(), 1),
            ("cached_file".to_owned(), 1),
            ("fact".to_owned(), 1),
            ("fact_version".to_owned(), 2),
            ("fact_source".to_owned(), 1),
        ]
    );
    let by_kind =
        |kind: &str| -> Vec<&Value> { exported.iter().filter(|r| r["kind"] == kind).collect() };
    assert_eq!(by_kind("working_memory")[0].get("tasks"), None);
    assert_eq!(by_kind("task")[0]["session_id"], "s1");
    assert_eq!(by_kind("task")[0]["description"], "the docs");
    assert_eq!(by_kind("cached_file")[0]["content"], "hello");
    assert_eq!(by_kind("fact")[0].get("versions"), None);
    assert_eq!(by_kind("fact")[0].get("sources"), None);
    assert_eq!(
        by_kind("fact_source")[0],
        &json!({"kind": "fact_source", "fact_id": "f1", "episode_id": "e1"})
    );
    let versions = by_kind("fact_version");
    assert_eq!(
        versions
            .iter()
            .map(|v| (&v["fact_id"], &v["content"]))
            .collect::<Vec<_>>(),
        [
            (&json!("f1"), &json!("quartz")),
            (&json!("f1"), &json!("zephyr"))
        ]
    );
    // Found at its current version only.
    let found = crate::search::search(&server, crate::search::query("zephyr")).await;
    assert_eq!(crate::search::names(&found), ["fact:alice"]);
    let older = crate::search::search(&server, crate::search::query("quartz")).await;
    assert!(older.is_empty(), "{older:?}");
    // The same file again finds everything in place.
    let again = import(&server.channel, &old).await.expect("again");
    assert!(again.imported.is_empty(), "{:?}", again.imported);

    // A fact of 50 versions of 128 KiB: 6.4 MB, more than a message holds.
    const VERSIONS: i64 = 50;
    let big = |n: i64| json!(format!("{n} {}", "x".repeat(128 * 1024)));
    let mut long = vec![header(2), line(fact_head("f2", VERSIONS))];
    for n in 1..=VERSIONS {
        let mut version = fact_version(n, big(n));
        version["kind"] = json!("fact_version");
        version["fact_id"] = json!("f2");
        long.push(line(version));
    }
    let imported = import(&server.channel, &long).await.expect("a long fact");
    assert_eq!(imported.imported["fact_version"], VERSIONS);
    let moved = TestServer::spawn(the_other(backend)).await;
    let lines = export(&server.channel, ExportRequest::default()).await;
    import(&moved.channel, &lines).await.expect("moved");
    let exported = records(&export(&moved.channel, ExportRequest::default()).await);
    let contents: Vec<&Value> = exported
        .iter()
        .filter(|r| r["kind"] == "fact_version" && r["fact_id"] == "f2")
        .map(|r| &r["content"])
        .collect();
    assert_eq!(
        contents,
        (1..=VERSIONS)
            .map(big)
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>()
    );
    assert_eq!(
        exported,
        records(&lines),
        "the same records on the other store"
    );

    // Refused by line: a fact whose current version never comes, a version
    // past the current one or of a fact not there, a task of a working
    // memory not there.
    let refused = |lines: Vec<String>| conflict(&server.channel, lines);
    let mut cut = long.clone();
    cut.truncate(long.len() - 1);
    for n in cut.iter_mut().skip(1) {
        *n = n.replace("\"f2\"", "\"f3\"");
    }
    let message = refused(cut).await;
    assert!(
        message.starts_with("line 2: fact \"f3\", whose current version 50"),
        "{message}"
    );
    let mut past = fact_version(3, json!("third"));
    past["kind"] = json!("fact_version");
    past["fact_id"] = json!("f1");
    let message = refused(vec![header(2), line(past.clone())]).await;
    assert!(
        message.starts_with("line 2: version 3 of fact \"f1\""),
        "{message}"
    );
    past["fact_id"] = json!("f9");
    let message = refused(vec![header(2), line(past)]).await;
    assert!(
        message.starts_with("line 2: a version of fact \"f9\""),
        "{message}"
    );
    let source = json!({"kind": "fact_source", "fact_id": "f9", "episode_id": "e1"});
    let message = refused(vec![header(2), line(source)]).await;
    assert!(
        message.starts_with("line 2: a source of fact \"f9\""),
        "{message}"
    );
    let task = json!({"kind": "task", "session_id": "s2", "number": 1, "subject": "x",
                      "description": "", "status": "pending", "create_time": T0,
                      "update_time": T0});
    let message = refused(vec![header(2), session_line("s2"), line(task)]).await;
    assert!(
        message.starts_with("line 3: a task of the working memory of session \"s2\""),
        "{message}"
    );
}

fn episode_line(session: &str, seq: i64, user: &str) -> Value {
    json!({"kind": "episode", "session_id": session, "seq": seq, "id": format!("{session}-e{seq}"),
           "app": "app", "user": user, "agent": "bot", "type": "message",
           "content": format!("turn {seq}"), "metadata": {}, "source_node": "",
           "timestamp": T0, "create_time": T0, "fingerprint": format!("{seq:064x}")})
}

/// What a store derives from its records (a session's last seq, owner and
/// count of episodes, a working memory's last task number, a fact's
/// subject, predicate and deletion) must agree with the records a file
/// brings: a file that contradicts it is refused by line, since the store
/// would break on it (the next append or task given a taken number, an
/// episode found under another user). A file that agrees imports, and the
/// next writes follow on.
async fn an_import_agrees_with_what_the_store_derives(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let session = |last_seq: i64, count: i64, evicted: i64| {
        let mut session: Value = serde_json::from_str(&session_line("s1")).expect("json");
        session["last_seq"] = json!(last_seq);
        session["episode_count"] = json!(count);
        session["episodes_evicted"] = json!(evicted);
        line(session)
    };
    let working = |next_task: i64| {
        line(
            json!({"kind": "working_memory", "session_id": "s1", "goal": "",
                    "next_task": next_task, "update_time": T0}),
        )
    };
    let task = |number: i64| {
        line(
            json!({"kind": "task", "session_id": "s1", "number": number, "subject": "x",
                    "description": "", "status": "pending", "create_time": T0,
                    "update_time": T0}),
        )
    };
    let refused = |lines: Vec<String>| conflict(&server.channel, lines);
    let ep = |seq: i64, user: &str| line(episode_line("s1", seq, user));

    let message = refused(vec![
        header(2),
        session(2, 2, 0),
        ep(1, "alice"),
        ep(2, "mallory"),
    ])
    .await;
    assert!(
        message.starts_with("line 4: episode \"s1-e2\" is of app \"app\" and user \"mallory\""),
        "{message}"
    );
    let message = refused(vec![
        header(2),
        session(2, 3, 0),
        ep(1, "alice"),
        ep(2, "alice"),
        ep(3, "alice"),
    ])
    .await;
    assert!(
        message.starts_with("line 5: episode \"s1-e3\" has seq 3, past the last seq 2"),
        "{message}"
    );
    let message = refused(vec![header(2), session(2, 2, 0), ep(1, "alice")]).await;
    assert!(
        message.starts_with(
            "line 2: session \"s1\" would hold 1 episodes, but its episode_count is 2"
        ),
        "{message}"
    );
    let message = refused(vec![
        header(2),
        session(2, 2, 0),
        ep(1, "alice"),
        ep(2, "alice"),
        working(1),
        task(1),
        task(2),
    ])
    .await;
    assert!(
        message.starts_with("line 7: task 2 of session \"s1\", past the last task number 1"),
        "{message}"
    );
    let mut tombstone = fact_version(2, Value::Null);
    tombstone["kind"] = json!("fact_version");
    tombstone["fact_id"] = json!("f1");
    tombstone["deleted"] = json!(true);
    let mut first = fact_version(1, json!("quartz"));
    first["kind"] = json!("fact_version");
    first["fact_id"] = json!("f1");
    let message = refused(vec![
        header(2),
        line(fact_head("f1", 2)),
        line(first.clone()),
        line(tombstone.clone()),
    ])
    .await;
    assert!(
        message.starts_with(
            "line 4: version 2 of fact \"f1\" is its current version, and its deleted differs"
        ),
        "{message}"
    );
    let mut renamed = first.clone();
    renamed["predicate"] = json!("likes");
    let message = refused(vec![header(2), line(fact_head("f1", 1)), line(renamed)]).await;
    assert!(message.contains("its predicate differs"), "{message}");
    // In a version 1 line, the same contradictions are malformed fields.
    let mut old_fact = fact_head("f1", 2);
    let mut gone = fact_version(2, Value::Null);
    gone["deleted"] = json!(true);
    old_fact["versions"] = json!([fact_version(1, json!("quartz")), gone]);
    let err = import(&server.channel, &[header(1), line(old_fact)])
        .await
        .expect_err("v1 fact");
    assert_eq!(bad_fields(&err), ["line 2.versions[1].deleted"]);
    let old_working = line(
        json!({"kind": "working_memory", "session_id": "s1", "goal": "",
        "next_task": 1, "update_time": T0,
        "tasks": [{"number": 2, "subject": "x", "description": "", "status": "pending",
                   "create_time": T0, "update_time": T0}]}),
    );
    let err = import(&server.channel, &[header(1), session(0, 0, 0), old_working])
        .await
        .expect_err("v1 working");
    assert_eq!(bad_fields(&err), ["line 3.tasks[0].number"]);

    // Nothing of those landed; a file that agrees does, one episode
    // evicted, and the next append and task follow on.
    let agreeing = vec![
        header(2),
        session(3, 2, 1),
        ep(2, "alice"),
        ep(3, "alice"),
        working(2),
        task(1),
        task(2),
    ];
    let imported = import(&server.channel, &agreeing).await.expect("agrees");
    assert_eq!(imported.imported["episode"], 2);
    let appended = server
        .episodes()
        .append_episode(AppendEpisodeRequest {
            session_id: "s1".into(),
            episode: Some(episode("next", "message", json!("turn 4"))),
            ..AppendEpisodeRequest::default()
        })
        .await
        .expect("append after import")
        .into_inner()
        .episode
        .expect("episode");
    assert_eq!((appended.seq, appended.user.as_str()), (4, "alice"));
    let created = WorkingMemoryServiceClient::new(server.channel.clone())
        .create_task(CreateTaskRequest {
            session_id: "s1".into(),
            subject: "third".into(),
            ..CreateTaskRequest::default()
        })
        .await
        .expect("task after import")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(created.id, "t3");
    // The stored session counts too: its evicted episode brought back
    // would make three where it counts two.
    let message = refused(vec![header(2), ep(1, "alice")]).await;
    assert!(
        message.starts_with(
            "line 2: session \"s1\" would hold 4 episodes, but its episode_count is 3"
        ),
        "{message}"
    );
}

/// A rule stored before filters that mix AND and OR without parentheses
/// were refused (such as one an earlier release exported) imports, and
/// runs with the reading it was written for, `(a AND b) OR c`; the same
/// filter in a new rule is refused, naming where the OR is.
async fn a_rule_keeps_the_reading_it_was_stored_with(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mixed = "user = nobody AND agent = bot OR user = alice";
    let mut session: Value = serde_json::from_str(&session_line("s1")).expect("json");
    session["last_seq"] = json!(2);
    session["episode_count"] = json!(2);
    let stored = json!({"kind": "rule", "id": "old", "filter": mixed, "every_n_episodes": 100,
        "cron": null, "then_emits": ["semantic"], "fact_kind": "semantic", "confidence": 0.5,
        "enabled": false, "watermark_episode": null, "episodes_promoted": 0,
        "create_time": T0, "last_run_time": null});
    let lines = vec![
        header(2),
        line(session),
        line(episode_line("s1", 1, "alice")),
        line(episode_line("s1", 2, "alice")),
        line(stored),
    ];
    import(&server.channel, &lines).await.expect("import");

    let mut rules = server.consolidation();
    let run = rules
        .run_rule(RunRuleRequest {
            rule_id: "old".into(),
            dry_run: true,
            max_episodes: 0,
        })
        .await
        .expect("run")
        .into_inner();
    assert_eq!(
        (run.episodes_scanned, run.episodes_matched),
        (2, 2),
        "(nobody AND bot) OR alice matches alice's episodes"
    );

    let err = rules
        .create_rule(CreateRuleRequest {
            rule: Some(rule("new", mixed, false)),
            ..CreateRuleRequest::default()
        })
        .await
        .expect_err("ambiguous");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_FILTER")
    );
    assert_eq!(bad_fields(&err), vec!["rule.filter".to_owned()]);
    assert!(
        err.message().contains("position 30") && err.message().contains("parentheses"),
        "{}",
        err.message()
    );
    for (id, spelt) in [
        ("either", "(user = nobody AND agent = bot) OR user = alice"),
        ("both", "user = nobody AND (agent = bot OR user = alice)"),
    ] {
        rules
            .create_rule(CreateRuleRequest {
                rule: Some(rule(id, spelt, false)),
                ..CreateRuleRequest::default()
            })
            .await
            .expect("parenthesised");
    }
}

/// The keyed creations of one store, made in another: a session, a task,
/// a fact and a rule, each under a request id.
async fn keyed_creations(server: &TestServer) -> (String, String, String, String) {
    let session = server
        .sessions()
        .create_session(CreateSessionRequest {
            app: "bot".into(),
            user: "alice".into(),
            session_id: "k1".into(),
            request_id: "req-session".into(),
            ..CreateSessionRequest::default()
        })
        .await
        .expect("session")
        .into_inner();
    let mut working = WorkingMemoryServiceClient::new(server.channel.clone());
    let task = working
        .create_task(CreateTaskRequest {
            session_id: "k1".into(),
            app: "bot".into(),
            user: "alice".into(),
            subject: "write notes".into(),
            request_id: "req-task".into(),
            ..CreateTaskRequest::default()
        })
        .await
        .expect("task")
        .into_inner();
    let fact = working
        .remember(RememberRequest {
            session_id: "k1".into(),
            app: "bot".into(),
            user: "alice".into(),
            content: "alice deploys on fridays".into(),
            request_id: "req-fact".into(),
            ..RememberRequest::default()
        })
        .await
        .expect("remember")
        .into_inner();
    let rule = ConsolidationServiceClient::new(server.channel.clone())
        .create_rule(CreateRuleRequest {
            rule: Some(rule("learn", "metadata.learn:*", false)),
            request_id: "req-rule".into(),
        })
        .await
        .expect("rule")
        .into_inner();
    (
        session.session.map(|s| s.id).unwrap_or_default(),
        task.task.map(|t| t.id).unwrap_or_default(),
        fact.fact.map(|f| f.id).unwrap_or_default(),
        rule.rule.map(|r| r.id).unwrap_or_default(),
    )
}

/// A creation's request id moves with what it created (format version
/// 4), so a retry of the creation after the move finds it instead of
/// making another; an id the importing store holds already for something
/// else stays the store's; a file of version 3, which has none, imports
/// into a store that has them as unchanged.
async fn request_ids_move_with_what_they_created(backend: Backend) {
    let source = TestServer::spawn(backend).await;
    let made = keyed_creations(&source).await;
    let lines = export(&source.channel, ExportRequest::default()).await;
    let exported = records(&lines);
    let request_of = |kind: &str| {
        exported
            .iter()
            .find(|r| r["kind"] == kind)
            .map(|r| r["request"]["request_id"].clone())
    };
    for (kind, id) in [
        ("session", "req-session"),
        ("task", "req-task"),
        ("fact", "req-fact"),
        ("rule", "req-rule"),
    ] {
        assert_eq!(request_of(kind), Some(json!(id)), "{kind}");
    }

    let target = TestServer::spawn(the_other(backend)).await;
    import(&target.channel, &lines).await.expect("import");
    assert_eq!(
        records(&export(&target.channel, ExportRequest::default()).await),
        exported
    );
    // Each creation retried against the new store finds what it made.
    assert_eq!(keyed_creations(&target).await, made);
    assert_eq!(
        records(&export(&target.channel, ExportRequest::default()).await),
        exported,
        "the retries made nothing"
    );

    // A file of version 3 says nothing of request ids: unchanged.
    let old: Vec<String> = lines
        .iter()
        .map(|line| {
            let mut record: Value = serde_json::from_str(line).expect("a line");
            if let Some(record) = record.as_object_mut() {
                record.remove("request");
                if record["kind"] == "header" {
                    record.insert("version".into(), json!(3));
                }
            }
            record.to_string()
        })
        .collect();
    let again = import(&target.channel, &old).await.expect("version 3");
    assert!(again.imported.is_empty(), "{:?}", again.imported);
    // Into a fresh store it imports without them.
    let fresh = TestServer::spawn(backend).await;
    import(&fresh.channel, &old)
        .await
        .expect("version 3, fresh");
    let plain = records(&export(&fresh.channel, ExportRequest::default()).await);
    assert!(
        plain.iter().all(|r| r.get("request").is_none()),
        "{plain:?}"
    );

    // A store whose own session holds the id keeps it for that one.
    let busy = TestServer::spawn(backend).await;
    busy.sessions()
        .create_session(CreateSessionRequest {
            app: "bot".into(),
            user: "carol".into(),
            request_id: "req-session".into(),
            ..CreateSessionRequest::default()
        })
        .await
        .expect("the store's own");
    import(&busy.channel, &lines)
        .await
        .expect("import beside it");
    let held = records(&export(&busy.channel, ExportRequest::default()).await);
    let k1 = held
        .iter()
        .find(|r| r["kind"] == "session" && r["id"] == "k1")
        .expect("k1 imported");
    assert!(k1.get("request").is_none(), "{k1}");
    let err = busy
        .sessions()
        .create_session(CreateSessionRequest {
            app: "bot".into(),
            user: "alice".into(),
            session_id: "k1".into(),
            request_id: "req-session".into(),
            ..CreateSessionRequest::default()
        })
        .await
        .expect_err("the id is the store's own session's");
    assert_eq!(reason(&err), "REQUEST_ID_REUSED");

    // A malformed request is refused, naming its field.
    let mut bad = lines.clone();
    let at = bad
        .iter()
        .position(|l| l.contains("\"kind\":\"rule\""))
        .expect("the rule line");
    bad[at] = bad[at].replace("req-rule", "req rule");
    let err = import(&fresh.channel, &bad)
        .await
        .expect_err("a bad request id");
    assert_eq!(reason(&err), "IMPORT_MALFORMED", "{err:?}");
    assert!(err.message().contains("request.request_id"), "{err:?}");
}

on_both_stores!(
    request_ids_move_with_what_they_created,
    a_rule_keeps_the_reading_it_was_stored_with,
    an_import_agrees_with_what_the_store_derives,
    items_have_lines_of_their_own,
    an_export_is_one_moment_of_the_tenant,
    round_trip_across_stores,
    a_failed_import_leaves_nothing,
    imports_respect_tenants_and_selections
);
