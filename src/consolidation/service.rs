//! The rules between requests and the store for rules, runs and facts.

use std::collections::HashMap;
use std::sync::Arc;

use super::cron::Schedule;
use super::filter;
use super::ports::{
    ConsolidationStore, Dedup, FactFilter, FactTx, Locked, RuleCreation, RunLock, RunRequest,
};
use super::types::{
    Applied, Cadence, Delta, Fact, FactKind, FactVersion, Provenance, Rule, RunOutcome,
};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result, fingerprint};
use crate::memory::now_micros;
use crate::memory::ports::RequestStamp;
use crate::paging::{self, ListPage};
use crate::ports::{Feed, Feeds};
use crate::search::embedder::Embedder;
use crate::sessions::{Id, Name};

/// Episodes one `RunRule` reads when the request names no limit.
pub const DEFAULT_RUN_EPISODES: i64 = 1000;
pub const MAX_RUN_EPISODES: i64 = 10_000;
/// The most deltas one `ApplyDeltas` call may carry.
pub const MAX_DELTAS: usize = 1000;

/// A rule as a client defines it, before validation.
#[derive(Debug, Clone)]
pub struct NewRule {
    pub id: String,
    pub filter: String,
    pub cadence: Option<Cadence>,
    pub then_emits: Vec<String>,
    pub kind: Option<FactKind>,
    /// 0 means 1.0.
    pub confidence: f64,
    pub enabled: bool,
}

#[derive(Clone)]
pub struct Consolidation<S> {
    store: S,
    /// Merging near-duplicate facts: the embedder and the similarity at
    /// which an Add becomes an Update.
    dedup: Option<(Arc<dyn Embedder>, f32)>,
}

/// Texts sent to the embedder in one call when a run deduplicates.
const DEDUP_BATCH: usize = 64;

fn invalid(reason: Reason, field: impl Into<String>, why: impl Into<String>) -> Error {
    Error::invalid(reason, field, why)
}

fn fact_not_found(id: &str) -> Error {
    Error::NotFound {
        reason: Reason::FactNotFound,
        message: format!("fact {id:?} does not exist"),
        metadata: vec![("fact_id", id.to_owned())],
    }
}

/// What a rule's creation asked for (its definition, defaults filled),
/// kept with its request id so that the id reused for another rule is
/// told from a repeat.
fn rule_fingerprint(rule: &Rule) -> [u8; 32] {
    let cadence = match &rule.cadence {
        Cadence::EveryNEpisodes(n) => format!("every {n}"),
        Cadence::Cron(text) => format!("cron {text}"),
    };
    let (kind, confidence) = (rule.kind.as_i16().to_string(), rule.confidence.to_string());
    let mut parts = vec![
        rule.id.as_str(),
        rule.filter.as_str(),
        &cadence,
        &kind,
        &confidence,
        if rule.enabled { "enabled" } else { "disabled" },
    ];
    parts.extend(rule.then_emits.iter().map(String::as_str));
    fingerprint(&parts)
}

/// Checks a new rule's definition and fills its defaults.
pub fn validate_rule(new: NewRule, now: chrono::DateTime<chrono::Utc>) -> Result<Rule> {
    checked_rule(new, now, filter::parse)
}

/// Checks a rule as an earlier release stored it (an import's): its filter
/// may mix AND and OR without parentheses ([`filter::parse_stored`]).
pub fn validate_stored_rule(new: NewRule, now: chrono::DateTime<chrono::Utc>) -> Result<Rule> {
    checked_rule(new, now, filter::parse_stored)
}

fn checked_rule(
    new: NewRule,
    now: chrono::DateTime<chrono::Utc>,
    parse: fn(&str) -> std::result::Result<filter::Expr, filter::FilterError>,
) -> Result<Rule> {
    let id = Id::parse("rule.id", new.id)?;
    parse(&new.filter).map_err(|err| {
        invalid(
            Reason::InvalidFilter,
            "rule.filter",
            format!("{err} (in {:?})", new.filter),
        )
    })?;
    let cadence = match new.cadence {
        None => {
            return Err(invalid(
                Reason::InvalidCadence,
                "rule.cadence",
                "set every_n_episodes or cron",
            ));
        }
        Some(Cadence::EveryNEpisodes(n)) if n <= 0 => {
            return Err(invalid(
                Reason::InvalidCadence,
                "rule.every_n_episodes",
                format!("must be positive, got {n}"),
            ));
        }
        Some(Cadence::Cron(text)) => {
            Schedule::parse(&text)
                .map_err(|why| invalid(Reason::InvalidCadence, "rule.cron", why))?;
            Cadence::Cron(text.trim().to_owned())
        }
        Some(every) => every,
    };
    for (i, channel) in new.then_emits.iter().enumerate() {
        Name::parse(&format!("rule.then_emits[{i}]"), channel.as_str())?;
    }
    let confidence = if new.confidence == 0.0 {
        1.0
    } else {
        new.confidence
    };
    if !(confidence > 0.0 && confidence <= 1.0) {
        return Err(invalid(
            Reason::InvalidArgument,
            "rule.confidence",
            format!("must be above 0 and at most 1, got {confidence}"),
        ));
    }
    Ok(Rule {
        id: id.as_str().to_owned(),
        filter: new.filter,
        cadence,
        then_emits: new.then_emits,
        kind: new.kind.unwrap_or(FactKind::Semantic),
        confidence,
        enabled: new.enabled,
        watermark: 0,
        episodes_promoted: 0,
        create_time: now,
        last_run_time: None,
    })
}

/// Checks a delta a client proposes: its provenance is complete, and what
/// it writes is well formed. `field` is its path in the request.
pub fn validate_delta(field: &str, delta: &Delta) -> Result<()> {
    let field = format!("{field}.{}", delta.name());
    delta.provenance().check(&format!("{field}.provenance"))?;
    let payload_field = match delta {
        Delta::Add { .. } | Delta::Update { .. } => format!("{field}.fact_payload"),
        _ => field.clone(),
    };
    let check_owner = |app: &str, user: &str, kind: Option<FactKind>| -> Result<()> {
        Name::parse(&format!("{payload_field}.app"), app)?;
        match kind {
            Some(FactKind::Procedural) if !user.is_empty() => Err(invalid(
                Reason::InvalidArgument,
                format!("{payload_field}.user"),
                "must be empty for a procedural (app-wide) fact",
            )),
            Some(FactKind::Procedural) => Ok(()),
            _ => Name::parse(&format!("{payload_field}.user"), user).map(|_| ()),
        }
    };
    let check_replaces = |replaces: &[String]| -> Result<()> {
        if replaces.is_empty() {
            return Err(invalid(
                Reason::InvalidArgument,
                format!("{field}.replaces"),
                "must name at least one fact or episode id",
            ));
        }
        Ok(())
    };
    match delta {
        Delta::Add { payload, .. } => {
            check_owner(&payload.app, &payload.user, Some(payload.kind))?;
            payload.check_triple(&payload_field)
        }
        Delta::Update {
            payload, replaces, ..
        } => {
            check_owner(&payload.app, &payload.user, Some(payload.kind))?;
            payload.check_triple(&payload_field)?;
            check_replaces(replaces)
        }
        Delta::Delete {
            app,
            user,
            replaces,
            ..
        } => {
            Name::parse(&format!("{field}.app"), app.as_str())?;
            if !user.is_empty() {
                check_owner(app, user, None)?;
            }
            check_replaces(replaces)
        }
        Delta::Noop { .. } => Ok(()),
    }
}

impl<S: ConsolidationStore + Feeds> Consolidation<S> {
    pub fn new(store: S) -> Self {
        Consolidation { store, dedup: None }
    }

    /// Runs then turn an Add within `threshold` (cosine similarity) of a
    /// live fact of the same app, user and kind into an Update of it.
    pub fn deduplicating(mut self, embedder: Arc<dyn Embedder>, threshold: f32) -> Self {
        self.dedup = Some((embedder, threshold));
        self
    }

    /// Creates a rule; with a `request_id`, a repeat of the request (a
    /// retry after a reply that was lost) is answered with the rule the
    /// first one made, as it is now, instead of `RULE_EXISTS`.
    pub async fn create_rule(
        &self,
        ctx: &CallerContext,
        new: NewRule,
        request_id: Option<&str>,
    ) -> Result<Rule> {
        let rule = validate_rule(new, now_micros())?;
        let request = request_id.map(|id| RequestStamp {
            id,
            fingerprint: rule_fingerprint(&rule),
        });
        match self.store.create_rule(&ctx.tenant, &rule, request).await? {
            RuleCreation::Created => Ok(rule),
            RuleCreation::Repeated(first) => Ok(first),
            RuleCreation::Taken => Err(super::rule_exists(&rule.id)),
        }
    }

    pub async fn get_rule(&self, ctx: &CallerContext, id: &str) -> Result<Rule> {
        self.store
            .get_rule(&ctx.tenant, id)
            .await?
            .ok_or_else(|| super::rule_not_found(id))
    }

    pub async fn list_rules(
        &self,
        ctx: &CallerContext,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Rule>> {
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&["rules"]);
        let after: Option<String> = paging::decode_token(&query, page_token)?;
        let mut items = self
            .store
            .list_rules(&ctx.tenant, after.as_deref(), limit + 1)
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, &last.id)
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    pub async fn delete_rule(&self, ctx: &CallerContext, id: &str) -> Result<()> {
        if self.store.delete_rule(&ctx.tenant, id).await? {
            Ok(())
        } else {
            Err(super::rule_not_found(id))
        }
    }

    /// One run of a rule over the episodes after its watermark (at most
    /// `max_episodes` of them), waiting for any run of it in progress.
    pub async fn run_rule(
        &self,
        ctx: &CallerContext,
        id: &str,
        dry_run: bool,
        max_episodes: i64,
    ) -> Result<RunOutcome> {
        self.run(ctx, id, dry_run, max_episodes, RunLock::Wait)
            .await?
            .ok_or_else(|| Error::internal("a waiting run came back without running"))
    }

    /// A run for the scheduler: `None` when another run holds the rule.
    pub async fn try_run(&self, ctx: &CallerContext, id: &str) -> Result<Option<RunOutcome>> {
        self.run(ctx, id, false, DEFAULT_RUN_EPISODES, RunLock::Try)
            .await
    }

    async fn run(
        &self,
        ctx: &CallerContext,
        id: &str,
        dry_run: bool,
        max_episodes: i64,
        lock: RunLock,
    ) -> Result<Option<RunOutcome>> {
        // Never past the settled horizon: an append that commits late below
        // it would otherwise be skipped for good. A caller's run sees every
        // episode committed before it (the shared horizon may lag by a poll);
        // the scheduler takes the shared one, which costs no query.
        let up_to = match lock {
            RunLock::Wait => self.store.settled(Feed::Episodes).await?,
            RunLock::Try => *self.store.horizon(Feed::Episodes).await?.borrow(),
        };
        let mut request = RunRequest {
            rule_id: id,
            up_to,
            limit: max_episodes.clamp(1, MAX_RUN_EPISODES),
            dry_run,
            now: now_micros(),
            lock,
            dedup: None,
        };
        let dedup = match &self.dedup {
            None => None,
            Some((embedder, threshold)) => {
                match self
                    .dedup_vectors(ctx, &request, embedder.as_ref(), *threshold)
                    .await?
                {
                    Ok(dedup) => Some(dedup),
                    Err(Locked::Missing) => return Err(super::rule_not_found(id)),
                    Err(_) => return Ok(None),
                }
            }
        };
        request.dedup = dedup.as_ref();
        let mut tx = self.store.begin(&ctx.tenant).await?;
        match super::run::run(&mut tx, &ctx.tenant, &request).await? {
            Ok(outcome) if dry_run => {
                tx.rollback().await?;
                Ok(Some(outcome))
            }
            Ok(outcome) => {
                tx.commit().await?;
                Ok(Some(outcome))
            }
            Err(Locked::Missing) => Err(super::rule_not_found(id)),
            Err(_) => Ok(None),
        }
    }

    /// The vectors of what a run would add: the run done once and rolled
    /// back, then its Adds' texts embedded, outside any transaction (a
    /// model call never holds one open). The real run that follows reads
    /// the same episodes; an Add it makes that was not embedded here is
    /// added as it is.
    async fn dedup_vectors(
        &self,
        ctx: &CallerContext,
        request: &RunRequest<'_>,
        embedder: &dyn Embedder,
        threshold: f32,
    ) -> Result<std::result::Result<Dedup, Locked>> {
        let preview = RunRequest {
            dry_run: true,
            dedup: None,
            ..*request
        };
        let mut tx = self.store.begin(&ctx.tenant).await?;
        let outcome = super::run::run(&mut tx, &ctx.tenant, &preview).await?;
        tx.rollback().await?;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(locked) => return Ok(Err(locked)),
        };
        let mut texts: Vec<String> = outcome
            .deltas
            .iter()
            .filter_map(|delta| match delta {
                Delta::Add { payload, .. } => Some(payload.text()),
                _ => None,
            })
            .collect();
        texts.sort();
        texts.dedup();
        let mut vectors = HashMap::with_capacity(texts.len());
        for chunk in texts.chunks(DEDUP_BATCH) {
            let embedded =
                embedder
                    .embed(chunk)
                    .await
                    .map_err(|err| Error::DependencyUnavailable {
                        reason: Reason::EmbedderUnavailable,
                        message: format!("the embedder failed: {err}"),
                    })?;
            vectors.extend(chunk.iter().cloned().zip(embedded));
        }
        Ok(Ok(Dedup {
            model: embedder.model().to_owned(),
            threshold,
            vectors,
        }))
    }

    pub async fn apply_deltas(&self, ctx: &CallerContext, deltas: Vec<Delta>) -> Result<Applied> {
        if deltas.is_empty() || deltas.len() > MAX_DELTAS {
            return Err(invalid(
                Reason::InvalidArgument,
                "deltas",
                format!("must hold 1 to {MAX_DELTAS} deltas, got {}", deltas.len()),
            ));
        }
        for (i, delta) in deltas.iter().enumerate() {
            validate_delta(&format!("deltas[{i}]"), delta)?;
        }
        let mut tx = self.store.begin(&ctx.tenant).await?;
        let applied = super::run::apply(&mut tx, &ctx.tenant, &deltas, now_micros()).await?;
        tx.commit().await?;
        Ok(applied)
    }

    pub async fn list_facts(
        &self,
        ctx: &CallerContext,
        filter: FactFilter,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Fact>> {
        let limit = paging::page_size(page_size)?;
        let kind = filter.kind.map_or(0, FactKind::as_i16).to_string();
        let query = paging::query_digest(&[
            "facts",
            filter.app.as_deref().unwrap_or(""),
            filter.user.as_deref().unwrap_or("\u{0}"),
            &kind,
        ]);
        let after: Option<String> = paging::decode_token(&query, page_token)?;
        let mut items = self
            .store
            .list_facts(&ctx.tenant, &filter, after.as_deref(), limit + 1)
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, &last.id)
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    /// A fact at its newest version, with a page of its versions, oldest
    /// first.
    pub async fn get_fact(
        &self,
        ctx: &CallerContext,
        id: &str,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Fact, ListPage<FactVersion>)> {
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&["fact versions", id]);
        let after: Option<i64> = paging::decode_token(&query, page_token)?;
        let (fact, mut items) = self
            .store
            .get_fact(&ctx.tenant, id, after.unwrap_or(0), limit + 1)
            .await?
            .ok_or_else(|| fact_not_found(id))?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, last.version)
        });
        Ok((
            fact,
            ListPage {
                items,
                next_page_token,
            },
        ))
    }

    /// Tombstones a fact; its versions stay readable through `GetFact`.
    pub async fn delete_fact(&self, ctx: &CallerContext, id: &str) -> Result<Fact> {
        let provenance = Provenance {
            source_episode_ids: Vec::new(),
            promotion_ts: now_micros(),
            rule_id: "delete".to_owned(),
            confidence: 1.0,
        };
        let mut tx = self.store.begin(&ctx.tenant).await?;
        if tx.lock_live_fact(&ctx.tenant, id).await? {
            tx.write_version(&ctx.tenant, id, None, &provenance, provenance.promotion_ts)
                .await?;
            let fact = tx.fact(&ctx.tenant, id).await?;
            tx.commit().await?;
            return fact.ok_or_else(|| Error::internal("a deleted fact was not read back"));
        }
        tx.rollback().await?;
        Err(match self.store.get_fact(&ctx.tenant, id, 0, 0).await? {
            Some(_) => Error::NotFound {
                reason: Reason::FactNotFound,
                message: format!("fact {id:?} is already deleted"),
                metadata: vec![("fact_id", id.to_owned())],
            },
            None => fact_not_found(id),
        })
    }

    /// Every enabled rule of every tenant, for the scheduler.
    pub(crate) async fn enabled_rules(&self) -> Result<Vec<(crate::context::Tenant, Rule)>> {
        self.store.enabled_rules().await
    }

    /// Whether at least `n` episodes wait after a rule's watermark.
    pub(crate) async fn has_pending(
        &self,
        tenant: &crate::context::Tenant,
        rule: &Rule,
        n: i64,
    ) -> Result<bool> {
        let up_to = *self.store.horizon(Feed::Episodes).await?.borrow();
        Ok(self
            .store
            .pending_episodes(tenant, rule.watermark, up_to, n)
            .await?
            >= n)
    }
}
