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
//! spends a round trip only where one is owed: rolling back a transaction
//! left open, checking a connection that sat idle or may have died with the
//! database.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Executor};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::context::Tenant;
use crate::error::{Error, Result};

/// A connection idle for longer than this is pinged before it is used.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// A connection idle for longer than this is closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// A connection older than this is closed when it comes back, so load
/// spreads again after the database fails over or scales.
const MAX_LIFETIME: Duration = Duration::from_secs(1800);

/// Bumped whenever an error said a database connection broke (a reset, a
/// restart). A pooled connection last checked in an older epoch is pinged
/// before its next use, so a dead one is dropped instead of failing the
/// next request, and the one that failed is not handed out again.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// Records that a connection broke; see [`EPOCH`].
pub(crate) fn connection_broke() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

#[derive(Clone)]
pub(super) struct Pool(Arc<Shared>);

struct Shared {
    connect: PgConnectOptions,
    max: u32,
    acquire_timeout: Duration,
    permits: Arc<Semaphore>,
    /// Most recently returned last.
    idle: Mutex<Vec<Idle>>,
    open: Arc<AtomicU32>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

struct Conn {
    raw: PgConnection,
    /// What this session's `engram.tenant` is set to, when known.
    tenant: Option<Box<str>>,
    born: Instant,
    epoch: u64,
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
            idle: Mutex::new(Vec::new()),
            open: Arc::default(),
        }));
        let first = pool.open_connection().await?;
        pool.put(first);
        Ok(pool)
    }

    pub(super) fn max(&self) -> u32 {
        self.0.max
    }

    pub(super) fn open(&self) -> u32 {
        self.0.open.load(Ordering::Relaxed)
    }

    pub(super) fn idle(&self) -> u32 {
        self.idle_list().len() as u32
    }

    /// A connection in autocommit whose session row-level security confines
    /// to `tenant` (`*`: every tenant, for the server's own work). Each
    /// statement is its own transaction; the setting costs a round trip
    /// only when this connection was last used for another tenant.
    pub(super) async fn session(&self, tenant: &str) -> Result<Lease> {
        let mut lease = self.acquire(Some(tenant)).await?;
        let conn = lease.conn_mut();
        if conn.tenant.as_deref() != Some(tenant) {
            // Unknown until the SET is known to have run: a failed or
            // cancelled one leaves the next user to set it again.
            conn.tenant = None;
            conn.raw
                .execute(sqlx::AssertSqlSafe(format!(
                    "SET engram.tenant = '{}'",
                    checked(tenant)?
                )))
                .await?;
            conn.tenant = Some(tenant.into());
        }
        Ok(lease)
    }

    /// A transaction confined to `tenant`. The tenant rides in the same
    /// round trip as `BEGIN` when the session is set to another one, as a
    /// `SET LOCAL` that ends with the transaction. Commit it with
    /// [`Lease::commit`]; dropped uncommitted, it is rolled back.
    pub(super) async fn transaction(&self, tenant: &str) -> Result<Lease> {
        let mut lease = self.acquire(Some(tenant)).await?;
        let begin = if lease.conn_mut().tenant.as_deref() == Some(tenant) {
            "BEGIN".to_owned()
        } else {
            format!("BEGIN; SET LOCAL engram.tenant = '{}'", checked(tenant)?)
        };
        // Marked first: a BEGIN that fails or is cancelled half-way leaves
        // the connection's state unknown, and a rollback settles it.
        lease.in_transaction = true;
        lease.execute(sqlx::AssertSqlSafe(begin)).await?;
        Ok(lease)
    }

    /// A connection with whatever its session was set to; for work that
    /// touches no tenant's rows (migrations, grants, snapshot checks).
    pub(super) async fn plain(&self) -> Result<Lease> {
        self.acquire(None).await
    }

    async fn acquire(&self, tenant: Option<&str>) -> Result<Lease> {
        tokio::time::timeout(self.0.acquire_timeout, self.acquire_now(tenant))
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    async fn acquire_now(&self, tenant: Option<&str>) -> Result<Lease> {
        let permit = Arc::clone(&self.0.permits)
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        loop {
            let Some(Idle { mut conn, since }) = self.take_idle(tenant) else {
                let conn = self.open_connection().await?;
                return Ok(self.lease(conn, permit));
            };
            if conn.born.elapsed() > MAX_LIFETIME || since.elapsed() > IDLE_TIMEOUT {
                close(conn);
                continue;
            }
            let epoch = EPOCH.load(Ordering::Relaxed);
            if since.elapsed() > IDLE_CHECK || conn.epoch != epoch {
                if conn.raw.ping().await.is_err() {
                    continue;
                }
                conn.epoch = epoch;
            }
            return Ok(self.lease(conn, permit));
        }
    }

    /// The most recently returned idle connection, preferring one whose
    /// session is already set to `tenant`.
    fn take_idle(&self, tenant: Option<&str>) -> Option<Idle> {
        let mut idle = self.idle_list();
        let matching = tenant.and_then(|tenant| {
            idle.iter()
                .rposition(|entry| entry.conn.tenant.as_deref() == Some(tenant))
        });
        match matching {
            Some(at) => Some(idle.remove(at)),
            None => idle.pop(),
        }
    }

    async fn open_connection(&self) -> Result<Conn> {
        let raw = PgConnection::connect_with(&self.0.connect).await?;
        self.0.open.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            raw,
            tenant: None,
            born: Instant::now(),
            epoch: EPOCH.load(Ordering::Relaxed),
            _counted: Counted(Arc::clone(&self.0.open)),
        })
    }

    fn lease(&self, conn: Conn, permit: OwnedSemaphorePermit) -> Lease {
        Lease {
            conn: Some(conn),
            permit: Some(permit),
            pool: self.clone(),
            in_transaction: false,
        }
    }

    fn put(&self, conn: Conn) {
        if conn.born.elapsed() > MAX_LIFETIME {
            close(conn);
            return;
        }
        let expired = {
            let mut idle = self.idle_list();
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

    fn idle_list(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        // The list is consistent after every statement that touches it, so
        // a panic elsewhere while it was held leaves nothing half-done.
        self.0.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
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

/// The one place a value is spliced into SQL: the tenant is a validated
/// name, and is checked again here.
fn checked(tenant: &str) -> Result<&str> {
    if tenant == "*" || Tenant::is_valid_name(tenant) {
        Ok(tenant)
    } else {
        Err(Error::internal(format!("unsafe tenant name {tenant:?}")))
    }
}

/// A connection taken from the pool; it goes back when dropped.
pub(super) struct Lease {
    conn: Option<Conn>,
    permit: Option<OwnedSemaphorePermit>,
    pool: Pool,
    in_transaction: bool,
}

impl Lease {
    fn conn_mut(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until it is dropped")
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
        self.execute(statement).await?;
        self.in_transaction = false;
        Ok(())
    }
}

impl std::ops::Deref for Lease {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self
            .conn
            .as_ref()
            .expect("a lease holds its connection until it is dropped")
            .raw
    }
}

impl std::ops::DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn_mut().raw
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
            drop(permit);
            return;
        }
        // An open transaction (an early return, a cancelled call) would
        // hold its locks until the connection's next use: roll it back now.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = self.pool.clone();
        runtime.spawn(async move {
            let _permit = permit;
            let mut conn = conn;
            let rollback = conn.raw.execute("ROLLBACK");
            if let Ok(Ok(_)) = tokio::time::timeout(pool.0.acquire_timeout, rollback).await {
                pool.put(conn);
            }
        });
    }
}
