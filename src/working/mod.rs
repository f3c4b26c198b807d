//! Working memory (SPEC 1.4): a session's goal, tasks and content cache, the
//! facts of its user and the procedures of its app, rendered into the
//! MEMORY block, and the four LLM-callable actions.

pub mod ports;
pub mod render;
mod service;
pub mod tools;
mod types;

pub use service::{REMEMBER, Snapshot, WorkingMemory};
pub use types::*;
