//! Scoped, versioned key-value memory: the types, and the rules that sit
//! between a request and the store (caller context, default scope, limits,
//! idempotency fingerprints).

pub mod admin;
pub mod audit;
mod past;
pub mod ports;
pub mod retention;
mod service;
mod types;

pub use crate::paging::ListPage;
pub use past::ForkOutcome;
pub use service::{
    HistoryCursor, Memory, MemoryLimits, ScopeSelector, WATCH_BATCH, WatchStart, WriteRequest,
};
pub(crate) use service::{key_not_found_error, now_micros};
pub use types::*;
