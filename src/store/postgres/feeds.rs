//! The feeds' horizons on Postgres: the newest position of the change feed
//! and of the episodes' cursor below which nothing can still appear, kept
//! current per replica by LISTEN/NOTIFY from every replica and a poll.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::watch;

use super::PgStore;
use super::pool::Pool;
use crate::error::Result;
use crate::ports::{Feed, Feeds};

/// How often the horizon is re-read without a notification (a missed
/// NOTIFY, a dropped listener): the bound on delivery delay then.
const HORIZON_POLL: Duration = Duration::from_millis(500);

impl Feeds for PgStore {
    async fn horizon(&self, feed: Feed) -> Result<watch::Receiver<i64>> {
        let (pool, listen) = (self.pool.clone(), self.listen.clone());
        let settles = self.settles.clone();
        let receiver = self.horizons[feed as usize]
            .get_or_try_init(|| async move {
                let newest = self.settled(feed).await?;
                let (sender, receiver) = watch::channel(newest);
                tokio::spawn(run_horizon(pool, settles, listen, feed, newest, sender));
                Ok::<_, crate::error::Error>(receiver)
            })
            .await?;
        Ok(receiver.clone())
    }

    async fn settled(&self, feed: Feed) -> Result<i64> {
        let (newest, fence) = horizon_candidate(&self.pool, feed).await?;
        wait_settled(&self.pool, &self.settles, feed, &fence).await?;
        Ok(newest)
    }
}

/// What a store's settles share.
#[derive(Debug)]
pub(super) struct Settles {
    /// Set once the database refused a settle its look at the running
    /// transactions ([`wait_settled`]): settles then wait on xmin alone.
    refused: AtomicBool,
    /// How long a settle waits before the log names what it waits for
    /// (`--feed-wait-warn-ms`).
    warn_after: Duration,
    /// When the log last named what each feed waits for: once a
    /// [`REPORT_EVERY`] per feed, however many settles wait.
    reported: [Mutex<Option<Instant>>; 2],
}

impl Settles {
    pub(super) fn new(warn_after: Duration) -> Settles {
        Settles {
            refused: AtomicBool::new(false),
            warn_after,
            reported: Default::default(),
        }
    }

    /// Whether a wait of `feed` is to be reported at `now` (none reported
    /// in the [`REPORT_EVERY`] before it), noting it if so.
    fn report_due(&self, feed: Feed, now: Instant) -> bool {
        let mut last = self.reported[feed as usize]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|at| now.duration_since(at) < REPORT_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// How often the log names a feed's blockers again while it still waits.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// The newest position a feed's sequence has handed out, as SQL: read by
/// `pg_sequence_last_value`, which holds the sequence's buffer lock while
/// it reads. Not by selecting `last_value` from the sequence relation: a
/// scan reads that tuple with only a pin, and `nextval` writes it in place,
/// for a moment (while it WAL-logs values ahead) holding one up to 32
/// beyond the last handed out. A horizon read then covered positions no
/// writer had taken yet, and a writer that took one after the fence was
/// never waited for: a watcher skipped its change (seen once in CI, a
/// version missing from `Watch` under load; `SELECT last_value` ran ahead
/// 20 times in 1.5M reads beside two busy `nextval` sessions).
///
/// NULL before the first position is handed out: none yet, 0. Postgres 17
/// also answers NULL, not an error, to a role without the right to read
/// the sequence; that stays NULL, so the read fails (and says so in the
/// log) instead of holding every feed at 0.
macro_rules! newest_position {
    (Changes) => {
        newest_position!("memory_changes_revision_seq")
    };
    (Episodes) => {
        newest_position!("episodes_cursor_seq")
    };
    ($sequence:literal) => {
        concat!(
            "coalesce(pg_sequence_last_value('",
            $sequence,
            "'), CASE WHEN has_sequence_privilege('",
            $sequence,
            "', 'SELECT, USAGE') THEN 0 END)"
        )
    };
}

impl PgStore {
    /// The SQL expression of a feed's newest handed-out position (see
    /// [`newest_position!`]). Public for the test that races it against
    /// busy writers; not an interface.
    #[doc(hidden)]
    pub fn newest_position_sql(feed: Feed) -> &'static str {
        match feed {
            Feed::Changes => newest_position!(Changes),
            Feed::Episodes => newest_position!(Episodes),
        }
    }
}

/// The newest position of a feed, and a fence: a transaction id taken
/// *after* that position was read. Every position at or below the newest
/// was taken by a transaction that already had its id then (writers take
/// their id before their position), so that id is below the fence; once
/// every transaction up to the fence has finished, nothing at or below the
/// newest position can still appear.
///
/// The fence must be a freshly assigned id, not the snapshot's xmax: xmax is
/// only "newest completed id + 1", and a transaction with a higher id may be
/// running (holding a lower position) while not being listed in the
/// snapshot at all.
async fn horizon_candidate(pool: &Pool, feed: Feed) -> Result<(i64, String)> {
    // Each feed's identity sequence: every position up to its last value
    // has been handed out, by a writer that then already had its id. (Not
    // max() over the rows: rows go when the feed is pruned or a user is
    // forgotten, and the horizon must not go back with them.)
    // One statement: the materialized CTE is read before the outer row is
    // projected, so the id is assigned after the position was read.
    macro_rules! candidate {
        ($feed:ident) => {
            concat!(
                "WITH newest AS MATERIALIZED (SELECT ",
                newest_position!($feed),
                " AS position) SELECT position, pg_current_xact_id()::text FROM newest"
            )
        };
    }
    let sql = match feed {
        Feed::Changes => candidate!(Changes),
        Feed::Episodes => candidate!(Episodes),
    };
    let mut conn = pool.system().await?;
    let (newest, fence): (i64, String) = sqlx::query_as(sql).fetch_one(&mut conn).await?;
    Ok((newest, fence))
}

/// Whether every transaction of this database with an id up to the fence
/// ($1) has finished. Only this database's transactions can hold a
/// position, but transaction ids are cluster-wide: a transaction left open
/// in another database of a shared cluster (a long batch job, a session
/// idle in a transaction) keeps the snapshot's xmin at or below the fence
/// for as long as it runs, and every watch and tail would stall behind it.
/// So when xmin says "not yet", the running ids up to the fence (the
/// snapshot's list, which holds every id below its xmax, and the fence is
/// below that once its own transaction has ended) are looked up among this
/// database's backends and prepared transactions; an id found in neither
/// belongs to another database, or has finished since the snapshot.
/// `pg_stat_activity` shows every role the backends' ids and databases.
const SETTLED: &str = "SELECT CASE WHEN pg_snapshot_xmin(s) > f THEN true ELSE NOT EXISTS ( \
       SELECT 1 FROM pg_snapshot_xip(s) AS running(id) WHERE running.id <= f \
       AND running.id::xid IN ( \
         SELECT backend_xid FROM pg_stat_activity WHERE datname = current_database() \
         UNION ALL \
         SELECT transaction FROM pg_prepared_xacts WHERE database = current_database())) \
     END FROM pg_current_snapshot() AS s, (VALUES ($1::text::xid8)) AS fence(f)";

/// Whether every transaction on the cluster with an id up to the fence
/// ($1) has finished, and the snapshot's xmin: the plain check, one
/// snapshot and no catalog read.
const XMIN_PASSED: &str = "SELECT pg_snapshot_xmin(s) > f, pg_snapshot_xmin(s)::text \
     FROM pg_current_snapshot() AS s, (VALUES ($1::text::xid8)) AS fence(f)";

/// Polls of [`XMIN_PASSED`] that find the same xmin before a settle turns
/// to [`SETTLED`]. Under load xmin moves on every few milliseconds (each
/// writer holds its id for one statement), so nearly every settle passes
/// on the plain check; an xmin that stays put is a long transaction, here
/// or in another database. [`SETTLED`] reads every backend's status, and
/// read on every poll it cost appends a quarter more Postgres CPU (1,634
/// and 1,685 appends/s against 2,074 and 1,920, `engram bench`, 16
/// clients, a tail's horizon settling beside them).
const STUCK_POLLS: u32 = 5;

/// How often a settle polls once xmin stays put: it waits on a long
/// transaction.
const LONG_WAIT_POLL: Duration = Duration::from_millis(10);

/// Waits until every transaction of this database with an id up to
/// `fence` has finished: [`XMIN_PASSED`] while xmin moves, [`SETTLED`]
/// once it stays put. The connection goes back between polls: a waiter
/// must not hold a connection the others need meanwhile.
///
/// Some hardened clusters revoke `pg_stat_activity` from PUBLIC. There
/// [`SETTLED`] is refused (42501); the store says so once in the log,
/// sets `refused`, and its settles from then on wait on xmin alone, as
/// they did before the look-up: correct, only held back by any long
/// transaction on the cluster.
///
/// A wait that has not passed on its first poll counts in
/// `engram_feed_wait_seconds` until it ends; one that lasts
/// `--feed-wait-warn-ms` has the log name the transactions it waits for
/// ([`report_blockers`]).
async fn wait_settled(pool: &Pool, settles: &Settles, feed: Feed, fence: &str) -> Result<()> {
    let started = Instant::now();
    let mut counted = None;
    // When this settle next asks whether to report (once it has waited
    // `warn_after`, then each second; `report_due` keeps it to once a
    // minute per feed).
    let mut next_check = started + settles.warn_after;
    let (mut xmin, mut stuck) = (String::new(), 0);
    loop {
        let mut conn = pool.system().await?;
        if stuck >= STUCK_POLLS && !settles.refused.load(Ordering::Relaxed) {
            match sqlx::query_scalar(SETTLED)
                .bind(fence)
                .fetch_one(&mut conn)
                .await
            {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(err) if insufficient_privilege(&err) => {
                    if !settles.refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            error = %crate::error::report(&err),
                            "cannot see which transactions run in this database; \
                             watches and tails now wait for every long transaction on the cluster"
                        );
                    }
                }
                Err(err) => return Err(err.into()),
            }
        } else {
            let (passed, now): (bool, String) = sqlx::query_as(XMIN_PASSED)
                .bind(fence)
                .fetch_one(&mut conn)
                .await?;
            if passed {
                return Ok(());
            }
            if now == xmin {
                stuck = stuck.saturating_add(1);
            } else {
                (xmin, stuck) = (now, 0);
            }
        }
        drop(conn);
        counted.get_or_insert_with(|| crate::metrics::global().feed_waiting(feed, started));
        let now = Instant::now();
        if now >= next_check {
            next_check = now + Duration::from_secs(1);
            if settles.report_due(feed, now) {
                report_blockers(pool, settles, feed, fence, now - started).await;
            }
        }
        // Writers' transactions are one short statement: while xmin
        // moves this is a few ms. Once it stays put, a long transaction
        // holds it, and polls come slower.
        let pause = if stuck < STUCK_POLLS {
            Duration::from_millis(1)
        } else {
            LONG_WAIT_POLL
        };
        tokio::time::sleep(pause).await;
    }
}

/// The transactions of this database that hold a settle with fence $1
/// back, each described for the log: running backends (by process id) and
/// prepared transactions (by their global id), the longest open first.
const BLOCKERS: &str = "WITH running AS ( \
       SELECT r.id::xid AS id FROM pg_snapshot_xip(pg_current_snapshot()) AS r(id) \
       WHERE r.id <= $1::text::xid8), \
     blockers AS ( \
       SELECT format('backend %s (application %L, user %L, client %s, %s', pid, \
           application_name, usename, coalesce(host(client_addr), 'local'), state) AS what, \
         now() - xact_start AS open \
       FROM pg_stat_activity WHERE datname = current_database() \
         AND backend_xid IN (SELECT id FROM running) \
       UNION ALL \
       SELECT format('prepared transaction %L (owner %L', gid, owner), now() - prepared \
       FROM pg_prepared_xacts WHERE database = current_database() \
         AND transaction IN (SELECT id FROM running)) \
     SELECT what || format(', open %s s)', coalesce(round(extract(epoch FROM open)), 0)) \
     FROM blockers ORDER BY open DESC NULLS LAST LIMIT 10";

/// Says in the log that `feed` has waited `waited` for transactions to
/// end, naming them where the database lets the server see them: what an
/// operator needs to find the session to end (`pg_terminate_backend`, or
/// `ROLLBACK PREPARED`). The look-up failing only leaves them unnamed.
async fn report_blockers(
    pool: &Pool,
    settles: &Settles,
    feed: Feed,
    fence: &str,
    waited: Duration,
) {
    let feed_name = feed.name();
    let waited_s = (waited.as_secs_f64() * 10.0).round() / 10.0;
    let said = "a feed has waited for transactions in Engram's database to end: \
                Watch and TailEpisodes deliver nothing newer until they do";
    if settles.refused.load(Ordering::Relaxed) {
        tracing::warn!(
            feed = feed_name,
            waited_s,
            blockers = "unknown: pg_stat_activity is refused to this role",
            "{said}"
        );
        return;
    }
    let found: Result<Vec<String>> = async {
        let mut conn = pool.system().await?;
        Ok(sqlx::query_scalar(BLOCKERS)
            .bind(fence)
            .fetch_all(&mut conn)
            .await?)
    }
    .await;
    let blockers = match found {
        Ok(rows) if rows.is_empty() => "none left (they ended as the server looked)".to_owned(),
        Ok(rows) => rows.join("; "),
        Err(err) => format!("unknown: {err}"),
    };
    tracing::warn!(feed = feed_name, waited_s, blockers, "{said}");
}

/// Whether Postgres refused a statement for want of a privilege.
fn insufficient_privilege(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("42501"))
}

/// Keeps the horizon current: woken by NOTIFY from any replica, and by a
/// poll in case a notification was missed.
async fn run_horizon(
    pool: Pool,
    settles: Arc<Settles>,
    listen: PgPool,
    feed: Feed,
    mut horizon: i64,
    sender: watch::Sender<i64>,
) {
    let channel = match feed {
        Feed::Changes => "engram_changes",
        Feed::Episodes => "engram_episodes",
    };
    let mut listener: Option<PgListener> = None;
    loop {
        if sender.is_closed() {
            return;
        }
        if listener.is_none() {
            match PgListener::connect_with(&listen).await {
                Ok(mut fresh) => match fresh.listen(channel).await {
                    Ok(()) => listener = Some(fresh),
                    Err(err) => {
                        tracing::warn!(error = %crate::error::report(&err), "cannot LISTEN for changes, polling")
                    }
                },
                Err(err) => {
                    tracing::warn!(error = %crate::error::report(&err), "cannot LISTEN for changes, polling")
                }
            }
        }
        match &mut listener {
            Some(active) => {
                tokio::select! {
                    received = active.try_recv() => if let Err(err) = received {
                        tracing::warn!(error = %crate::error::report(&err), "change listener lost, reconnecting");
                        listener = None;
                    },
                    () = tokio::time::sleep(HORIZON_POLL) => {}
                }
                // One advance covers every write notified so far: under
                // load, notifications arrive faster than one pass per write.
                if let Some(active) = &mut listener {
                    while active.next_buffered().is_some() {}
                }
            }
            None => tokio::time::sleep(HORIZON_POLL).await,
        }
        let advanced = async {
            let (newest, fence) = horizon_candidate(&pool, feed).await?;
            if newest > horizon {
                wait_settled(&pool, &settles, feed, &fence).await?;
            }
            Ok::<_, crate::error::Error>(newest)
        };
        match advanced.await {
            Ok(newest) if newest > horizon => {
                horizon = newest;
                sender.send_replace(horizon);
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %crate::error::report(&err), "cannot advance the change horizon")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{REPORT_EVERY, Settles};
    use crate::ports::Feed;

    /// However many settles of a feed wait, the log names its blockers once
    /// a minute; each feed keeps its own minute.
    #[test]
    fn blockers_are_reported_again_once_a_minute_per_feed() {
        let settles = Settles::new(Duration::from_secs(5));
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert!(settles.report_due(Feed::Changes, at(0)), "the first report");
        assert!(!settles.report_due(Feed::Changes, at(1)));
        assert!(!settles.report_due(Feed::Changes, at(59)));
        assert!(
            settles.report_due(Feed::Episodes, at(30)),
            "another feed's report does not wait on this one's"
        );
        assert!(settles.report_due(Feed::Changes, at(60)), "a minute later");
        assert!(!settles.report_due(Feed::Changes, at(61)));
        assert!(!settles.report_due(Feed::Episodes, at(89)));
        assert!(settles.report_due(Feed::Episodes, at(90)));
        assert!(settles.report_due(Feed::Changes, at(60) + REPORT_EVERY));
    }
}
