//! The shared statements of `store/sql.rs` on Postgres: parameters bound
//! with their Postgres types, columns decoded from Postgres rows.

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};

use super::PgStore;
use super::pool::Lease;
use crate::context::Tenant;
use crate::error::Result;
use crate::store::sql::{
    Backend, Cols, Dialect, Param, Run, Sql, Transaction, bind_params, cols_by_driver,
    run_by_driver,
};

bind_params!(PgArguments, |time: DateTime<Utc>| time, <[String]>::to_vec);

run_by_driver!(Lease, PgRow, arguments, postgres, Dialect::Postgres);

cols_by_driver!(
    PgRow,
    |row: &PgRow, at| Ok(sqlx::Row::try_get(row, at)?),
    |row: &PgRow, at| Ok(sqlx::Row::try_get(row, at)?)
);

impl Transaction for Lease {
    async fn commit(self) -> Result<()> {
        Lease::commit(self).await
    }

    async fn rollback(self) -> Result<()> {
        Lease::rollback(self).await
    }
}

/// Every tenant call runs on a connection bound to its tenant; a single
/// statement in autocommit, several in a transaction.
impl Backend for PgStore {
    type Conn = Lease;
    type Tx = Lease;

    async fn reader(&self, tenant: &Tenant) -> Result<Lease> {
        self.session(tenant).await
    }

    async fn writer(&self, tenant: &Tenant) -> Result<Lease> {
        self.session(tenant).await
    }

    async fn begin(&self, tenant: &Tenant) -> Result<Lease> {
        self.scoped(tenant).await
    }

    async fn snapshot(&self, tenant: &Tenant) -> Result<Lease> {
        self.pool.snapshot(tenant).await
    }

    async fn system(&self) -> Result<Lease> {
        PgStore::system(self).await
    }

    async fn system_writer(&self) -> Result<Lease> {
        PgStore::system(self).await
    }
}
