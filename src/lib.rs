//! Engram: durable memory for AI agents, served over gRPC.
//!
//! `api` is the gRPC edge, `memory` the domain, `store` the Postgres and
//! SQLite backends behind one interface, `server` start-up and shutdown.

/// `println!` for what the CLI prints: a reader that stopped reading
/// (`engram memory list | head`) ends the command quietly
/// ([`cli::stdout_line`]) where `println!` panicked with a backtrace.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::stdout_line(format_args!($($arg)*))
    };
}

pub mod api;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod config;
pub mod console;
pub mod consolidation;
pub mod context;
pub mod data;
pub mod error;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod openai;
pub mod paging;
pub mod ports;
pub mod redact;
pub mod reload;
pub mod search;
pub mod server;
pub mod sessions;
pub mod store;
pub mod summarizer;
pub mod telemetry;
pub mod ticks;
pub mod tls;
pub mod working;

/// Code generated from `proto/engram/v1`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("engram.v1");

    /// The encoded descriptor set of every Engram proto, for reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/engram_descriptor.bin"));
}
