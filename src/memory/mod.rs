//! Scoped, versioned key-value memory: the types, and the rules that sit
//! between a request and the store (caller context, default scope, limits,
//! idempotency fingerprints).

pub mod admin;
pub mod audit;
mod service;
mod types;

pub(crate) use service::key_not_found_error;
pub use service::{
    HistoryCursor, ListPage, Memory, MemoryLimits, ScopeSelector, WATCH_BATCH, WatchStart,
    WriteRequest,
};
pub use types::*;
