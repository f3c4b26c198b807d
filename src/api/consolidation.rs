//! The `ConsolidationService` adapter and the conversions of rules, deltas
//! and facts.

use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::convert::{json_at, json_to_proto, optional_timestamp, request_id, timestamp};
use super::error::to_status;
use crate::consolidation::FactFilter;
use crate::consolidation::{
    Applied, Cadence, Consolidation, DEFAULT_RUN_EPISODES, Delta, Fact, FactKind, FactPayload,
    FactVersion, NewRule, Provenance, Rule,
};
use crate::error::{Error, Reason, Result};
use crate::ports::Store;
use crate::proto;
use crate::proto::consolidation_service_server::ConsolidationService;

pub struct ConsolidationApi<S> {
    consolidation: Consolidation<S>,
}

impl<S: Store> ConsolidationApi<S> {
    pub fn new(consolidation: Consolidation<S>) -> Self {
        ConsolidationApi { consolidation }
    }
}

pub fn kind_from_proto(field: &str, n: i32) -> Result<Option<FactKind>> {
    match proto::FactKind::try_from(n) {
        Ok(proto::FactKind::Unspecified) => Ok(None),
        Ok(proto::FactKind::Semantic) => Ok(Some(FactKind::Semantic)),
        Ok(proto::FactKind::Procedural) => Ok(Some(FactKind::Procedural)),
        Err(_) => Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            format!("unknown fact kind {n}"),
        )),
    }
}

fn kind_to_proto(kind: FactKind) -> i32 {
    match kind {
        FactKind::Semantic => proto::FactKind::Semantic as i32,
        FactKind::Procedural => proto::FactKind::Procedural as i32,
    }
}

pub fn rule_to_proto(rule: Rule) -> proto::ConsolidationRule {
    proto::ConsolidationRule {
        id: rule.id,
        filter: rule.filter,
        cadence: Some(match rule.cadence {
            Cadence::EveryNEpisodes(n) => proto::consolidation_rule::Cadence::EveryNEpisodes(n),
            Cadence::Cron(text) => proto::consolidation_rule::Cadence::Cron(text),
        }),
        then_emits: rule.then_emits,
        kind: kind_to_proto(rule.kind),
        confidence: rule.confidence,
        enabled: rule.enabled,
        watermark: rule.watermark,
        episodes_promoted: rule.episodes_promoted,
        create_time: Some(timestamp(rule.create_time)),
        last_run_time: rule.last_run_time.map(timestamp),
    }
}

fn rule_from_proto(rule: proto::ConsolidationRule) -> Result<NewRule> {
    Ok(NewRule {
        id: rule.id,
        filter: rule.filter,
        cadence: rule.cadence.map(|cadence| match cadence {
            proto::consolidation_rule::Cadence::EveryNEpisodes(n) => Cadence::EveryNEpisodes(n),
            proto::consolidation_rule::Cadence::Cron(text) => Cadence::Cron(text),
        }),
        then_emits: rule.then_emits,
        kind: kind_from_proto("rule.kind", rule.kind)?,
        confidence: rule.confidence,
        enabled: rule.enabled,
    })
}

fn provenance_to_proto(provenance: &Provenance) -> proto::DeltaProvenance {
    proto::DeltaProvenance {
        source_episode_ids: provenance.source_episode_ids.clone(),
        promotion_ts: Some(timestamp(provenance.promotion_ts)),
        rule_id: provenance.rule_id.clone(),
        confidence: provenance.confidence,
    }
}

fn provenance_from_proto(
    field: &str,
    provenance: Option<proto::DeltaProvenance>,
) -> Result<Provenance> {
    let missing = |part: &str| {
        Error::invalid(
            Reason::MissingProvenance,
            format!("{field}.provenance{part}"),
            "is required: a delta without provenance cannot be applied",
        )
    };
    let provenance = provenance.ok_or_else(|| missing(""))?;
    let promotion_ts = optional_timestamp(
        &format!("{field}.provenance.promotion_ts"),
        provenance.promotion_ts,
    )?
    .ok_or_else(|| missing(".promotion_ts"))?;
    Ok(Provenance {
        source_episode_ids: provenance.source_episode_ids,
        promotion_ts,
        rule_id: provenance.rule_id,
        confidence: provenance.confidence,
    })
}

fn payload_to_proto(payload: &FactPayload) -> proto::FactPayload {
    proto::FactPayload {
        app: payload.app.clone(),
        user: payload.user.clone(),
        kind: kind_to_proto(payload.kind),
        subject: payload.subject.clone(),
        predicate: payload.predicate.clone(),
        object: payload.object.clone(),
        content: Some(json_to_proto(&payload.content)),
        channels: payload.channels.clone(),
    }
}

fn payload_from_proto(field: &str, payload: Option<proto::FactPayload>) -> Result<FactPayload> {
    let field = format!("{field}.fact_payload");
    let payload = payload
        .ok_or_else(|| Error::invalid(Reason::InvalidArgument, field.as_str(), "is required"))?;
    Ok(FactPayload {
        app: payload.app,
        user: payload.user,
        kind: kind_from_proto(&format!("{field}.kind"), payload.kind)?
            .unwrap_or(FactKind::Semantic),
        subject: payload.subject,
        predicate: payload.predicate,
        object: payload.object,
        content: match payload.content {
            Some(content) => json_at(&format!("{field}.content"), content)?,
            None => serde_json::Value::Null,
        },
        channels: payload.channels,
    })
}

pub fn delta_to_proto(delta: &Delta) -> proto::MemoryDelta {
    use proto::memory_delta::Delta as D;
    let delta = match delta {
        Delta::Add {
            payload,
            provenance,
        } => D::Add(proto::AddDelta {
            fact_payload: Some(payload_to_proto(payload)),
            provenance: Some(provenance_to_proto(provenance)),
        }),
        Delta::Update {
            payload,
            replaces,
            provenance,
        } => D::Update(proto::UpdateDelta {
            fact_payload: Some(payload_to_proto(payload)),
            replaces: replaces.clone(),
            provenance: Some(provenance_to_proto(provenance)),
        }),
        Delta::Delete {
            app,
            user,
            replaces,
            provenance,
        } => D::Delete(proto::DeleteDelta {
            app: app.clone(),
            user: user.clone(),
            replaces: replaces.clone(),
            provenance: Some(provenance_to_proto(provenance)),
        }),
        Delta::Noop { provenance } => D::Noop(proto::NoopDelta {
            provenance: Some(provenance_to_proto(provenance)),
        }),
    };
    proto::MemoryDelta { delta: Some(delta) }
}

fn delta_from_proto(field: &str, delta: proto::MemoryDelta) -> Result<Delta> {
    use proto::memory_delta::Delta as D;
    Ok(match delta.delta {
        None => {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                field,
                "set one of add, update, delete, noop",
            ));
        }
        Some(D::Add(add)) => Delta::Add {
            payload: payload_from_proto(&format!("{field}.add"), add.fact_payload)?,
            provenance: provenance_from_proto(&format!("{field}.add"), add.provenance)?,
        },
        Some(D::Update(update)) => Delta::Update {
            payload: payload_from_proto(&format!("{field}.update"), update.fact_payload)?,
            replaces: update.replaces,
            provenance: provenance_from_proto(&format!("{field}.update"), update.provenance)?,
        },
        Some(D::Delete(delete)) => Delta::Delete {
            app: delete.app,
            user: delete.user,
            replaces: delete.replaces,
            provenance: provenance_from_proto(&format!("{field}.delete"), delete.provenance)?,
        },
        Some(D::Noop(noop)) => Delta::Noop {
            provenance: provenance_from_proto(&format!("{field}.noop"), noop.provenance)?,
        },
    })
}

fn version_to_proto(version: FactVersion) -> proto::FactVersion {
    proto::FactVersion {
        version: version.version,
        deleted: version.deleted,
        subject: version.subject,
        predicate: version.predicate,
        object: version.object,
        content: Some(json_to_proto(&version.content)),
        confidence: version.confidence,
        lineage: Some(proto::Lineage {
            source: version.source,
            source_episode_ids: version.source_episode_ids,
        }),
        channels: version.channels,
        create_time: Some(timestamp(version.create_time)),
    }
}

pub fn fact_to_proto(fact: Fact) -> proto::Fact {
    proto::Fact {
        id: fact.id,
        app: fact.app,
        user: fact.user,
        kind: kind_to_proto(fact.kind),
        current: Some(version_to_proto(fact.current)),
        create_time: Some(timestamp(fact.create_time)),
    }
}

fn required_id(field: &str, id: String) -> Result<String> {
    crate::sessions::Id::parse(field, id).map(|id| id.as_str().to_owned())
}

#[tonic::async_trait]
impl<S: Store> ConsolidationService for ConsolidationApi<S> {
    async fn create_rule(
        &self,
        request: Request<proto::CreateRuleRequest>,
    ) -> Result<Response<proto::CreateRuleResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let request_id = request_id(req.request_id).map_err(to_status)?;
        let rule = req
            .rule
            .ok_or_else(|| Error::invalid(Reason::InvalidArgument, "rule", "is required"))
            .and_then(rule_from_proto)
            .map_err(to_status)?;
        let rule = self
            .consolidation
            .create_rule(&ctx, rule, request_id.as_deref())
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::CreateRuleResponse {
            rule: Some(rule_to_proto(rule)),
        }))
    }

    async fn get_rule(
        &self,
        request: Request<proto::GetRuleRequest>,
    ) -> Result<Response<proto::GetRuleResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let id = required_id("rule_id", request.into_inner().rule_id).map_err(to_status)?;
        let rule = self
            .consolidation
            .get_rule(&ctx, &id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetRuleResponse {
            rule: Some(rule_to_proto(rule)),
        }))
    }

    async fn list_rules(
        &self,
        request: Request<proto::ListRulesRequest>,
    ) -> Result<Response<proto::ListRulesResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let page = self
            .consolidation
            .list_rules(&ctx, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListRulesResponse {
            rules: page.items.into_iter().map(rule_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn delete_rule(
        &self,
        request: Request<proto::DeleteRuleRequest>,
    ) -> Result<Response<proto::DeleteRuleResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let id = required_id("rule_id", request.into_inner().rule_id).map_err(to_status)?;
        self.consolidation
            .delete_rule(&ctx, &id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::DeleteRuleResponse {}))
    }

    async fn run_rule(
        &self,
        request: Request<proto::RunRuleRequest>,
    ) -> Result<Response<proto::RunRuleResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let id = required_id("rule_id", req.rule_id).map_err(to_status)?;
        let max_episodes = match req.max_episodes {
            n if n < 0 => {
                return Err(to_status(Error::invalid(
                    Reason::InvalidArgument,
                    "max_episodes",
                    format!("must not be negative, got {n}"),
                )));
            }
            0 => DEFAULT_RUN_EPISODES,
            n => i64::from(n),
        };
        let outcome = self
            .consolidation
            .run_rule(&ctx, &id, req.dry_run, max_episodes)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RunRuleResponse {
            deltas: outcome.deltas.iter().map(delta_to_proto).collect(),
            episodes_scanned: outcome.episodes_scanned,
            episodes_matched: outcome.episodes_matched,
            watermark: outcome.watermark,
            more: outcome.more,
            facts_added: outcome.applied.facts_added,
            facts_updated: outcome.applied.facts_updated,
            facts_deleted: outcome.applied.facts_deleted,
            fact_ids: outcome.applied.fact_ids,
        }))
    }

    async fn apply_deltas(
        &self,
        request: Request<proto::ApplyDeltasRequest>,
    ) -> Result<Response<proto::ApplyDeltasResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let deltas = request
            .into_inner()
            .deltas
            .into_iter()
            .enumerate()
            .map(|(i, delta)| delta_from_proto(&format!("deltas[{i}]"), delta))
            .collect::<Result<Vec<_>>>()
            .map_err(to_status)?;
        let Applied {
            facts_added,
            facts_updated,
            facts_deleted,
            fact_ids,
        } = self
            .consolidation
            .apply_deltas(&ctx, deltas)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ApplyDeltasResponse {
            facts_added,
            facts_updated,
            facts_deleted,
            fact_ids,
        }))
    }

    async fn list_facts(
        &self,
        request: Request<proto::ListFactsRequest>,
    ) -> Result<Response<proto::ListFactsResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let filter = super::sessions::owner(req.app, req.user)
            .and_then(|owner| {
                Ok(FactFilter {
                    app: owner.app.map(|app| app.as_str().to_owned()),
                    user: owner.user.map(|user| user.as_str().to_owned()),
                    kind: kind_from_proto("kind", req.kind)?,
                    newest_first: false,
                })
            })
            .map_err(to_status)?;
        let page = self
            .consolidation
            .list_facts(&ctx, filter, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListFactsResponse {
            facts: page.items.into_iter().map(fact_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_fact(
        &self,
        request: Request<proto::GetFactRequest>,
    ) -> Result<Response<proto::GetFactResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let id = required_id("fact_id", req.fact_id).map_err(to_status)?;
        let (fact, versions) = self
            .consolidation
            .get_fact(&ctx, &id, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetFactResponse {
            fact: Some(fact_to_proto(fact)),
            versions: versions.items.into_iter().map(version_to_proto).collect(),
            next_page_token: versions.next_page_token,
        }))
    }

    async fn delete_fact(
        &self,
        request: Request<proto::DeleteFactRequest>,
    ) -> Result<Response<proto::DeleteFactResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let id = required_id("fact_id", request.into_inner().fact_id).map_err(to_status)?;
        let fact = self
            .consolidation
            .delete_fact(&ctx, &id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::DeleteFactResponse {
            fact: Some(fact_to_proto(fact)),
        }))
    }
}
