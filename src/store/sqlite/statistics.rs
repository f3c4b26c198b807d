//! The planner's statistics on SQLite: taken by the server as tables grow,
//! as `engram_analyze_grown()` takes them on Postgres.
//!
//! Without statistics SQLite plans by fixed guesses. Those guesses read a
//! search's filter rows first and asked the full-text index once per row
//! (the matches statement now fixes its join order instead), and with
//! statistics the bench's `search` over 130,000 episodes ran about a third
//! faster than without. A database the server made had none, since only
//! the bench's loader ran `ANALYZE`.
//!
//! SQLite's own `PRAGMA optimize` decides which tables to analyze: a
//! table whose indexes have no statistics yet, or whose size changed
//! tenfold since they were taken. Its debugging bit lists them without
//! analyzing; this module then analyzes those of them that hold at least
//! [`MIN_ROWS`] rows (on a nearly empty table any plan is cheap, and
//! statistics taken then would only mislead later), each under SQLite's
//! analysis limit, so that a large table costs a sample, not a full read.
//!
//! `ANALYZE` reloads the statistics of the connection that ran it (the
//! writer) only: SQLite's other connections read them when they next load
//! the schema, which `ANALYZE` does not make them do. So the readers'
//! pool closes, as they are next taken, its connections opened before the
//! newest analysis ([`Analyzed::is_older`]); new ones read the statistics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::SqliteConnection;

use crate::error::Result;

/// Tables smaller than this are left unanalyzed (Postgres's rule is
/// the same size: twice 500 rows).
const MIN_ROWS: i64 = 1000;

/// The rows `ANALYZE` reads of each index: SQLite's own limit for
/// `PRAGMA optimize` (`SQLITE_DEFAULT_OPTIMIZE_LIMIT`). Every connection
/// of the store is opened with it.
pub(super) const ANALYSIS_LIMIT: u32 = 2000;

/// When the newest analysis finished, for the readers' pool to tell which
/// of its connections hold older statistics.
#[derive(Debug)]
pub(super) struct Analyzed {
    /// The store's creation, which the times below count from.
    since: Instant,
    /// Microseconds from `since` to the newest analysis; 0 before any.
    newest: AtomicU64,
    /// What the writer's connection knew of writes when the tables were
    /// last sized up (-1 before): with no write since, no table can have
    /// grown, and an idle server skips `PRAGMA optimize`'s count of every
    /// table. See [`analyze_grown`].
    writes: AtomicI64,
}

impl Analyzed {
    pub(super) fn new() -> Self {
        Analyzed {
            since: Instant::now(),
            newest: AtomicU64::new(0),
            writes: AtomicI64::new(-1),
        }
    }

    fn record(&self) {
        let micros = u64::try_from(self.since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.newest.store(micros.max(1), Ordering::Release);
    }

    /// Whether a connection of this `age` was opened before the newest
    /// analysis, and so plans with the statistics it replaced.
    pub(super) fn is_older(&self, age: Duration) -> bool {
        let newest = self.newest.load(Ordering::Acquire);
        newest != 0
            && age
                > self
                    .since
                    .elapsed()
                    .saturating_sub(Duration::from_micros(newest))
    }
}

/// Analyzes the tables that have grown past what their statistics say
/// (or have none) and hold at least [`MIN_ROWS`] rows, on the writer's
/// connection; returns how many.
pub(super) async fn analyze_grown(conn: &mut SqliteConnection, analyzed: &Analyzed) -> Result<u64> {
    // The rows this connection (every write of this server) changed, and
    // SQLite's count of commits by other connections (another process on
    // the file); a new connection starts both again, which only costs one
    // sizing up. Summed, since each only grows.
    let writes: i64 =
        sqlx::query_scalar("SELECT total_changes() + data_version FROM pragma_data_version")
            .fetch_one(&mut *conn)
            .await?;
    if analyzed.writes.swap(writes, Ordering::Relaxed) == writes {
        return Ok(0);
    }
    // 0x10000: size up every table, not only those this connection has
    // planned with statistics; 0x2: analysis; 0x1: only list the
    // statements it would run, as `ANALYZE "main"."table"`.
    let listed: Vec<String> = sqlx::query_scalar("PRAGMA optimize(0x10003)")
        .fetch_all(&mut *conn)
        .await?;
    let mut count = 0;
    for statement in listed {
        let Some(table) = statement.strip_prefix("ANALYZE ") else {
            continue;
        };
        // The name as SQLite quoted it, so it is an identifier, never text
        // from a request.
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT {MIN_ROWS})"
        )))
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
        if rows < MIN_ROWS {
            continue;
        }
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .persistent(false)
            .execute(&mut *conn)
            .await?;
        count += 1;
    }
    if count > 0 {
        analyzed.record();
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_opened_before_the_newest_analysis_are_older() {
        let analyzed = Analyzed::new();
        let long_ago = Duration::from_secs(3600);
        assert!(!analyzed.is_older(long_ago), "nothing analyzed yet");
        analyzed.record();
        assert!(analyzed.is_older(analyzed.since.elapsed() + long_ago));
        assert!(!analyzed.is_older(Duration::ZERO), "opened since");
    }
}
