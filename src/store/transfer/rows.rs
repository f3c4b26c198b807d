//! Rows to records, with what a record holds beside its row (a fact's
//! sources, a rule's watermark as an episode id, and for comparing with a
//! version 1 file a working memory's tasks and cache and a fact's
//! versions).

use serde_json::Value;

use crate::context::Tenant;
use crate::data::records::{
    self, Cached, CreatedBy, Episode, Execution, Fact, FactVersion, MemoryVersion, Rule, Session,
    Task, WorkingMemory,
};
use crate::error::{Error, Result};
use crate::memory::ScopeType;
use crate::store::sql::{Cols, Run, Sql, params, select};

static TASKS: Sql = select!(
    task_columns!(),
    " FROM working_tasks WHERE tenant = $1 AND session_id = $2 ORDER BY number"
);

static CACHE: Sql = select!(
    cached_columns!(),
    " FROM working_cache WHERE tenant = $1 AND session_id = $2 ORDER BY path"
);

static FACT_VERSIONS: Sql = select!(
    fact_version_columns!(),
    " FROM fact_versions WHERE tenant = $1 AND fact_id = $2 ORDER BY version"
);

static FACT_SOURCES: Sql = Sql::new(
    "SELECT episode_id FROM fact_sources WHERE tenant = $1 AND fact_id = $2 ORDER BY episode_id",
);

/// The newest episode at or below a watermark.
static WATERMARK_EPISODE: Sql = Sql::new(
    "SELECT id FROM episodes WHERE tenant = $1 AND cursor <= $2 ORDER BY cursor DESC LIMIT 1",
);

// ---- rows to records ----

/// The request a row was created by (its `create_request_id` and
/// `create_fingerprint` at `at` and after), when keyed.
fn created_by(row: &impl Cols, at: usize) -> Result<Option<CreatedBy>> {
    Ok(CreatedBy::of(row.opt_text(at)?, row.opt_bytes(at + 1)?))
}

fn json(text: String) -> Result<Value> {
    serde_json::from_str(&text).map_err(Error::internal)
}

pub(super) fn execution_row(row: &impl Cols) -> Result<Execution> {
    Ok(Execution {
        execution_id: row.text(0)?,
        flow_id: row.text(1)?,
        flow_name: row.text(2)?,
        create_time: row.time(3)?,
    })
}

pub(super) fn memory_row(row: &impl Cols) -> Result<MemoryVersion> {
    let scope_type = ScopeType::from_i32(row.small(0)?.into())
        .ok_or_else(|| Error::internal("stored scope type out of range"))?;
    Ok(MemoryVersion {
        scope_type: scope_type.as_str().to_owned(),
        scope: row.text(1)?,
        key: row.text(2)?,
        version: row.int(3)?,
        value: row
            .opt_text(4)?
            .map(json)
            .transpose()?
            .unwrap_or(Value::Null),
        deleted: row.boolean(5)?,
        execution_id: row.text(6)?,
        flow_id: row.text(7)?,
        flow_name: row.text(8)?,
        create_time: row.time(9)?,
    })
}

pub(super) fn session_row(row: &impl Cols) -> Result<Session> {
    Ok(Session {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        metadata: json(row.text(3)?)?,
        create_time: row.time(4)?,
        update_time: row.time(5)?,
        end_time: row.opt_time(6)?,
        last_seq: row.int(7)?,
        episode_count: row.int(8)?,
        episodes_evicted: row.int(9)?,
        request: created_by(row, 10)?,
    })
}

/// An episode and its cursor.
pub(super) fn episode_row(row: &impl Cols) -> Result<(i64, Episode)> {
    Ok((
        row.int(13)?,
        Episode {
            session_id: row.text(0)?,
            seq: row.int(1)?,
            id: row.text(2)?,
            app: row.text(3)?,
            user: row.text(4)?,
            agent: row.text(5)?,
            episode_type: row.text(6)?,
            content: json(row.text(7)?)?,
            metadata: json(row.text(8)?)?,
            source_node: row.text(9)?,
            timestamp: row.time(10)?,
            create_time: row.time(11)?,
            fingerprint: records::to_hex(&row.bytes(12)?),
        },
    ))
}

/// Working memory without its tasks and cache, which [`working_of`] adds.
pub(super) fn working_row(row: &impl Cols) -> Result<WorkingMemory> {
    Ok(WorkingMemory {
        session_id: row.text(0)?,
        goal: row.text(1)?,
        next_task: row.int(2)?,
        update_time: row.time(3)?,
        tasks: Vec::new(),
        cache: Vec::new(),
    })
}

pub(super) fn task_row(row: &impl Cols) -> Result<Task> {
    let status = crate::working::TaskStatus::from_i16(row.small(4)?)
        .ok_or_else(|| Error::internal("stored task status out of range"))?;
    Ok(Task {
        session_id: row.text(0)?,
        number: row.int(1)?,
        subject: row.text(2)?,
        description: row.text(3)?,
        status: status.name().to_owned(),
        create_time: row.time(5)?,
        update_time: row.time(6)?,
        request: created_by(row, 7)?,
    })
}

pub(super) fn cached_row(row: &impl Cols) -> Result<Cached> {
    Ok(Cached {
        session_id: row.text(0)?,
        path: row.text(1)?,
        content: row.text(2)?,
        bytes: row.int(3)?,
        update_time: row.time(4)?,
    })
}

/// Working memory with its tasks and cache inside, as a version 1 file
/// holds it (the items name no session there).
pub(super) async fn working_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut working: WorkingMemory,
) -> Result<WorkingMemory> {
    let at = params![tenant.as_str(), working.session_id.as_str()];
    working.tasks = conn.all(&TASKS, at, task_row).await?;
    working.cache = conn.all(&CACHE, at, cached_row).await?;
    for task in &mut working.tasks {
        task.session_id.clear();
        // A version 1 file predates request ids: it says nothing of them.
        task.request = None;
    }
    for cached in &mut working.cache {
        cached.session_id.clear();
    }
    Ok(working)
}

/// A fact without its versions and sources, which [`fact_of`] adds.
pub(super) fn fact_row(row: &impl Cols) -> Result<Fact> {
    let kind = crate::consolidation::FactKind::from_i16(row.small(3)?)
        .ok_or_else(|| Error::internal("stored fact kind out of range"))?;
    Ok(Fact {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        fact_kind: records::fact_kind_name(kind).to_owned(),
        subject: row.text(4)?,
        predicate: row.text(5)?,
        version: row.int(6)?,
        deleted: row.boolean(7)?,
        create_time: row.time(8)?,
        update_time: row.time(9)?,
        versions: Vec::new(),
        sources: Vec::new(),
        request: created_by(row, 10)?,
    })
}

pub(super) fn fact_version_row(row: &impl Cols) -> Result<FactVersion> {
    Ok(FactVersion {
        fact_id: row.text(0)?,
        version: row.int(1)?,
        deleted: row.boolean(2)?,
        subject: row.text(3)?,
        predicate: row.text(4)?,
        object: row.text(5)?,
        content: json(row.text(6)?)?,
        confidence: row.float(7)?,
        source: row.text(8)?,
        source_episode_ids: json(row.text(9)?)?,
        channels: json(row.text(10)?)?,
        create_time: row.time(11)?,
    })
}

/// A fact with its sources: a version 2 `fact` line.
pub(super) async fn sources_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut fact: Fact,
) -> Result<Fact> {
    let at = params![tenant.as_str(), fact.id.as_str()];
    fact.sources = conn.all(&FACT_SOURCES, at, |row| row.text(0)).await?;
    Ok(fact)
}

/// A fact with its sources and versions inside, as a version 1 file
/// holds it (the versions name no fact there).
pub(super) async fn fact_of(conn: &mut impl Run, tenant: &Tenant, fact: Fact) -> Result<Fact> {
    let mut fact = sources_of(conn, tenant, fact).await?;
    let at = params![tenant.as_str(), fact.id.as_str()];
    fact.versions = conn.all(&FACT_VERSIONS, at, fact_version_row).await?;
    for version in &mut fact.versions {
        version.fact_id.clear();
    }
    Ok(fact)
}

/// A rule and its watermark (a cursor), which [`rule_of`] names by episode.
pub(super) fn rule_row(row: &impl Cols) -> Result<(Rule, i64)> {
    let kind = crate::consolidation::FactKind::from_i16(row.small(5)?)
        .ok_or_else(|| Error::internal("stored fact kind out of range"))?;
    let then_emits: Vec<String> = serde_json::from_str(&row.text(4)?).map_err(Error::internal)?;
    Ok((
        Rule {
            id: row.text(0)?,
            filter: row.text(1)?,
            every_n_episodes: row.opt_int(2)?,
            cron: row.opt_text(3)?,
            then_emits,
            fact_kind: records::fact_kind_name(kind).to_owned(),
            confidence: row.float(6)?,
            enabled: row.boolean(7)?,
            watermark_episode: None,
            episodes_promoted: row.int(9)?,
            create_time: row.time(10)?,
            last_run_time: row.opt_time(11)?,
            request: created_by(row, 12)?,
        },
        row.int(8)?,
    ))
}

pub(super) async fn rule_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut rule: Rule,
    watermark: i64,
) -> Result<Rule> {
    if watermark > 0 {
        rule.watermark_episode = conn
            .first(
                &WATERMARK_EPISODE,
                params![tenant.as_str(), watermark],
                |row| row.text(0),
            )
            .await?;
    }
    Ok(rule)
}
