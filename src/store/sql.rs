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
pub struct Sql {
    text: &'static str,
    sqlite: OnceLock<String>,
    planned_each_call: bool,
}

impl Sql {
    pub const fn new(text: &'static str) -> Sql {
        Sql {
            text,
            sqlite: OnceLock::new(),
            planned_each_call: false,
        }
    }

    /// A statement Postgres plans for each call's values instead of keeping
    /// a plan on the connection: one whose optional filters ask for
    /// different indexes. A kept statement goes to Postgres's generic plan
    /// after five calls when that plan looks no dearer than theirs, and a
    /// generic plan cannot know which filters a call leaves blank: it may
    /// walk a whole tenant in the order of the page for a filter that an
    /// index answers at once. Planning costs about 0.2 ms, so only listings
    /// that are not hot paths are written this way. SQLite plans each
    /// statement once whatever its values, so it keeps them all.
    pub const fn planned_each_call(text: &'static str) -> Sql {
        Sql {
            text,
            sqlite: OnceLock::new(),
            planned_each_call: true,
        }
    }

    /// Whether the connection keeps the statement prepared.
    pub fn kept(&self, dialect: Dialect) -> bool {
        dialect == Dialect::Sqlite || !self.planned_each_call
    }

    /// The text Postgres runs: as written.
    pub fn postgres(&'static self) -> &'static str {
        self.text
    }

    /// The text SQLite runs: as written, less the casts, with arrays read
    /// as JSON arrays and a value's stored size (`pg_column_size`) its
    /// length.
    pub fn sqlite(&'static self) -> &'static str {
        self.sqlite.get_or_init(|| {
            without_casts(&json_arrays(self.text)).replace("pg_column_size(", "length(")
        })
    }
}

/// Rewrites the two array forms shared statements use for SQLite, where a
/// list parameter is a JSON array: `cardinality($N::text[])` becomes
/// `json_array_length($N)` and `= ANY($N)` becomes
/// `IN (SELECT value FROM json_each($N))`.
fn json_arrays(text: &str) -> String {
    let mut out = text.to_owned();
    for (form, sqlite) in [
        ("cardinality(", "json_array_length("),
        ("= ANY(", "IN (SELECT value FROM json_each("),
    ] {
        let mut rewritten = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(form) {
            rewritten.push_str(&rest[..at]);
            rewritten.push_str(sqlite);
            let after = &rest[at + form.len()..];
            let close = after.find(')').unwrap_or(after.len());
            rewritten.push_str(&after[..close]);
            if form.starts_with('=') {
                // The subquery's own parenthesis closes before the ANY's.
                rewritten.push(')');
            }
            rest = &after[close..];
        }
        rewritten.push_str(rest);
        out = rewritten;
    }
    out
}

/// Removes every `::type` cast (`::jsonb`, `::text[]`, `::timestamptz`).
pub(super) fn without_casts(text: &str) -> String {
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
pub enum Param<'a> {
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
    OptBytes(Option<&'a [u8]>),
    /// A `text[]` on Postgres, a JSON array on SQLite (read with
    /// `json_each`): statements taking one are per dialect.
    TextList(&'a [String]),
}

/// Each Rust type a parameter is bound from, and the kind it binds as.
macro_rules! param_from {
    ($($from:ty => $kind:ident),* $(,)?) => {$(
        impl<'a> From<$from> for Param<'a> {
            fn from(value: $from) -> Self {
                Param::$kind(value)
            }
        }
    )*};
}

param_from! {
    &'a str => Text,
    &'a String => Text,
    Option<&'a str> => OptText,
    i64 => Int,
    Option<i64> => OptInt,
    i16 => Small,
    Option<i16> => OptSmall,
    f64 => Float,
    bool => Bool,
    DateTime<Utc> => Time,
    Option<DateTime<Utc>> => OptTime,
    &'a [String] => TextList,
    &'a [u8] => Bytes,
    Option<&'a [u8]> => OptBytes,
}

/// The parameters of a statement, in order: `params![tenant, id, now]`.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::Param::from($value)),*]
    };
}
pub(super) use params;

/// A row's columns by position, as both backends decode them.
pub trait Cols {
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
    fn opt_bytes(&self, at: usize) -> Result<Option<Vec<u8>>>;
}

/// Which SQL a connection speaks, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

/// A connection (or transaction) that runs shared statements.
pub trait Run: Send {
    type Row: Cols + Send;

    const DIALECT: Dialect;

    /// Every row the statement returns.
    fn rows(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Self::Row>>> + Send;

    /// The first row, if any (statements read this way return at most
    /// one).
    fn row(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Option<Self::Row>>> + Send {
        async move { Ok(self.rows(sql, params).await?.into_iter().next()) }
    }

    /// Every row of a statement built at run time (search, whose filters
    /// decide its conditions), in the connection's own dialect.
    fn rows_built(
        &mut self,
        sql: String,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Self::Row>>> + Send;

    /// The rows decoded, read one at a time, up to the first that paging
    /// would cut ([`overflows`]); the rest of the result is not held in
    /// memory. A list of large values then ends where its page will:
    /// paging weighs the same items, cuts that last one and gives a token
    /// for the rest.
    ///
    /// [`overflows`]: crate::paging::overflows
    fn all_weighed<T: Send + crate::paging::Weigh>(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
        decode: impl Fn(&Self::Row) -> Result<T> + Send,
    ) -> impl Future<Output = Result<Vec<T>>> + Send;

    /// [`Run::all_weighed`] into `read`, which may hold what an earlier
    /// part of the page read, for a statement that also cuts by bytes
    /// itself ([`SENT_WHOLE_BYTES`]): a row `decode` answers `None` for
    /// came past that cut, without its value, and reading stops there.
    /// Returns whether it did: then more rows follow though `read` may not
    /// be full, and the caller reads on after the last item.
    fn weigh_into<T: Send + crate::paging::Weigh>(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
        read: &mut crate::paging::Weighed<T>,
        decode: impl Fn(&Self::Row) -> Result<Option<T>> + Send,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// [`Run::all_weighed`] for a statement built at run time: search's
    /// hits, which come back best first.
    fn built_weighed<T: Send + crate::paging::Weigh>(
        &mut self,
        sql: String,
        params: &[Param<'_>],
        decode: impl Fn(&Self::Row) -> Result<T> + Send,
    ) -> impl Future<Output = Result<Vec<T>>> + Send;

    /// Runs the statement; returns how many rows it changed.
    fn exec(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Every row, decoded.
    fn all<T: Send>(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
        decode: impl Fn(&Self::Row) -> Result<T> + Send,
    ) -> impl Future<Output = Result<Vec<T>>> + Send {
        async move { self.rows(sql, params).await?.iter().map(decode).collect() }
    }

    /// The first row, decoded, if any.
    fn first<T: Send>(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
        decode: impl Fn(&Self::Row) -> Result<T> + Send,
    ) -> impl Future<Output = Result<Option<T>>> + Send {
        async move {
            self.row(sql, params)
                .await?
                .as_ref()
                .map(decode)
                .transpose()
        }
    }

    /// The first column of the first row as a number (a count); 0 when
    /// there is no row.
    fn count(
        &mut self,
        sql: &'static Sql,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<i64>> + Send {
        async move {
            Ok(self
                .first(sql, params, |row| row.int(0))
                .await?
                .unwrap_or(0))
        }
    }
}

/// A `SELECT` of a column list (a macro expanding to a literal) and the
/// rest of the statement.
macro_rules! select {
    ($columns:expr, $rest:literal) => {
        $crate::store::sql::Sql::new(concat!("SELECT ", $columns, $rest))
    };
}
pub(super) use select;

/// Rows in `$order` from `$from` (which ends in `ORDER BY $order`, limited
/// there or before), each followed by `past`, the condition `$past`:
/// `$inner` are the columns read from `$from` (large ones as stored, not
/// yet read), `$columns` those sent, whose large ones are `CASE WHEN past
/// THEN NULL ELSE … END`. The shape of [`page_by_bytes!`] and
/// [`page_by_row!`]. A leading `planned_each_call;` makes the statement
/// with [`Sql::planned_each_call`] instead of [`Sql::new`].
macro_rules! page_marked {
    ($columns:expr, $inner:expr, $past:expr, $order:literal, $from:expr) => {
        $crate::store::sql::page_marked!(new; $columns, $inner, $past, $order, $from)
    };
    ($new:ident; $columns:expr, $inner:expr, $past:expr, $order:literal, $from:expr) => {
        $crate::store::sql::Sql::$new(concat!(
            "SELECT ",
            $columns,
            ", past FROM (SELECT ",
            $inner,
            ", ",
            $past,
            " AS past ",
            $from,
            ") page ORDER BY ",
            $order
        ))
    };
}
pub(super) use page_marked;

/// [`page_marked!`] with `past` whether the stored sizes (`$size`, summed)
/// of the rows before it come to more than `$bytes`
/// ([`SENT_WHOLE_BYTES`]): a statement of pages that stops sending values
/// past a page's bytes itself (see [`Run::weigh_into`]).
macro_rules! page_by_bytes {
    ($columns:expr, $inner:expr, $size:expr, $order:literal, $bytes:literal, $from:expr) => {
        $crate::store::sql::page_by_bytes!(new; $columns, $inner, $size, $order, $bytes, $from)
    };
    ($new:ident; $columns:expr, $inner:expr, $size:expr, $order:literal, $bytes:literal, $from:expr) => {
        $crate::store::sql::page_marked!(
            $new;
            $columns,
            $inner,
            concat!(
                "coalesce(sum(",
                $size,
                ") OVER (ORDER BY ",
                $order,
                " ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) > ",
                $bytes
            ),
            $order,
            $from
        )
    };
}
pub(super) use page_by_bytes;

/// [`page_marked!`] with `past` decided by each row alone: whether its own
/// stored size passes `$bytes` ([`row_share`]). Every row of such a
/// statement within its share, all of them together stay within twice a
/// page's bytes, and Postgres sums nothing: the first statement of a read
/// of many small rows (a `History` of ten thousand versions spent a fifth
/// of its Postgres time in [`page_by_bytes!`]'s window). A row past its
/// share ends the read as a row past the cut does, and the read goes on by
/// [`page_by_bytes!`]'s statement, which sends that row whole.
macro_rules! page_by_row {
    ($columns:expr, $inner:expr, $size:expr, $order:literal, $bytes:literal, $from:expr) => {
        $crate::store::sql::page_marked!(
            $columns,
            $inner,
            concat!("coalesce(", $size, ", 0) > ", $bytes),
            $order,
            $from
        )
    };
}
pub(super) use page_by_row;

/// A transaction of either backend; dropped uncommitted, it rolls back.
pub trait Transaction: Run {
    fn commit(self) -> impl Future<Output = Result<()>> + Send;
    fn rollback(self) -> impl Future<Output = Result<()>> + Send;
}

/// What the shared implementations need from a backend: connections for a
/// tenant's reads, for its single-statement writes and for its
/// transactions, and one for the server's cross-tenant work.
pub trait Backend: Clone + Send + Sync + 'static {
    type Conn: Run;
    type Tx: Transaction + 'static;

    fn reader(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Conn>> + Send;

    fn writer(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Conn>> + Send;

    fn begin(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Tx>> + Send;

    /// A read-only transaction that sees one snapshot of the tenant for as
    /// long as it is held (a long read made of many statements, as an
    /// export is), without holding back writers.
    fn snapshot(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Tx>> + Send;

    fn system(&self) -> impl Future<Output = Result<Self::Conn>> + Send;

    /// For the server's cross-tenant writes (pruning).
    fn system_writer(&self) -> impl Future<Output = Result<Self::Conn>> + Send;
}

/// Defines `fn arguments`, which binds each [`Param`] to a backend's
/// arguments; `$time` turns a timestamp and `$list` a list into what the
/// backend stores.
macro_rules! bind_params {
    ($args:ty, $time:expr, $list:expr) => {
        fn arguments(params: &[Param<'_>]) -> Result<$args> {
            use sqlx::Arguments as _;
            let mut args = <$args>::default();
            for param in params {
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
                    Param::OptBytes(v) => args.add(v),
                    Param::TextList(v) => args.add($list(v)),
                }
                .map_err(crate::error::Error::internal)?;
            }
            Ok(args)
        }
    };
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

            fn opt_bytes(&self, at: usize) -> Result<Option<Vec<u8>>> {
                Ok(sqlx::Row::try_get(self, at)?)
            }
        }
    };
}
pub(super) use cols_by_driver;

/// The [`Run`] of a backend's connection type, with its arguments and the
/// statement text it takes.
macro_rules! run_by_driver {
    ($conn:ty, $row:ty, $arguments:ident, $text:ident, $dialect:expr) => {
        impl Run for $conn {
            type Row = $row;

            const DIALECT: Dialect = $dialect;

            async fn rows(&mut self, sql: &'static Sql, params: &[Param<'_>]) -> Result<Vec<$row>> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sql.$text(), args)
                    .persistent(sql.kept($dialect))
                    .fetch_all(self)
                    .await?)
            }

            async fn rows_built(&mut self, sql: String, params: &[Param<'_>]) -> Result<Vec<$row>> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sqlx::AssertSqlSafe(sql), args)
                    .fetch_all(self)
                    .await?)
            }

            async fn exec(&mut self, sql: &'static Sql, params: &[Param<'_>]) -> Result<u64> {
                let args = $arguments(params)?;
                Ok(sqlx::query_with(sql.$text(), args)
                    .persistent(sql.kept($dialect))
                    .execute(self)
                    .await?
                    .rows_affected())
            }

            async fn all_weighed<T: Send + $crate::paging::Weigh>(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
                decode: impl Fn(&$row) -> Result<T> + Send,
            ) -> Result<Vec<T>> {
                let args = $arguments(params)?;
                let rows = sqlx::query_with(sql.$text(), args)
                    .persistent(sql.kept($dialect))
                    .fetch(self);
                $crate::store::sql::weighed(rows, decode).await
            }

            async fn weigh_into<T: Send + $crate::paging::Weigh>(
                &mut self,
                sql: &'static Sql,
                params: &[Param<'_>],
                read: &mut $crate::paging::Weighed<T>,
                decode: impl Fn(&$row) -> Result<Option<T>> + Send,
            ) -> Result<bool> {
                let args = $arguments(params)?;
                let rows = sqlx::query_with(sql.$text(), args)
                    .persistent(sql.kept($dialect))
                    .fetch(self);
                $crate::store::sql::weigh_into(rows, read, decode).await
            }

            async fn built_weighed<T: Send + $crate::paging::Weigh>(
                &mut self,
                sql: String,
                params: &[Param<'_>],
                decode: impl Fn(&$row) -> Result<T> + Send,
            ) -> Result<Vec<T>> {
                let args = $arguments(params)?;
                let rows = sqlx::query_with(sqlx::AssertSqlSafe(sql), args).fetch(self);
                $crate::store::sql::weighed(rows, decode).await
            }
        }
    };
}
pub(super) use run_by_driver;

/// The rows of a stream decoded, up to the first that paging would cut
/// (see [`Run::all_weighed`]); the stream is dropped there.
pub(super) async fn weighed<R, T: crate::paging::Weigh>(
    rows: impl futures::Stream<Item = std::result::Result<R, sqlx::Error>> + Unpin,
    decode: impl Fn(&R) -> Result<T>,
) -> Result<Vec<T>> {
    let mut read = crate::paging::Weighed::default();
    weigh_into(rows, &mut read, move |row| decode(row).map(Some)).await?;
    Ok(read.items)
}

/// About how many bytes of stored values a statement that cuts by bytes
/// itself sends in full (see [`Run::weigh_into`]): a page's worth.
///
/// Dropping a stream does not stop Postgres: it sends every row the
/// statement was asked for, and the driver reads and discards the rest
/// before the connection runs anything else. A page of a hundred values of
/// a megabyte that paging cuts after two still moved a hundred megabytes.
/// Such a statement sums `pg_column_size` of the values before each row (a
/// running window sum, read off the stored form without detoasting it) and
/// sends a row past this many bytes without its value. Stored sizes are
/// compressed sizes: values that compress well are still sent in full.
pub(super) const SENT_WHOLE_BYTES: i64 = crate::paging::PAGE_BYTES as i64;

/// The most stored bytes a row of a statement of `limit` rows by
/// [`page_by_row!`] comes with whole: all `limit` of that size stay within
/// twice [`SENT_WHOLE_BYTES`].
pub(super) fn row_share(limit: i64) -> i64 {
    2 * SENT_WHOLE_BYTES / limit.max(1)
}

/// [`Run::weigh_into`] over a stream of rows.
pub(super) async fn weigh_into<R, T: crate::paging::Weigh>(
    mut rows: impl futures::Stream<Item = std::result::Result<R, sqlx::Error>> + Unpin,
    read: &mut crate::paging::Weighed<T>,
    decode: impl Fn(&R) -> Result<Option<T>>,
) -> Result<bool> {
    use futures::TryStreamExt as _;
    while !read.full
        && let Some(row) = rows.try_next().await?
    {
        match decode(&row)? {
            Some(item) => read.push(item),
            None => return Ok(true),
        }
    }
    Ok(false)
}

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

    #[test]
    fn sqlite_reads_array_parameters_as_json_arrays() {
        let sql = super::json_arrays(
            "WHERE (cardinality($5::text[]) = 0 OR type = ANY($5)) AND id = ANY($2::text[])",
        );
        assert_eq!(
            without_casts(&sql),
            "WHERE (json_array_length($5) = 0 OR type IN (SELECT value FROM json_each($5))) \
             AND id IN (SELECT value FROM json_each($2))"
        );
    }
}
