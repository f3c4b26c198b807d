//! The `MemoryAdminService` adapter.

use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::convert::{
    duration_from_proto, entry_to_proto, scope_type_from_proto, scope_type_to_proto, timestamp,
};
use super::error::to_status;
use crate::error::{Error, Reason, Result};
use crate::memory::admin::{
    CompactCommand, MAX_COMPACT_KEYS, MemoryAdmin, Sources, describe_unknown,
};
use crate::memory::audit::{AuditRecord, SourceMode};
use crate::memory::ports::{Retention, RetentionPolicy};
use crate::memory::{Key, Scope, ScopeName};
use crate::ports::Store;
use crate::proto;
use crate::proto::memory_admin_service_server::MemoryAdminService;

pub struct MemoryAdminApi<S> {
    admin: MemoryAdmin<S>,
}

impl<S: Store> MemoryAdminApi<S> {
    pub fn new(admin: MemoryAdmin<S>) -> Self {
        MemoryAdminApi { admin }
    }
}

/// Maintenance always names its scope explicitly: no defaults from the
/// caller context, so an operator cannot purge the wrong flow by accident.
fn scope(scope_type: i32, scope: String) -> Result<Scope> {
    let scope_type = scope_type_from_proto("scope_type", scope_type)?
        .ok_or_else(|| Error::invalid(Reason::InvalidArgument, "scope_type", "is required"))?;
    Ok(Scope {
        scope_type,
        name: ScopeName::parse("scope", scope)?,
    })
}

fn keep(keep: Option<i64>) -> Result<Option<i64>> {
    match keep {
        Some(n) if n < 0 => Err(Error::invalid(
            Reason::InvalidArgument,
            "keep",
            format!("must not be negative, got {n}"),
        )),
        other => Ok(other),
    }
}

fn source_mode_to_proto(mode: SourceMode) -> proto::SourceMode {
    match mode {
        SourceMode::Current => proto::SourceMode::Current,
        SourceMode::History => proto::SourceMode::History,
    }
}

pub fn record_to_proto(record: AuditRecord) -> proto::CompactionRecord {
    let source_scope_type = record
        .source_scope_type()
        .map_or(proto::ScopeType::Unspecified, scope_type_to_proto)
        as i32;
    proto::CompactionRecord {
        operation: match record.operation {
            crate::memory::audit::Operation::Compact => "compact".to_owned(),
            crate::memory::audit::Operation::Purge => "purge".to_owned(),
            crate::memory::audit::Operation::Retention => "retention".to_owned(),
            crate::memory::audit::Operation::Rollback => "rollback".to_owned(),
            crate::memory::audit::Operation::Fork => "fork".to_owned(),
            crate::memory::audit::Operation::Forget => "forget".to_owned(),
        },
        scope_type: record
            .scope_type()
            .map_or(proto::ScopeType::Unspecified, scope_type_to_proto) as i32,
        scope: record.scope,
        create_time: Some(timestamp(record.timestamp)),
        source_keys: record.source_keys,
        source_versions: record.source_versions,
        target_key: record.target_key,
        target_version: record.target_version,
        instruction: record.instruction,
        model: record.model,
        source_mode: record
            .source_mode
            .map_or(proto::SourceMode::Unspecified, source_mode_to_proto)
            as i32,
        keys_affected: record.keys_affected,
        versions_deleted: record.versions_deleted,
        keep: record.keep,
        audit_key: record.audit_key,
        source_scope_type,
        source_scope: record.source_scope,
        as_of_revision: record.as_of_revision,
        as_of_time: record.as_of_time.map(timestamp),
        subject: record.subject,
        counts: record.counts.into_iter().collect(),
    }
}

fn compact_command(req: proto::CompactRequest) -> Result<CompactCommand> {
    let scope = scope(req.scope_type, req.scope)?;
    let history = match proto::SourceMode::try_from(req.source_mode) {
        Ok(proto::SourceMode::Unspecified | proto::SourceMode::Current) => false,
        Ok(proto::SourceMode::History) => true,
        Err(_) => {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "source_mode",
                format!("unknown source mode {}", req.source_mode),
            ));
        }
    };
    let sources = match (req.key.is_empty(), req.keys.is_empty()) {
        (false, true) => Sources::One {
            key: Key::parse("key", req.key)?,
            history,
        },
        (true, false) => {
            if history {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    "source_mode",
                    "SOURCE_MODE_HISTORY summarises one key: set key, not keys",
                ));
            }
            if req.keys.len() > MAX_COMPACT_KEYS {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    "keys",
                    format!("at most {MAX_COMPACT_KEYS} keys, got {}", req.keys.len()),
                ));
            }
            let mut keys = Vec::with_capacity(req.keys.len());
            for (i, key) in req.keys.into_iter().enumerate() {
                let key = Key::parse(&format!("keys[{i}]"), key)?;
                if keys.contains(&key) {
                    return Err(Error::invalid(
                        Reason::InvalidArgument,
                        format!("keys[{i}]"),
                        format!("{key} is listed twice"),
                    ));
                }
                keys.push(key);
            }
            Sources::Many(keys)
        }
        _ => {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "key",
                "set exactly one of key and keys",
            ));
        }
    };
    let target_key = if req.target_key.is_empty() {
        None
    } else {
        Some(Key::parse("target_key", req.target_key)?)
    };
    let max_tokens = u32::try_from(req.max_tokens).map_err(|_| {
        Error::invalid(
            Reason::InvalidArgument,
            "max_tokens",
            "must not be negative",
        )
    })?;
    Ok(CompactCommand {
        scope,
        sources,
        target_key,
        instruction: req.instruction,
        model: req.model,
        max_tokens,
    })
}

/// A duration field of a retention policy: unset is `None`, anything set
/// must be positive and representable.
fn policy_duration(
    field: &str,
    d: Option<prost_types::Duration>,
) -> Result<Option<chrono::Duration>> {
    d.map(|d| {
        let d = duration_from_proto(field, &d)?;
        chrono::Duration::from_std(d)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Error::invalid(Reason::InvalidArgument, field, "must be positive"))
    })
    .transpose()
}

fn policy_from_proto(policy: Option<proto::RetentionPolicy>) -> Result<RetentionPolicy> {
    let policy = policy.unwrap_or_default();
    Ok(RetentionPolicy {
        keep_versions: policy.keep_versions,
        max_age: policy_duration("policy.max_age", policy.max_age)?,
        tombstone_grace: policy_duration("policy.tombstone_grace", policy.tombstone_grace)?,
    })
}

fn duration_to_proto(d: chrono::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.num_seconds(),
        nanos: (d.subsec_nanos()).max(0),
    }
}

fn retention_to_proto(retention: Retention) -> proto::Retention {
    proto::Retention {
        scope_type: scope_type_to_proto(retention.scope.scope_type) as i32,
        scope: retention.scope.name.as_str().to_owned(),
        policy: Some(proto::RetentionPolicy {
            keep_versions: retention.policy.keep_versions,
            max_age: retention.policy.max_age.map(duration_to_proto),
            tombstone_grace: retention.policy.tombstone_grace.map(duration_to_proto),
        }),
        next_run_time: Some(timestamp(retention.next_run_time)),
        last_run_time: retention.last_run_time.map(timestamp),
        last_versions_deleted: retention.last_versions_deleted,
    }
}

#[tonic::async_trait]
impl<S: Store> MemoryAdminService for MemoryAdminApi<S> {
    async fn set_retention(
        &self,
        request: Request<proto::SetRetentionRequest>,
    ) -> Result<Response<proto::SetRetentionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                scope(req.scope_type, req.scope)?,
                policy_from_proto(req.policy)?,
            ))
        })();
        let (scope, policy) = parsed.map_err(to_status)?;
        if req.dry_run {
            let preview = self
                .admin
                .preview_retention(&ctx, &scope, policy)
                .await
                .map_err(to_status)?;
            return Ok(Response::new(proto::SetRetentionResponse {
                retention: None,
                versions_to_delete: preview.versions_deleted,
                keys_to_affect: preview.keys_affected,
            }));
        }
        let retention = self
            .admin
            .set_retention(&ctx, &scope, policy)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::SetRetentionResponse {
            retention: retention.map(retention_to_proto),
            versions_to_delete: 0,
            keys_to_affect: 0,
        }))
    }

    async fn get_retention(
        &self,
        request: Request<proto::GetRetentionRequest>,
    ) -> Result<Response<proto::GetRetentionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let scope = scope(req.scope_type, req.scope).map_err(to_status)?;
        let retention = self
            .admin
            .get_retention(&ctx, &scope)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetRetentionResponse {
            retention: Some(retention_to_proto(retention)),
        }))
    }

    async fn apply_retention(
        &self,
        request: Request<proto::ApplyRetentionRequest>,
    ) -> Result<Response<proto::ApplyRetentionResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let scope = scope(req.scope_type, req.scope).map_err(to_status)?;
        let outcome = self
            .admin
            .apply_retention(&ctx, &scope, req.dry_run)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ApplyRetentionResponse {
            versions_deleted: outcome.versions_deleted,
            keys_affected: outcome.keys_affected,
            record: outcome.record.map(record_to_proto),
        }))
    }

    async fn purge(
        &self,
        request: Request<proto::PurgeRequest>,
    ) -> Result<Response<proto::PurgeResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                scope(req.scope_type, req.scope)?,
                Key::parse("key", req.key)?,
                keep(req.keep)?,
            ))
        })();
        let (scope, key, keep) = parsed.map_err(to_status)?;
        let outcome = self
            .admin
            .purge(&ctx, &scope, &key, keep, req.dry_run)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::PurgeResponse {
            versions_deleted: outcome.versions_deleted,
            keys_affected: outcome.keys_affected,
            record: outcome.record.map(record_to_proto),
        }))
    }

    async fn purge_scope(
        &self,
        request: Request<proto::PurgeScopeRequest>,
    ) -> Result<Response<proto::PurgeScopeResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| Ok::<_, Error>((scope(req.scope_type, req.scope)?, keep(req.keep)?)))();
        let (scope, keep) = parsed.map_err(to_status)?;
        let outcome = self
            .admin
            .purge_scope(&ctx, &scope, keep, req.include_deleted, req.dry_run)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::PurgeScopeResponse {
            versions_deleted: outcome.versions_deleted,
            keys_affected: outcome.keys_affected,
            record: outcome.record.map(record_to_proto),
        }))
    }

    async fn compact(
        &self,
        request: Request<proto::CompactRequest>,
    ) -> Result<Response<proto::CompactResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let command = compact_command(request.into_inner()).map_err(to_status)?;
        let compaction = self.admin.compact(&ctx, command).await.map_err(to_status)?;
        Ok(Response::new(proto::CompactResponse {
            entry: Some(entry_to_proto(compaction.entry)),
            sources: compaction.sources.into_iter().map(entry_to_proto).collect(),
            record: Some(record_to_proto(compaction.record)),
        }))
    }

    async fn get_compaction_log(
        &self,
        request: Request<proto::GetCompactionLogRequest>,
    ) -> Result<Response<proto::GetCompactionLogResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let scope = scope(req.scope_type, req.scope).map_err(to_status)?;
        let page = self
            .admin
            .compaction_log(&ctx, &scope, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetCompactionLogResponse {
            records: page.items.into_iter().map(record_to_proto).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn reindex(
        &self,
        request: Request<proto::ReindexRequest>,
    ) -> Result<Response<proto::ReindexResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let apply = request.into_inner().apply;
        let outcome = self.admin.reindex(&ctx, apply).await.map_err(to_status)?;
        Ok(Response::new(proto::ReindexResponse {
            versions_scanned: outcome.versions_scanned,
            tags_added: outcome.tags_added,
            issues: outcome
                .unknown
                .iter()
                .map(|(scope, versions)| describe_unknown(scope, *versions))
                .collect(),
            applied: apply,
        }))
    }
}
