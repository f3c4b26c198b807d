//! Memory as it was: reads at a point (`as_of`), forks of a scope's state
//! at a point, and the purge records that let both say "purged since"
//! instead of silently skipping a key. One statement text each for both
//! backends.
//!
//! A version carries the change-feed revision that wrote it (migration
//! 0011), so the state at a point is, per key, the newest version written
//! at or before it. Purges remove the oldest versions of a key, so the kept
//! versions are always a contiguous range ending at the head: when one of
//! them was written by the point it is the answer, and when none was but a
//! purged one was (`memory_purges`), the answer is "purged".

use super::memory::{
    entry_row, flow_filters, purge_params, purge_victim, scope_summary, version_columns,
};
use super::sql::{Cols, Param, Run, SENT_WHOLE_BYTES, Sql, params, select};
use crate::context::Tenant;
use crate::error::Result;
use crate::memory::ports::{Fork, Forked, ListQuery, Past, Point, Purge, ScopeFilter};
use crate::memory::{Key, Scope, ScopeSummary, ScopeType};
use crate::paging::Weighed;

/// The newest version number of `k.key` in scope ($1, $2, $3) written by
/// the point ($4 revision, $5 time), for `concat!`.
macro_rules! version_at {
    () => {
        "(SELECT max(v.version) FROM memory_versions v WHERE v.tenant = $1 \
         AND v.scope_type = $2 AND v.scope = $3 AND v.key = k.key \
         AND v.revision <= $4 AND v.create_time <= $5)"
    };
}

/// Whether a version of `k.key` written by the point has been purged.
macro_rules! purged_at {
    () => {
        "EXISTS (SELECT 1 FROM memory_purges p WHERE p.tenant = $1 \
         AND p.scope_type = $2 AND p.scope = $3 AND p.key = k.key \
         AND p.first_revision <= $4 AND p.first_time <= $5)"
    };
}

/// Every key of scope ($1, $2, $3) that has a version or lost one to a
/// purge, for `concat!`.
macro_rules! keys_ever {
    ($range:literal) => {
        concat!(
            "(SELECT key FROM memory_heads WHERE tenant = $1 AND scope_type = $2 \
             AND scope = $3",
            $range,
            " UNION SELECT key FROM memory_purges WHERE tenant = $1 \
             AND scope_type = $2 AND scope = $3",
            $range,
            ") k"
        )
    };
}

/// Records, before a purge deletes them, the oldest version each target
/// key loses (merged with what earlier purges took), and returns the keys.
/// Parameters as `purge_victim!`, and $9 now. In key order, so that purges
/// of one scope that share keys take their rows in one order (in the order
/// of a hash table, which differs with the keys that share it, two
/// deadlocked). The purge then deletes from these keys alone: a key that
/// gains its first victim after this statement looked is left whole to the
/// next purge, rather than losing a version no record covers.
pub(super) static RECORD_PURGES: Sql = Sql::new(concat!(
    "INSERT INTO memory_purges (tenant, scope_type, scope, key, first_revision, first_time, \
     purge_time) \
     SELECT $1, $2, $3, v.key, min(v.revision), min(v.create_time), $9 FROM memory_versions v \
     JOIN memory_heads h USING (tenant, scope_type, scope, key) WHERE ",
    purge_victim!(),
    " GROUP BY v.key ORDER BY v.key \
     ON CONFLICT (tenant, scope_type, scope, key) DO UPDATE SET \
       first_revision = CASE WHEN EXCLUDED.first_revision < memory_purges.first_revision \
         THEN EXCLUDED.first_revision ELSE memory_purges.first_revision END, \
       first_time = CASE WHEN EXCLUDED.first_time < memory_purges.first_time \
         THEN EXCLUDED.first_time ELSE memory_purges.first_time END, \
       purge_time = EXCLUDED.purge_time \
     RETURNING key"
));

/// $6 key.
static GET_AT: Sql = select!(
    version_columns!(),
    " FROM memory_versions v WHERE v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
     AND v.key = $6 AND v.revision <= $4 AND v.create_time <= $5 \
     ORDER BY v.version DESC LIMIT 1"
);

/// $6 key.
static PURGED_AT: Sql = Sql::new(
    "SELECT count(*) FROM memory_purges p WHERE p.tenant = $1 AND p.scope_type = $2 \
     AND p.scope = $3 AND p.key = $6 AND p.first_revision <= $4 AND p.first_time <= $5",
);

/// The first $10 keys of the scope that have a version or lost one to a
/// purge, after $8 within $6 and $7 ($9: whether reserved keys count), for
/// `concat!`. Each table gives its first $10 and their union is cut to
/// $10 again: those are the first $10 of both, and no statement reads
/// further. (A union of the whole range made every page read, and look up
/// the version at the point of, each key from the page's start to the
/// range's end: 44 ms a page of a scope of 10,000 keys, 335 ms past the
/// 150,000th key of 200,000.)
macro_rules! keys_next {
    () => {
        concat!(
            "(SELECT key FROM (SELECT key FROM (SELECT key FROM memory_heads WHERE tenant = $1 \
               AND scope_type = $2 AND scope = $3 AND key >= $6 AND key < $7 AND key > $8 \
               AND ($9 OR substr(key, 1, 12) <> '_compaction/') ORDER BY key LIMIT $10) hk \
             UNION SELECT key FROM (SELECT key FROM memory_purges WHERE tenant = $1 \
               AND scope_type = $2 AND scope = $3 AND key >= $6 AND key < $7 AND key > $8 \
               AND ($9 OR substr(key, 1, 12) <> '_compaction/') ORDER BY key LIMIT $10) pk) u \
             ORDER BY key LIMIT $10) k"
        )
    };
}

/// $6 and $7 the key range, $8 the last key read, $9 whether reserved
/// keys count, $10 how many keys to look at ([`keys_next!`]), $11
/// [`SENT_WHOLE_BYTES`]. Of those keys, the ones listed at the point: the
/// columns of `entry_row`, then the key again for the purged rows, which
/// have no version, then whether the row came past the bytes sent whole,
/// without its value (as `List` at the head does). A key deleted at the
/// point is looked at but not listed, so fewer rows may come than keys
/// were looked at; [`KEYS_NEXT_END`] says where the next look starts.
static LIST_AT: Sql = Sql::new(concat!(
    "SELECT key, version, CASE WHEN past THEN NULL ELSE value::text END, deleted, \
     execution_id, flow_id, flow_name, create_time, listed, past \
     FROM (SELECT v.key, v.version, v.value, v.deleted, v.execution_id, v.flow_id, \
       v.flow_name, v.create_time, a.key AS listed, \
       coalesce(sum(pg_column_size(v.value)) OVER (ORDER BY a.key \
         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) > $11 AS past \
     FROM (SELECT k.key, ",
    version_at!(),
    " AS version, ",
    purged_at!(),
    " AS purged FROM ",
    keys_next!(),
    ") a \
     LEFT JOIN memory_versions v ON v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
       AND v.key = a.key AND v.version = a.version \
     WHERE (a.version IS NULL AND a.purged) OR (a.version IS NOT NULL AND NOT v.deleted) \
     ORDER BY a.key) page ORDER BY listed"
));

/// The last of the keys [`LIST_AT`] looked at ($1 to $10 as there), and
/// how many there were: fewer than $10 when the range ends among them.
static KEYS_NEXT_END: Sql = Sql::new(concat!("SELECT max(k.key), count(*) FROM ", keys_next!()));

/// The first $5 scopes of `$table` after ($3, $4), of type $2 (0: any)
/// and within the flow filters ($6, $7), for `concat!`.
macro_rules! scopes_next_of {
    ($table:literal) => {
        concat!(
            "SELECT scope_type, scope FROM (SELECT DISTINCT k.scope_type, k.scope FROM ",
            $table,
            " k WHERE k.tenant = $1 AND ($2 = 0 OR k.scope_type = $2) \
             AND (k.scope_type, k.scope) > ($3, $4) AND ",
            flow_filters!(),
            " ORDER BY k.scope_type, k.scope LIMIT $5)"
        )
    };
}

/// `ListScopes` at a point ($8 revision, $9 time), parameters as
/// `SCOPES` (memory.rs) but $5 how many scopes to look at: the first $5
/// scopes that hold a key or lost one to a purge (each table's first $5,
/// their union cut to $5 again, as [`keys_next!`] takes keys), each with
/// its keys live then (column 2), its keys whose value then was purged
/// since (3) and its keys that had a version then (4). A scope with
/// neither of the last two is looked at but not listed. (Looking at every
/// scope from the page's start made each page work out every key after
/// it: on Postgres the first page of 100 took 82 ms among 5,000 scopes of
/// 20 keys and 418 ms among 25,000; it takes 7–8 ms now, wherever the page
/// starts.) Each key's version at the point is read once: the keys are
/// `MATERIALIZED`, since Postgres would otherwise read it again for each
/// count that names it (11 ms a page).
static SCOPES_AT: Sql = Sql::new(concat!(
    "WITH s AS (SELECT scope_type, scope FROM (",
    scopes_next_of!("memory_heads"),
    " hs UNION ",
    scopes_next_of!("memory_purges"),
    " ps) u ORDER BY scope_type, scope LIMIT $5), \
     a AS MATERIALIZED (SELECT k.scope_type, k.scope, k.key, \
       (SELECT v.deleted FROM memory_versions v WHERE v.tenant = $1 \
        AND v.scope_type = k.scope_type AND v.scope = k.scope AND v.key = k.key \
        AND v.revision <= $8 AND v.create_time <= $9 ORDER BY v.version DESC LIMIT 1) AS deleted \
       FROM (SELECT h.scope_type, h.scope, h.key FROM s JOIN memory_heads h ON h.tenant = $1 \
           AND h.scope_type = s.scope_type AND h.scope = s.scope \
         UNION SELECT p.scope_type, p.scope, p.key FROM s JOIN memory_purges p ON p.tenant = $1 \
           AND p.scope_type = s.scope_type AND p.scope = s.scope) k) \
     SELECT a.scope_type, a.scope, \
     count(*) FILTER (WHERE NOT a.deleted AND substr(a.key, 1, 12) <> '_compaction/'), \
     count(*) FILTER (WHERE a.deleted IS NULL AND EXISTS (SELECT 1 FROM memory_purges p \
       WHERE p.tenant = $1 AND p.scope_type = a.scope_type AND p.scope = a.scope \
       AND p.key = a.key AND p.first_revision <= $8 AND p.first_time <= $9)), \
     count(a.deleted) \
     FROM a GROUP BY a.scope_type, a.scope ORDER BY a.scope_type, a.scope"
));

/// The live, unreserved keys of the source scope ($1, $2, $3) at the point
/// ($4, $5) and their versions then, for `concat!`.
macro_rules! fork_state {
    () => {
        concat!(
            "(SELECT a.key, a.version FROM (SELECT k.key, ",
            version_at!(),
            " AS version FROM memory_heads k WHERE k.tenant = $1 AND k.scope_type = $2 \
             AND k.scope = $3 AND substr(k.key, 1, 12) <> '_compaction/') a \
             JOIN memory_versions v ON v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
               AND v.key = a.key AND v.version = a.version WHERE NOT v.deleted) s"
        )
    };
}

/// A few source keys whose value at the point was purged since.
static FORK_PURGED: Sql = Sql::new(concat!(
    "SELECT k.key FROM ",
    keys_ever!(""),
    " WHERE substr(k.key, 1, 12) <> '_compaction/' AND ",
    version_at!(),
    " IS NULL AND ",
    purged_at!(),
    " ORDER BY k.key LIMIT 10"
));

static FORK_COUNT: Sql = Sql::new(concat!("SELECT count(*) FROM ", fork_state!()));

/// Keys of a scope ($1 tenant, $2 scope_type, $3 scope).
static SCOPE_KEYS: Sql = Sql::new(
    "SELECT count(*) FROM memory_heads WHERE tenant = $1 AND scope_type = $2 AND scope = $3",
);

/// $6, $7 the target scope, $8 now. Taken first, so the transaction holds
/// its id before it takes revisions (see migration 0003). The heads are
/// created in key order, the order a group of sets creates its keys in:
/// an insert of a key another transaction is inserting waits for it, so
/// in the plan's order (a hash join's, say) a fork and a group of sets
/// creating two of its keys could each wait for the other (a deadlock,
/// and one of them failed).
static FORK_HEADS: Sql = Sql::new(concat!(
    "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
     SELECT $1, $6, $7, s.key, 1, false, $8 FROM ",
    fork_state!(),
    " WHERE true ORDER BY s.key ON CONFLICT DO NOTHING"
));

/// One change per key of the target ($1, $2, $3) at $4 now.
static FORK_CHANGES: Sql = Sql::new(
    "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
     SELECT $1, $2, $3, h.key, 1, 1, $4 FROM memory_heads h \
     WHERE h.tenant = $1 AND h.scope_type = $2 AND h.scope = $3 ORDER BY h.key \
     RETURNING revision",
);

/// $6, $7 the target scope, $8 now, $9 the first revision of the fork's
/// changes. A version a concurrent write gave the target first is passed
/// over, not an error: the count then falls short, and the fork is refused
/// as SOURCE_CHANGED with nothing written.
static FORK_VERSIONS: Sql = Sql::new(concat!(
    "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, \
     execution_id, flow_id, flow_name, create_time, revision) \
     SELECT $1, $6, $7, v.key, 1, v.value, false, v.execution_id, v.flow_id, v.flow_name, $8, \
     c.revision FROM ",
    fork_state!(),
    " JOIN memory_versions v ON v.tenant = $1 AND v.scope_type = $2 AND v.scope = $3 \
       AND v.key = s.key AND v.version = s.version \
     JOIN memory_changes c ON c.tenant = $1 AND c.scope_type = $6 AND c.scope = $7 \
       AND c.key = s.key AND c.kind = 1 AND c.version = 1 AND c.revision >= $9 \
     WHERE true ON CONFLICT DO NOTHING"
));

/// A key at a point; see [`MemoryStore::get_at`](crate::memory::ports::MemoryStore::get_at).
pub(super) async fn get_at(
    conn: &mut impl Run,
    tenant: &Tenant,
    scope: &Scope,
    key: &Key,
    at: Point,
) -> Result<Option<Past>> {
    let params = params![
        tenant.as_str(),
        scope.scope_type.as_i16(),
        scope.name.as_str(),
        at.revision,
        at.time,
        key.as_str(),
    ];
    if let Some(entry) = conn
        .first(&GET_AT, params, |row| entry_row(row, scope))
        .await?
    {
        return Ok(Some(Past::Entry(entry)));
    }
    let purged = conn.count(&PURGED_AT, params).await? > 0;
    Ok(purged.then(|| Past::Purged(key.clone())))
}

/// A page of a scope at a point; see [`MemoryStore::list_at`](crate::memory::ports::MemoryStore::list_at).
pub(super) async fn list_at(
    conn: &mut impl Run,
    tenant: &Tenant,
    query: &ListQuery<'_>,
    at: Point,
) -> Result<Vec<Past>> {
    let (low, high) = query.prefix.range();
    let mut read = Weighed::default();
    let mut after = query.after.unwrap_or("").to_owned();
    loop {
        let wanted = query.limit - read.items.len() as i64;
        let held = read.items.len();
        let params = params![
            tenant.as_str(),
            query.scope.scope_type.as_i16(),
            query.scope.name.as_str(),
            at.revision,
            at.time,
            low.as_str(),
            high.as_str(),
            after.as_str(),
            query.include_reserved,
            wanted,
            SENT_WHOLE_BYTES,
        ];
        let cut = conn
            .weigh_into(&LIST_AT, params, &mut read, |row| {
                if row.opt_int(1)?.is_none() {
                    return Ok(Some(Past::Purged(Key::from_store(row.text(8)?))));
                }
                if row.boolean(9)? {
                    return Ok(None);
                }
                Ok(Some(Past::Entry(entry_row(row, query.scope)?)))
            })
            .await?;
        if read.full || read.items.len() - held == wanted as usize {
            return Ok(read.items);
        }
        after = match (cut, read.items.last()) {
            // Read on after the last key held.
            (true, Some(Past::Entry(entry))) => entry.key.as_str().to_owned(),
            (true, Some(Past::Purged(key))) => key.as_str().to_owned(),
            // Some of the keys looked at were deleted at the point: look
            // on after the last of them, unless the range ended there.
            _ => {
                let params = &params[..10];
                let end = conn
                    .row(&KEYS_NEXT_END, params)
                    .await?
                    .map(|row| Ok::<_, crate::error::Error>((row.opt_text(0)?, row.int(1)?)))
                    .transpose()?;
                match end {
                    Some((Some(last), looked)) if looked == wanted => last,
                    _ => return Ok(read.items),
                }
            }
        };
    }
}

/// A page of scopes at a point; see
/// [`MemoryStore::list_scopes`](crate::memory::ports::MemoryStore::list_scopes).
/// Each statement looks at the next `limit` scopes ([`SCOPES_AT`]); when
/// some of them held nothing then, the read looks on after the last one
/// until the page is full or the scopes end.
pub(super) async fn list_scopes_at(
    conn: &mut impl Run,
    tenant: &Tenant,
    filter: &ScopeFilter<'_>,
    after: Option<&Scope>,
    limit: i64,
    at: Point,
) -> Result<Vec<ScopeSummary>> {
    let mut after = after.map_or((0, String::new()), |scope| {
        (scope.scope_type.as_i16(), scope.name.as_str().to_owned())
    });
    let mut listed = Vec::new();
    loop {
        let params = params![
            tenant.as_str(),
            filter.scope_type.map_or(0, ScopeType::as_i16),
            after.0,
            after.1.as_str(),
            limit,
            filter.flow_id.unwrap_or(""),
            filter.flow_name.unwrap_or(""),
            at.revision,
            at.time,
        ];
        let looked = conn
            .all(&SCOPES_AT, params, |row| {
                Ok((scope_summary(row)?, row.int(4)? > 0))
            })
            .await?;
        let ended = (looked.len() as i64) < limit;
        if let Some((last, _)) = looked.last() {
            after = (
                last.scope.scope_type.as_i16(),
                last.scope.name.as_str().to_owned(),
            );
        }
        listed.extend(
            looked
                .into_iter()
                .filter(|(summary, had_versions)| *had_versions || summary.purged_count > 0)
                .map(|(summary, _)| summary),
        );
        if ended || listed.len() as i64 >= limit {
            listed.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
            return Ok(listed);
        }
    }
}

/// Records what a purge is about to take, and returns the keys it takes
/// from; see [`RECORD_PURGES`].
pub(super) async fn record_purges(
    conn: &mut impl Run,
    tenant: &Tenant,
    purge: &Purge<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<String>> {
    let at: &[Param<'_>] = params![now];
    conn.all(
        &RECORD_PURGES,
        &[&purge_params(tenant, purge)[..], at].concat(),
        |row| row.text(0),
    )
    .await
}

/// What a fork copied: the keys and the newest revision it wrote.
pub(super) struct Copied {
    pub keys: i64,
    pub newest_revision: i64,
}

/// Copies the source's live keys at the point into the target as version 1
/// of each, inside the caller's transaction; a refusal leaves the
/// transaction to be rolled back.
pub(super) async fn fork_in(
    conn: &mut impl Run,
    tenant: &Tenant,
    fork: &Fork<'_>,
) -> Result<std::result::Result<Copied, Forked>> {
    let target: &[Param<'_>] = params![
        tenant.as_str(),
        fork.target.scope_type.as_i16(),
        fork.target.name.as_str(),
    ];
    if conn.count(&SCOPE_KEYS, target).await? > 0 {
        return Ok(Err(Forked::TargetNotEmpty));
    }
    let source: &[Param<'_>] = params![
        tenant.as_str(),
        fork.source.scope_type.as_i16(),
        fork.source.name.as_str(),
        fork.at.revision,
        fork.at.time,
    ];
    let copied = copy_at(conn, fork, target, source).await?;
    // Checked once the copy has read the source: a purge committed before
    // any of its statements shows here (its record commits with what it
    // deletes), and one committed after them took nothing the copy read.
    // Checked before the copy, a purge committed in between left the copy
    // without the keys whose values at the point it took (all of them, or
    // some), and the fork succeeded with what remained.
    let purged = conn.all(&FORK_PURGED, source, |row| row.text(0)).await?;
    if !purged.is_empty() {
        return Ok(Err(Forked::Purged(purged)));
    }
    Ok(copied)
}

/// The copy of [`fork_in`]: the source's live keys at the point
/// (`source`: its parameters) into the empty target.
async fn copy_at(
    conn: &mut impl Run,
    fork: &Fork<'_>,
    target: &[Param<'_>],
    source: &[Param<'_>],
) -> Result<std::result::Result<Copied, Forked>> {
    let keys = conn.count(&FORK_COUNT, source).await?;
    if keys == 0 {
        return Ok(Ok(Copied {
            keys,
            newest_revision: 0,
        }));
    }
    let into: &[Param<'_>] = params![
        fork.target.scope_type.as_i16(),
        fork.target.name.as_str(),
        fork.now,
    ];
    let both = &[source, into].concat();
    // A count that moves between statements means a concurrent write to
    // the target or a purge of the source (Postgres reads each statement
    // at its own snapshot): refuse rather than copy a torn state.
    let heads = conn.exec(&FORK_HEADS, both).await?;
    let revisions = conn
        .all(
            &FORK_CHANGES,
            &[target, &[Param::from(fork.now)]].concat(),
            |row| row.int(0),
        )
        .await?;
    let (Some(&first), Some(&newest)) = (revisions.iter().min(), revisions.iter().max()) else {
        return Ok(Err(Forked::SourceChanged));
    };
    let versions = conn
        .exec(
            &FORK_VERSIONS,
            &[both.as_slice(), &[Param::from(first)]].concat(),
        )
        .await?;
    let moved = [heads, revisions.len() as u64, versions]
        .iter()
        .any(|&n| n != keys as u64);
    if moved {
        return Ok(Err(Forked::SourceChanged));
    }
    Ok(Ok(Copied {
        keys,
        newest_revision: newest,
    }))
}
