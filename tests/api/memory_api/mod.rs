//! `MemoryService` through a real server and the generated client, on both
//! stores: what a user would check (values, versions, ordering, error codes
//! and reasons).
//!
//! Here: the request builders the cases share; a file per concern below.

mod listing;
mod provenance;
mod values;
mod versions;

use engram::api::convert::json_to_proto;
use engram::proto::{
    DeleteRequest, GetRequest, HistoryRequest, ListRequest, MemoryEntry, RollbackRequest,
    ScopeType, SetRequest,
};

const NS: i32 = ScopeType::Namespace as i32;

fn set(scope: &str, key: &str, value: serde_json::Value) -> SetRequest {
    SetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        value: Some(json_to_proto(&value)),
        ..SetRequest::default()
    }
}

fn get(scope: &str, key: &str, version: i64) -> GetRequest {
    GetRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        version,
        as_of: None,
    }
}

fn delete(scope: &str, key: &str) -> DeleteRequest {
    DeleteRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        ..DeleteRequest::default()
    }
}

fn history(scope: &str, key: &str, from_version: i64) -> HistoryRequest {
    HistoryRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key: key.to_owned(),
        from_version,
    }
}

fn list(scope: &str, prefix: &str, page_size: i32, page_token: &str) -> ListRequest {
    ListRequest {
        scope_type: NS,
        scope: scope.to_owned(),
        key_prefix: prefix.to_owned(),
        page_size,
        page_token: page_token.to_owned(),
        include_reserved: false,
        as_of: None,
    }
}

fn json_of(entry: &MemoryEntry) -> serde_json::Value {
    let value = entry.value.clone().expect("entry has a value");
    engram::api::convert::json_from_proto(value).expect("valid json")
}

pub(crate) fn rollback_to(scope: &str, key: &str, to_version: i64) -> RollbackRequest {
    RollbackRequest {
        scope_type: NS,
        scope: scope.into(),
        key: key.into(),
        to_version,
    }
}
