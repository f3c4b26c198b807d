//! The rules between requests and the store for working memory: session
//! ownership, redaction before storage, limits.

use serde_json::Value;

use super::ports::{CachePut, NewTask, WorkingStore};
use super::types::{
    CachedFile, Task, TaskChange, WorkingLimits, limit_exceeded, task_not_found, task_number,
};
use crate::consolidation::ports::{ConsolidationStore, FactFilter, FactTx};
use crate::consolidation::{Fact, FactKind, FactPayload, Provenance, check_triple_part};
use crate::context::CallerContext;
use crate::error::{
    Error, Reason, Result, fingerprint, refuse_nul, refuse_over, request_id_reused,
};
use crate::memory::now_micros;
use crate::memory::ports::RequestStamp;
use crate::paging::{self, ListPage};
use crate::ports::Feeds;
use crate::redact::Redactor;
use crate::search::ports::{EmbeddingStore, SearchStore};
use crate::search::{Filters, Item, MAX_LIMIT, Query, Search, SearchRequest, Source};
use crate::sessions::ports::SessionStore;
use crate::sessions::{
    CreateMode, CreateRequest, Episode, Id, Name, Owner, Session, Sessions, session_ended,
    session_not_found,
};

/// The lineage source of facts stated directly.
pub const REMEMBER: &str = "remember";
/// Longest goal, task subject or description, remembered fact, in bytes.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// `GetSnapshot` and `RenderMemoryBlock` without limits.
pub const DEFAULT_FACTS: i64 = 20;
pub const DEFAULT_EVENTS: i64 = 10;
pub const MAX_LISTED: i64 = 1000;

/// Everything the MEMORY block is made of.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub goal: String,
    pub tasks: Vec<Task>,
    /// Oldest first.
    pub facts: Vec<Fact>,
    pub procedures: Vec<Fact>,
    /// Oldest first.
    pub recent: Vec<Episode>,
    pub cache: Vec<CachedFile>,
}

#[derive(Clone)]
pub struct WorkingMemory<S> {
    store: S,
    sessions: Sessions<S>,
    /// Finds the facts relevant to a query (hybrid with an embedder).
    search: Search<S>,
    limits: WorkingLimits,
    /// `None` when redaction is turned off.
    redactor: Option<Redactor>,
}

fn text(field: &str, value: &str, required: bool) -> Result<()> {
    refuse_nul(field, value)?;
    if required && value.trim().is_empty() {
        return Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            "must not be empty",
        ));
    }
    refuse_over(field, value, MAX_TEXT_BYTES)
}

impl<S: WorkingStore + SessionStore + ConsolidationStore + SearchStore + EmbeddingStore + Feeds>
    WorkingMemory<S>
{
    pub fn new(
        store: S,
        sessions: Sessions<S>,
        search: Search<S>,
        limits: WorkingLimits,
        redactor: Option<Redactor>,
    ) -> Self {
        WorkingMemory {
            store,
            sessions,
            search,
            limits,
            redactor,
        }
    }

    /// Text as it may be stored: redacted when redaction is on.
    pub fn redact(&self, text: &str) -> String {
        match &self.redactor {
            Some(redactor) => redactor.text(text),
            None => text.to_owned(),
        }
    }

    /// The session a request acts on: it must belong to the owner given,
    /// and is created when missing and both app and user are given.
    /// Writes (`open`) need a session that has not ended.
    pub async fn session(
        &self,
        ctx: &CallerContext,
        id: &Id,
        owner: &Owner,
        open: bool,
    ) -> Result<Session> {
        let session = match self.sessions.get(ctx, id, owner).await {
            Err(Error::NotFound {
                reason: Reason::SessionNotFound,
                ..
            }) if owner.complete().is_some() => {
                let (app, user) = owner
                    .complete()
                    .ok_or_else(|| session_not_found(id.as_str()))?;
                let request = CreateRequest {
                    app: app.clone(),
                    user: user.clone(),
                    id: Some(id.clone()),
                    metadata: serde_json::Map::new(),
                    request_id: None,
                };
                self.sessions
                    .create(ctx, request, CreateMode::GetOrCreate)
                    .await?
                    .0
            }
            other => other?,
        };
        if open && session.end_time.is_some() {
            return Err(session_ended(&session.id));
        }
        Ok(session)
    }

    pub async fn set_goal(
        &self,
        ctx: &CallerContext,
        session: &Session,
        goal: &str,
    ) -> Result<String> {
        text("goal", goal, false)?;
        let goal = self.redact(goal.trim());
        self.store
            .set_goal(&ctx.tenant, &session.id, &goal, now_micros())
            .await?;
        Ok(goal)
    }

    pub async fn create_task(
        &self,
        ctx: &CallerContext,
        session: &Session,
        subject: &str,
        description: &str,
        request_id: Option<&str>,
    ) -> Result<Task> {
        text("subject", subject, true)?;
        text("description", description, false)?;
        let request = request_id.map(|id| RequestStamp {
            id,
            fingerprint: fingerprint(&[subject, description]),
        });
        let (subject, description) = (self.redact(subject.trim()), self.redact(description));
        let task = NewTask {
            session_id: &session.id,
            subject: &subject,
            description: &description,
            now: now_micros(),
            max_tasks: self.limits.max_tasks_per_session,
            request,
        };
        self.store
            .create_task(&ctx.tenant, &task)
            .await?
            .ok_or_else(|| {
                limit_exceeded(
                    "max_tasks_per_session",
                    self.limits.max_tasks_per_session,
                    "the session has as many tasks as it may hold",
                )
            })
    }

    pub async fn update_task(
        &self,
        ctx: &CallerContext,
        session: &Session,
        task_id: &str,
        mut change: TaskChange,
    ) -> Result<Task> {
        let number = task_number(task_id).ok_or_else(|| task_not_found(task_id))?;
        if let Some(subject) = &change.subject {
            text("subject", subject, true)?;
            change.subject = Some(self.redact(subject.trim()));
        }
        if let Some(description) = &change.description {
            text("description", description, false)?;
            change.description = Some(self.redact(description));
        }
        self.store
            .update_task(&ctx.tenant, &session.id, number, &change, now_micros())
            .await?
            .ok_or_else(|| task_not_found(task_id))
    }

    /// A page of the session's tasks, in creation order.
    pub async fn list_tasks(
        &self,
        ctx: &CallerContext,
        session: &Session,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Task>> {
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&["tasks", session.id.as_str()]);
        let after: Option<i64> = paging::decode_token(&query, page_token)?;
        let mut items = self
            .store
            .list_tasks(&ctx.tenant, &session.id, after.unwrap_or(0), limit + 1)
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            paging::encode_token(&query, task_number(&last.id).unwrap_or(0))
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    /// Stores a fact (after redaction) through the facts store, with the
    /// lineage source `remember`.
    async fn store_fact(
        &self,
        ctx: &CallerContext,
        payload: FactPayload,
        limit: (&'static str, i64),
        request: Option<RequestStamp<'_>>,
    ) -> Result<Fact> {
        let mut tx = self.store.begin(&ctx.tenant).await?;
        let owner = (payload.app.as_str(), payload.user.as_str());
        // Holds the owner's fact writers until the transaction ends, so a
        // repeat finds the fact of a concurrent first try committed.
        let count = tx
            .count_owned_facts(&ctx.tenant, owner, payload.kind)
            .await?;
        if let Some(request) = &request {
            let first = tx
                .fact_of_request(&ctx.tenant, owner, payload.kind, request.id)
                .await?;
            if let Some((id, kept)) = first {
                if kept[..] != request.fingerprint[..] {
                    return Err(request_id_reused(request.id));
                }
                let fact = tx.fact(&ctx.tenant, &id).await?;
                tx.rollback().await?;
                return fact.ok_or_else(|| Error::internal("a remembered fact was not read back"));
            }
        }
        if limit.1 > 0 && count >= limit.1 {
            return Err(limit_exceeded(
                limit.0,
                limit.1,
                "no room for another fact of this owner",
            ));
        }
        let now = now_micros();
        let provenance = Provenance {
            source_episode_ids: Vec::new(),
            promotion_ts: now,
            rule_id: REMEMBER.to_owned(),
            confidence: 1.0,
        };
        let id = uuid::Uuid::now_v7().to_string();
        tx.insert_fact(&ctx.tenant, &id, &payload, &provenance, now)
            .await?;
        if let Some(request) = &request {
            tx.keep_request(&ctx.tenant, &id, request).await?;
        }
        let fact = tx.fact(&ctx.tenant, &id).await?;
        tx.commit().await?;
        fact.ok_or_else(|| Error::internal("a remembered fact was not read back"))
    }

    /// A semantic fact for the session's app and user.
    pub async fn remember(
        &self,
        ctx: &CallerContext,
        session: &Session,
        content: &str,
        key: (String, String, String),
        request_id: Option<&str>,
    ) -> Result<Fact> {
        text("content", content, true)?;
        for (field, part) in [
            ("subject", &key.0),
            ("predicate", &key.1),
            ("object", &key.2),
        ] {
            check_triple_part(field, part)?;
        }
        let payload = FactPayload {
            app: session.app.clone(),
            user: session.user.clone(),
            kind: FactKind::Semantic,
            subject: self.redact(&key.0),
            predicate: self.redact(&key.1),
            object: self.redact(&key.2),
            content: Value::String(self.redact(content.trim())),
            channels: vec!["semantic".to_owned()],
        };
        let request = request_id.map(|id| RequestStamp {
            id,
            fingerprint: fingerprint(&["semantic", content, &key.0, &key.1, &key.2]),
        });
        self.store_fact(
            ctx,
            payload,
            ("max_facts_per_user", self.limits.max_facts_per_user),
            request,
        )
        .await
    }

    /// A procedural fact for an app.
    pub async fn record_procedure(
        &self,
        ctx: &CallerContext,
        app: &Name,
        content: &str,
        key: (String, String),
        request_id: Option<&str>,
    ) -> Result<Fact> {
        text("content", content, true)?;
        for (field, part) in [("subject", &key.0), ("predicate", &key.1)] {
            check_triple_part(field, part)?;
        }
        let payload = FactPayload {
            app: app.as_str().to_owned(),
            user: String::new(),
            kind: FactKind::Procedural,
            subject: self.redact(&key.0),
            predicate: self.redact(&key.1),
            object: String::new(),
            content: Value::String(self.redact(content.trim())),
            channels: vec!["procedural".to_owned()],
        };
        let request = request_id.map(|id| RequestStamp {
            id,
            fingerprint: fingerprint(&["procedural", content, &key.0, &key.1]),
        });
        self.store_fact(
            ctx,
            payload,
            ("max_facts_per_user", self.limits.max_facts_per_user),
            request,
        )
        .await
    }

    pub async fn cache_content(
        &self,
        ctx: &CallerContext,
        session: &Session,
        path: &str,
        content: &str,
    ) -> Result<(CachedFile, Vec<String>)> {
        text("path", path, true)?;
        if path.len() > 1024 {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "path",
                "must be at most 1024 bytes",
            ));
        }
        refuse_nul("content", content)?;
        let content = self.redact(content);
        if content.len() as i64 > self.limits.max_cache_bytes {
            return Err(limit_exceeded(
                "max_cache_bytes",
                self.limits.max_cache_bytes,
                &format!("{} bytes do not fit in the session cache", content.len()),
            ));
        }
        let put = CachePut {
            session_id: &session.id,
            path,
            content: &content,
            now: now_micros(),
            max_files: self.limits.max_cached_files.max(1),
            max_bytes: self.limits.max_cache_bytes,
        };
        self.store.cache_content(&ctx.tenant, &put).await
    }

    async fn newest_facts(
        &self,
        ctx: &CallerContext,
        app: &str,
        user: &str,
        kind: FactKind,
        limit: i64,
    ) -> Result<Vec<Fact>> {
        let filter = FactFilter {
            app: Some(app.to_owned()),
            user: Some(user.to_owned()),
            kind: Some(kind),
            newest_first: true,
        };
        let mut facts = self
            .store
            .list_facts(&ctx.tenant, &filter, None, limit)
            .await?;
        facts.reverse();
        Ok(facts)
    }

    /// The user's facts most relevant to `query`, best first, then the
    /// newest of the others up to `limit`: an agent sees what bears on the
    /// turn at hand without losing the rest when nothing matches.
    async fn relevant_facts(
        &self,
        ctx: &CallerContext,
        session: &Session,
        query: &Query,
        limit: i64,
    ) -> Result<Vec<Fact>> {
        let filters = Filters {
            app: Some(Name::parse("app", session.app.clone())?),
            user: Some(Name::parse("user", session.user.clone())?),
            kind: Some(FactKind::Semantic),
            ..Filters::default()
        };
        let wanted = usize::try_from(limit).unwrap_or(0);
        let request = SearchRequest {
            query: query.clone(),
            sources: [Source::Facts].into(),
            mode: None,
            limit: i32::try_from(wanted.clamp(1, MAX_LIMIT)).unwrap_or(1),
            filters,
            following_episodes: 0,
        };
        let mut facts: Vec<Fact> = self
            .search
            .search(ctx, request)
            .await?
            .into_iter()
            .filter_map(|hit| match hit.item {
                Item::Fact(fact) => Some(fact),
                _ => None,
            })
            .collect();
        if facts.len() < wanted {
            let newest = self
                .newest_facts(ctx, &session.app, &session.user, FactKind::Semantic, limit)
                .await?;
            for fact in newest.into_iter().rev() {
                if facts.len() >= wanted {
                    break;
                }
                if !facts.iter().any(|f| f.id == fact.id) {
                    facts.push(fact);
                }
            }
        }
        Ok(facts)
    }

    /// What the MEMORY block shows. With a `query` the Facts section holds
    /// the facts most relevant to it (then the newest); without, the newest.
    pub async fn snapshot(
        &self,
        ctx: &CallerContext,
        session: &Session,
        max_facts: i32,
        max_events: i32,
        query: Option<&Query>,
    ) -> Result<Snapshot> {
        let max_facts = paging::bounded("max_facts", max_facts, DEFAULT_FACTS, MAX_LISTED)?;
        let max_events = paging::bounded("max_events", max_events, DEFAULT_EVENTS, MAX_LISTED)?;
        let goal = self.store.goal(&ctx.tenant, &session.id).await?;
        // As many as the answer may carry: the budget below keeps them.
        let mut tasks = self
            .store
            .list_tasks(&ctx.tenant, &session.id, 0, i64::MAX)
            .await?;
        // One message holds it all: the sections share one answer's bytes,
        // in this order, each keeping what matters most in it (the best or
        // newest facts, the newest events and files).
        let mut budget = paging::Budget::after(goal.len());
        budget.keep_first(&mut tasks);
        let facts = match query {
            Some(query) => {
                let mut best = self.relevant_facts(ctx, session, query, max_facts).await?;
                budget.keep_first(&mut best);
                best
            }
            None => {
                let mut newest = self
                    .newest_facts(
                        ctx,
                        &session.app,
                        &session.user,
                        FactKind::Semantic,
                        max_facts,
                    )
                    .await?;
                budget.keep_last(&mut newest);
                newest
            }
        };
        let mut procedures = self
            .newest_facts(ctx, &session.app, "", FactKind::Procedural, max_facts)
            .await?;
        budget.keep_last(&mut procedures);
        let mut recent = self
            .sessions
            .newest_of(ctx, session, Vec::new(), max_events)
            .await?;
        budget.keep_first(&mut recent);
        recent.reverse();
        let mut cache = self.store.list_cache(&ctx.tenant, &session.id).await?;
        budget.keep_last(&mut cache);
        Ok(Snapshot {
            goal,
            tasks,
            facts,
            procedures,
            recent,
            cache,
        })
    }
}
