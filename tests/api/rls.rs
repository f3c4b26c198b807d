//! Row-level security on Postgres, the second wall behind the tenant
//! filters: the server runs as an ordinary role that does not own the
//! tables, and Postgres itself, queried directly as that role, shows a
//! tenant's transaction nothing of another tenant's rows, and refuses a row
//! written for another tenant.

use engram::api::convert::json_to_proto;
use engram::auth::hash_token;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{AppendEpisodeRequest, GetRequest, NewEpisode, ScopeType, SetRequest};
use serde_json::json;
use sqlx::{Connection, PgConnection, Row};

use crate::helpers::{
    APP_ROLE, Backend, Metadata, TestDb, as_user, connect, create_app_role, test_settings,
};

const NS: i32 = ScopeType::Namespace as i32;

fn set(key: &str, value: &str) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: "shared".into(),
        key: key.into(),
        value: Some(json_to_proto(&json!(value))),
        ..SetRequest::default()
    }
}

/// The tenants of the rows a transaction with `engram.tenant` set (or
/// not) sees in a table.
async fn tenants_seen(app: &mut PgConnection, tenant: Option<&str>, table: &str) -> Vec<String> {
    let mut tx = app.begin().await.expect("begin");
    if let Some(tenant) = tenant {
        sqlx::query("SELECT set_config('engram.tenant', $1, true)")
            .bind(tenant)
            .execute(&mut *tx)
            .await
            .expect("set tenant");
    }
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT tenant FROM {table} ORDER BY tenant"
    )))
    .fetch_all(&mut *tx)
    .await
    .expect("select");
    rows.iter().map(|r| r.get::<String, _>(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_confines_each_transaction_to_its_tenant() {
    let db = TestDb::new(Backend::Postgres).await;
    // The owner (the test's superuser) migrates and grants the app role
    // the use of the tables, as the Helm chart's migration Job does.
    let mut owner = PgConnection::connect(&db.url).await.expect("owner");
    create_app_role(&mut owner).await;
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["migrate", "--database-url", &db.url, "--grant-to", APP_ROLE])
        .output()
        .expect("run engram migrate");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "migrate",
            "--database-url",
            &db.url,
            "--grant-to",
            "Robert'); DROP",
        ])
        .output()
        .expect("run engram migrate");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("role name"));

    let app_url = as_user(&db.url, APP_ROLE);
    let mut settings = test_settings(&app_url);
    settings.migrate = Some(engram::config::MigrateMode::Off);
    settings.tokens = Some(format!(
        "{} acme; {} globex",
        hash_token("acme-token"),
        hash_token("globex-token")
    ));
    let server = engram::server::start(engram::config::Config::resolve(settings).expect("config"))
        .await
        .expect("the server starts as the app role");
    let channel = connect(server.grpc_addr).await;
    let bearer = |token: &str| Metadata::new(&[("authorization", &format!("Bearer {token}"))]);
    let mut acme = MemoryServiceClient::with_interceptor(channel.clone(), bearer("acme-token"));
    let mut globex = MemoryServiceClient::with_interceptor(channel.clone(), bearer("globex-token"));

    // The server works under row-level security: writes, reads, appends.
    acme.set(set("plan", "acme's")).await.expect("acme sets");
    globex
        .set(set("plan", "globex's"))
        .await
        .expect("globex sets");
    let read = acme
        .get(GetRequest {
            scope_type: NS,
            scope: "shared".into(),
            key: "plan".into(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("acme reads")
        .into_inner();
    assert_eq!(
        read.entry.and_then(|e| e.value),
        Some(json_to_proto(&json!("acme's")))
    );
    EpisodeServiceClient::with_interceptor(channel.clone(), bearer("acme-token"))
        .append_episode(AppendEpisodeRequest {
            session_id: "s1".into(),
            app: "app".into(),
            user: "u".into(),
            episode: Some(NewEpisode {
                id: "e1".into(),
                r#type: "observation".into(),
                content: Some(json_to_proto(&json!("hello"))),
                ..NewEpisode::default()
            }),
            require_session: false,
        })
        .await
        .expect("acme appends");

    // Postgres itself, as the app role.
    let mut app = PgConnection::connect(&app_url).await.expect("app role");
    for table in ["memory_heads", "memory_versions", "memory_changes"] {
        assert_eq!(
            tenants_seen(&mut app, Some("globex"), table).await,
            ["globex"],
            "{table} as globex"
        );
        assert_eq!(
            tenants_seen(&mut app, Some("acme"), table).await,
            ["acme"],
            "{table} as acme"
        );
        assert!(
            tenants_seen(&mut app, None, table).await.is_empty(),
            "{table} with no tenant set"
        );
        assert_eq!(
            tenants_seen(&mut app, Some("*"), table).await,
            ["acme", "globex"],
            "{table} for the server's own cross-tenant work"
        );
    }
    for table in ["sessions", "episodes"] {
        assert!(
            tenants_seen(&mut app, Some("globex"), table)
                .await
                .is_empty()
        );
        assert_eq!(tenants_seen(&mut app, Some("acme"), table).await, ["acme"]);
    }

    // A row for another tenant is refused, not just hidden.
    let mut tx = app.begin().await.expect("begin");
    sqlx::query("SELECT set_config('engram.tenant', 'globex', true)")
        .execute(&mut *tx)
        .await
        .expect("set tenant");
    let err = sqlx::query(
        "INSERT INTO working_memory (tenant, session_id, goal, update_time) \
         VALUES ('acme', 's1', 'planted', now())",
    )
    .execute(&mut *tx)
    .await
    .expect_err("row-level security refuses it");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("42501"),
        "{err}"
    );
    drop(tx);

    // Every tenant table forces its policy, and the app role owns none.
    let rows = sqlx::query(
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity, pg_get_userbyid(c.relowner) \
         FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant' \
         WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace",
    )
    .fetch_all(&mut owner)
    .await
    .expect("catalog");
    assert_eq!(rows.len(), 21, "every table with a tenant column");
    for row in rows {
        let table: String = row.get(0);
        assert!(
            row.get::<bool, _>(1) && row.get::<bool, _>(2),
            "{table} forces RLS"
        );
        assert_ne!(
            row.get::<String, _>(3),
            APP_ROLE,
            "{table} is not the app role's"
        );
    }

    // A call's rows live together: every key of a tenant table leads with
    // the tenant, as sharding by tenant needs (README, "Past one
    // Postgres"), but for the two tables keyed by a database-wide position.
    let keys = sqlx::query(
        "SELECT c.conrelid::regclass::text, c.contype::text, a.attname::text \
         FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid \
           AND a.attnum = c.conkey[1] \
         WHERE c.contype IN ('p', 'f') AND c.connamespace = 'public'::regnamespace \
         AND EXISTS (SELECT 1 FROM pg_attribute t WHERE t.attrelid = c.conrelid \
           AND t.attname = 'tenant') \
         ORDER BY 1, 2",
    )
    .fetch_all(&mut owner)
    .await
    .expect("catalog");
    let mut global = Vec::new();
    for row in &keys {
        let (table, kind, first): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        if first != "tenant" {
            global.push(format!("{table} {kind} {first}"));
        }
    }
    assert_eq!(
        global,
        ["embedding_outbox p id", "memory_changes p revision"],
        "keys that do not lead with the tenant"
    );
    assert!(keys.len() > 20, "{} keys read", keys.len());

    server.shutdown();
    server.wait().await.expect("stops");
}
