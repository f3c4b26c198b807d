//! Authentication and tenant isolation through a real server configured
//! with tokens, on both stores: a missing token, a wrong one, another
//! tenant's token (which reads, lists, tails and watches nothing of the
//! first tenant's), a non-admin calling admin RPCs. Health and reflection
//! stay open; the HTTP JSON endpoints take the same tokens.

use engram::api::convert::json_to_proto;
use engram::auth::hash_token;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::session_service_client::SessionServiceClient;
use engram::proto::{
    AppendEpisodeRequest, CreateSessionRequest, DeleteSessionRequest, GetRequest, ListRequest,
    ListSessionsRequest, NewEpisode, PurgeScopeRequest, ScopeType, SetRequest, TailEpisodesRequest,
    WatchRequest,
};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::helpers::{Backend, Metadata, TestServer, http_get_json_as, reason};
use crate::on_both_stores;

const NS: i32 = ScopeType::Namespace as i32;
const ACME_ADMIN: &str = "acme-admin-token";
const ACME: &str = "acme-user-token";
const GLOBEX: &str = "globex-user-token";

pub(crate) type Authed = InterceptedService<Channel, Metadata>;

async fn server(backend: Backend) -> TestServer {
    let tokens = format!(
        "{} acme admin\n{} acme\n{} globex",
        hash_token(ACME_ADMIN),
        hash_token(ACME),
        hash_token(GLOBEX)
    );
    TestServer::spawn_with(backend, |s| s.tokens = Some(tokens)).await
}

fn bearer(token: Option<&str>) -> Metadata {
    match token {
        Some(token) => Metadata::new(&[("authorization", &format!("Bearer {token}"))]),
        None => Metadata::new(&[]),
    }
}

pub(crate) fn memory(server: &TestServer, token: Option<&str>) -> MemoryServiceClient<Authed> {
    MemoryServiceClient::with_interceptor(server.channel.clone(), bearer(token))
}

fn sessions(server: &TestServer, token: Option<&str>) -> SessionServiceClient<Authed> {
    SessionServiceClient::with_interceptor(server.channel.clone(), bearer(token))
}

fn episodes(server: &TestServer, token: Option<&str>) -> EpisodeServiceClient<Authed> {
    EpisodeServiceClient::with_interceptor(server.channel.clone(), bearer(token))
}

fn admin(server: &TestServer, token: Option<&str>) -> MemoryAdminServiceClient<Authed> {
    MemoryAdminServiceClient::with_interceptor(server.channel.clone(), bearer(token))
}

pub(crate) fn set(key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: "shared".into(),
        key: key.into(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

pub(crate) fn get(key: &str) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: "shared".into(),
        key: key.into(),
        version: 0,
        as_of: None,
    }
}

/// An append of episode `id` to session `s1` of app `app` and user `u`,
/// made by the first.
pub(crate) fn append(id: &str) -> AppendEpisodeRequest {
    AppendEpisodeRequest {
        session_id: "s1".into(),
        app: "app".into(),
        user: "u".into(),
        episode: Some(NewEpisode {
            id: id.into(),
            r#type: "user_message".into(),
            content: Some(json_to_proto(&json!(id))),
            ..NewEpisode::default()
        }),
        require_session: false,
    }
}

async fn tokens_are_required(backend: Backend) {
    let server = server(backend).await;
    for (token, code, why) in [
        (None, Code::Unauthenticated, "TOKEN_MISSING"),
        (Some("not-a-token"), Code::Unauthenticated, "TOKEN_INVALID"),
    ] {
        let err = memory(&server, token)
            .get(get("k"))
            .await
            .expect_err("refused");
        assert_eq!((err.code(), reason(&err).as_str()), (code, why));
        // Streams are refused before they start.
        let err = memory(&server, token)
            .watch(WatchRequest {
                scope_type: NS,
                scope: "shared".into(),
                ..WatchRequest::default()
            })
            .await
            .expect_err("refused");
        assert_eq!((err.code(), reason(&err).as_str()), (code, why));
    }
    // A header that is not a bearer token.
    let err = MemoryServiceClient::with_interceptor(
        server.channel.clone(),
        Metadata::new(&[("authorization", "Basic YWxhZGRpbjpvcGVu")]),
    )
    .get(get("k"))
    .await
    .expect_err("refused");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::Unauthenticated, "TOKEN_INVALID")
    );

    // Health and reflection answer without a token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel.clone());
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health without a token")
        .into_inner();
    assert_eq!(serving.status, 1, "SERVING");
    let mut reflection =
        tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(
            server.channel.clone(),
        );
    let request = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(
                String::new(),
            ),
        ),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection without a token")
        .into_inner();
    let answer = answers
        .next()
        .await
        .expect("an answer")
        .expect("reflection answers");
    assert!(format!("{answer:?}").contains("engram.v1.MemoryService"));

    // The token's own tenant works.
    memory(&server, Some(ACME))
        .set(set("k", json!(1)))
        .await
        .expect("acme writes");
}

async fn tenants_see_only_their_own(backend: Backend) {
    let server = server(backend).await;
    let mut acme = memory(&server, Some(ACME));
    let mut globex = memory(&server, Some(GLOBEX));

    // Globex follows the same scope and the same user before acme writes.
    let mut watch = globex
        .watch(WatchRequest {
            scope_type: NS,
            scope: "shared".into(),
            from_revision: Some(0),
            ..WatchRequest::default()
        })
        .await
        .expect("globex watches")
        .into_inner();
    let mut tail = episodes(&server, Some(GLOBEX))
        .tail_episodes(TailEpisodesRequest {
            user: "u".into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("globex tails")
        .into_inner();

    acme.set(set("secret", json!("acme only")))
        .await
        .expect("acme writes");
    let mut acme_episodes = episodes(&server, Some(ACME));
    for id in ["a1", "a2"] {
        acme_episodes
            .append_episode(append(id))
            .await
            .expect("acme appends");
    }

    // Globex reads and lists nothing of it, under the very same names.
    let err = globex.get(get("secret")).await.expect_err("not globex's");
    assert_eq!(err.code(), Code::NotFound);
    let listed = globex
        .list(ListRequest {
            scope_type: NS,
            scope: "shared".into(),
            ..ListRequest::default()
        })
        .await
        .expect("globex lists")
        .into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");
    let listed = sessions(&server, Some(GLOBEX))
        .list_sessions(ListSessionsRequest::default())
        .await
        .expect("globex lists sessions")
        .into_inner();
    assert!(listed.sessions.is_empty(), "{listed:?}");
    let (status, body) =
        http_get_json_as(server.http_addr(), "/memory/sessions", Some(GLOBEX)).await;
    assert_eq!((status, &body["sessions"]), (200, &json!([])));

    // Globex's own writes are what its watch and tail deliver first.
    globex
        .set(set("secret", json!("globex's own")))
        .await
        .expect("globex writes");
    episodes(&server, Some(GLOBEX))
        .append_episode(append("g1"))
        .await
        .expect("globex appends");
    let change = watch
        .next()
        .await
        .expect("a change")
        .expect("watch continues");
    assert_eq!(
        (change.key.as_str(), change.value.map(|v| format!("{v:?}"))),
        (
            "secret",
            Some(format!("{:?}", json_to_proto(&json!("globex's own"))))
        )
    );
    let episode = tail
        .next()
        .await
        .expect("an episode")
        .expect("tail continues")
        .episode
        .expect("episode");
    assert_eq!(episode.id, "g1");

    // And acme still sees its own, over gRPC and HTTP.
    let read = acme
        .get(get("secret"))
        .await
        .expect("acme reads")
        .into_inner();
    assert_eq!(read.entry.expect("entry").version, 1);
    let (status, body) = http_get_json_as(
        server.http_addr(),
        "/memory/events?session_id=s1",
        Some(ACME),
    )
    .await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = body["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .collect();
    assert_eq!(ids, ["a1", "a2"]);
    let (status, body) = http_get_json_as(server.http_addr(), "/memory/events", None).await;
    assert_eq!((status, &body["reason"]), (401, &json!("TOKEN_MISSING")));
    let (status, _) = http_get_json_as(server.http_addr(), "/memory/events", Some("nope")).await;
    assert_eq!(status, 401);

    // A request id names a creation within its tenant only: the same id
    // creates a session in each, and neither answers with the other's.
    let create = || CreateSessionRequest {
        app: "bot".into(),
        user: "u".into(),
        request_id: "create-1".into(),
        ..CreateSessionRequest::default()
    };
    let mut made = Vec::new();
    for token in [ACME, GLOBEX, ACME, GLOBEX] {
        let session = sessions(&server, Some(token))
            .create_session(create())
            .await
            .expect("create")
            .into_inner()
            .session
            .expect("session");
        made.push(session.id);
    }
    assert_ne!(made[0], made[1], "each tenant has its own session");
    assert_eq!(
        made[2..],
        made[..2],
        "each repeat answers with its tenant's"
    );
}

async fn admin_calls_need_the_admin_role(backend: Backend) {
    let server = server(backend).await;
    episodes(&server, Some(ACME))
        .append_episode(append("a1"))
        .await
        .expect("acme appends");
    let purge = || PurgeScopeRequest {
        scope_type: NS,
        scope: "shared".into(),
        dry_run: true,
        ..PurgeScopeRequest::default()
    };
    let delete = || DeleteSessionRequest {
        session_id: "s1".into(),
        ..DeleteSessionRequest::default()
    };
    let err = admin(&server, Some(ACME))
        .purge_scope(purge())
        .await
        .expect_err("not an admin");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::PermissionDenied, "ADMIN_REQUIRED")
    );
    let err = sessions(&server, Some(ACME))
        .delete_session(delete())
        .await
        .expect_err("not an admin");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::PermissionDenied, "ADMIN_REQUIRED")
    );
    // Without any token it is the token that is missing, not the role.
    let err = admin(&server, None)
        .purge_scope(purge())
        .await
        .expect_err("no token");
    assert_eq!(err.code(), Code::Unauthenticated);

    // Acme's admin may.
    admin(&server, Some(ACME_ADMIN))
        .purge_scope(purge())
        .await
        .expect("an admin purges");
    let deleted = sessions(&server, Some(ACME_ADMIN))
        .delete_session(delete())
        .await
        .expect("an admin deletes")
        .into_inner();
    assert_eq!(deleted.episodes_deleted, 1);
}

/// A tokens file rewritten under a running server (as a Kubernetes Secret
/// update does) takes effect without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tokens_file_takes_effect() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokens");
    let write = |text: String| {
        let temp = dir.path().join(".tokens.tmp");
        std::fs::write(&temp, text).expect("write");
        std::fs::rename(&temp, &path).expect("rename");
    };
    write(format!("{} acme\n", hash_token("old-token")));
    let server = TestServer::spawn_with(Backend::Sqlite, |s| {
        s.tokens_file = Some(path.clone());
        s.tokens_reload_interval_ms = Some(50);
    })
    .await;
    memory(&server, Some("old-token"))
        .set(set("k", json!(1)))
        .await
        .expect("the old token works");

    write(format!("{} acme\n", hash_token("new-token")));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while memory(&server, Some("new-token"))
        .set(set("k", json!(2)))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the new token never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let err = memory(&server, Some("old-token"))
        .set(set("k", json!(3)))
        .await
        .expect_err("the old token is gone");
    assert_eq!(reason(&err), "TOKEN_INVALID");
}

on_both_stores!(
    tokens_are_required,
    tenants_see_only_their_own,
    admin_calls_need_the_admin_role,
);
