//! What the bench's appends wrote, removed when a run that appends ends
//! (unless `--keep-appended`), earlier runs' included: the sessions
//! `append` and `tail` wrote through the server, deleted through it as a
//! user's would be, and those the baseline wrote straight to the database,
//! deleted there. A session goes when its id holds this run's token, or
//! when it was there before the run began and nothing was written to it
//! since: another bench appending beside this one keeps its sessions.
//! The keys `set` writes stay: there are 10,000, `get` reads them, and
//! the versions each run adds are not read.
//!
//! Left in the store, every run's 1 KB appends (35,000–60,000 a run here)
//! lengthened the index lists each later `search` reads: a bench database
//! that had collected 463,569 of them searched at 732–882 ops/s against
//! 909–1,027 for the loaded episodes alone. On Postgres the episodes'
//! table is vacuumed afterwards, where the bench knows the database (it
//! started the server on it, or ran the baseline on it): a search still
//! reads the deleted rows' index entries until it is, and autovacuum waits
//! for a fifth of the table to be dead.

use std::collections::HashMap;

use crate::proto;
use crate::proto::session_service_client::SessionServiceClient;

use super::baseline::{INPROC_APP, RAW_APP};
use super::workloads::{APPEND_APP, TAIL_APP, Target, channel, session_prefix};

/// The apps of the sessions the bench's own workloads append to.
const WRITTEN_APPS: [&str; 2] = [APPEND_APP, TAIL_APP];

/// The apps of the sessions the baseline appends to: pgbench on Postgres,
/// the store in-process on SQLite.
const BASELINE_APPS: [&str; 2] = [RAW_APP, INPROC_APP];

type Client = SessionServiceClient<crate::cli::Authorized>;

/// The bench's sessions as they were before this run appended (each id
/// with its update time, as text): the ones it may delete when it ends,
/// unless they were written to meanwhile. `None` where they could not be
/// read: then only this run's sessions go there.
#[derive(Debug, Default)]
pub struct Earlier {
    server: Option<HashMap<String, String>>,
    database: Option<HashMap<String, String>>,
}

/// Reads the bench's sessions before the run appends: through the server,
/// and in the database when it is given (see [`remove_written`]). What
/// cannot be read is said as a warning.
pub async fn earlier(target: &Target, database_url: Option<&str>) -> Earlier {
    let server = async {
        let mut sessions = SessionServiceClient::new(channel(target).await?);
        let mut stamps = HashMap::new();
        for app in WRITTEN_APPS {
            for session in listed(&mut sessions, app).await? {
                stamps.insert(session.id.clone(), stamp(&session));
            }
        }
        anyhow::Ok(stamps)
    };
    let server = server.await.map_err(|err| {
        eprintln!(
            "engram bench: warning: cannot list the sessions earlier runs appended to \
             ({err:#}); only this run's will be deleted"
        );
    });
    let database = match database_url {
        Some(url) => baseline_stamps(url).await.map_err(|err| {
            eprintln!(
                "engram bench: warning: cannot read the baseline's earlier sessions \
                 ({err:#}); only this run's will be deleted"
            );
        }),
        None => Err(()),
    };
    Earlier {
        server: server.ok(),
        database: database.ok(),
    }
}

/// Deletes this run's sessions of [`WRITTEN_APPS`] and those `earlier`
/// found idle through the server and, given the database, the same of
/// [`BASELINE_APPS`] in it; returns the episodes deleted.
pub async fn remove_written(
    target: &Target,
    database_url: Option<&str>,
    run: &str,
    earlier: &Earlier,
) -> anyhow::Result<u64> {
    let mut sessions = SessionServiceClient::new(channel(target).await?);
    let mut deleted = 0;
    for app in WRITTEN_APPS {
        // Listed whole first: deleting while paging would move the pages.
        let doomed: Vec<String> = listed(&mut sessions, app)
            .await?
            .into_iter()
            .filter(|s| goes(app, run, earlier.server.as_ref(), &s.id, &stamp(s)))
            .map(|s| s.id)
            .collect();
        // A session that cannot be deleted ends the deletion with its error.
        for session_id in doomed {
            deleted += sessions
                .delete_session(proto::DeleteSessionRequest {
                    session_id,
                    app: app.to_owned(),
                    ..proto::DeleteSessionRequest::default()
                })
                .await?
                .into_inner()
                .episodes_deleted
                .max(0) as u64;
        }
    }
    if let Some(url) = database_url {
        deleted += remove_baseline(url, run, earlier.database.as_ref(), deleted).await?;
    }
    Ok(deleted)
}

/// Every session of `app`, page by page.
async fn listed(sessions: &mut Client, app: &str) -> anyhow::Result<Vec<proto::Session>> {
    let mut all = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = sessions
            .list_sessions(proto::ListSessionsRequest {
                app: app.to_owned(),
                page_size: 1000,
                page_token,
                ..proto::ListSessionsRequest::default()
            })
            .await?
            .into_inner();
        all.extend(page.sessions);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        page_token = page.next_page_token;
    }
}

/// A session's update time as the server gave it, to compare.
fn stamp(session: &proto::Session) -> String {
    session
        .update_time
        .as_ref()
        .map_or_else(String::new, |t| format!("{}.{:09}", t.seconds, t.nanos))
}

/// Whether the cleanup deletes a session of `app`: this run's, or one
/// that was there before the run with the same update time (`earlier`).
fn goes(
    app: &str,
    run: &str,
    earlier: Option<&HashMap<String, String>>,
    id: &str,
    updated: &str,
) -> bool {
    id.starts_with(&session_prefix(app, run))
        || earlier
            .and_then(|e| e.get(id))
            .is_some_and(|was| was == updated)
}

/// The baseline's sessions in the database, each id with its update time.
async fn baseline_stamps(database_url: &str) -> anyhow::Result<HashMap<String, String>> {
    Ok(Db::open(database_url)
        .await?
        .baseline_sessions()
        .await?
        .into_iter()
        .map(|(id, _, updated)| (id, updated))
        .collect())
}

/// The database the baseline wrote to.
enum Db {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl Db {
    async fn open(database_url: &str) -> anyhow::Result<Db> {
        Ok(if database_url.starts_with("postgres") {
            Db::Postgres(sqlx::PgPool::connect(database_url).await?)
        } else {
            Db::Sqlite(crate::store::SqliteStore::direct_pool(database_url).await?)
        })
    }

    /// The baseline's sessions: id, app and update time (as text on both
    /// stores, to compare).
    async fn baseline_sessions(&self) -> anyhow::Result<Vec<(String, String, String)>> {
        let sql = format!(
            "SELECT id, app, CAST(update_time AS TEXT) FROM sessions \
             WHERE tenant = 'default' AND app IN ('{}', '{}')",
            BASELINE_APPS[0], BASELINE_APPS[1]
        );
        let sql = sqlx::AssertSqlSafe(sql);
        Ok(match self {
            Db::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
            Db::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await?,
        })
    }
}

/// Deletes the baseline's sessions that [`goes`] says (their episodes go
/// with them) and, on Postgres, vacuums the episodes' table when any
/// episode went (`deleted` already, or the baseline's); returns the
/// baseline's episodes.
async fn remove_baseline(
    database_url: &str,
    run: &str,
    earlier: Option<&HashMap<String, String>>,
    deleted: u64,
) -> anyhow::Result<u64> {
    let db = Db::open(database_url).await?;
    let doomed: Vec<String> = db
        .baseline_sessions()
        .await?
        .into_iter()
        .filter(|(id, app, updated)| goes(app, run, earlier, id, updated))
        .map(|(id, _, _)| id)
        .collect();
    let baseline: i64 = match &db {
        Db::Postgres(pool) => {
            let baseline: i64 = sqlx::query_scalar(
                "WITH gone AS (DELETE FROM sessions WHERE tenant = 'default' AND id = ANY($1) \
                 RETURNING episode_count) \
                 SELECT coalesce(sum(episode_count), 0)::bigint FROM gone",
            )
            .bind(&doomed)
            .fetch_one(pool)
            .await?;
            if deleted + baseline.max(0) as u64 > 0 {
                vacuum(pool).await;
            }
            baseline
        }
        Db::Sqlite(pool) => sqlx::query_scalar::<_, i64>(
            "DELETE FROM sessions WHERE tenant = 'default' \
             AND id IN (SELECT value FROM json_each(?1)) RETURNING episode_count",
        )
        .bind(serde_json::to_string(&doomed)?)
        .fetch_all(pool)
        .await?
        .into_iter()
        .sum(),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// This run's sessions go, and earlier ones nobody wrote to since;
    /// a session another run wrote to meanwhile, or created, stays.
    #[test]
    fn a_run_deletes_its_own_and_idle_sessions_only() {
        let earlier: HashMap<String, String> = [
            ("bench-append-old-0", "100.000000000"),
            ("bench-append-busy-0", "100.000000000"),
        ]
        .into_iter()
        .map(|(id, t)| (id.to_owned(), t.to_owned()))
        .collect();
        let goes = |id: &str, updated: &str| goes(APPEND_APP, "r1", Some(&earlier), id, updated);
        assert!(goes("bench-append-r1-0", "300.000000000"), "this run's");
        assert!(
            goes("bench-append-r1-15", ""),
            "this run's, whatever its time"
        );
        assert!(goes("bench-append-old-0", "100.000000000"), "idle since");
        assert!(
            !goes("bench-append-busy-0", "250.000000000"),
            "written to meanwhile"
        );
        assert!(
            !goes("bench-append-other-3", "200.000000000"),
            "created meanwhile"
        );
        assert!(
            !goes("bench-append-r10-0", "300.000000000"),
            "another run's token"
        );
        // Unread earlier sessions: this run's alone.
        assert!(!super::goes(
            APPEND_APP,
            "r1",
            None,
            "bench-append-old-0",
            "100.000000000"
        ));
        assert!(super::goes(
            APPEND_APP,
            "r1",
            None,
            "bench-append-r1-2",
            "1.000000000"
        ));
    }
}
