//! A History stream of 100k versions (about 100 MB of values) completes in
//! order while the server's resident memory stays flat: it reads a batch at
//! a time and only as fast as the client consumes.

use engram::ports::Database;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{HistoryRequest, ScopeType};

use crate::helpers::{Backend, ChildServer, TestDb, connect};
use crate::on_both_stores;

const VERSIONS: i64 = 100_000;
const LOAD_CHUNK: usize = 2_000;

/// Writes the versions straight into the tables: the test is about reading.
async fn load_history(db: &TestDb) {
    match db.backend {
        Backend::Sqlite => {
            db.sqlite_store().await.migrate().await.expect("migrate");
            let pool = engram::store::SqliteStore::direct_pool(&db.url)
                .await
                .expect("pool");
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
                 INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, create_time) \
                 SELECT 'default', 1, 'big', 'history', i, \
                 '\"' || replace(hex(zeroblob(500)), '0', 'x') || i || '\"', 0, i FROM n",
            )
            .bind(VERSIONS)
            .execute(&pool)
            .await
            .expect("load versions");
            sqlx::query(
                "INSERT INTO memory_heads VALUES ('default', 1, 'big', 'history', ?1, 0, 0)",
            )
            .bind(VERSIONS)
            .execute(&pool)
            .await
            .expect("load head");
            pool.close().await;
        }
        Backend::Postgres => {
            db.pg_store().await.migrate().await.expect("migrate");
            let pool = sqlx::PgPool::connect(&db.url).await.expect("pool");
            // In chunks, each its own transaction: transaction ids are
            // cluster-wide, and one long load would hold back the horizon
            // (tails, the scheduler) of every other test's database.
            for start in (1..=VERSIONS).step_by(LOAD_CHUNK) {
                sqlx::query(
                    "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, create_time) \
                     SELECT 'default', 1, 'big', 'history', i, to_jsonb(repeat('x', 1000) || i), false, now() \
                     FROM generate_series($1::bigint, $2::bigint) AS i",
                )
                .bind(start)
                .bind((start + LOAD_CHUNK as i64 - 1).min(VERSIONS))
                .execute(&pool)
                .await
                .expect("load versions");
            }
            sqlx::query("INSERT INTO memory_heads VALUES ('default', 1, 'big', 'history', $1, false, now())")
                .bind(VERSIONS)
                .execute(&pool)
                .await
                .expect("load head");
            pool.close().await;
        }
    }
}

async fn history_of_100k_versions_in_flat_memory(backend: Backend) {
    let db = TestDb::new(backend).await;
    load_history(&db).await;
    let server = ChildServer::spawn(&[], &[("ENGRAM_DATABASE_URL", &db.url)], None).await;
    let mut client = MemoryServiceClient::new(connect(server.grpc_addr).await);
    let request = |from_version| HistoryRequest {
        scope_type: ScopeType::Namespace as i32,
        scope: "big".to_owned(),
        key: "history".to_owned(),
        from_version,
    };

    // Warm up the code paths and pools, then take the baseline.
    let mut warm = client
        .history(request(VERSIONS - 2000))
        .await
        .expect("warm-up")
        .into_inner();
    while warm.message().await.expect("item").is_some() {}
    let baseline = server.memory_kib("VmRSS");

    let mut stream = client
        .history(request(0))
        .await
        .expect("history")
        .into_inner();
    let mut expected = 1;
    let mut bytes = 0usize;
    let mut peak = baseline;
    while let Some(item) = stream.message().await.expect("item") {
        let entry = item.entry.expect("entry");
        assert_eq!(
            entry.version, expected,
            "oldest first, no gap, no duplicate"
        );
        if let Some(prost_types::value::Kind::StringValue(s)) = entry.value.and_then(|v| v.kind) {
            bytes += s.len();
        }
        expected += 1;
        if expected % 5000 == 0 {
            peak = peak.max(server.memory_kib("VmRSS"));
        }
    }
    assert_eq!(expected - 1, VERSIONS);
    peak = peak.max(server.memory_kib("VmRSS"));
    let growth_mib = peak.saturating_sub(baseline) / 1024;
    let streamed_mib = bytes / (1024 * 1024);
    println!(
        "history: {VERSIONS} versions, {streamed_mib} MiB of values, server RSS {baseline} KiB -> peak {peak} KiB"
    );
    assert!(
        streamed_mib >= 90,
        "the stream carried the values ({streamed_mib} MiB)"
    );
    assert!(
        growth_mib < 40,
        "server RSS grew by {growth_mib} MiB while streaming {streamed_mib} MiB"
    );
    let status = server.terminate().await;
    assert!(
        status.success(),
        "engram exits cleanly on SIGTERM: {status}"
    );
}

on_both_stores!(history_of_100k_versions_in_flat_memory);
