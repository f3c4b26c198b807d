//! Sessions and their event logs (episodes): the types, and the rules that
//! sit between a request and the store (ownership, defaults, limits,
//! idempotency fingerprints, the conversation text).

mod conversation;
pub mod ports;
mod service;
mod types;

pub use conversation::render_conversation;
pub use service::{CreateMode, CreateRequest, Sessions, TAIL_BATCH, TailStart};
pub use types::*;
