//! Engram's integration tests, one binary so they link once. Each test gets
//! a fresh database (a temp SQLite file, or a new Postgres database when
//! ENGRAM_TEST_DATABASE_URL points at a server) and a real server on port 0.

mod auth;
mod backup;
mod bench;
mod binary;
mod cli;
mod compaction_races;
mod connection_age;
mod console;
mod consolidation;
mod consolidation_races;
mod database_full;
mod embedding_races;
mod forget;
mod helpers;
mod history_memory;
mod hostile_input;
mod large_answers;
mod limits;
mod maintenance_races;
mod memory_admin;
mod memory_api;
mod metrics;
mod operator_timeouts;
mod outage;
mod pool;
mod postgres_tls;
mod properties;
mod purge_races;
mod races;
mod retention;
mod rls;
mod robustness;
mod search;
mod search_properties;
mod search_reading;
mod search_vectors;
mod semantic;
mod sessions_api;
mod sqlite_wal;

mod store_conformance;
mod summarizer_http;
mod tail;
mod telemetry;
mod time_travel;
mod tls;
mod transfer;
mod transfer_races;
mod upgrade;
mod watch;
mod working_memory;
