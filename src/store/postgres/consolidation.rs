//! Rules and facts on Postgres. A run holds an advisory lock on its rule
//! (so the scheduler on another replica can skip it with a try-lock) and
//! the rule's row lock, and reads the rule's watermark under them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::PgStore;
use super::pool::Lease;
use super::sessions::{EPISODE_COLUMNS, episode_row};
use crate::consolidation::ports::{
    ConsolidationStore, FactFilter, FactTx, Locked, RuleTx, RunLock,
};
use crate::consolidation::{Cadence, Fact, FactKey, FactPayload, FactVersion, Provenance, Rule};
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::sessions::Episode;
use crate::store::consolidation::{NewVersion, fact_kind, string_list, string_list_json};

/// A transaction of consolidation work, confined to one tenant; rolled back
/// when dropped uncommitted.
pub struct PgTx(Lease);

impl PgTx {
    fn conn(&mut self) -> &mut Lease {
        &mut self.0
    }
}

const RULE_COLUMNS: &str = "id, filter, every_n_episodes, cron, then_emits::text, kind, \
                            confidence, enabled, watermark, episodes_promoted, create_time, \
                            last_run_time";

const FACT_COLUMNS: &str = "f.id, f.app, f.user_id, f.kind, f.create_time, v.version, v.deleted, \
                            v.subject, v.predicate, v.object, v.content::text, v.confidence, \
                            v.source, v.source_episode_ids::text, v.channels::text, v.create_time";

fn rule_row(row: &PgRow, at: usize) -> Result<Rule> {
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
        create_time: row.try_get(at + 10)?,
        last_run_time: row.try_get(at + 11)?,
    })
}

fn version_row(row: &PgRow, at: usize) -> Result<FactVersion> {
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
        create_time: row.try_get(at + 10)?,
    })
}

fn fact_row(row: &PgRow) -> Result<Fact> {
    Ok(Fact {
        id: row.try_get(0)?,
        app: row.try_get(1)?,
        user: row.try_get(2)?,
        kind: fact_kind(row.try_get(3)?)?,
        create_time: row.try_get(4)?,
        current: version_row(row, 5)?,
    })
}

fn lock_key(tenant: &Tenant, id: &str) -> String {
    format!("engram.rule/{}/{id}", tenant.as_str())
}

async fn insert_version(
    conn: &mut Lease,
    tenant: &Tenant,
    id: &str,
    new: NewVersion<'_>,
    provenance: &Provenance,
    now: DateTime<Utc>,
) -> Result<()> {
    let NewVersion {
        version,
        payload,
        subject,
        predicate,
    } = new;
    let empty = Vec::new();
    sqlx::query(
        "INSERT INTO fact_versions (tenant, fact_id, version, deleted, subject, predicate, object, \
         content, confidence, source, source_episode_ids, channels, create_time) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11::jsonb, $12::jsonb, $13)",
    )
    .bind(tenant.as_str())
    .bind(id)
    .bind(version)
    .bind(payload.is_none())
    .bind(subject)
    .bind(predicate)
    .bind(payload.map_or("", |p| p.object.as_str()))
    .bind(payload.map_or_else(|| "null".to_owned(), |p| p.content.to_string()))
    .bind(provenance.confidence)
    .bind(&provenance.rule_id)
    .bind(string_list_json(&provenance.source_episode_ids))
    .bind(string_list_json(payload.map_or(&empty, |p| &p.channels)))
    .bind(now)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO fact_sources (tenant, episode_id, fact_id) \
         SELECT $1, e, $3 FROM unnest($2::text[]) AS e ON CONFLICT DO NOTHING",
    )
    .bind(tenant.as_str())
    .bind(&provenance.source_episode_ids)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

impl FactTx for PgTx {
    async fn resolve(
        &mut self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        ids: &[String],
    ) -> Result<Vec<String>> {
        let rows: Vec<String> = sqlx::query_scalar(
            "SELECT f.id FROM unnest($4::text[]) WITH ORDINALITY AS w(id, ord) \
             JOIN facts f ON f.tenant = $1 AND f.app = $2 AND f.user_id = $3 AND NOT f.deleted \
             AND (f.id = w.id COLLATE \"C\" OR f.id IN (SELECT s.fact_id FROM fact_sources s \
                  WHERE s.tenant = $1 AND s.episode_id = w.id COLLATE \"C\")) \
             ORDER BY w.ord, f.create_time",
        )
        .bind(tenant.as_str())
        .bind(app)
        .bind(user)
        .bind(ids)
        .fetch_all(self.conn())
        .await?;
        let mut seen = std::collections::HashSet::new();
        Ok(rows
            .into_iter()
            .filter(|id| seen.insert(id.clone()))
            .collect())
    }

    async fn live_facts(
        &mut self,
        tenant: &Tenant,
        keys: &[FactKey],
    ) -> Result<HashMap<FactKey, String>> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let column = |f: fn(&FactKey) -> &String| keys.iter().map(f).collect::<Vec<_>>();
        let rows = sqlx::query(
            "SELECT f.app, f.user_id, f.subject, f.predicate, f.id FROM facts f \
             JOIN unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS k(app, user_id, subject, predicate) \
             ON f.app = k.app COLLATE \"C\" AND f.user_id = k.user_id COLLATE \"C\" \
             AND f.subject = k.subject COLLATE \"C\" AND f.predicate = k.predicate COLLATE \"C\" \
             WHERE f.tenant = $1 AND NOT f.deleted ORDER BY f.create_time, f.id",
        )
        .bind(tenant.as_str())
        .bind(column(|k| &k.0))
        .bind(column(|k| &k.1))
        .bind(column(|k| &k.2))
        .bind(column(|k| &k.3))
        .fetch_all(self.conn())
        .await?;
        let mut live = HashMap::new();
        for row in &rows {
            // The newest fact of a key wins.
            live.insert(
                (
                    row.try_get(0)?,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                ),
                row.try_get(4)?,
            );
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
             deleted, create_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, false, $8, $8)",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(&payload.app)
        .bind(&payload.user)
        .bind(payload.kind.as_i16())
        .bind(&payload.subject)
        .bind(&payload.predicate)
        .bind(now)
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
            "UPDATE facts SET version = version + 1, deleted = $3, \
             subject = coalesce($4, subject), predicate = coalesce($5, predicate), update_time = $6 \
             WHERE tenant = $1 AND id = $2 RETURNING version, subject, predicate",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(payload.is_none())
        .bind(payload.map(|p| p.subject.as_str()))
        .bind(payload.map(|p| p.predicate.as_str()))
        .bind(now)
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
        let live: Option<String> = sqlx::query_scalar(
            "SELECT id FROM facts WHERE tenant = $1 AND id = $2 AND NOT deleted FOR UPDATE",
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
             WHERE f.tenant = $1 AND f.id = $2"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(self.conn())
        .await?;
        row.as_ref().map(fact_row).transpose()
    }

    async fn commit(self) -> Result<()> {
        self.0.commit().await
    }

    async fn rollback(self) -> Result<()> {
        self.0.rollback().await
    }
}

impl RuleTx for PgTx {
    async fn lock_rule(&mut self, tenant: &Tenant, id: &str, lock: RunLock) -> Result<Locked> {
        let key = lock_key(tenant, id);
        match lock {
            RunLock::Try => {
                let locked: bool =
                    sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))")
                        .bind(&key)
                        .fetch_one(self.conn())
                        .await?;
                if !locked {
                    return Ok(Locked::Busy);
                }
            }
            RunLock::Wait => {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
                    .bind(&key)
                    .execute(self.conn())
                    .await?;
            }
        }
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = $1 AND id = $2 FOR UPDATE"
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
            "SELECT {EPISODE_COLUMNS} FROM episodes WHERE tenant = $1 AND cursor > $2 \
             AND cursor <= $3 ORDER BY cursor LIMIT $4"
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
            "UPDATE consolidation_rules SET watermark = $3, \
             episodes_promoted = episodes_promoted + $4, last_run_time = $5 \
             WHERE tenant = $1 AND id = $2",
        )
        .bind(tenant.as_str())
        .bind(id)
        .bind(watermark)
        .bind(promoted)
        .bind(now)
        .execute(self.conn())
        .await?;
        Ok(())
    }
}

impl ConsolidationStore for PgStore {
    type Tx = PgTx;

    async fn begin(&self, tenant: &Tenant) -> Result<PgTx> {
        Ok(PgTx(self.scoped(tenant).await?))
    }
    async fn create_rule(&self, tenant: &Tenant, rule: &Rule) -> Result<bool> {
        let mut conn = self.session(tenant).await?;
        let (every, cron) = match &rule.cadence {
            Cadence::EveryNEpisodes(n) => (Some(*n), None),
            Cadence::Cron(text) => (None, Some(text.as_str())),
        };
        let done = sqlx::query(
            "INSERT INTO consolidation_rules (tenant, id, filter, every_n_episodes, cron, \
             then_emits, kind, confidence, enabled, watermark, create_time) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11) \
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
        .bind(rule.create_time)
        .execute(&mut conn)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn get_rule(&self, tenant: &Tenant, id: &str) -> Result<Option<Rule>> {
        let mut conn = self.session(tenant).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = $1 AND id = $2"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(&mut conn)
        .await?;
        row.map(|row| rule_row(&row, 0)).transpose()
    }

    async fn list_rules(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Rule>> {
        let mut conn = self.session(tenant).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM consolidation_rules WHERE tenant = $1 \
             AND id > $2 ORDER BY id LIMIT $3"
        )))
        .bind(tenant.as_str())
        .bind(after.unwrap_or(""))
        .bind(limit)
        .fetch_all(&mut conn)
        .await?;
        rows.iter().map(|row| rule_row(row, 0)).collect()
    }

    async fn delete_rule(&self, tenant: &Tenant, id: &str) -> Result<bool> {
        let mut conn = self.session(tenant).await?;
        let done = sqlx::query("DELETE FROM consolidation_rules WHERE tenant = $1 AND id = $2")
            .bind(tenant.as_str())
            .bind(id)
            .execute(&mut conn)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn enabled_rules(&self) -> Result<Vec<(Tenant, Rule)>> {
        let mut conn = self.system().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT tenant, {RULE_COLUMNS} FROM consolidation_rules WHERE enabled ORDER BY tenant, id"
        )))
        .fetch_all(&mut conn)
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
        let mut conn = self.session(tenant).await?;
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM episodes WHERE tenant = $1 AND cursor > $2 \
             AND cursor <= $3 LIMIT $4) pending",
        )
        .bind(tenant.as_str())
        .bind(after)
        .bind(up_to)
        .bind(at_most)
        .fetch_one(&mut conn)
        .await?)
    }

    async fn list_facts(
        &self,
        tenant: &Tenant,
        filter: &FactFilter,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Fact>> {
        let mut conn = self.session(tenant).await?;
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
             WHERE f.tenant = $1 AND NOT f.deleted \
             AND ($2::text IS NULL OR f.app = $2) AND ($3::text IS NULL OR f.user_id = $3) \
             AND ($4::smallint IS NULL OR f.kind = $4) AND f.id {compare} $5 \
             ORDER BY f.id {order} LIMIT $6"
        )))
        .bind(tenant.as_str())
        .bind(filter.app.as_deref())
        .bind(filter.user.as_deref())
        .bind(filter.kind.map(|k| k.as_i16()))
        .bind(after)
        .bind(limit)
        .fetch_all(&mut conn)
        .await?;
        rows.iter().map(fact_row).collect()
    }

    async fn get_fact(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> Result<Option<(Fact, Vec<FactVersion>)>> {
        let mut conn = self.session(tenant).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {FACT_COLUMNS} FROM facts f JOIN fact_versions v \
             ON v.tenant = f.tenant AND v.fact_id = f.id \
             WHERE f.tenant = $1 AND f.id = $2 ORDER BY v.version"
        )))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_all(&mut conn)
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
