//! The connections the Postgres store leases, and what each one's session
//! is set to.
//!
//! sqlx's own pool pings every connection it takes back before anyone may
//! use it again: one more round trip per operation, on a machine where
//! round trips are what an operation costs. It also has nowhere to remember
//! a connection's session settings, so every operation had to be a
//! transaction that set the tenant for row-level security first. This pool
//! hands a connection back as it is, remembers the tenant its session is
//! confined to (so a single-statement read or write is one round trip), and
//! spends a round trip only where one is owed: binding another tenant,
//! rolling back a transaction left open, checking a connection that sat
//! idle or may have died with the database.
//!
//! Tenant isolation rests on that bookkeeping, so the pool keeps it out of
//! reach: the tenant is bound as a parameter (`set_config`), never spliced
//! into SQL; a [`Lease`] runs queries but hands out no connection and
//! refuses statements that would change its session (`SET`, `RESET`,
//! `set_config`, transaction control); the server's cross-tenant work runs
//! on connections opened for it, set to `*` at start-up, that never join
//! the tenant idle list; and migrations run on a connection of their own,
//! set explicitly to see every row.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryFutureExt, TryStreamExt};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgQueryResult, PgRow};
use sqlx::{ConnectOptions, Connection, Either, Execute, Executor, Postgres};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::context::Tenant;
use crate::error::Result;

/// A connection idle for longer than this is pinged before it is used.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// A connection idle for longer than this is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// A connection older than this is closed when it comes back, so load
/// spreads again after the database fails over or scales.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// What `engram.tenant` is set to for the server's cross-tenant work.
const EVERY_TENANT: &str = "*";

/// Connections for the server's cross-tenant work (the feeds' horizons, the
/// scheduler's rule list, pruning, health checks), beyond the configured
/// maximum for tenants' calls: that work is short and never waits on a
/// tenant's call, and a budget of its own keeps connections from being
/// closed and reopened as the mix of the two kinds changes.
const SYSTEM_CONNECTIONS: usize = 2;

/// Bumped whenever an error said a database connection broke (a reset, a
/// restart). A pooled connection last checked in an older epoch is pinged
/// before its next use, so a dead one is dropped instead of failing the
/// next request, and the one that failed is not handed out again.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Notes an error: one that says a connection broke moves the epoch.
fn observe(err: &sqlx::Error) {
    if super::super::connection_lost(err) {
        EPOCH.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub(super) struct Pool(Arc<Shared>);

struct Shared {
    connect: PgConnectOptions,
    max: u32,
    acquire_timeout: Duration,
    /// One per lease of a tenant's call out.
    permits: Arc<Semaphore>,
    /// One per lease of cross-tenant work out.
    system_permits: Arc<Semaphore>,
    /// Idle connections bound to a tenant (or to none yet); most recently
    /// returned last.
    idle: Mutex<Vec<Idle>>,
    /// Idle connections of the server's cross-tenant work.
    system_idle: Mutex<Vec<Idle>>,
    open: Arc<AtomicU32>,
    /// Leases out now, and a wake-up for a shutdown waiting for them.
    leased: AtomicU32,
    returned: Notify,
    closed: AtomicBool,
    /// Bumped whenever a statement met a read-only server (`25006`): after
    /// a failover, pooled connections may still talk to the old primary,
    /// now a standby, and would refuse every write until their lifetime
    /// ran out. A connection opened in an older generation is closed
    /// instead of being used again, so the next ones resolve the
    /// database's address anew.
    generation: AtomicU64,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Which list a connection belongs to; it never moves to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tenant,
    System,
}

struct Conn {
    raw: PgConnection,
    kind: Kind,
    /// What this session's `engram.tenant` is bound to, when known (a
    /// system connection's is `*` from its start-up packet on).
    tenant: Option<Box<str>>,
    born: Instant,
    epoch: u64,
    generation: u64,
    _counted: Counted,
}

/// Keeps the count of open connections: one per live `Conn`.
struct Counted(Arc<AtomicU32>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("max", &self.0.max)
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Opens one connection right away, so a wrong address or password is
    /// reported at start-up rather than on the first request.
    pub(super) async fn connect(
        connect: PgConnectOptions,
        max: u32,
        acquire_timeout: Duration,
    ) -> Result<Pool> {
        let max = max.max(1);
        let pool = Pool(Arc::new(Shared {
            connect,
            max,
            acquire_timeout,
            permits: Arc::new(Semaphore::new(max as usize)),
            system_permits: Arc::new(Semaphore::new(SYSTEM_CONNECTIONS)),
            idle: Mutex::new(Vec::new()),
            system_idle: Mutex::new(Vec::new()),
            open: Arc::default(),
            leased: AtomicU32::new(0),
            returned: Notify::new(),
            closed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }));
        let first = pool.open_connection(Kind::Tenant).await?;
        pool.put(first);
        Ok(pool)
    }

    /// The most connections open at once: the tenants' and the server's own.
    pub(super) fn max(&self) -> u32 {
        self.0.max + SYSTEM_CONNECTIONS as u32
    }

    /// Notes an error ([`observe`]); one that says the server is
    /// read-only retires every connection open now (see
    /// `Shared::generation`).
    fn observe(&self, err: &sqlx::Error) {
        observe(err);
        if super::super::read_only_server(err) {
            let retired = self.0.generation.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                generation = retired,
                "the database refused a statement as read-only (a standby after a failover?); \
                 reopening every pooled connection"
            );
        }
    }

    /// Whether a connection was opened before the server last turned out
    /// read-only.
    fn retired(&self, conn: &Conn) -> bool {
        conn.generation != self.0.generation.load(Ordering::Relaxed)
    }

    pub(super) fn open(&self) -> u32 {
        self.0.open.load(Ordering::Relaxed)
    }

    pub(super) fn idle(&self) -> u32 {
        (lock(&self.0.idle).len() + lock(&self.0.system_idle).len()) as u32
    }

    /// A connection in autocommit whose session row-level security confines
    /// to `tenant`. Each statement is its own transaction; binding the
    /// tenant costs a round trip only when this connection was last bound
    /// to another one.
    pub(super) async fn session(&self, tenant: &Tenant) -> Result<Lease> {
        let mut lease = self.acquire(Kind::Tenant, Some(tenant.as_str())).await?;
        let conn = lease.conn_mut();
        if conn.tenant.as_deref() != Some(tenant.as_str()) {
            // Unknown until the call is known to have run: a failed or
            // cancelled one leaves the next user to bind it again.
            conn.tenant = None;
            sqlx::query("SELECT set_config('engram.tenant', $1, false)")
                .bind(tenant.as_str())
                .execute(&mut conn.raw)
                .await
                .inspect_err(|err| self.observe(err))?;
            conn.tenant = Some(tenant.as_str().into());
        }
        Ok(lease)
    }

    /// A transaction confined to `tenant`. Commit it with
    /// [`Lease::commit`]; dropped uncommitted, it is rolled back.
    pub(super) async fn transaction(&self, tenant: &Tenant) -> Result<Lease> {
        self.begin(tenant, "BEGIN").await
    }

    /// A read-only transaction confined to `tenant` that sees one snapshot
    /// throughout (`REPEATABLE READ`). Having no transaction id, it holds
    /// back no feed horizon; it does hold back vacuum while it lasts.
    pub(super) async fn snapshot(&self, tenant: &Tenant) -> Result<Lease> {
        self.begin(tenant, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
    }

    async fn begin(&self, tenant: &Tenant, statement: &'static str) -> Result<Lease> {
        let mut lease = self.session(tenant).await?;
        // Marked first: a BEGIN that fails or is cancelled half-way leaves
        // the connection's state unknown, and a rollback settles it.
        lease.in_transaction = true;
        lease
            .conn_mut()
            .raw
            .execute(statement)
            .await
            .inspect_err(|err| self.observe(err))?;
        Ok(lease)
    }

    /// A connection in autocommit that row-level security lets see every
    /// tenant, for the server's own cross-tenant work (the scheduler's rule
    /// list, pruning, the feeds' horizons, health checks). It comes from
    /// connections opened for that work only.
    pub(super) async fn system(&self) -> Result<Lease> {
        self.acquire(Kind::System, None).await
    }

    /// A connection of its own, outside the pool, set to see every row:
    /// for migrations and grants, which the owner runs and which may touch
    /// rows of every tenant. Closed when dropped. Its statements are not
    /// logged: a migration that takes a while would otherwise be printed
    /// whole, every line of it, as a slow statement.
    pub(super) async fn dedicated(&self) -> Result<PgConnection> {
        let connect = self
            .0
            .connect
            .clone()
            .options([("engram.tenant", EVERY_TENANT)])
            .disable_statement_logging();
        Ok(PgConnection::connect_with(&connect).await?)
    }

    /// Refuses new leases, waits (up to the acquire timeout) until every
    /// lease out has come back, then says goodbye to every connection: the
    /// last step of a graceful shutdown.
    pub(super) async fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.permits.close();
        self.0.system_permits.close();
        let drained = async {
            loop {
                let returned = self.0.returned.notified();
                if self.0.leased.load(Ordering::SeqCst) == 0 {
                    return;
                }
                returned.await;
            }
        };
        if tokio::time::timeout(self.0.acquire_timeout, drained)
            .await
            .is_err()
        {
            tracing::warn!(
                leased = self.0.leased.load(Ordering::SeqCst),
                "closing the database pool with calls still holding connections"
            );
        }
        let idle: Vec<Idle> = [&self.0.idle, &self.0.system_idle]
            .into_iter()
            .flat_map(|list| std::mem::take(&mut *lock(list)))
            .collect();
        for Idle { conn, .. } in idle {
            let Conn { raw, _counted, .. } = conn;
            let _ = raw.close().await;
        }
    }

    async fn acquire(&self, kind: Kind, tenant: Option<&str>) -> Result<Lease> {
        tokio::time::timeout(self.0.acquire_timeout, self.acquire_now(kind, tenant))
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    async fn acquire_now(&self, kind: Kind, tenant: Option<&str>) -> Result<Lease> {
        let permits = match kind {
            Kind::Tenant => &self.0.permits,
            Kind::System => &self.0.system_permits,
        };
        let permit = Arc::clone(permits)
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let Some(Idle { mut conn, since }) = self.take_idle(kind, tenant) else {
                let conn = self.open_connection(kind).await?;
                return Ok(self.lease(conn, permit));
            };
            if conn.born.elapsed() > MAX_LIFETIME
                || since.elapsed() > IDLE_TIMEOUT
                || self.retired(&conn)
            {
                close(conn);
                continue;
            }
            let epoch = EPOCH.load(Ordering::Relaxed);
            if since.elapsed() > IDLE_CHECK || conn.epoch != epoch {
                if conn.raw.ping().await.inspect_err(observe).is_err() {
                    continue;
                }
                conn.epoch = epoch;
            }
            return Ok(self.lease(conn, permit));
        }
    }

    /// The most recently returned idle connection of a kind, preferring
    /// one whose session is already bound to `tenant`.
    fn take_idle(&self, kind: Kind, tenant: Option<&str>) -> Option<Idle> {
        let mut idle = match kind {
            Kind::Tenant => lock(&self.0.idle),
            Kind::System => lock(&self.0.system_idle),
        };
        let matching = tenant.and_then(|tenant| {
            idle.iter()
                .rposition(|entry| entry.conn.tenant.as_deref() == Some(tenant))
        });
        match matching {
            Some(at) => Some(idle.remove(at)),
            None => idle.pop(),
        }
    }

    async fn open_connection(&self, kind: Kind) -> Result<Conn> {
        let (raw, tenant) = match kind {
            // A fresh session is bound to no tenant and sees no row.
            Kind::Tenant => (PgConnection::connect_with(&self.0.connect).await, None),
            Kind::System => {
                let connect = self
                    .0
                    .connect
                    .clone()
                    .options([("engram.tenant", EVERY_TENANT)]);
                (
                    PgConnection::connect_with(&connect).await,
                    Some(EVERY_TENANT.into()),
                )
            }
        };
        let raw = raw.inspect_err(observe)?;
        self.0.open.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            raw,
            kind,
            tenant,
            born: Instant::now(),
            epoch: EPOCH.load(Ordering::Relaxed),
            generation: self.0.generation.load(Ordering::Relaxed),
            _counted: Counted(Arc::clone(&self.0.open)),
        })
    }

    fn lease(&self, conn: Conn, permit: OwnedSemaphorePermit) -> Lease {
        self.0.leased.fetch_add(1, Ordering::SeqCst);
        Lease {
            conn: Some(conn),
            permit: Some(permit),
            pool: self.clone(),
            in_transaction: false,
        }
    }

    /// Takes a connection back into the idle list of its kind (or closes it
    /// when it is old or retired, or the pool is closing).
    fn put(&self, conn: Conn) {
        if conn.born.elapsed() > MAX_LIFETIME
            || self.retired(&conn)
            || self.0.closed.load(Ordering::SeqCst)
        {
            close(conn);
            return;
        }
        let list = match conn.kind {
            Kind::Tenant => &self.0.idle,
            Kind::System => &self.0.system_idle,
        };
        let expired = {
            let mut idle = lock(list);
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
            // The least recently used one is at the front; one check per
            // return closes connections a quieter load no longer needs.
            match idle.first() {
                Some(oldest) if oldest.since.elapsed() > IDLE_TIMEOUT => Some(idle.remove(0)),
                _ => None,
            }
        };
        if let Some(expired) = expired {
            close(expired.conn);
        }
    }

    /// A lease is over: its permit goes back, and a shutdown waiting for
    /// the last one hears of it.
    fn returned(&self, permit: Option<OwnedSemaphorePermit>) {
        drop(permit);
        self.0.leased.fetch_sub(1, Ordering::SeqCst);
        self.0.returned.notify_waiters();
    }
}

fn lock(list: &Mutex<Vec<Idle>>) -> std::sync::MutexGuard<'_, Vec<Idle>> {
    // The list is consistent after every statement that touches it, so a
    // panic elsewhere while it was held leaves nothing half-done.
    list.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Says goodbye to the server when there is a runtime to do it on.
fn close(conn: Conn) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let Conn { raw, _counted, .. } = conn;
            let _ = raw.close().await;
        });
    }
}

/// A connection taken from the pool; it goes back when dropped. It runs
/// queries (it is a sqlx [`Executor`]) but gives no access to the
/// connection, and refuses a statement that would change what its session
/// is bound to (see [`session_neutral`]).
pub struct Lease {
    conn: Option<Conn>,
    permit: Option<OwnedSemaphorePermit>,
    pool: Pool,
    in_transaction: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("in_transaction", &self.in_transaction)
            .finish_non_exhaustive()
    }
}

impl Lease {
    fn conn_mut(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until it is dropped")
    }

    /// The connection, for this module only: what runs on it past the
    /// pool's own statements goes through [`Checked`].
    fn raw(&mut self) -> &mut PgConnection {
        &mut self.conn_mut().raw
    }

    /// The connection and its pool, borrowed apart: what a statement
    /// runs on, and where its errors are noted.
    fn parts(&mut self) -> (&mut PgConnection, &Pool) {
        let conn = self
            .conn
            .as_mut()
            .expect("a lease holds its connection until it is dropped");
        (&mut conn.raw, &self.pool)
    }

    /// Commits the transaction this lease began.
    pub(super) async fn commit(self) -> Result<()> {
        self.end("COMMIT").await
    }

    /// Rolls back the transaction this lease began, now rather than when
    /// the lease is dropped.
    pub(super) async fn rollback(self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, statement: &'static str) -> Result<()> {
        let (raw, pool) = self.parts();
        raw.execute(statement)
            .await
            .inspect_err(|err| pool.observe(err))?;
        self.in_transaction = false;
        Ok(())
    }
}

/// Whether a statement leaves the session as it found it: no transaction
/// control, no session settings, one statement. The pool's own statements
/// do not pass here; everything else does, so a mistake in a store query
/// cannot rebind a connection another tenant will use next.
fn session_neutral(sql: &str) -> bool {
    const SESSION_KEYWORDS: [&str; 14] = [
        "set",
        "reset",
        "discard",
        "begin",
        "start",
        "commit",
        "end",
        "rollback",
        "abort",
        "savepoint",
        "release",
        "prepare",
        "listen",
        "load",
    ];
    let first = sql
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or_default();
    let mentions = |needle: &[u8]| {
        sql.as_bytes()
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
    };
    !SESSION_KEYWORDS
        .iter()
        .any(|keyword| first.eq_ignore_ascii_case(keyword))
        && !sql.trim_end().trim_end_matches(';').contains(';')
        && !mentions(b"set_config")
        && !mentions(b"engram.tenant")
}

/// A query taken apart, checked, and put back together for the connection.
struct Checked {
    sql: sqlx::SqlStr,
    arguments: Option<PgArguments>,
    persistent: bool,
}

impl Checked {
    fn of<'q, E: Execute<'q, Postgres>>(mut query: E) -> std::result::Result<Self, sqlx::Error> {
        let arguments = query.take_arguments().map_err(sqlx::Error::Encode)?;
        let persistent = query.persistent();
        let sql = query.sql();
        if !session_neutral(sql.as_str()) {
            return Err(sqlx::Error::InvalidArgument(format!(
                "a pooled connection refused a statement that would change its session: {:?}",
                sql.as_str()
            )));
        }
        Ok(Checked {
            sql,
            arguments,
            persistent,
        })
    }
}

impl Execute<'_, Postgres> for Checked {
    fn sql(self) -> sqlx::SqlStr {
        self.sql
    }

    fn statement(&self) -> Option<&sqlx::postgres::PgStatement> {
        None
    }

    fn take_arguments(
        &mut self,
    ) -> std::result::Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        Ok(self.arguments.take())
    }

    fn persistent(&self) -> bool {
        self.persistent
    }
}

impl<'c> Executor<'c> for &'c mut Lease {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, std::result::Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match Checked::of(query) {
            Ok(query) => {
                let (raw, pool) = self.parts();
                raw.fetch_many(query)
                    .inspect_err(|err| pool.observe(err))
                    .boxed()
            }
            Err(err) => futures::stream::once(async move { Err(err) }).boxed(),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        match Checked::of(query) {
            Ok(query) => {
                let (raw, pool) = self.parts();
                raw.fetch_optional(query)
                    .inspect_err(|err| pool.observe(err))
                    .boxed()
            }
            Err(err) => futures::future::ready(Err(err)).boxed(),
        }
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<sqlx::postgres::PgStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.raw().prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: sqlx::SqlStr,
    ) -> BoxFuture<'e, std::result::Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.raw().describe(sql)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let permit = self.permit.take();
        if !self.in_transaction {
            // Back first, then the permit: a waiter woken by the permit
            // finds the connection.
            self.pool.put(conn);
            self.pool.returned(permit);
            return;
        }
        // An open transaction (an early return, a cancelled call) would
        // hold its locks until the connection's next use: roll it back now.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.pool.returned(permit);
            return;
        };
        let pool = self.pool.clone();
        runtime.spawn(async move {
            let mut conn = conn;
            let rollback = conn.raw.execute("ROLLBACK");
            if let Ok(Ok(_)) = tokio::time::timeout(pool.0.acquire_timeout, rollback).await {
                pool.put(conn);
            }
            pool.returned(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::session_neutral;

    #[test]
    fn statements_that_would_rebind_a_session_are_refused() {
        for sql in [
            "SELECT 1",
            "WITH h AS (UPDATE memory_heads SET version = version + 1 RETURNING version) SELECT 1",
            "  select version from memory_heads where tenant = $1",
            "DELETE FROM sessions WHERE tenant = $1;",
        ] {
            assert!(session_neutral(sql), "{sql}");
        }
        for sql in [
            "SET engram.tenant = 'x'",
            "set local engram.tenant = 'x'",
            "RESET engram.tenant",
            "RESET ALL",
            "DISCARD ALL",
            "BEGIN",
            "COMMIT",
            "rollback",
            "SELECT set_config('engram.tenant', 'x', false)",
            "SELECT SET_CONFIG('search_path', 'x', false)",
            "SELECT current_setting('engram.tenant')",
            "SELECT 1; SET engram.tenant = 'x'",
        ] {
            assert!(!session_neutral(sql), "{sql}");
        }
    }
}
