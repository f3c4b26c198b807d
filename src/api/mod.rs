//! The network edge: one thin gRPC adapter per service, the JSON endpoints
//! of the HTTP port, and the conversions and error mapping they share. No SQL and no business rules here.

pub mod consolidation;
pub mod context;
pub mod convert;
pub mod data;
pub mod edge;
pub mod episodes;
pub mod error;
pub mod feed;
pub mod http;
pub mod memory;
pub mod memory_admin;
pub mod search;
pub mod sessions;
pub mod watch;
pub mod working;

pub use consolidation::ConsolidationApi;
pub use data::DataApi;
pub use episodes::EpisodeApi;
pub use memory::MemoryApi;
pub use memory_admin::MemoryAdminApi;
pub use search::SearchApi;
pub use sessions::SessionApi;
pub use working::WorkingMemoryApi;
