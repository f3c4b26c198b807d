//! Who may call: bearer tokens, each mapped to a tenant and roles.
//!
//! Tokens are configured by their SHA-256 (so the configuration at rest
//! holds no usable secret), one per line:
//!
//! ```text
//! # sha256(token) in hex            tenant  roles (comma-separated, optional)
//! 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 acme admin
//! ```
//!
//! A presented token is hashed and compared with every configured hash in
//! constant time, so neither the comparison nor the lookup says how close a
//! guess came. The tenant always comes from the token, never from a request
//! field.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};

use crate::context::Tenant;

/// The request header (gRPC metadata key) carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// What a caller may do beyond reading and writing its tenant's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `MemoryAdminService` and deleting whole sessions.
    Admin,
}

impl Role {
    fn parse(text: &str) -> Option<Role> {
        match text {
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: Tenant,
    pub admin: bool,
}

impl Principal {
    /// The caller when authentication is off: the default tenant, with
    /// every role.
    pub fn anonymous() -> Self {
        Principal {
            tenant: Tenant::default(),
            admin: true,
        }
    }

    pub fn has(&self, role: Role) -> bool {
        match role {
            Role::Admin => self.admin,
        }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization: Bearer …` header.
    Missing,
    /// A header that is not a bearer token, or a token nobody configured.
    Invalid,
    /// A valid token without the role the call needs.
    Forbidden(Role),
}

impl Refusal {
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Missing => "TOKEN_MISSING",
            Refusal::Invalid => "TOKEN_INVALID",
            Refusal::Forbidden(Role::Admin) => "ADMIN_REQUIRED",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "this call needs an `authorization: Bearer <token>` header",
            Refusal::Invalid => "the bearer token is not valid",
            Refusal::Forbidden(Role::Admin) => "this call needs a token with the admin role",
        }
    }
}

/// A malformed tokens configuration; `line` counts from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ConfigError {}

struct Entry {
    hash: [u8; 32],
    principal: Principal,
}

/// The configured tokens, or none at all when authentication is off.
/// Clones share the tokens, so a [`replace`](Self::replace) (a reloaded
/// tokens file) reaches every clone at once.
#[derive(Clone)]
pub struct Authenticator {
    entries: Option<Arc<RwLock<Arc<[Entry]>>>>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entries {
            None => f.write_str("Authenticator(off)"),
            Some(_) => write!(f, "Authenticator({} tokens)", self.len()),
        }
    }
}

/// Where the tokens come from: a file (which may change while the server
/// runs) and lines given inline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSources {
    pub file: Option<PathBuf>,
    pub inline: Option<String>,
}

impl TokenSources {
    /// The file's text, if there is a file.
    pub fn read_file(&self) -> Result<Option<String>, String> {
        self.file
            .as_deref()
            .map(|path| {
                std::fs::read_to_string(path)
                    .map_err(|err| format!("cannot read tokens file {}: {err}", path.display()))
            })
            .transpose()
    }

    /// Parses the file's text (as read) and the inline lines, each with
    /// its own line numbers in errors.
    pub fn parse(&self, file_text: Option<&str>) -> Result<Authenticator, String> {
        let mut text = String::new();
        if let Some(file_text) = file_text {
            let path = self.file.as_deref().unwrap_or(Path::new("tokens file"));
            Authenticator::parse(file_text)
                .map_err(|err| format!("invalid tokens file {}: {err}", path.display()))?;
            text.push_str(file_text);
        }
        if let Some(inline) = &self.inline {
            Authenticator::parse(inline).map_err(|err| format!("invalid ENGRAM_TOKENS: {err}"))?;
            text.push('\n');
            text.push_str(inline);
        }
        Authenticator::parse(&text).map_err(|err| format!("invalid tokens: {err}"))
    }
}

impl Authenticator {
    /// Every caller is [`Principal::anonymous`].
    pub fn off() -> Self {
        Authenticator { entries: None }
    }

    /// Parses the token lines (`#` starts a comment; `;` also separates
    /// entries, for an environment variable on one line).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line_number = index + 1;
            let error = |message: String| ConfigError {
                line: line_number,
                message,
            };
            let content = line.split('#').next().unwrap_or_default();
            for entry in content.split(';') {
                let fields: Vec<&str> = entry.split_whitespace().collect();
                let (hash, tenant, roles) = match fields.as_slice() {
                    [] => continue,
                    [hash, tenant] => (*hash, *tenant, ""),
                    [hash, tenant, roles] => (*hash, *tenant, *roles),
                    _ => {
                        return Err(error("expected `<sha256 hex> <tenant> [roles]`".to_owned()));
                    }
                };
                let hash = parse_hash(hash).ok_or_else(|| {
                    error("the first field must be a SHA-256 in hex (64 digits)".to_owned())
                })?;
                if !Tenant::is_valid_name(tenant) {
                    return Err(error(format!(
                        "tenant {tenant:?} must be {}",
                        Tenant::NAME_RULE
                    )));
                }
                let mut admin = false;
                for role in roles.split(',').filter(|r| !r.is_empty()) {
                    match Role::parse(role) {
                        Some(Role::Admin) => admin = true,
                        None => return Err(error(format!("unknown role {role:?} (known: admin)"))),
                    }
                }
                if entries.iter().any(|e| e.hash == hash) {
                    return Err(error("the same token is configured twice".to_owned()));
                }
                entries.push(Entry {
                    hash,
                    principal: Principal {
                        tenant: Tenant::new(tenant),
                        admin,
                    },
                });
            }
        }
        Ok(Authenticator {
            entries: Some(Arc::new(RwLock::new(entries.into()))),
        })
    }

    pub fn is_on(&self) -> bool {
        self.entries.is_some()
    }

    /// The tokens now (empty when off).
    fn current(&self) -> Arc<[Entry]> {
        match &self.entries {
            None => Arc::new([]),
            Some(shared) => shared
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }

    /// Swaps in the tokens of `fresh` for this authenticator and all its
    /// clones. Nothing changes when either is off.
    pub fn replace(&self, fresh: &Authenticator) {
        if let (Some(shared), Some(_)) = (&self.entries, &fresh.entries) {
            *shared
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh.current();
        }
    }

    /// How many tokens are configured (0 when off).
    pub fn len(&self) -> usize {
        self.current().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The caller behind an `authorization` header value.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Principal, Refusal> {
        if self.entries.is_none() {
            return Ok(Principal::anonymous());
        }
        let entries = self.current();
        let header = header.ok_or(Refusal::Missing)?;
        let token = bearer(header).ok_or(Refusal::Invalid)?;
        let presented: [u8; 32] = Sha256::digest(token).into();
        // Look at every entry whatever matches, so timing says nothing.
        let mut found: Option<&Principal> = None;
        for entry in entries.iter() {
            if constant_time_eq(&entry.hash, &presented) {
                found = Some(&entry.principal);
            }
        }
        found.cloned().ok_or(Refusal::Invalid)
    }

    /// [`authenticate`](Self::authenticate), then the role a call needs.
    pub fn authorize(
        &self,
        header: Option<&[u8]>,
        needs: Option<Role>,
    ) -> Result<Principal, Refusal> {
        let principal = self.authenticate(header)?;
        match needs {
            Some(role) if !principal.has(role) => Err(Refusal::Forbidden(role)),
            _ => Ok(principal),
        }
    }
}

/// The role a gRPC method needs beyond a valid token, by its path.
pub fn role_for(path: &str) -> Option<Role> {
    const ADMIN: [&str; 5] = [
        "/engram.v1.MemoryAdminService/",
        "/engram.v1.DataService/ForgetUser",
        "/engram.v1.DataService/Import",
        "/engram.v1.SessionService/DeleteSession",
        "/engram.v1.SessionService/CleanupSessions",
    ];
    ADMIN
        .iter()
        .any(|p| path.starts_with(p))
        .then_some(Role::Admin)
}

/// Paths served without a token: health checks (for probes) and reflection
/// (for grpcurl discovery; it can be turned off instead).
pub fn is_public(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path.starts_with("/grpc.reflection.v1.ServerReflection/")
        || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/")
}

/// A fresh random token (256 bits, URL-safe base64) for `engram token new`.
pub fn new_token() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    format!(
        "eg_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The SHA-256 of a token in hex, as the tokens configuration holds it.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn bearer(header: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = header.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let text = text.strip_prefix("sha256:").unwrap_or(text);
    if text.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// Equal or not, in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Authenticator {
        let text = format!(
            "# comment\n{} acme admin\n\n{} globex ; {} initech\n",
            hash_token("alpha"),
            hash_token("beta"),
            hash_token("gamma"),
        );
        Authenticator::parse(&text).expect("parses")
    }

    #[test]
    fn tokens_map_to_tenants_and_roles() {
        let auth = config();
        assert_eq!(auth.len(), 3);
        let acme = auth.authenticate(Some(b"Bearer alpha")).expect("alpha");
        assert_eq!((acme.tenant.as_str(), acme.admin), ("acme", true));
        let globex = auth.authenticate(Some(b"bearer beta")).expect("beta");
        assert_eq!((globex.tenant.as_str(), globex.admin), ("globex", false));
        assert_eq!(
            auth.authenticate(Some(b"Bearer gamma"))
                .expect("gamma")
                .tenant,
            Tenant::new("initech")
        );
    }

    #[test]
    fn refusals_say_why() {
        let auth = config();
        assert_eq!(auth.authenticate(None), Err(Refusal::Missing));
        assert_eq!(
            auth.authenticate(Some(b"Bearer nope")),
            Err(Refusal::Invalid)
        );
        assert_eq!(
            auth.authenticate(Some(b"Basic alpha")),
            Err(Refusal::Invalid)
        );
        assert_eq!(auth.authenticate(Some(b"Bearer ")), Err(Refusal::Invalid));
        assert_eq!(
            auth.authorize(Some(b"Bearer beta"), Some(Role::Admin)),
            Err(Refusal::Forbidden(Role::Admin))
        );
        assert!(
            auth.authorize(Some(b"Bearer alpha"), Some(Role::Admin))
                .is_ok()
        );
        assert_eq!(
            Authenticator::off().authenticate(None),
            Ok(Principal::anonymous())
        );
    }

    #[test]
    fn bad_configuration_names_the_line() {
        let cases = [
            ("abc acme", 1, "SHA-256"),
            (&format!("\n{} bad/tenant", hash_token("x")), 2, "tenant"),
            (&format!("{} acme root", hash_token("x")), 1, "unknown role"),
            (&format!("{} a b c", hash_token("x")), 1, "expected"),
            (&format!("{h} a\n{h} b", h = hash_token("x")), 2, "twice"),
        ];
        for (text, line, needle) in cases {
            let err = Authenticator::parse(text)
                .err()
                .unwrap_or_else(|| panic!("{text:?} parsed"));
            assert_eq!(err.line, line, "{text:?}");
            assert!(err.message.contains(needle), "{text:?}: {err}");
        }
    }

    #[test]
    fn new_tokens_are_distinct_and_hash_to_hex() {
        let (a, b) = (new_token(), new_token());
        assert_ne!(a, b);
        assert!(a.len() > 40);
        assert_eq!(hash_token(&a).len(), 64);
        assert_eq!(
            hash_token("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn admin_paths() {
        assert_eq!(
            role_for("/engram.v1.MemoryAdminService/Purge"),
            Some(Role::Admin)
        );
        assert_eq!(
            role_for("/engram.v1.SessionService/DeleteSession"),
            Some(Role::Admin)
        );
        assert_eq!(role_for("/engram.v1.SessionService/GetSession"), None);
        assert!(is_public("/grpc.health.v1.Health/Check"));
        assert!(!is_public("/engram.v1.MemoryService/Get"));
    }
}
