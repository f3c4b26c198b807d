//! Who is calling and from where: the tenant (from authentication, `default`
//! until auth exists) and the caller context a client sets once per channel
//! (execution, flow, checkpoint).

use crate::memory::ScopeName;

/// The tenant every row belongs to. No read ever crosses tenants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

impl Tenant {
    pub const DEFAULT: &'static str = "default";

    pub fn new(name: impl Into<String>) -> Self {
        Tenant(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What [`Tenant::is_valid_name`] allows, in words for refusals.
    pub const NAME_RULE: &str = "1 to 63 ASCII letters, digits, '-', '_' or '.'";

    /// Whether `name` can name a tenant: 1 to 63 of `[A-Za-z0-9._-]`
    /// (which also makes it safe inside a quoted SQL literal).
    pub fn is_valid_name(name: &str) -> bool {
        (1..=63).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }
}

impl Default for Tenant {
    fn default() -> Self {
        Tenant(Self::DEFAULT.to_owned())
    }
}

/// The caller context of one call, parsed from request metadata at the edge.
#[derive(Debug, Clone, Default)]
pub struct CallerContext {
    pub tenant: Tenant,
    /// The run making the call; empty outside a run.
    pub execution_id: Option<ScopeName>,
    pub flow_id: Option<ScopeName>,
    /// The flow making the call; it names the default `FLOW` scope.
    pub flow_name: Option<ScopeName>,
    /// Set when the call comes from inside a checkpoint, where memory is refused.
    pub checkpoint_id: Option<String>,
}
