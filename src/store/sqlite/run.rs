//! The shared statements of `store/sql.rs` on SQLite: the text without its
//! Postgres casts, timestamps bound and read as microseconds.

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::context::Tenant;
use crate::error::Result;
use crate::store::sql::{
    Backend, Cols, Dialect, Param, Run, Sql, Transaction, bind_params, cols_by_driver,
    run_by_driver,
};
use crate::store::{from_micros, to_micros};

bind_params!(SqliteArguments, to_micros, |list: &[String]| {
    serde_json::Value::from(list.to_vec()).to_string()
});

run_by_driver!(
    SqliteConnection,
    SqliteRow,
    arguments,
    sqlite,
    Dialect::Sqlite
);

cols_by_driver!(
    SqliteRow,
    |row: &SqliteRow, at| from_micros(sqlx::Row::try_get(row, at)?),
    |row: &SqliteRow, at| sqlx::Row::try_get::<Option<i64>, _>(row, at)?
        .map(from_micros)
        .transpose()
);

/// Pooled connections and transactions run on the connection they hold.
macro_rules! run_on_held_connection {
    ($($holder:ty),*) => {$(
        impl Run for $holder {
            type Row = SqliteRow;

            const DIALECT: Dialect = Dialect::Sqlite;

            async fn rows(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
            ) -> Result<Vec<SqliteRow>> {
                (**self).rows(sql, params).await
            }

            async fn rows_built(
                &mut self,
                sql: String,
                params: &[Param<'_>],
            ) -> Result<Vec<SqliteRow>> {
                (**self).rows_built(sql, params).await
            }

            async fn exec(&mut self, sql: &'static Sql, params: &[Param<'_>]) -> Result<u64> {
                (**self).exec(sql, params).await
            }

            async fn all_weighed<T: Send + crate::paging::Weigh>(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
                decode: impl Fn(&SqliteRow) -> Result<T> + Send,
            ) -> Result<Vec<T>> {
                (**self).all_weighed(sql, params, decode).await
            }

            async fn weigh_into<T: Send + crate::paging::Weigh>(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
                read: &mut crate::paging::Weighed<T>,
                decode: impl Fn(&SqliteRow) -> Result<Option<T>> + Send,
            ) -> Result<bool> {
                (**self).weigh_into(sql, params, read, decode).await
            }

            async fn built_weighed<T: Send + crate::paging::Weigh>(
                &mut self,
                sql: String,
                params: &[Param<'_>],
                decode: impl Fn(&SqliteRow) -> Result<T> + Send,
            ) -> Result<Vec<T>> {
                (**self).built_weighed(sql, params, decode).await
            }
        }
    )*};
}

run_on_held_connection!(PoolConnection<Sqlite>, sqlx::Transaction<'_, Sqlite>);

impl Transaction for sqlx::Transaction<'static, Sqlite> {
    async fn commit(self) -> Result<()> {
        Ok(sqlx::Transaction::commit(self).await?)
    }

    async fn rollback(self) -> Result<()> {
        Ok(sqlx::Transaction::rollback(self).await?)
    }
}

/// Reads share a pool beside the single writer connection, whose
/// transactions are `BEGIN IMMEDIATE`: one writer at a time, also across
/// processes sharing the file.
impl Backend for SqliteStore {
    type Conn = PoolConnection<Sqlite>;
    type Tx = sqlx::Transaction<'static, Sqlite>;

    async fn reader(&self, _tenant: &Tenant) -> Result<PoolConnection<Sqlite>> {
        Ok(self.reader.acquire().await?)
    }

    async fn writer(&self, _tenant: &Tenant) -> Result<PoolConnection<Sqlite>> {
        Ok(self.writer.acquire().await?)
    }

    async fn begin(&self, _tenant: &Tenant) -> Result<sqlx::Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// A deferred transaction on a reader: its first statement takes the
    /// snapshot (WAL mode), which the writer does not wait for.
    async fn snapshot(&self, _tenant: &Tenant) -> Result<sqlx::Transaction<'static, Sqlite>> {
        Ok(self.reader.begin().await?)
    }

    async fn system(&self) -> Result<PoolConnection<Sqlite>> {
        Ok(self.reader.acquire().await?)
    }

    async fn system_writer(&self) -> Result<PoolConnection<Sqlite>> {
        Ok(self.writer.acquire().await?)
    }
}
