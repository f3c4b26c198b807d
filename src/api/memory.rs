//! The `MemoryService` adapter: turns requests into domain types, calls
//! `Memory`, and turns the results back into messages.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::context::caller_context;
use super::convert::{
    entry_to_proto, json_from_proto, optional_timestamp, request_id, scope_type_from_proto,
    scope_type_to_proto,
};
use super::error::to_status;
use super::feed::{self, FeedOptions, FeedStream};
use super::watch::Changes;
use crate::error::{Error, Reason, Result};
use crate::memory::ports::{Past, ScopeFilter};
use crate::memory::{AsOf, Key, KeyPrefix, Memory, Scope, ScopeName, ScopeSelector, WriteRequest};
use crate::ports::Store;
use crate::proto;
use crate::proto::memory_service_server::MemoryService;

pub struct MemoryApi<S> {
    memory: Memory<S>,
    /// How watches are bounded and ended.
    feed: FeedOptions,
}

impl<S: Store> MemoryApi<S> {
    pub fn new(memory: Memory<S>, feed: FeedOptions) -> Self {
        MemoryApi { memory, feed }
    }
}

fn selector(scope_type: i32, scope: String) -> Result<ScopeSelector> {
    selector_named(("scope_type", scope_type), ("scope", scope))
}

/// A scope selector from fields of these names (ForkScope's source).
fn selector_named(
    (type_field, scope_type): (&str, i32),
    (scope_field, scope): (&str, String),
) -> Result<ScopeSelector> {
    Ok(ScopeSelector {
        scope_type: scope_type_from_proto(type_field, scope_type)?,
        scope: if scope.is_empty() {
            None
        } else {
            Some(ScopeName::parse(scope_field, scope)?)
        },
    })
}

fn version(field: &str, n: i64) -> Result<Option<i64>> {
    match n {
        n if n < 0 => Err(Error::invalid(
            Reason::InvalidVersion,
            field,
            format!("must not be negative, got {n}"),
        )),
        0 => Ok(None),
        n => Ok(Some(n)),
    }
}

/// The point of an `as_of` field, if one is set.
fn as_of(point: Option<proto::AsOf>) -> Result<Option<AsOf>> {
    use proto::as_of::Point;
    let Some(point) = point else {
        return Ok(None);
    };
    match point.point {
        None => Err(Error::invalid(
            Reason::InvalidArgument,
            "as_of",
            "names no point: set as_of.time or as_of.revision",
        )),
        Some(Point::Revision(n)) if n < 0 => Err(Error::invalid(
            Reason::InvalidArgument,
            "as_of.revision",
            format!("must not be negative, got {n}"),
        )),
        Some(Point::Revision(n)) => Ok(Some(AsOf::Revision(n))),
        Some(Point::Time(time)) => {
            Ok(optional_timestamp("as_of.time", Some(time))?.map(AsOf::Time))
        }
    }
}

fn expected_version(n: Option<i64>) -> Result<Option<i64>> {
    match n {
        Some(n) if n < 0 => Err(Error::invalid(
            Reason::InvalidVersion,
            "expected_version",
            format!("must not be negative, got {n}"),
        )),
        other => Ok(other),
    }
}

/// The fields Set and Delete share, parsed.
fn write_request(
    scope_type: i32,
    scope: String,
    key: String,
    expected: Option<i64>,
    id: String,
) -> Result<WriteRequest> {
    Ok(WriteRequest {
        selector: selector(scope_type, scope)?,
        key: Key::parse("key", key)?,
        expected_version: expected_version(expected)?,
        request_id: request_id(id)?,
    })
}

type HistoryStream = Pin<Box<dyn Stream<Item = Result<proto::HistoryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Store> MemoryService for MemoryApi<S> {
    async fn set(
        &self,
        request: Request<proto::SetRequest>,
    ) -> Result<Response<proto::SetResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let value = req.value.ok_or_else(|| {
                Error::invalid(
                    Reason::InvalidValue,
                    "value",
                    "is required (store a JSON null explicitly if that is what you mean)",
                )
            })?;
            let write = write_request(
                req.scope_type,
                req.scope,
                req.key,
                req.expected_version,
                req.request_id,
            )?;
            Ok::<_, Error>((write, json_from_proto(value)?))
        })();
        let (write, value) = parsed.map_err(to_status)?;
        let entry = self
            .memory
            .set(&ctx, write, value)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::SetResponse {
            entry: Some(entry_to_proto(entry)),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetRequest>,
    ) -> Result<Response<proto::GetResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let parsed = (
                selector(req.scope_type, req.scope)?,
                Key::parse("key", req.key)?,
                version("version", req.version)?,
                as_of(req.as_of)?,
            );
            if parsed.2.is_some() && parsed.3.is_some() {
                return Err(Error::invalid(
                    Reason::InvalidArgument,
                    "as_of",
                    "cannot be combined with version",
                ));
            }
            Ok::<_, Error>(parsed)
        })();
        let (selector, key, version, as_of) = parsed.map_err(to_status)?;
        let entry = match as_of {
            Some(as_of) => self.memory.get_as_of(&ctx, selector, &key, as_of).await,
            None => self.memory.get(&ctx, selector, &key, version).await,
        }
        .map_err(to_status)?;
        Ok(Response::new(proto::GetResponse {
            entry: Some(entry_to_proto(entry)),
        }))
    }

    async fn rollback(
        &self,
        request: Request<proto::RollbackRequest>,
    ) -> Result<Response<proto::RollbackResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                selector(req.scope_type, req.scope)?,
                Key::parse("key", req.key)?,
            ))
        })();
        let (selector, key) = parsed.map_err(to_status)?;
        let (entry, record) = self
            .memory
            .rollback(&ctx, selector, &key, req.to_version)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::RollbackResponse {
            entry: Some(entry_to_proto(entry)),
            audit_key: record.audit_key,
        }))
    }

    async fn fork_scope(
        &self,
        request: Request<proto::ForkScopeRequest>,
    ) -> Result<Response<proto::ForkScopeResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let target_type = scope_type_from_proto("target_scope_type", req.target_scope_type)?
                .ok_or_else(|| {
                    Error::invalid(Reason::InvalidArgument, "target_scope_type", "is required")
                })?;
            let target = Scope {
                scope_type: target_type,
                name: ScopeName::parse("target_scope", req.target_scope)?,
            };
            let source = selector_named(
                ("source_scope_type", req.source_scope_type),
                ("source_scope", req.source_scope),
            )?;
            Ok::<_, Error>((source, target, as_of(req.as_of)?))
        })();
        let (source, target, as_of) = parsed.map_err(to_status)?;
        let outcome = self
            .memory
            .fork_scope(&ctx, source, target, as_of)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ForkScopeResponse {
            keys_copied: outcome.keys,
            revision: outcome.revision,
            audit_key: outcome.record.audit_key,
        }))
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                selector(req.scope_type, req.scope)?,
                KeyPrefix::parse("key_prefix", req.key_prefix)?,
                as_of(req.as_of)?,
            ))
        })();
        let (selector, prefix, as_of) = parsed.map_err(to_status)?;
        let Some(as_of) = as_of else {
            let page = self
                .memory
                .list(
                    &ctx,
                    selector,
                    &prefix,
                    req.include_reserved,
                    req.page_size,
                    &req.page_token,
                )
                .await
                .map_err(to_status)?;
            return Ok(Response::new(proto::ListResponse {
                entries: page.items.into_iter().map(entry_to_proto).collect(),
                next_page_token: page.next_page_token,
                purged_keys: Vec::new(),
            }));
        };
        let page = self
            .memory
            .list_as_of(
                &ctx,
                selector,
                &prefix,
                req.include_reserved,
                as_of,
                req.page_size,
                &req.page_token,
            )
            .await
            .map_err(to_status)?;
        let mut response = proto::ListResponse {
            next_page_token: page.next_page_token,
            ..Default::default()
        };
        for item in page.items {
            match item {
                Past::Entry(entry) => response.entries.push(entry_to_proto(entry)),
                Past::Purged(key) => response.purged_keys.push(key.as_str().to_owned()),
            }
        }
        Ok(Response::new(response))
    }

    type HistoryStream = HistoryStream;

    async fn history(
        &self,
        request: Request<proto::HistoryRequest>,
    ) -> Result<Response<Self::HistoryStream>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            Ok::<_, Error>((
                selector(req.scope_type, req.scope)?,
                Key::parse("key", req.key)?,
                version("from_version", req.from_version)?.unwrap_or(1),
            ))
        })();
        let (selector, key, from_version) = parsed.map_err(to_status)?;
        let cursor = self
            .memory
            .history(&ctx, selector, key, from_version)
            .await
            .map_err(to_status)?;
        let stream = self.memory.history_stream(&ctx, cursor).map(|item| {
            item.map(|entry| proto::HistoryResponse {
                entry: Some(entry_to_proto(entry)),
            })
            .map_err(to_status)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn delete(
        &self,
        request: Request<proto::DeleteRequest>,
    ) -> Result<Response<proto::DeleteResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let write = write_request(
            req.scope_type,
            req.scope,
            req.key,
            req.expected_version,
            req.request_id,
        )
        .map_err(to_status)?;
        let entry = self.memory.delete(&ctx, write).await.map_err(to_status)?;
        Ok(Response::new(proto::DeleteResponse {
            entry: Some(entry_to_proto(entry)),
        }))
    }

    type WatchStream = FeedStream<Changes<S>>;

    async fn watch(
        &self,
        request: Request<proto::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let parsed = (|| {
            let from_revision = match req.from_revision {
                Some(n) if n < 0 => {
                    return Err(Error::invalid(
                        Reason::InvalidArgument,
                        "from_revision",
                        format!("must not be negative, got {n}"),
                    ));
                }
                other => other,
            };
            Ok::<_, Error>((
                selector(req.scope_type, req.scope)?,
                KeyPrefix::parse("key_prefix", req.key_prefix)?,
                from_revision,
            ))
        })();
        let (selector, prefix, from_revision) = parsed.map_err(to_status)?;
        let start = self
            .memory
            .watch(&ctx, selector, prefix, from_revision)
            .await
            .map_err(to_status)?;
        let after = start.after;
        let horizon = start.horizon.clone();
        let changes = Changes {
            memory: self.memory.clone(),
            ctx,
            start,
        };
        Ok(Response::new(feed::spawn(
            changes,
            after,
            horizon,
            self.feed.clone(),
        )))
    }

    async fn list_scopes(
        &self,
        request: Request<proto::ListScopesRequest>,
    ) -> Result<Response<proto::ListScopesResponse>, Status> {
        let ctx = caller_context(&request).map_err(to_status)?;
        let req = request.into_inner();
        let scope_type = scope_type_from_proto("scope_type", req.scope_type).map_err(to_status)?;
        let flow = |field: &str, value: &str| -> Result<Option<()>> {
            if value.is_empty() {
                return Ok(None);
            }
            ScopeName::parse(field, value)?;
            Ok(Some(()))
        };
        let flow_id = flow("flow_id", &req.flow_id)
            .map_err(to_status)?
            .map(|()| req.flow_id.as_str());
        let flow_name = flow("flow_name", &req.flow_name)
            .map_err(to_status)?
            .map(|()| req.flow_name.as_str());
        let filter = ScopeFilter {
            scope_type,
            flow_id,
            flow_name,
            at: None,
        };
        let as_of = as_of(req.as_of).map_err(to_status)?;
        let page = self
            .memory
            .list_scopes(&ctx, filter, as_of, req.page_size, &req.page_token)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::ListScopesResponse {
            scopes: page
                .items
                .into_iter()
                .map(|summary| proto::ScopeSummary {
                    scope_type: scope_type_to_proto(summary.scope.scope_type) as i32,
                    scope: summary.scope.name.as_str().to_owned(),
                    entry_count: summary.entry_count,
                    purged_count: summary.purged_count,
                })
                .collect(),
            next_page_token: page.next_page_token,
        }))
    }
}
