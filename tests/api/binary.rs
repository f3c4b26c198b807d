//! The `engram` binary as a user runs it: the embedded default store made
//! on first start, `engram migrate`, `--migrate=off`, a config file, and a
//! graceful exit on SIGTERM.

use engram::api::convert::json_to_proto;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{GetRequest, ScopeType, SetRequest};
use serde_json::json;

use crate::helpers::{Backend, ChildServer, TestDb, connect, statement_spans};
use crate::on_both_stores;

fn engram(args: &[&str]) -> std::process::Output {
    engram_with(args, &[])
}

/// [`engram`] with these environment variables set.
fn engram_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(args)
        .env_remove("ENGRAM_DATABASE_URL")
        .envs(env.iter().copied())
        .output()
        .expect("run engram")
}

/// The embedded store is served by one process: a second `engram serve`
/// on the same file refuses to start, saying why, instead of running
/// beside the first and missing its writes in tails and watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_refuses_to_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = ChildServer::spawn(&[], &[], Some(dir.path())).await;
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("serve")
        .env("ENGRAM_GRPC_ADDR", "127.0.0.1:0")
        .env("ENGRAM_HTTP_ADDR", "127.0.0.1:0")
        .env_remove("ENGRAM_DATABASE_URL")
        .current_dir(dir.path())
        .output()
        .expect("run a second engram serve");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    assert!(
        stderr.contains("another engram server is already serving"),
        "{stderr}"
    );
    // Once the first stops, the file can be served again.
    let status = first.terminate().await;
    assert!(status.success(), "exit status {status}");
    let again = ChildServer::spawn(&[], &[], Some(dir.path())).await;
    again.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_creates_the_embedded_store_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    // sqlx's statements logged, each inside its RPC's span.
    let logged = [("ENGRAM_LOG", "info,sqlx=debug")];
    let server = ChildServer::spawn(&[], &logged, Some(dir.path())).await;
    assert!(
        dir.path().join("engram.db").exists(),
        "sqlite://engram.db is the default"
    );
    let mut client = MemoryServiceClient::new(connect(server.grpc_addr).await);
    let request = SetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "first".to_owned(),
        key: "run".to_owned(),
        value: Some(json_to_proto(&json!("works"))),
        ..SetRequest::default()
    };
    client.set(request).await.expect("set");
    let read = GetRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "first".to_owned(),
        key: "run".to_owned(),
        version: 0,
        as_of: None,
    };
    client.get(read.clone()).await.expect("get");
    let lines = server.stderr.clone();
    let status = server.terminate().await;
    assert!(status.success(), "exit status {status}");
    let lines = lines.lock().expect("lines").join("\n");
    assert!(
        lines.contains("engram stopped"),
        "logs say it stopped: {lines}"
    );
    // The RPC's span names the method once, and (no traces exported)
    // holds nothing else. (The set's statements run in the writer's
    // task, outside it.)
    assert!(
        statement_spans(&lines)
            .contains(&json!({"name": "rpc", "method": "/engram.v1.MemoryService/Get"})),
        "a statement in the Get's span: {lines}"
    );

    // The data is still there for the next start.
    let again = ChildServer::spawn(&[], &[], Some(dir.path())).await;
    let mut client = MemoryServiceClient::new(connect(again.grpc_addr).await);
    let read = client
        .get(read)
        .await
        .expect("get after restart")
        .into_inner();
    assert_eq!(read.entry.expect("entry").version, 1);
    assert!(again.terminate().await.success());
}

/// With a shutdown delay, SIGTERM first takes the server out of rotation
/// (health NOT_SERVING, `/readyz` 503) while it goes on accepting
/// connections and serving calls, since Kubernetes signals a pod while its
/// endpoints are still being removed; a second signal ends the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_delay_drains_before_it_stops() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    use crate::outage::{assert_not_ready_but_alive, http_status, wait_for};

    let dir = tempfile::tempdir().expect("temp dir");
    // Longer than the test may take: only the second signal ends it.
    let delay = [("ENGRAM_SHUTDOWN_DELAY_SECS", "3600")];
    let server = ChildServer::spawn(&[], &delay, Some(dir.path())).await;
    let mut health = HealthClient::new(connect(server.grpc_addr).await);
    let mut updates = health
        .watch(HealthCheckRequest::default())
        .await
        .expect("health watch")
        .into_inner();
    wait_for(&mut updates, ServingStatus::Serving).await;
    assert_eq!(http_status(server.http_addr(), "/readyz").await, 200);

    server.send_term();
    wait_for(&mut updates, ServingStatus::NotServing).await;
    assert_not_ready_but_alive(&mut health, server.http_addr()).await;
    // A connection made now is accepted, and its calls served.
    let mut late = MemoryServiceClient::new(connect(server.grpc_addr).await);
    let written = late
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "draining".to_owned(),
            key: "k".to_owned(),
            value: Some(json_to_proto(&json!("still served"))),
            ..SetRequest::default()
        })
        .await
        .expect("a call while draining")
        .into_inner();
    assert_eq!(written.entry.expect("entry").version, 1);

    drop(updates);
    let lines = server.stderr.clone();
    let status = server.terminate().await;
    assert!(status.success(), "exit status {status}");
    let lines = lines.lock().expect("lines").join("\n");
    assert!(lines.contains("draining"), "{lines}");
    assert!(lines.contains("engram stopped"), "{lines}");
}

/// `engram health`, a container's HEALTHCHECK: exit 0 while the server is
/// ready, 1 once it drains (`--live` still 0) and when nothing answers; a
/// wildcard address, as the image sets, is asked on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_for_a_container_healthcheck() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    use crate::outage::wait_for;

    let dir = tempfile::tempdir().expect("temp dir");
    let delay = [("ENGRAM_SHUTDOWN_DELAY_SECS", "3600")];
    let server = ChildServer::spawn(&[], &delay, Some(dir.path())).await;
    let http = server.http_addr();
    let wildcard = format!("0.0.0.0:{}", http.port());
    let health = |args: &[&str]| {
        let out = engram(&[&["health"], args].concat());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    };
    let address = http.to_string();
    assert_eq!(health(&["--http-addr", &address]).0, Some(0));
    assert_eq!(health(&["--http-addr", &address]).1, "ready");
    assert_eq!(health(&["--http-addr", &wildcard]).1, "ready");
    assert_eq!(health(&["--http-addr", &address, "--live"]).1, "ok");

    let mut updates = HealthClient::new(connect(server.grpc_addr).await)
        .watch(HealthCheckRequest::default())
        .await
        .expect("health watch")
        .into_inner();
    server.send_term();
    wait_for(&mut updates, ServingStatus::NotServing).await;
    let (code, _, stderr) = health(&["--http-addr", &address]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("not ready (503): shutting down"),
        "{stderr}"
    );
    assert_eq!(health(&["--http-addr", &address, "--live"]).0, Some(0));

    // A health watch is a stream that never ends: closed, shutdown need
    // not wait out its grace for it.
    drop(updates);
    assert!(server.terminate().await.success());
    let (code, _, stderr) = health(&["--http-addr", &address]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot ask"), "{stderr}");
}

/// A Postgres database in an encoding other than UTF8 is refused before
/// any migration runs, by `engram migrate` and by `serve` with and
/// without migrating, saying why and what to do. (It failed deep in
/// migration 0031: "conversion between UTF8 and SQL_ASCII is not
/// supported".)
#[tokio::test]
async fn a_database_not_in_utf8_is_refused_saying_why() {
    let db = TestDb::postgres_in_encoding("SQL_ASCII").await;
    let addresses = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
    let runs: [Vec<&str>; 3] = [
        vec!["migrate", "--database-url", &db.url],
        [&["serve", "--database-url", &db.url][..], &addresses].concat(),
        [
            &["serve", "--migrate", "off", "--database-url", &db.url][..],
            &addresses,
        ]
        .concat(),
    ];
    for args in runs {
        let out = engram(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the database's encoding is SQL_ASCII, and Engram needs UTF8")
                && stderr.contains("ENCODING 'UTF8'"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("conversion"), "{args:?}: {stderr}");
    }
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            .fetch_one(&mut conn)
            .await
            .expect("tables");
    assert_eq!(tables, 0, "nothing was migrated");
}

async fn migrate_then_serve_with_migrations_off(backend: Backend) {
    let fresh = TestDb::new(backend).await;
    // A server that may not migrate refuses an empty database, saying why.
    let refused = engram(&["serve", "--migrate", "off", "--database-url", &fresh.url]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("engram migrate"),
        "tells the user what to run: {stderr}"
    );
    assert_eq!(
        stderr.matches("engram migrate").count(),
        1,
        "said once, not logged and printed: {stderr}"
    );
    assert!(!stderr.contains("password"), "{stderr}");

    // With every statement logged, as a slow one would be.
    let migrated = engram_with(
        &["migrate", "--database-url", &fresh.url],
        &[("ENGRAM_LOG", "info,sqlx=debug")],
    );
    let said = String::from_utf8_lossy(&migrated.stderr);
    assert!(migrated.status.success(), "{said}");
    // It says which migrations it applies, and not their SQL: a migration
    // that runs long would otherwise be printed whole as a slow statement.
    assert!(
        said.contains("applying migrations") && said.contains("0001 memory"),
        "{said}"
    );
    assert!(said.contains("DEBUG"), "sqlx logs: {said}");
    // Text logs into a pipe carry no terminal colour codes.
    assert!(!said.contains('\u{1b}'), "escape codes in a pipe: {said:?}");
    assert!(!said.contains("CREATE TABLE"), "{said}");
    // Running it again is a no-op, and says nothing of applying.
    let again = engram(&["migrate", "--database-url", &fresh.url]);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{said}");
    assert!(!said.contains("applying migrations"), "{said}");

    // The same settings from a config file.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("engram.toml");
    std::fs::write(
        &config,
        format!("database_url = \"{}\"\nmigrate = \"off\"\n", fresh.url),
    )
    .expect("write config");
    let server = ChildServer::spawn(
        &["--config", config.to_str().expect("utf-8 path")],
        &[],
        None,
    )
    .await;
    assert!(server.terminate().await.success());
}

#[test]
fn bad_configuration_is_refused_with_a_clear_message() {
    let out = engram(&["serve", "--database-url", "mysql://nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sqlite:// or postgres://"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("engram.toml");
    std::fs::write(&config, "databse_url = \"typo\"\n").expect("write config");
    let out = engram(&["serve", "--config", config.to_str().expect("utf-8 path")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field"));
    let help = engram(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--database-url",
        "--grpc-addr",
        "--http-addr",
        "--migrate",
        "--max-value-bytes",
        "ENGRAM_DATABASE_URL",
    ] {
        assert!(help.contains(flag), "serve --help documents {flag}");
    }
}

/// `engram mcp` takes how to reach the server and nothing about printing:
/// it prints no results of its own (standard output carries the protocol).
#[test]
fn mcp_help_offers_the_connection_flags_only() {
    let out = engram(&["mcp", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--server", "--token", "--ca-cert", "--client-cert"] {
        assert!(help.contains(flag), "mcp --help documents {flag}");
    }
    for flag in ["--output", "--json"] {
        assert!(!help.contains(flag), "mcp --help offers {flag}:\n{help}");
    }
    let out = engram(&["mcp", "--json"]);
    assert_eq!(out.status.code(), Some(2), "--json is a usage error");
}

/// A client command's own flags come first, then the shared ones under
/// headings of their own, so they do not interleave with the command's.
#[test]
fn client_help_groups_the_shared_flags() {
    let out = engram(&["episodes", "append", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let at = |needle: &str| {
        help.find(needle)
            .unwrap_or_else(|| panic!("{needle} missing from:\n{help}"))
    };
    assert!(at("--metadata") < at("Connection:"), "{help}");
    assert!(at("Connection:") < at("--server") && at("--server") < at("Output:"));
    assert!(at("Output:") < at("--output") && at("--output") < at("--json"));
}

/// A database a later release migrated (a migration this binary does not
/// know is applied) is served as it is: `engram migrate` and `serve`
/// start, saying so, instead of refusing the unknown migration. A rolling
/// upgrade's old replicas restart this way, as each migration keeps the
/// release before it working.
async fn a_database_migrated_by_a_later_release_is_served(backend: Backend) {
    let db = TestDb::new(backend).await;
    assert!(
        engram(&["migrate", "--database-url", &db.url])
            .status
            .success()
    );
    let checksum = match backend {
        Backend::Sqlite => "X'00'",
        Backend::Postgres => "'\\x00'::bytea",
    };
    db.execute(format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
         execution_time) VALUES (99999, 'from a later release', true, {checksum}, 0)"
    ))
    .await;
    let checked = engram(&["migrate", "--check", "--database-url", &db.url]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert_eq!(checked.status.code(), Some(0), "nothing to apply: {stdout}");
    assert!(
        stdout.contains("ahead: a later release migrated it (to 99999"),
        "{stdout}"
    );
    let migrated = engram(&["migrate", "--database-url", &db.url]);
    let stderr = String::from_utf8_lossy(&migrated.stderr);
    assert!(migrated.status.success(), "{stderr}");
    assert!(stderr.contains("newer than this release"), "{stderr}");
    let server = ChildServer::spawn(&["--database-url", &db.url], &[], None).await;
    assert!(server.terminate().await.success());
}

/// `engram migrate --check` says what an upgrade would apply, applying
/// nothing: exit 2 while migrations are pending (each listed, in order),
/// 0 once none is; an SQLite file that does not exist is not made.
async fn migrate_check_lists_what_is_pending_and_applies_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let check = || {
        let out = engram(&["migrate", "--check", "--database-url", &db.url]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), stdout)
    };
    let (code, fresh) = check();
    assert_eq!(code, Some(2), "{fresh}");
    assert!(fresh.contains("applied: none"), "{fresh}");
    let listed: Vec<&str> = fresh
        .lines()
        .filter_map(|line| line.strip_prefix("  "))
        .collect();
    assert_eq!(listed.first().copied(), Some("0001 memory"), "{fresh}");
    assert!(
        fresh.contains(&format!("pending: {} (", listed.len())),
        "{fresh}"
    );
    if backend == Backend::Sqlite {
        let file = db.url.trim_start_matches("sqlite://");
        assert!(
            !std::path::Path::new(file).exists(),
            "the check made {file}"
        );
    }

    // An older release's schema: the first three applied.
    use engram::ports::Database;
    match backend {
        Backend::Sqlite => db.sqlite_store().await.migrate_through(Some(3)).await,
        Backend::Postgres => db.pg_store().await.migrate_through(Some(3)).await,
    }
    .expect("migrate through 0003");
    let (code, older) = check();
    assert_eq!(code, Some(2), "{older}");
    assert!(
        older.contains("applied: 3 migrations, the newest 0003"),
        "{older}"
    );
    assert!(
        older.contains(&format!("pending: {} (", listed.len() - 3)),
        "{older}"
    );
    assert!(older.contains("\n  0004 "), "{older}");
    assert!(!older.contains("\n  0003 "), "{older}");
    assert_eq!(check(), (Some(2), older), "the check applied nothing");
    // The same report for a script, with the same exit code.
    let out = engram(&["migrate", "--check", "--json", "--database-url", &db.url]);
    assert_eq!(out.status.code(), Some(2));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        (
            &report["applied"],
            &report["newest_applied"],
            &report["ahead"]
        ),
        (&json!(3), &json!(3), &json!(null)),
        "{report}"
    );
    let pending = report["pending"].as_array().expect("pending");
    assert_eq!(pending.len(), listed.len() - 3, "{report}");
    assert_eq!(pending[0]["version"], json!(4), "{report}");
    assert_eq!(
        report["newest_known"],
        pending[pending.len() - 1]["version"],
        "{report}"
    );
    let refused = engram(&["migrate", "--json", "--database-url", &db.url]);
    assert_eq!(refused.status.code(), Some(2), "--json without --check");

    assert!(
        engram(&["migrate", "--database-url", &db.url])
            .status
            .success()
    );
    let (code, current) = check();
    assert_eq!(code, Some(0), "{current}");
    assert!(
        current.contains("pending: none, the schema is current"),
        "{current}"
    );
    // A database that cannot be reached is an error, not "pending".
    let (unreachable, _) = {
        let out = engram(&[
            "migrate",
            "--check",
            "--database-url",
            "postgres://nobody@127.0.0.1:1/none",
        ]);
        (out.status.code(), out.stderr)
    };
    assert_eq!(unreachable, Some(1));
}

on_both_stores!(
    migrate_then_serve_with_migrations_off,
    a_database_migrated_by_a_later_release_is_served,
    migrate_check_lists_what_is_pending_and_applies_nothing
);

/// `engram token new` makes a token whose line a server accepts; the CLI
/// calls with `--token` (or `ENGRAM_TOKEN`) and is refused without it
/// (exit code 6). A non-loopback bind without tokens does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_the_cli_to_the_server() {
    // `--json` is `--output json`.
    let out = engram(&["token", "new", "--tenant", "acme", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let token = made["token"].as_str().expect("token").to_owned();
    let line = made["line"].as_str().expect("line").to_owned();
    assert_eq!(
        line,
        format!("{} acme", made["sha256"].as_str().expect("hash"))
    );
    assert!(!line.contains(&token), "the line holds only the hash");
    // A tenant the tokens file could not hold is refused as a tenant.
    for bad in ["two words", "a#b", ""] {
        let out = engram(&["token", "new", "--tenant", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("--tenant {bad:?} must be 1 to 63 ASCII letters")),
            "{stderr}"
        );
    }

    let mut hash = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["token", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run engram token hash");
    use std::io::Write;
    hash.stdin
        .take()
        .expect("stdin")
        .write_all(format!("{token}\n").as_bytes())
        .expect("write token");
    let hashed = hash.wait_with_output().expect("hash output");
    assert_eq!(
        String::from_utf8_lossy(&hashed.stdout).trim(),
        made["sha256"].as_str().expect("hash")
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# acme's agents\n{line}\n")).expect("write tokens");
    let url = format!("sqlite://{}", dir.path().join("e.db").display());
    let server = ChildServer::spawn(
        &["--tokens-file", tokens.to_str().expect("utf-8 path")],
        &[("ENGRAM_DATABASE_URL", &url)],
        None,
    )
    .await;
    let address = format!("http://{}", server.grpc_addr);
    let cli = |extra: &[&str], env_token: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
        command
            .args(["memory", "--server", &address, "--output", "json"])
            .args(["set", "k", "1", "--scope", "s", "--scope-type", "namespace"])
            .args(extra)
            .env_remove("ENGRAM_TOKEN");
        if let Some(token) = env_token {
            command.env("ENGRAM_TOKEN", token);
        }
        command.output().expect("run engram memory")
    };
    let refused = cli(&[], None);
    assert_eq!(refused.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("TOKEN_MISSING"));
    let wrong = cli(&["--token", "eg_wrong"], None);
    assert_eq!(wrong.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("TOKEN_INVALID"));
    assert!(cli(&["--token", &token], None).status.success());
    assert!(cli(&[], Some(&token)).status.success());
    assert!(server.terminate().await.success());

    let out = engram(&["serve", "--database-url", &url, "--grpc-addr", "0.0.0.0:0"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ENGRAM_AUTH=none"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
