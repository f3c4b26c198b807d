//! The gRPC layer: one thin adapter per service, plus the conversions and
//! the error mapping they share. No SQL and no business rules here.

pub mod context;
pub mod convert;
pub mod error;
pub mod memory;
pub mod memory_admin;
pub mod watch;

pub use memory::MemoryApi;
pub use memory_admin::MemoryAdminApi;
