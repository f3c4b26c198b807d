//! What the bench's appends wrote, removed when a run that appends ends
//! (unless `--keep-appended`), earlier runs' included: the sessions
//! `append` and `tail` wrote through the server, deleted through it as a
//! user's would be, and those the baseline wrote straight to the database,
//! deleted there. The keys `set` writes stay: there are 10,000,
//! `get` reads them, and the versions each run adds are not read.
//!
//! Left in the store, every run's 1 KB appends (35,000–60,000 a run here)
//! lengthened the index lists each later `search` reads: a bench database
//! that had collected 463,569 of them searched at 732–882 ops/s against
//! 909–1,027 for the loaded episodes alone. On Postgres the episodes'
//! table is vacuumed afterwards, where the bench knows the database (it
//! started the server on it, or ran the baseline on it): a search still
//! reads the deleted rows' index entries until it is, and autovacuum waits
//! for a fifth of the table to be dead.

use crate::proto;
use crate::proto::session_service_client::SessionServiceClient;

use super::baseline::{INPROC_APP, RAW_APP};
use super::workloads::{APPEND_APP, TAIL_APP, Target, channel};

/// The apps of the sessions the bench's own workloads append to.
const WRITTEN_APPS: [&str; 2] = [APPEND_APP, TAIL_APP];

/// The apps of the sessions the baseline appends to: pgbench on Postgres,
/// the store in-process on SQLite.
const BASELINE_APPS: [&str; 2] = [RAW_APP, INPROC_APP];

/// Deletes the sessions of [`WRITTEN_APPS`] through the server and, given
/// the database, those of [`BASELINE_APPS`] in it; returns the episodes
/// deleted.
pub async fn remove_written(target: &Target, database_url: Option<&str>) -> anyhow::Result<u64> {
    let mut sessions = SessionServiceClient::new(channel(target).await?);
    let mut deleted = 0;
    for app in WRITTEN_APPS {
        // Each pass deletes the first page, so the next pass lists what is
        // left; a session that cannot be deleted ends the deletion with its
        // error.
        loop {
            let page = sessions
                .list_sessions(proto::ListSessionsRequest {
                    app: app.to_owned(),
                    page_size: 1000,
                    ..proto::ListSessionsRequest::default()
                })
                .await?
                .into_inner()
                .sessions;
            if page.is_empty() {
                break;
            }
            for session in page {
                deleted += sessions
                    .delete_session(proto::DeleteSessionRequest {
                        session_id: session.id,
                        app: app.to_owned(),
                        ..proto::DeleteSessionRequest::default()
                    })
                    .await?
                    .into_inner()
                    .episodes_deleted
                    .max(0) as u64;
            }
        }
    }
    if let Some(url) = database_url {
        deleted += remove_baseline(url, deleted).await?;
    }
    Ok(deleted)
}

/// Deletes the baseline's sessions (their episodes go with them) and, on
/// Postgres, vacuums the episodes' table when any episode went
/// (`deleted` already, or the baseline's); returns the baseline's
/// episodes.
async fn remove_baseline(database_url: &str, deleted: u64) -> anyhow::Result<u64> {
    if database_url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(database_url).await?;
        let baseline: i64 = sqlx::query_scalar(
            "WITH gone AS (DELETE FROM sessions WHERE tenant = 'default' AND app = ANY($1) \
             RETURNING episode_count) SELECT coalesce(sum(episode_count), 0)::bigint FROM gone",
        )
        .bind(&BASELINE_APPS[..])
        .fetch_one(&pool)
        .await?;
        let baseline = baseline.max(0) as u64;
        if deleted + baseline > 0 {
            vacuum(&pool).await;
        }
        return Ok(baseline);
    }
    let pool = crate::store::SqliteStore::direct_pool(database_url).await?;
    let baseline: i64 = sqlx::query_scalar::<_, i64>(
        "DELETE FROM sessions WHERE tenant = 'default' AND app IN (?1, ?2) RETURNING episode_count",
    )
    .bind(BASELINE_APPS[0])
    .bind(BASELINE_APPS[1])
    .fetch_all(&pool)
    .await?
    .into_iter()
    .sum();
    Ok(baseline.max(0) as u64)
}

/// Vacuums the episodes' table; a role that may not (it does not own the
/// table) leaves it to autovacuum, with a warning.
async fn vacuum(pool: &sqlx::PgPool) {
    eprintln!("engram bench: vacuuming the episodes' table …");
    if let Err(err) = sqlx::query("VACUUM episodes").execute(pool).await {
        eprintln!("engram bench: warning: cannot vacuum the episodes' table: {err}");
    }
}
