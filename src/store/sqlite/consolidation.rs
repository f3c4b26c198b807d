//! Rules and facts on SQLite. Runs and applies happen on the single writer
//! connection in `BEGIN IMMEDIATE` transactions, which serialises them (also
//! across processes sharing the file), so no other lock is needed.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use super::SqliteStore;
use super::sessions::{EPISODE_COLUMNS, episode_row};
use crate::consolidation::ports::{
    ConsolidationStore, FactFilter, FactTx, Locked, RuleTx, RunLock,
};
use crate::consolidation::{Cadence, Fact, FactKey, FactPayload, FactVersion, Provenance, Rule};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::sessions::Episode;
use crate::store::consolidation::{NewVersion, fact_kind, string_list, string_list_json};

/// A write transaction of consolidation work on the single writer
/// connection; rolled back when dropped uncommitted.
pub struct SqliteTx(sqlx::Transaction<'static, sqlx::Sqlite>);

impl SqliteTx {
    fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.0
    }
}
use crate::store::{from_micros, to_micros};

const RULE_COLUMNS: &str = "id, filter, every_n_episodes, cron, then_emits, kind, confidence, \
                            enabled, watermark, episodes_promoted, create_time, last_run_time";

const FACT_COLUMNS: &str = "f.id, f.app, f.user_id, f.kind, f.create_time, v.version, v.deleted, \
                            v.subject, v.predicate, v.object, v.content, v.confidence, v.source, \
                            v.source_episode_ids, v.channels, v.create_time";

fn rule_row(row: &SqliteRow, at: usize) -> Result<Rule> {
    let every: Option<i64> = row.try_get(at + 2)?;
    let cron: Option<String> = row.try_get(at + 3)?;
    Ok(Rule {
        id: row.try_get(at)?,
        filter: row.try_get(at + 1)?,
        cadence: match (every, cron) {
            (Some(n), _) => Cadence::EveryNEpisodes(n),
            (None, Some(cron)) => Cadence::Cron(cron),
            (None, None) => return Err(Error::internal("a stored rule has no cadence")),
        },
        then_emits: string_list(&row.try_get::<String, _>(at + 4)?)?,
        kind: fact_kind(row.try_get(at + 5)?)?,
        confidence: row.try_get(at + 6)?,
        enabled: row.try_get(at + 7)?,
        watermark: row.try_get(at + 8)?,
        episodes_promoted: row.try_get(at + 9)?,
        create_time: from_micros(row.try_get(at + 10)?)?,
        last_run_time: row
            .try_get::<Option<i64>, _>(at + 11)?
            .map(from_micros)
            .transpose()?,
    })
}

fn version_row(row: &SqliteRow, at: usize) -> Result<FactVersion> {
    let content: String = row.try_get(at + 5)?;
    Ok(FactVersion {
        version: row.try_get(at)?,
        deleted: row.try_get(at + 1)?,
        subject: row.try_get(at + 2)?,
        predicate: row.try_get(at + 3)?,
        object: row.try_get(at + 4)?,
        content: serde_json::from_str(&content).map_err(Error::internal)?,
        confidence: row.try_get(at + 6)?,
        source: row.try_get(at + 7)?,
        source_episode_ids: string_list(&row.try_get::<String, _>(at + 8)?)?,
        channels: string_list(&row.try_get::<String, _>(at + 9)?)?,
        create_time: from_micros(row.try_get(at + 10)?)?,
    })
}

fn fact_row(row: &SqliteRow) -> Result<Fact> {
    Ok(Fact {
        id: row.try_get(0)?,
        app: row.try_get(1)?,
        user: row.try_get(2)?,
        kind: fact_kind(row.try_get(3)?)?,
        create_time: from_micros(row.try_get(4)?)?,
        current: version_row(row, 5)?,
    })
}

async fn insert_version(
    conn: &mut SqliteConnection,
    tenant: &Tenant,
    id: &str,
    new: NewVersion<'_>,
    provenance: &Provenance,
    now: DateTime<Utc>,
) -> Result<()> {
    let empty = Vec::new();
    sqlx::query(
        "INSERT INTO fact_versions (tenant, fact_id, version, deleted, subject, predicate, object, \
         content, confidence, source, source_episode_ids, channels, create_time) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )
    .bind(tenant.as_str())
    .bind(id)
    .bind(new.version)
    .bind(new.payload.is_none())
    .bind(new.subject)
    .bind(new.predicate)
    .bind(new.payload.map_or("", |p| p.object.as_str()))
    .bind(
        new.payload
            .map_or_else(|| "null".to_owned(), |p| p.content.to_string()),
    )
    .bind(provenance.confidence)
    .bind(&provenance.rule_id)
    .bind(string_list_json(&provenance.source_episode_ids))
    .bind(string_list_json(
        new.payload.map_or(&empty, |p| &p.channels),
    ))
    .bind(to_micros(now))
    .execute(&mut *conn)
    .await?;
    for episode in &provenance.source_episode_ids {
        sqlx::query(
            "INSERT INTO fact_sources (tenant, episode_id, fact_id) VALUES (?1, ?2, ?3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(episode)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

impl FactTx for SqliteTx {
    async fn resolve(
        &mut self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        ids: &[String],
    ) -> Result<Vec<String>> {
        let mut found: Vec<String> = Vec::new();
        for wanted in ids {
            let rows: Vec<String> = sqlx::query_scalar(
                "SELECT f.id FROM facts f WHERE f.tenant = ?1 AND f.app = ?2 AND f.user_id = ?3 \
                 AND f.deleted = 0 AND (f.id = ?4 OR f.id IN (SELECT s.fact_id FROM fact_sources s \
                 WHERE s.tenant = ?1 AND s.episode_id = ?4)) ORDER BY f.create_time",
            )
            .bind(tenant.as_str())
            .bind(app)
            .bind(user)
            .bind(wanted)
            .fetch_all(self.conn())
            .await?;
            for id in rows {
                if !found.contains(&id) {
                    found.push(id);
                }
            }
        }
        Ok(found)
    }

    async fn live_facts(
        &mut self,
        tenant: &Tenant,
        keys: &[FactKey],
    ) -> Result<HashMap<FactKey, String>> {
        let mut live = HashMap::new();
        for key in keys {
            let newest: Option<String> = sqlx::query_scalar(
                "SELECT id FROM facts WHERE tenant = ?1 AND app = ?2 AND user_id = ?3 \
                 AND subject = ?4 AND predicate = ?5 AND deleted = 0 \
                 ORDER BY create_time DESC, id DESC LIMIT 1",
            )
            .bind(tenant.as_str())
            .bind(&key.0)
            .bind(&key.1)
            .bind(&key.2)
            .bind(&key.3)
            .fetch_optional(self.conn())
            .await?;
            if let Some(id) = newest {
                live.insert(key.clone(), id);
            }
        }
        Ok(live)
    }

    async fn insert_fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: &FactPayload,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO facts (tenant, id, app, user_id, kind, subject, predicate, version, \
             deleted, create_time, update_time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, 0, ?8, ?8)",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(&payload.app)
        .bind(&payload.user)
        .bind(payload.kind.as_i16())
        .bind(&payload.subject)
        .bind(&payload.predicate)
        .bind(to_micros(now))
        .execute(self.conn())
        .await?;
        let new = NewVersion {
            version: 1,
            payload: Some(payload),
            subject: &payload.subject,
            predicate: &payload.predicate,
        };
        insert_version(self.conn(), tenant, id, new, provenance, now).await
    }

    async fn write_version(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: Option<&FactPayload>,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let row = sqlx::query(
            "UPDATE facts SET version = version + 1, deleted = ?3, \
             subject = coalesce(?4, subject), predicate = coalesce(?5, predicate), update_time = ?6 \
             WHERE tenant = ?1 AND id = ?2 RETURNING version, subject, predicate",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(payload.is_none())
        .bind(payload.map(|p| p.subject.as_str()))
        .bind(payload.map(|p| p.predicate.as_str()))
        .bind(to_micros(now))
        .fetch_one(self.conn())
        .await?;
        let (version, subject, predicate): (i64, String, String) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let new = NewVersion {
            version,
            payload,
            subject: &subject,
            predicate: &predicate,
        };
        insert_version(self.conn(), tenant, id, new, provenance, now).await
    }

    async fn lock_live_fact(&mut self, tenant: &Tenant, id: &str) -> Result<bool> {
        // The write transaction already excludes every other writer.
        let live: Option<String> = sqlx::query_scalar(
            "SELECT id FROM facts WHERE tenant = ?1 AND id = ?2 AND deleted = 0",
        )
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(self.conn())
        .await?;
        Ok(live.is_some())
    }

    async fn fact(&mut self, tenant: &Tenant, id: &str) -> Result<Option<Fact>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {FACT_COLUMNS} FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
             WHERE f.tenant = ?1 AND f.id = ?2"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(self.conn())
        .await?;
        row.as_ref().map(fact_row).transpose()
    }

    async fn commit(self) -> Result<()> {
        Ok(self.0.commit().await?)
    }

    async fn rollback(self) -> Result<()> {
        Ok(self.0.rollback().await?)
    }
}

impl RuleTx for SqliteTx {
    async fn lock_rule(&mut self, tenant: &Tenant, id: &str, _lock: RunLock) -> Result<Locked> {
        // The write transaction already excludes every other writer.
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = ?1 AND id = ?2"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(self.conn())
        .await?;
        match row {
            Some(row) => rule_row(&row, 0).map(Locked::Rule),
            None => Ok(Locked::Missing),
        }
    }

    async fn episodes(
        &mut self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> Result<Vec<Episode>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = ?1 AND cursor > ?2 \
             AND cursor <= ?3 ORDER BY cursor LIMIT ?4"
        )))
        .bind(tenant.as_str())
        .bind(after)
        .bind(up_to)
        .bind(limit)
        .fetch_all(self.conn())
        .await?;
        rows.iter().map(episode_row).collect()
    }

    async fn advance(
        &mut self,
        tenant: &Tenant,
        id: &str,
        watermark: i64,
        promoted: i64,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE consolidation_rules SET watermark = ?3, \
             episodes_promoted = episodes_promoted + ?4, last_run_time = ?5 \
             WHERE tenant = ?1 AND id = ?2",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(watermark)
        .bind(promoted)
        .bind(to_micros(now))
        .execute(self.conn())
        .await?;
        Ok(())
    }
}

impl ConsolidationStore for SqliteStore {
    type Tx = SqliteTx;

    async fn begin(&self, _tenant: &Tenant) -> Result<SqliteTx> {
        Ok(SqliteTx(self.writer.begin_with("BEGIN IMMEDIATE").await?))
    }
    async fn create_rule(&self, tenant: &Tenant, rule: &Rule) -> Result<bool> {
        let (every, cron) = match &rule.cadence {
            Cadence::EveryNEpisodes(n) => (Some(*n), None),
            Cadence::Cron(text) => (None, Some(text.as_str())),
        };
        let done = sqlx::query(
            "INSERT INTO consolidation_rules (tenant, id, filter, every_n_episodes, cron, \
             then_emits, kind, confidence, enabled, watermark, create_time) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT (tenant, id) DO NOTHING",
        )
        .bind(tenant.as_str())
        .bind(&rule.id)
        .bind(&rule.filter)
        .bind(every)
        .bind(cron)
        .bind(string_list_json(&rule.then_emits))
        .bind(rule.kind.as_i16())
        .bind(rule.confidence)
        .bind(rule.enabled)
        .bind(rule.watermark)
        .bind(to_micros(rule.create_time))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn get_rule(&self, tenant: &Tenant, id: &str) -> Result<Option<Rule>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = ?1 AND id = ?2"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(&self.reader)
        .await?;
        row.map(|row| rule_row(&row, 0)).transpose()
    }

    async fn list_rules(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Rule>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = ?1 \
             AND id > ?2 ORDER BY id LIMIT ?3"
        )))
        .bind(tenant.as_str())
        .bind(after.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(|row| rule_row(row, 0)).collect()
    }

    async fn delete_rule(&self, tenant: &Tenant, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM consolidation_rules WHERE tenant = ?1 AND id = ?2")
            .bind(tenant.as_str())
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn enabled_rules(&self) -> Result<Vec<(Tenant, Rule)>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT tenant, {RULE_COLUMNS} FROM consolidation_rules WHERE enabled ORDER BY tenant, id"
        )))
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| Ok((Tenant::new(row.try_get::<String, _>(0)?), rule_row(row, 1)?)))
            .collect()
    }

    async fn pending_episodes(
        &self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        at_most: i64,
    ) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM episodes WHERE tenant = ?1 AND cursor > ?2 \
             AND cursor <= ?3 LIMIT ?4)",
        )
        .bind(tenant.as_str())
        .bind(after)
        .bind(up_to)
        .bind(at_most)
        .fetch_one(&self.reader)
        .await?)
    }

    async fn list_facts(
        &self,
        tenant: &Tenant,
        filter: &FactFilter,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Fact>> {
        let (order, compare) = if filter.newest_first {
            ("DESC", "<")
        } else {
            ("", ">")
        };
        let after = after.unwrap_or(if filter.newest_first {
            "\u{10ffff}"
        } else {
            ""
        });
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {FACT_COLUMNS} FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id AND v.version = f.version \
             WHERE f.tenant = ?1 AND f.deleted = 0 \
             AND (?2 IS NULL OR f.app = ?2) AND (?3 IS NULL OR f.user_id = ?3) \
             AND (?4 IS NULL OR f.kind = ?4) AND f.id {compare} ?5 \
             ORDER BY f.id {order} LIMIT ?6"
        )))
        .bind(tenant.as_str())
        .bind(filter.app.as_deref())
        .bind(filter.user.as_deref())
        .bind(filter.kind.map(|k| k.as_i16()))
        .bind(after)
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(fact_row).collect()
    }

    async fn get_fact(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> Result<Option<(Fact, Vec<FactVersion>)>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {FACT_COLUMNS} FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id \
             WHERE f.tenant = ?1 AND f.id = ?2 ORDER BY v.version"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_all(&self.reader)
        .await?;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        let fact = fact_row(last)?;
        let versions = rows
            .iter()
            .map(|row| version_row(row, 5))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((fact, versions)))
    }
}
