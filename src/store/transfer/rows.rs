//! Rows to records, with what a record holds beside its row (a working
//! memory's tasks and cache, a fact's versions and sources, a rule's
//! watermark as an episode id).

use serde_json::Value;

use crate::context::Tenant;
use crate::data::records::{
    self, Cached, Episode, Execution, Fact, FactVersion, MemoryVersion, Rule, Session, Task,
    WorkingMemory,
};
use crate::error::{Error, Result};
use crate::memory::ScopeType;
use crate::store::sql::{Cols, Run, Sql, params};

static TASKS: Sql = Sql::new(
    "SELECT number, subject, description, status, create_time, update_time FROM working_tasks \
     WHERE tenant = $1 AND session_id = $2 ORDER BY number",
);

static CACHE: Sql = Sql::new(
    "SELECT path, content, bytes, update_time FROM working_cache \
     WHERE tenant = $1 AND session_id = $2 ORDER BY path",
);

static FACT_VERSIONS: Sql = Sql::new(
    "SELECT version, deleted, subject, predicate, object, content::text, confidence, source, \
     source_episode_ids::text, channels::text, create_time FROM fact_versions \
     WHERE tenant = $1 AND fact_id = $2 ORDER BY version",
);

static FACT_SOURCES: Sql = Sql::new(
    "SELECT episode_id FROM fact_sources WHERE tenant = $1 AND fact_id = $2 ORDER BY episode_id",
);

/// The newest episode at or below a watermark.
static WATERMARK_EPISODE: Sql = Sql::new(
    "SELECT id FROM episodes WHERE tenant = $1 AND cursor <= $2 ORDER BY cursor DESC LIMIT 1",
);

// ---- rows to records ----

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

pub(super) async fn working_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut working: WorkingMemory,
) -> Result<WorkingMemory> {
    let at = params![tenant.as_str(), working.session_id.as_str()];
    working.tasks = conn
        .all(&TASKS, at, |row| {
            let status = crate::working::TaskStatus::from_i16(row.small(3)?)
                .ok_or_else(|| Error::internal("stored task status out of range"))?;
            Ok(Task {
                number: row.int(0)?,
                subject: row.text(1)?,
                description: row.text(2)?,
                status: status.name().to_owned(),
                create_time: row.time(4)?,
                update_time: row.time(5)?,
            })
        })
        .await?;
    working.cache = conn
        .all(&CACHE, at, |row| {
            Ok(Cached {
                path: row.text(0)?,
                content: row.text(1)?,
                bytes: row.int(2)?,
                update_time: row.time(3)?,
            })
        })
        .await?;
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
    })
}

pub(super) async fn fact_of(conn: &mut impl Run, tenant: &Tenant, mut fact: Fact) -> Result<Fact> {
    let at = params![tenant.as_str(), fact.id.as_str()];
    fact.versions = conn
        .all(&FACT_VERSIONS, at, |row| {
            Ok(FactVersion {
                version: row.int(0)?,
                deleted: row.boolean(1)?,
                subject: row.text(2)?,
                predicate: row.text(3)?,
                object: row.text(4)?,
                content: json(row.text(5)?)?,
                confidence: row.float(6)?,
                source: row.text(7)?,
                source_episode_ids: json(row.text(8)?)?,
                channels: json(row.text(9)?)?,
                create_time: row.time(10)?,
            })
        })
        .await?;
    fact.sources = conn.all(&FACT_SOURCES, at, |row| row.text(0)).await?;
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
