//! One SQL source for both backends.
//!
//! A statement both backends run is written once, in Postgres syntax with
//! its casts spelled out (`$8::jsonb`, `value::text`, `sum(n)::bigint`);
//! SQLite runs the same text with those casts removed, since it keeps JSON
//! as text, takes `$N` placeholders and reads `NOT deleted`, `true` and
//! `count(*) FILTER (…)` as Postgres does. Values cross through [`Param`]
//! and [`Cols`], so a timestamp is a `timestamptz` on Postgres and
//! microseconds since the epoch on SQLite without the statement knowing,
//! and code that runs statements is written once over [`Run`].
//!
//! Written here rather than taken from sqlx's `Any` driver: `Any` has no
//! timestamps and no arrays, and would put a translation layer under every
//! statement of the hot paths; this keeps each backend's own driver and
//! its prepared statements, and moves only the text and the binding.

use std::future::Future;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};

use crate::context::Tenant;
use crate::error::Result;

/// A statement written once for both backends.
pub(super) struct Sql {
    text: &'static str,
    sqlite: OnceLock<String>,
}

impl Sql {
    pub(super) const fn new(text: &'static str) -> Sql {
        Sql {
            text,
            sqlite: OnceLock::new(),
        }
    }

    /// The text Postgres runs: as written.
    pub(super) fn postgres(&'static self) -> &'static str {
        self.text
    }

    /// The text SQLite runs: as written, less the casts.
    pub(super) fn sqlite(&'static self) -> &'static str {
        self.sqlite.get_or_init(|| without_casts(self.text))
    }
}

/// Removes every `::type` cast (`::jsonb`, `::text[]`, `::timestamptz`).
fn without_casts(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("::") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let after = &after[name..];
        rest = after.strip_prefix("[]").unwrap_or(after);
    }
    out.push_str(rest);
    out
}

/// A value bound to a statement's parameter.
#[derive(Debug, Clone, Copy)]
pub(super) enum Param<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Int(i64),
    OptInt(Option<i64>),
    Small(i16),
    OptSmall(Option<i16>),
    Float(f64),
    Bool(bool),
    /// A `timestamptz` on Postgres, microseconds on SQLite.
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    Bytes(&'a [u8]),
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(value: &'a str) -> Self {
        Param::Text(value)
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(value: &'a String) -> Self {
        Param::Text(value)
    }
}

impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Param::OptText(value)
    }
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Param::Int(value)
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(value: Option<i64>) -> Self {
        Param::OptInt(value)
    }
}

impl From<i16> for Param<'_> {
    fn from(value: i16) -> Self {
        Param::Small(value)
    }
}

impl From<Option<i16>> for Param<'_> {
    fn from(value: Option<i16>) -> Self {
        Param::OptSmall(value)
    }
}

impl From<f64> for Param<'_> {
    fn from(value: f64) -> Self {
        Param::Float(value)
    }
}

impl From<bool> for Param<'_> {
    fn from(value: bool) -> Self {
        Param::Bool(value)
    }
}

impl From<DateTime<Utc>> for Param<'_> {
    fn from(value: DateTime<Utc>) -> Self {
        Param::Time(value)
    }
}

impl From<Option<DateTime<Utc>>> for Param<'_> {
    fn from(value: Option<DateTime<Utc>>) -> Self {
        Param::OptTime(value)
    }
}

impl<'a> From<&'a [u8]> for Param<'a> {
    fn from(value: &'a [u8]) -> Self {
        Param::Bytes(value)
    }
}

/// The parameters of a statement, in order: `params![tenant, id, now]`.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::Param::from($value)),*]
    };
}
pub(super) use params;

/// A row's columns by position, as both backends decode them.
pub(super) trait Cols {
    fn text(&self, at: usize) -> Result<String>;
    fn opt_text(&self, at: usize) -> Result<Option<String>>;
    fn int(&self, at: usize) -> Result<i64>;
    fn opt_int(&self, at: usize) -> Result<Option<i64>>;
    fn small(&self, at: usize) -> Result<i16>;
    fn float(&self, at: usize) -> Result<f64>;
    fn boolean(&self, at: usize) -> Result<bool>;
    fn time(&self, at: usize) -> Result<DateTime<Utc>>;
    fn opt_time(&self, at: usize) -> Result<Option<DateTime<Utc>>>;
    fn bytes(&self, at: usize) -> Result<Vec<u8>>;
}

/// A connection (or transaction) that runs shared statements.
pub(super) trait Run: Send {
    type Row: Cols + Send;

    /// Every row the statement returns.
    fn rows(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Self::Row>>> + Send;

    /// The first row, if any.
    fn row(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Option<Self::Row>>> + Send;

    /// Runs the statement; returns how many rows it changed.
    fn exec(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64>> + Send;
}

/// A transaction of either backend; dropped uncommitted, it rolls back.
pub(super) trait Transaction: Run {
    fn commit(self) -> impl Future<Output = Result<()>> + Send;
    fn rollback(self) -> impl Future<Output = Result<()>> + Send;
}

/// What the shared implementations need from a backend: connections for a
/// tenant's reads, for its single-statement writes and for its
/// transactions, and one for the server's cross-tenant work.
pub(super) trait Backend: Clone + Send + Sync + 'static {
    type Conn: Run;
    type Tx: Transaction;

    fn reader(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Conn>> + Send;

    fn writer(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Conn>> + Send;

    fn begin(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Tx>> + Send;

    fn system(&self) -> impl Future<Output = Result<Self::Conn>> + Send;
}

/// Binds each [`Param`] to a backend's arguments; `$time` turns a
/// timestamp into what the backend stores.
macro_rules! bind_params {
    ($args:ty, $params:expr, $time:expr) => {{
        use sqlx::Arguments as _;
        let mut args = <$args>::default();
        for param in $params {
            match *param {
                Param::Text(v) => args.add(v),
                Param::OptText(v) => args.add(v),
                Param::Int(v) => args.add(v),
                Param::OptInt(v) => args.add(v),
                Param::Small(v) => args.add(v),
                Param::OptSmall(v) => args.add(v),
                Param::Float(v) => args.add(v),
                Param::Bool(v) => args.add(v),
                Param::Time(v) => args.add($time(v)),
                Param::OptTime(v) => args.add(v.map($time)),
                Param::Bytes(v) => args.add(v),
            }
            .map_err(crate::error::Error::internal)?;
        }
        args
    }};
}
pub(super) use bind_params;

/// The [`Cols`] a row decodes as its driver does; `$time` and `$opt_time`
/// read timestamps as the backend stores them.
macro_rules! cols_by_driver {
    ($row:ty, $time:expr, $opt_time:expr) => {
        impl Cols for $row {
            fn text(&self, at: usize) -> Result<String> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn opt_text(&self, at: usize) -> Result<Option<String>> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn int(&self, at: usize) -> Result<i64> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn opt_int(&self, at: usize) -> Result<Option<i64>> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn small(&self, at: usize) -> Result<i16> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn float(&self, at: usize) -> Result<f64> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn boolean(&self, at: usize) -> Result<bool> {
                Ok(sqlx::Row::try_get(self, at)?)
            }

            fn time(&self, at: usize) -> Result<DateTime<Utc>> {
                $time(self, at)
            }

            fn opt_time(&self, at: usize) -> Result<Option<DateTime<Utc>>> {
                $opt_time(self, at)
            }

            fn bytes(&self, at: usize) -> Result<Vec<u8>> {
                Ok(sqlx::Row::try_get(self, at)?)
            }
        }
    };
}
pub(super) use cols_by_driver;

/// The [`Run`] of a backend's connection type, with its arguments and the
/// statement text it takes.
macro_rules! run_by_driver {
    ($conn:ty, $row:ty, $arguments:ident, $text:ident) => {
        impl Run for $conn {
            type Row = $row;

            async fn rows(&mut self, sql: &'static Sql, params: &[Param<'_>]) -> Result<Vec<$row>> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sql.$text(), args).fetch_all(self).await?)
            }

            async fn row(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
            ) -> Result<Option<$row>> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sql.$text(), args)
                    .fetch_optional(self)
                    .await?)
            }

            async fn exec(&mut self, sql: &'static Sql, params: &[Param<'_>]) -> Result<u64> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sql.$text(), args)
                    .execute(self)
                    .await?
                    .rows_affected())
            }
        }
    };
}
pub(super) use run_by_driver;

#[cfg(test)]
mod tests {
    use super::without_casts;

    #[test]
    fn sqlite_text_is_the_statement_without_casts() {
        assert_eq!(
            without_casts("SELECT v.value::text, $8::jsonb, sum(n)::bigint FROM t"),
            "SELECT v.value, $8, sum(n) FROM t"
        );
        assert_eq!(
            without_casts("WHERE ($2::text IS NULL OR a = $2) AND b = ANY($3::text[])"),
            "WHERE ($2 IS NULL OR a = $2) AND b = ANY($3)"
        );
        assert_eq!(without_casts("SELECT 1"), "SELECT 1");
    }
}
