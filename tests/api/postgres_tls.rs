//! Postgres over TLS, as managed services run it: the URL asks for
//! `sslmode=verify-full` with the service's CA in `sslrootcert`. Every
//! connection the server holds is encrypted; a certificate of another CA,
//! or a CA file that is not there, is refused at start, saying why.
//!
//! The test Postgres serves a certificate of a throwaway CA whose file
//! `ENGRAM_TEST_PG_CA` names (`scripts/test` makes both).

use engram::api::convert::json_to_proto;
use engram::config::Config;
use engram::proto::{GetRequest, ScopeType, SetRequest};
use serde_json::json;

use crate::helpers::{Backend, TestDb, TestServer, test_settings};

fn test_ca() -> String {
    std::env::var("ENGRAM_TEST_PG_CA").expect(
        "ENGRAM_TEST_PG_CA must name the CA certificate of the test Postgres's TLS \
         certificate (scripts/test makes both)",
    )
}

/// `url` asking for TLS verified against the CA in the file `ca`.
fn verified(url: &str, ca: &str) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}sslmode=verify-full&sslrootcert={ca}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reaches_postgres_over_verified_tls() {
    let db = TestDb::new(Backend::Postgres).await;
    let url = verified(&db.url, &test_ca());
    let server = TestServer::start(db, |s| s.database_url = Some(url)).await;
    let mut memory = server.memory();
    memory
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "tls".to_owned(),
            key: "k".to_owned(),
            value: Some(json_to_proto(&json!("over TLS"))),
            ..SetRequest::default()
        })
        .await
        .expect("a write over TLS");
    let read = memory
        .get(GetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "tls".to_owned(),
            key: "k".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("a read over TLS")
        .into_inner();
    assert_eq!(read.entry.expect("entry").version, 1);

    let mut check = server
        .db_connection("to look at the server's sessions")
        .await;
    let (sessions, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = current_database() AND a.application_name = 'engram'",
    )
    .fetch_one(&mut check)
    .await
    .expect("read pg_stat_ssl");
    assert!(sessions > 0, "the server holds connections");
    assert_eq!(encrypted, sessions, "every connection of the server is TLS");
}

#[tokio::test]
async fn a_certificate_of_another_ca_or_a_missing_ca_file_is_refused_saying_why() {
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let other = rcgen::CertificateParams::new(Vec::<String>::new())
        .expect("params")
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("another CA");
    let other_ca = dir.path().join("other-ca.crt");
    std::fs::write(&other_ca, other.pem()).expect("write the other CA");

    let start = |url: String| async move {
        let config = Config::resolve(test_settings(&url)).expect("config");
        match engram::server::start(config).await {
            Ok(server) => {
                server.shutdown();
                panic!("a server started on {url}");
            }
            Err(err) => format!("{err:#}"),
        }
    };
    let refused = start(verified(&db.url, &other_ca.display().to_string())).await;
    assert!(
        refused.contains("certificate") && refused.contains("UnknownIssuer"),
        "{refused}"
    );
    let missing = dir.path().join("no-such-ca.crt").display().to_string();
    let refused = start(verified(&db.url, &missing)).await;
    assert!(
        refused.contains(&format!("cannot read sslrootcert {missing}")),
        "{refused}"
    );
}
