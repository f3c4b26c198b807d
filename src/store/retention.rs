//! Retention policies on both backends, one statement text each. Durations
//! are kept as microseconds, so both stores hold them as plain integers.

use chrono::{DateTime, Utc};

use super::memory::scope_at;
use super::sql::{Cols, Run, Sql, params, select};
use crate::context::Tenant;
use crate::error::Result;
use crate::memory::Scope;
use crate::memory::ports::{Retention, RetentionPolicy};

/// The columns [`retention_row`] reads, for `concat!`.
macro_rules! retention_columns {
    () => {
        "scope_type, scope, keep_versions, max_age_micros, tombstone_grace_micros, \
         next_run_time, last_run_time, last_versions_deleted"
    };
}

static UPSERT: Sql = Sql::new(concat!(
    "INSERT INTO memory_retention (tenant, scope_type, scope, keep_versions, max_age_micros, \
     tombstone_grace_micros, next_run_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
     ON CONFLICT (tenant, scope_type, scope) DO UPDATE SET \
       keep_versions = EXCLUDED.keep_versions, max_age_micros = EXCLUDED.max_age_micros, \
       tombstone_grace_micros = EXCLUDED.tombstone_grace_micros, \
       next_run_time = EXCLUDED.next_run_time, update_time = EXCLUDED.update_time \
     RETURNING ",
    retention_columns!()
));

static REMOVE: Sql =
    Sql::new("DELETE FROM memory_retention WHERE tenant = $1 AND scope_type = $2 AND scope = $3");

static ONE: Sql = select!(
    retention_columns!(),
    " FROM memory_retention WHERE tenant = $1 AND scope_type = $2 AND scope = $3"
);

static DUE: Sql = Sql::new(concat!(
    "SELECT tenant, ",
    retention_columns!(),
    " FROM memory_retention WHERE next_run_time <= $1 ORDER BY next_run_time LIMIT $2"
));

static CLAIM: Sql = Sql::new(
    "UPDATE memory_retention SET next_run_time = $5 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND next_run_time = $4",
);

static RAN: Sql = Sql::new(
    "UPDATE memory_retention SET last_run_time = $4, last_versions_deleted = $5 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3",
);

fn duration(micros: Option<i64>) -> Option<chrono::Duration> {
    micros.map(chrono::Duration::microseconds)
}

fn micros(duration: Option<chrono::Duration>) -> Option<i64> {
    duration.and_then(|d| d.num_microseconds())
}

/// A policy row (columns as `retention_columns!`, from `at`).
fn retention_row(row: &impl Cols, at: usize) -> Result<Retention> {
    Ok(Retention {
        scope: scope_at(row, at)?,
        policy: RetentionPolicy {
            keep_versions: row.opt_int(at + 2)?,
            max_age: duration(row.opt_int(at + 3)?),
            tombstone_grace: duration(row.opt_int(at + 4)?),
        },
        next_run_time: row.time(at + 5)?,
        last_run_time: row.opt_time(at + 6)?,
        last_versions_deleted: row.int(at + 7)?,
    })
}

pub(super) async fn set(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    policy: Option<RetentionPolicy>,
    next_run_time: DateTime<Utc>,
) -> Result<Option<Retention>> {
    let Some(policy) = policy else {
        conn.exec(
            &REMOVE,
            params![
                tenant.as_str(),
                scope.scope_type.as_i16(),
                scope.name.as_str()
            ],
        )
        .await?;
        return Ok(None);
    };
    conn.first(
        &UPSERT,
        params![
            tenant.as_str(),
            scope.scope_type.as_i16(),
            scope.name.as_str(),
            policy.keep_versions,
            micros(policy.max_age),
            micros(policy.tombstone_grace),
            next_run_time,
        ],
        |row| retention_row(row, 0),
    )
    .await
}

pub(super) async fn get(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
) -> Result<Option<Retention>> {
    conn.first(
        &ONE,
        params![
            tenant.as_str(),
            scope.scope_type.as_i16(),
            scope.name.as_str()
        ],
        |row| retention_row(row, 0),
    )
    .await
}

pub(super) async fn due(
    conn: &mut impl Run,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<(Tenant, Retention)>> {
    conn.all(&DUE, params![now, limit], |row| {
        Ok((Tenant::new(row.text(0)?), retention_row(row, 1)?))
    })
    .await
}

pub(super) async fn claim(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    seen: DateTime<Utc>,
    next: DateTime<Utc>,
) -> Result<bool> {
    let moved = conn
        .exec(
            &CLAIM,
            params![
                tenant.as_str(),
                scope.scope_type.as_i16(),
                scope.name.as_str(),
                seen,
                next,
            ],
        )
        .await?;
    Ok(moved == 1)
}

pub(super) async fn ran(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    at: DateTime<Utc>,
    versions_deleted: i64,
) -> Result<()> {
    conn.exec(
        &RAN,
        params![
            tenant.as_str(),
            scope.scope_type.as_i16(),
            scope.name.as_str(),
            at,
            versions_deleted,
        ],
    )
    .await?;
    Ok(())
}
