//! Caller context of a request: the tenant of its token (put there by the
//! [edge](super::edge)), and the execution, flow and checkpoint a client
//! sets once per channel as metadata.

use crate::auth::Principal;
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::memory::ScopeName;

pub const EXECUTION_ID: &str = "engram-execution-id";
pub const FLOW_ID: &str = "engram-flow-id";
pub const FLOW_NAME: &str = "engram-flow-name";
pub const CHECKPOINT_ID: &str = "engram-checkpoint-id";

/// Parses the caller context; a malformed value is `INVALID_ARGUMENT` naming
/// the metadata key.
pub fn caller_context<T>(request: &tonic::Request<T>) -> Result<CallerContext> {
    let principal = request
        .extensions()
        .get::<Principal>()
        .ok_or_else(|| Error::internal("no principal on the request: the edge layer is missing"))?;
    let metadata = request.metadata();
    let text = |key: &'static str| -> Result<Option<String>> {
        match metadata.get(key) {
            None => Ok(None),
            Some(value) => {
                let value = value.to_str().map_err(|_| {
                    Error::invalid(Reason::InvalidArgument, key, "must be printable ASCII")
                })?;
                Ok((!value.is_empty()).then(|| value.to_owned()))
            }
        }
    };
    let identifier = |key: &'static str| -> Result<Option<ScopeName>> {
        text(key)?
            .map(|value| ScopeName::parse(key, value))
            .transpose()
    };
    Ok(CallerContext {
        tenant: principal.tenant.clone(),
        execution_id: identifier(EXECUTION_ID)?,
        flow_id: identifier(FLOW_ID)?,
        flow_name: identifier(FLOW_NAME)?,
        checkpoint_id: text(CHECKPOINT_ID)?,
    })
}
