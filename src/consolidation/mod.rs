//! Consolidation: rules that promote episodes into facts, exactly once.
//! `filter` is the rule filter language, `cron` the schedules, `classify`
//! the delta table, `run` the run and apply algorithms over the store's
//! transaction primitives (`ports`), `service` the rules between requests
//! and the store, and `scheduler` the background runner.

mod classify;
pub mod cron;
pub mod filter;
pub mod ports;
mod run;
pub mod scheduler;
mod service;
mod types;

pub use classify::{FactKey, classify, fact_key};
pub use ports::FactFilter;
pub use service::{
    Consolidation, DEFAULT_RUN_EPISODES, MAX_RUN_EPISODES, NewRule, validate_rule,
    validate_stored_rule,
};
pub use types::*;
