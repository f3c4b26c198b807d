//! The console's HTTP side without a browser (tests/console drives it in
//! Chromium): it can be turned off, an open server answers only requests
//! for localhost, and every page carries its security headers.

use std::net::SocketAddr;

use engram::auth::hash_token;
use serde_json::json;

use crate::helpers::{Backend, TestServer, http_get, http_get_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_on_localhost_with_a_policy_and_can_be_turned_off() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let (status, content_type, body) = http_get(server.http_addr(), "/ui", None).await;
    assert_eq!(status, 200);
    assert_eq!(content_type.as_deref(), Some("text/html; charset=utf-8"));
    assert!(String::from_utf8_lossy(&body).contains("<h1>Scopes</h1>"));
    let (status, content_type, _) = http_get(server.http_addr(), "/ui/static/tail.js", None).await;
    assert_eq!(
        (status, content_type.as_deref()),
        (200, Some("text/javascript; charset=utf-8"))
    );

    let off = TestServer::spawn_with(Backend::Sqlite, |s| s.console = Some(false)).await;
    let (status, _, _) = http_get(off.http_addr(), "/ui", None).await;
    assert_eq!(status, 404, "--console false serves no console");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_console_refuses_other_hosts() {
    use http_body_util::Empty;
    let server = TestServer::spawn(Backend::Sqlite).await;
    let stream = tokio::net::TcpStream::connect(server.http_addr())
        .await
        .expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::get("/ui/scope?type=namespace&scope=team")
        .header("host", "attacker.example:9090")
        .body(Empty::<hyper::body::Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status().as_u16(), 403);
    let policy = response
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(policy.contains("script-src 'self'"), "{policy}");
}

/// A console page as a browser on this machine asks for it, with `cookie`
/// when given: status and body.
async fn console_page(addr: SocketAddr, path: &str, cookie: Option<&str>) -> (u16, String) {
    let headers: Vec<(&str, &str)> = cookie.iter().map(|c| ("cookie", *c)).collect();
    let (status, _, body) = http_get_with(addr, path, &headers).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_out_is_offered_only_to_a_signed_in_visitor() {
    // Without tokens there is nothing to sign in to or out of.
    let open = TestServer::spawn(Backend::Sqlite).await;
    let (status, body) = console_page(open.http_addr(), "/ui", None).await;
    assert_eq!(status, 200);
    assert!(!body.contains("Sign out"), "{body}");
    let (status, _) = console_page(open.http_addr(), "/ui/login", None).await;
    assert_eq!(
        status, 303,
        "the sign-in page sends an open server's visitor on"
    );

    let token = "console-admin-token";
    let tokens = format!("{} acme admin", hash_token(token));
    let guarded = TestServer::spawn_with(Backend::Sqlite, |s| s.tokens = Some(tokens)).await;
    let (status, body) = console_page(guarded.http_addr(), "/ui/login", None).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("Sign in") && !body.contains("Sign out"),
        "{body}"
    );
    let cookie = format!("engram_token={token}");
    let (status, body) = console_page(guarded.http_addr(), "/ui", Some(&cookie)).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("<h1>Scopes</h1>") && body.contains("Sign out"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_narrows_by_source_and_user_and_keeps_the_form() {
    use crate::search::{append, episode, set};
    let server = TestServer::spawn(Backend::Sqlite).await;
    for (session, user) in [("chat-alice", "alice"), ("chat-bob", "bob")] {
        let said = episode(
            session,
            "message",
            "",
            json!(format!("{user} deploys with helm")),
        );
        server
            .episodes()
            .append_episodes(append(session, user, vec![said]))
            .await
            .expect("append");
    }
    server
        .memory()
        .set(set("ops", "deploy", json!("helm charts live here")))
        .await
        .expect("set");
    let addr = server.http_addr();

    let (status, everything) = console_page(addr, "/ui/search?q=helm", None).await;
    assert_eq!(status, 200);
    for found in ["chat-alice #1", "chat-bob #1", "ops / deploy"] {
        assert!(everything.contains(found), "{found}: {everything}");
    }

    let path = "/ui/search?q=helm&source=episodes&user=bob";
    let (status, narrowed) = console_page(addr, path, None).await;
    assert_eq!(status, 200);
    assert!(narrowed.contains("chat-bob #1"), "{narrowed}");
    assert!(!narrowed.contains("chat-alice"), "{narrowed}");
    assert!(!narrowed.contains("ops / deploy"), "{narrowed}");
    // The form holds what was asked, to change one part of it.
    assert!(
        narrowed.contains(r#"name="q" type="search" value="helm""#),
        "{narrowed}"
    );
    assert!(
        narrowed.contains(r#"<option value="episodes" selected>"#),
        "{narrowed}"
    );
    assert!(
        narrowed.contains(r#"name="user" value="bob""#),
        "{narrowed}"
    );

    // A source the API does not know is its refusal, with the reason.
    let (status, refused) = console_page(addr, "/ui/search?q=helm&source=files", None).await;
    assert_eq!(status, 400);
    assert!(refused.contains("INVALID_ARGUMENT"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_type_the_console_does_not_know_is_refused_by_name() {
    use crate::search::set;
    let server = TestServer::spawn(Backend::Sqlite).await;
    server
        .memory()
        .set(set("ops", "deploy", json!("helm")))
        .await
        .expect("set");
    let addr = server.http_addr();

    let (status, listed) = console_page(addr, "/ui/scope?type=namespace&scope=ops", None).await;
    assert_eq!(status, 200);
    assert!(listed.contains("deploy"), "{listed}");

    for path in [
        "/ui/scope?type=bogus&scope=ops",
        "/ui/key?type=bogus&scope=ops&key=deploy",
        "/ui/log?type=bogus&scope=ops",
        "/ui/export?type=bogus&scope=ops",
    ] {
        let (status, refused) = console_page(addr, path, None).await;
        assert_eq!(status, 400, "{path}");
        assert!(
            refused.contains(
                "unknown scope type &quot;bogus&quot;: one of namespace, flow, execution"
            ),
            "{path}: {refused}"
        );
    }
}

/// A query string or form the console cannot read is answered with its
/// refusal page, naming what was wrong, as a refused call is: not with the
/// web framework's plain-text rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_console_cannot_read_is_refused_on_its_page() {
    use http_body_util::{BodyExt, Full};
    let server = TestServer::spawn(Backend::Sqlite).await;
    let addr = server.http_addr();
    for (path, field) in [
        ("/ui/scope?scope=ops", "missing field `type`"),
        ("/ui/key?type=namespace&scope=ops", "missing field `key`"),
        ("/ui/session", "missing field `id`"),
    ] {
        let (status, refused) = console_page(addr, path, None).await;
        assert_eq!(status, 400, "{path}");
        assert!(refused.starts_with("<!DOCTYPE html>"), "{path}: {refused}");
        assert!(
            refused.contains("<code>INVALID_ARGUMENT</code>"),
            "{path}: {refused}"
        );
        assert!(refused.contains(field), "{path}: {refused}");
    }

    // A form posted as JSON is of a type the console does not read.
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post("/ui/scope/purge")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(hyper::body::Bytes::from_static(b"{}")))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    assert_eq!(response.status().as_u16(), 415);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("<code>INVALID_ARGUMENT</code>"), "{body}");
    assert!(body.contains("application/x-www-form-urlencoded"), "{body}");
}

/// A key with more versions than the page shows: the page shows the
/// newest, a tombstone too, and the diff is between the newest two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_history_shows_its_newest_versions() {
    use engram::proto::DeleteRequest;

    use crate::search::set;
    const VERSIONS: i64 = 1005;
    let server = TestServer::spawn_with(Backend::Sqlite, |s| {
        s.sqlite_synchronous = Some(engram::store::SqliteSynchronous::Normal);
    })
    .await;
    let mut memory = server.memory();
    for n in 1..=VERSIONS {
        memory
            .set(set("ops", "counter", json!(n)))
            .await
            .expect("set");
    }
    let addr = server.http_addr();
    let path = "/ui/key?type=namespace&scope=ops&key=counter";
    let (status, page) = console_page(addr, path, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Changes from version 1004 to version 1005"),
        "the diff is between the newest two"
    );
    assert!(page.contains(r#"<option value="1005" selected>"#));
    assert!(
        !page.contains(r#"<option value="5">"#),
        "the oldest are left out"
    );
    // A version outside them, chosen through the URL, is read by itself.
    let (status, page) = console_page(addr, &format!("{path}&a=3"), None).await;
    assert_eq!(status, 200);
    assert!(page.contains("Changes from version 3 to version 1005"));
    assert!(page.contains(r#"<option value="3" selected>"#));
    assert!(
        page.contains("<del>- 3\n</del>") && page.contains("<ins>+ 1005\n</ins>"),
        "{page}"
    );
    let (status, page) = console_page(addr, &format!("{path}&a=2000"), None).await;
    assert_eq!(status, 200);
    assert!(page.contains("(there is no version 2000)"), "{page}");

    memory
        .delete(DeleteRequest {
            scope_type: engram::proto::ScopeType::Namespace as i32,
            scope: "ops".into(),
            key: "counter".into(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    let (status, page) = console_page(addr, path, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Changes from version 1005 to version 1006"),
        "a deleted key shows its tombstone last"
    );
}
