//! Configuration: one typed struct, filled from flags, then `ENGRAM_*`
//! environment variables, then an optional TOML file, then defaults (first
//! one wins). The same `Settings` struct is the clap arguments and the file
//! format, so a setting cannot exist in one and not the other.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::auth::{Authenticator, TokenSources};
use crate::memory::MemoryLimits;
use crate::redact::Redactor;
use crate::sessions::SessionLimits;
use crate::tls::TlsFiles;
use crate::working::WorkingLimits;

/// A limit where 0 means unlimited, as the stores take it.
fn count(name: &str, value: Option<u64>) -> anyhow::Result<i64> {
    i64::try_from(value.unwrap_or(0)).with_context(|| format!("{name} is too large"))
}
use crate::store::{SqliteSynchronous, StoreOptions};
use crate::summarizer::OpenAiConfig;

pub const DEFAULT_DATABASE_URL: &str = "sqlite://engram.db";
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:50051";
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:9090";

/// Whether `engram serve` applies pending migrations at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MigrateMode {
    /// Apply pending migrations, then serve.
    #[default]
    Auto,
    /// Refuse to start while migrations are pending (run `engram migrate`).
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every call but health and reflection needs a configured bearer token.
    Tokens,
    /// No authentication: every caller is the `default` tenant, with every
    /// role. Only for a server nobody else can reach.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors in containers.
    Json,
}

/// Every setting, each optional so that sources can be layered.
#[derive(Debug, Clone, Default, Deserialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Database URL: sqlite://PATH (created on first start) or
    /// postgres://USER:PASSWORD@HOST/DB [default: sqlite://engram.db]
    #[arg(long, env = "ENGRAM_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Address of the gRPC server; port 0 picks a free port
    /// [default: 127.0.0.1:50051]
    #[arg(long, env = "ENGRAM_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,

    /// Address of the HTTP server (/healthz, /readyz); port 0 picks a free port
    /// [default: 127.0.0.1:9090]
    #[arg(long, env = "ENGRAM_HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,

    /// Apply pending migrations at start (auto) or refuse to start while any
    /// are pending (off) [default: auto]
    #[arg(long, env = "ENGRAM_MIGRATE", value_enum)]
    pub migrate: Option<MigrateMode>,

    /// Largest memory value accepted, in bytes of JSON [default: 1048576]
    #[arg(long, env = "ENGRAM_MAX_VALUE_BYTES")]
    pub max_value_bytes: Option<usize>,

    /// Most sessions per tenant; creating one more evicts the oldest 10%
    /// (0: unlimited) [default: 0]
    #[arg(long, env = "ENGRAM_MAX_SESSIONS")]
    pub max_sessions: Option<u64>,

    /// Most episodes kept per session; appending past it evicts the oldest
    /// (0: unlimited) [default: 0]
    #[arg(long, env = "ENGRAM_MAX_EVENTS_PER_SESSION")]
    pub max_events_per_session: Option<u64>,

    /// Most tasks a session's todo list may hold [default: 100]
    #[arg(long, env = "ENGRAM_MAX_TASKS_PER_SESSION")]
    pub max_tasks_per_session: Option<u64>,

    /// Most live facts (remembered or procedures) per user and app
    /// [default: 1000]
    #[arg(long, env = "ENGRAM_MAX_FACTS_PER_USER")]
    pub max_facts_per_user: Option<u64>,

    /// Most files in a session's content cache; the least recently cached
    /// go first [default: 32]
    #[arg(long, env = "ENGRAM_MAX_CACHED_FILES")]
    pub max_cached_files: Option<u64>,

    /// Most bytes in a session's content cache [default: 1048576]
    #[arg(long, env = "ENGRAM_MAX_CACHE_BYTES")]
    pub max_cache_bytes: Option<u64>,

    /// Replace secrets with [REDACTED] in working memory and remembered
    /// facts before they are stored [default: true]
    #[arg(long, env = "ENGRAM_REDACT_SECRETS")]
    pub redact_secrets: Option<bool>,

    /// Extra words that make a key sensitive, comma-separated (e.g.
    /// api_key,slack_webhook); the defaults always apply
    #[arg(long, env = "ENGRAM_SENSITIVE_PATTERNS")]
    pub sensitive_patterns: Option<String>,

    /// Also redact episode content and metadata on append [default: false]
    #[arg(long, env = "ENGRAM_REDACT_EPISODES")]
    pub redact_episodes: Option<bool>,

    /// Most database connections the server opens for calls (Postgres
    /// also opens one LISTEN connection per feed a Watch or tail follows)
    /// [default: 16]
    #[arg(long, env = "ENGRAM_DB_MAX_CONNECTIONS")]
    pub db_max_connections: Option<u32>,

    /// How long a call waits for a database connection before it fails
    /// with UNAVAILABLE, in milliseconds [default: 5000]
    #[arg(long, env = "ENGRAM_DB_ACQUIRE_TIMEOUT_MS")]
    pub db_acquire_timeout_ms: Option<u64>,

    /// SQLite durability: full syncs every commit to disk, normal may lose
    /// the last commits on power loss [default: full]
    #[arg(long, env = "ENGRAM_SQLITE_SYNCHRONOUS", value_enum)]
    pub sqlite_synchronous: Option<SqliteSynchronous>,

    /// How often the database is checked for the health service, in
    /// milliseconds [default: 1000]
    #[arg(long, env = "ENGRAM_HEALTH_CHECK_INTERVAL_MS")]
    pub health_check_interval_ms: Option<u64>,

    /// How long a request_id is remembered for idempotent retries, in
    /// seconds [default: 86400]
    #[arg(long, env = "ENGRAM_REQUEST_ID_TTL_SECS")]
    pub request_id_ttl_secs: Option<u64>,

    /// How long a shutdown waits for in-flight calls and open streams before
    /// closing them, in seconds [default: 10]
    #[arg(long, env = "ENGRAM_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,

    /// Base URL of an OpenAI-compatible API used by Compact, e.g.
    /// https://api.openai.com/v1; unset uses the built-in extractive summarizer
    #[arg(long, env = "ENGRAM_SUMMARIZER_URL")]
    pub summarizer_url: Option<String>,

    /// The model Compact asks when a request names none (required with
    /// --summarizer-url)
    #[arg(long, env = "ENGRAM_SUMMARIZER_MODEL")]
    pub summarizer_model: Option<String>,

    /// API key sent as a bearer token to the summarizer
    #[arg(long, env = "ENGRAM_SUMMARIZER_API_KEY", hide_env_values = true)]
    pub summarizer_api_key: Option<String>,

    /// Timeout of one summarizer call, in milliseconds [default: 60000]
    #[arg(long, env = "ENGRAM_SUMMARIZER_TIMEOUT_MS")]
    pub summarizer_timeout_ms: Option<u64>,

    /// Retries of a summarizer call on 429, 5xx and connection errors
    /// [default: 3]
    #[arg(long, env = "ENGRAM_SUMMARIZER_RETRIES")]
    pub summarizer_retries: Option<u32>,

    /// How long a Watch or TailEpisodes stream waits for a client that does
    /// not read before it ends the stream with CONSUMER_TOO_SLOW, in
    /// milliseconds [default: 30000]
    #[arg(long, env = "ENGRAM_WATCH_STALL_TIMEOUT_MS")]
    pub watch_stall_timeout_ms: Option<u64>,

    /// Items buffered per Watch or TailEpisodes stream before the stall
    /// timeout starts [default: 256]
    #[arg(long, env = "ENGRAM_WATCH_BUFFER")]
    pub watch_buffer: Option<usize>,

    /// How long the change feed behind Watch is kept, in seconds
    /// [default: 604800, a week]
    #[arg(long, env = "ENGRAM_CHANGE_RETENTION_SECS")]
    pub change_retention_secs: Option<u64>,

    /// How often the consolidation scheduler looks for due rules, in
    /// milliseconds; 0 turns the scheduler off on this replica (RunRule
    /// still works) [default: 1000]
    #[arg(long, env = "ENGRAM_SCHEDULER_INTERVAL_MS")]
    pub scheduler_interval_ms: Option<u64>,

    /// Log format [default: text]
    #[arg(long, env = "ENGRAM_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,

    /// Authentication: `tokens` requires a bearer token on every call but
    /// health and reflection; `none` turns it off. Unset: `tokens` when any
    /// are configured; otherwise off on loopback addresses, and a refusal
    /// to start on any other address
    #[arg(long, env = "ENGRAM_AUTH", value_enum)]
    pub auth: Option<AuthMode>,

    /// A file of tokens, one per line: `<sha256 of the token in hex>
    /// <tenant> [admin]` (`engram token new` prints one)
    #[arg(long, env = "ENGRAM_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,

    /// Tokens in the same format as the file, entries separated by `;` or
    /// newlines (added to the file's)
    #[arg(long, env = "ENGRAM_TOKENS", hide_env_values = true)]
    pub tokens: Option<String>,

    /// How often the tokens file is checked for changes (a changed file
    /// that parses replaces the tokens; one that does not is logged and
    /// ignored), in milliseconds [default: 10000]
    #[arg(long, env = "ENGRAM_TOKENS_RELOAD_INTERVAL_MS")]
    pub tokens_reload_interval_ms: Option<u64>,

    /// Serve gRPC reflection (for grpcurl discovery, without a token)
    /// [default: true]
    #[arg(long, env = "ENGRAM_REFLECTION")]
    pub reflection: Option<bool>,

    /// The longest a unary call may take before it fails with
    /// CANCELLED (a client deadline shorter than this wins), in
    /// milliseconds; 0: no limit
    /// [default: 300000, five minutes: summarizing compactions are slow]
    #[arg(long, env = "ENGRAM_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,

    /// Calls one connection may have in progress at once (HTTP/2 streams,
    /// live streams included) [default: 256]
    #[arg(long, env = "ENGRAM_MAX_STREAMS_PER_CONNECTION")]
    pub max_streams_per_connection: Option<u32>,

    /// Serve gRPC over TLS with this PEM certificate chain (with
    /// --tls-key-file); reloaded when the file changes
    #[arg(long, env = "ENGRAM_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file
    #[arg(long, env = "ENGRAM_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// Require client certificates signed by these PEM CA certificates
    /// (mTLS); needs --tls-cert-file
    #[arg(long, env = "ENGRAM_TLS_CLIENT_CA_FILE")]
    pub tls_client_ca_file: Option<PathBuf>,

    /// How often the TLS files are checked for changes, in milliseconds
    /// [default: 10000]
    #[arg(long, env = "ENGRAM_TLS_RELOAD_INTERVAL_MS")]
    pub tls_reload_interval_ms: Option<u64>,

    /// The largest gRPC message accepted, in bytes [default: twice
    /// max_value_bytes, at least 4 MiB]
    #[arg(long, env = "ENGRAM_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<usize>,
}

impl Settings {
    /// Fills every unset setting from `other`.
    fn or(self, other: Settings) -> Settings {
        Settings {
            database_url: self.database_url.or(other.database_url),
            grpc_addr: self.grpc_addr.or(other.grpc_addr),
            http_addr: self.http_addr.or(other.http_addr),
            migrate: self.migrate.or(other.migrate),
            max_value_bytes: self.max_value_bytes.or(other.max_value_bytes),
            max_sessions: self.max_sessions.or(other.max_sessions),
            max_events_per_session: self.max_events_per_session.or(other.max_events_per_session),
            max_tasks_per_session: self.max_tasks_per_session.or(other.max_tasks_per_session),
            max_facts_per_user: self.max_facts_per_user.or(other.max_facts_per_user),
            max_cached_files: self.max_cached_files.or(other.max_cached_files),
            max_cache_bytes: self.max_cache_bytes.or(other.max_cache_bytes),
            redact_secrets: self.redact_secrets.or(other.redact_secrets),
            sensitive_patterns: self.sensitive_patterns.or(other.sensitive_patterns),
            redact_episodes: self.redact_episodes.or(other.redact_episodes),
            db_max_connections: self.db_max_connections.or(other.db_max_connections),
            db_acquire_timeout_ms: self.db_acquire_timeout_ms.or(other.db_acquire_timeout_ms),
            sqlite_synchronous: self.sqlite_synchronous.or(other.sqlite_synchronous),
            health_check_interval_ms: self
                .health_check_interval_ms
                .or(other.health_check_interval_ms),
            request_id_ttl_secs: self.request_id_ttl_secs.or(other.request_id_ttl_secs),
            shutdown_grace_secs: self.shutdown_grace_secs.or(other.shutdown_grace_secs),
            watch_stall_timeout_ms: self.watch_stall_timeout_ms.or(other.watch_stall_timeout_ms),
            change_retention_secs: self.change_retention_secs.or(other.change_retention_secs),
            watch_buffer: self.watch_buffer.or(other.watch_buffer),
            summarizer_url: self.summarizer_url.or(other.summarizer_url),
            summarizer_model: self.summarizer_model.or(other.summarizer_model),
            summarizer_api_key: self.summarizer_api_key.or(other.summarizer_api_key),
            summarizer_timeout_ms: self.summarizer_timeout_ms.or(other.summarizer_timeout_ms),
            summarizer_retries: self.summarizer_retries.or(other.summarizer_retries),
            scheduler_interval_ms: self.scheduler_interval_ms.or(other.scheduler_interval_ms),
            log_format: self.log_format.or(other.log_format),
            auth: self.auth.or(other.auth),
            tokens_file: self.tokens_file.or(other.tokens_file),
            tokens: self.tokens.or(other.tokens),
            tokens_reload_interval_ms: self
                .tokens_reload_interval_ms
                .or(other.tokens_reload_interval_ms),
            reflection: self.reflection.or(other.reflection),
            request_timeout_ms: self.request_timeout_ms.or(other.request_timeout_ms),
            max_streams_per_connection: self
                .max_streams_per_connection
                .or(other.max_streams_per_connection),
            max_message_bytes: self.max_message_bytes.or(other.max_message_bytes),
            tls_cert_file: self.tls_cert_file.or(other.tls_cert_file),
            tls_key_file: self.tls_key_file.or(other.tls_key_file),
            tls_client_ca_file: self.tls_client_ca_file.or(other.tls_client_ca_file),
            tls_reload_interval_ms: self.tls_reload_interval_ms.or(other.tls_reload_interval_ms),
        }
    }
}

/// Arguments of `engram serve` and `engram migrate`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// A TOML file with any of the settings below (snake_case names, e.g.
    /// database_url = "postgres://..."); flags and environment win over it
    #[arg(long, env = "ENGRAM_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub settings: Settings,
}

/// A database URL whose password never reaches `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn new(url: impl Into<String>) -> Self {
        DatabaseUrl(url.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let url = &self.0;
        let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
            return url.clone();
        };
        let rest = &url[scheme_end..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => match rest[..at].find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end],
                    &rest[..colon],
                    &rest[at..]
                ),
                None => url.clone(),
            },
            None => url.clone(),
        }
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// The resolved configuration of a server.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: DatabaseUrl,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub migrate: MigrateMode,
    pub limits: MemoryLimits,
    pub sessions: SessionLimits,
    pub working: WorkingLimits,
    /// `None` when redaction is off.
    pub redactor: Option<Redactor>,
    /// Redact episode content and metadata too.
    pub redact_episodes: bool,
    pub store: StoreOptions,
    pub health_check_interval: Duration,
    pub request_id_ttl: Duration,
    pub shutdown_grace: Duration,
    pub watch_stall_timeout: Duration,
    pub watch_buffer: usize,
    pub change_retention: Duration,
    /// How often the consolidation scheduler runs; `None`: off.
    pub scheduler_interval: Option<Duration>,
    /// The HTTP summarizer; `None` uses the built-in extractive one.
    pub summarizer: Option<OpenAiConfig>,
    pub log_format: LogFormat,
    pub auth: Authenticator,
    /// Where the tokens came from; a tokens file is re-read on
    /// `tokens_reload_interval`.
    pub tokens: TokenSources,
    pub tokens_reload_interval: Duration,
    pub reflection: bool,
    /// `None`: no limit.
    pub request_timeout: Option<Duration>,
    pub max_streams_per_connection: u32,
    pub max_message_bytes: usize,
    /// TLS on the gRPC port; `None`: plaintext.
    pub tls: Option<TlsFiles>,
}

impl Config {
    /// Layers flags and environment (already merged by clap) over the file.
    pub fn load(args: ConfigArgs) -> anyhow::Result<Config> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str::<Settings>(&text)
                    .with_context(|| format!("invalid config file {}", path.display()))?
            }
            None => Settings::default(),
        };
        Config::resolve(args.settings.or(file))
    }

    /// Fills defaults and checks values.
    pub fn resolve(settings: Settings) -> anyhow::Result<Config> {
        let defaults = StoreOptions::default();
        let tokens = TokenSources {
            file: settings.tokens_file.clone(),
            inline: settings.tokens.clone(),
        };
        let auth = authenticator(&settings, &tokens)?;
        let tls = match (&settings.tls_cert_file, &settings.tls_key_file) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: settings.tls_client_ca_file.clone(),
                reload_interval: Duration::from_millis(
                    settings.tls_reload_interval_ms.unwrap_or(10_000).max(1),
                ),
            }),
            (None, None) => {
                anyhow::ensure!(
                    settings.tls_client_ca_file.is_none(),
                    "tls_client_ca_file needs tls_cert_file and tls_key_file"
                );
                None
            }
            _ => anyhow::bail!("tls_cert_file and tls_key_file go together"),
        };
        let config = Config {
            database_url: DatabaseUrl::new(
                settings
                    .database_url
                    .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
            ),
            grpc_addr: settings
                .grpc_addr
                .unwrap_or_else(|| DEFAULT_GRPC_ADDR.parse().expect("valid default address")),
            http_addr: settings
                .http_addr
                .unwrap_or_else(|| DEFAULT_HTTP_ADDR.parse().expect("valid default address")),
            migrate: settings.migrate.unwrap_or_default(),
            limits: MemoryLimits {
                max_value_bytes: settings
                    .max_value_bytes
                    .unwrap_or(MemoryLimits::default().max_value_bytes),
            },
            sessions: SessionLimits {
                max_sessions: count("max_sessions", settings.max_sessions)?,
                max_events_per_session: count(
                    "max_events_per_session",
                    settings.max_events_per_session,
                )?,
                max_episode_bytes: settings
                    .max_value_bytes
                    .unwrap_or(MemoryLimits::default().max_value_bytes),
            },
            working: {
                let defaults = WorkingLimits::default();
                let or = |name, value: Option<u64>, default: i64| -> anyhow::Result<i64> {
                    value.map_or(Ok(default), |v| count(name, Some(v)))
                };
                WorkingLimits {
                    max_tasks_per_session: or(
                        "max_tasks_per_session",
                        settings.max_tasks_per_session,
                        defaults.max_tasks_per_session,
                    )?,
                    max_facts_per_user: or(
                        "max_facts_per_user",
                        settings.max_facts_per_user,
                        defaults.max_facts_per_user,
                    )?,
                    max_cached_files: or(
                        "max_cached_files",
                        settings.max_cached_files,
                        defaults.max_cached_files,
                    )?,
                    max_cache_bytes: or(
                        "max_cache_bytes",
                        settings.max_cache_bytes,
                        defaults.max_cache_bytes,
                    )?,
                }
            },
            redactor: settings.redact_secrets.unwrap_or(true).then(|| {
                let extra: Vec<String> = settings
                    .sensitive_patterns
                    .as_deref()
                    .unwrap_or("")
                    .split(',')
                    .map(str::trim)
                    .filter(|w| !w.is_empty())
                    .map(str::to_owned)
                    .collect();
                Redactor::new(&extra)
            }),
            redact_episodes: settings.redact_episodes.unwrap_or(false),
            store: StoreOptions {
                max_connections: settings
                    .db_max_connections
                    .unwrap_or(defaults.max_connections),
                acquire_timeout: settings
                    .db_acquire_timeout_ms
                    .map_or(defaults.acquire_timeout, Duration::from_millis),
                sqlite_synchronous: settings.sqlite_synchronous.unwrap_or_default(),
            },
            health_check_interval: Duration::from_millis(
                settings.health_check_interval_ms.unwrap_or(1000),
            ),
            request_id_ttl: Duration::from_secs(settings.request_id_ttl_secs.unwrap_or(86_400)),
            shutdown_grace: Duration::from_secs(settings.shutdown_grace_secs.unwrap_or(10)),
            watch_stall_timeout: Duration::from_millis(settings.watch_stall_timeout_ms.unwrap_or(30_000)),
            watch_buffer: settings.watch_buffer.unwrap_or(256).max(1),
            change_retention: Duration::from_secs(settings.change_retention_secs.unwrap_or(7 * 86_400)),
            summarizer: match settings.summarizer_url {
                None => None,
                Some(url) => Some(OpenAiConfig {
                    url,
                    model: settings.summarizer_model.clone().ok_or_else(|| {
                        anyhow::anyhow!("summarizer_model (ENGRAM_SUMMARIZER_MODEL) is required with summarizer_url")
                    })?,
                    api_key: settings.summarizer_api_key,
                    timeout: Duration::from_millis(settings.summarizer_timeout_ms.unwrap_or(60_000)),
                    retries: settings.summarizer_retries.unwrap_or(3),
                }),
            },
            scheduler_interval: match settings.scheduler_interval_ms.unwrap_or(1000) {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
            log_format: settings.log_format.unwrap_or_default(),
            auth,
            tokens,
            tokens_reload_interval: Duration::from_millis(
                settings.tokens_reload_interval_ms.unwrap_or(10_000).max(1),
            ),
            tls,
            reflection: settings.reflection.unwrap_or(true),
            request_timeout: match settings.request_timeout_ms.unwrap_or(300_000) {
                0 => None,
                ms => Some(Duration::from_millis(ms)),
            },
            max_streams_per_connection: settings.max_streams_per_connection.unwrap_or(256).max(1),
            // A value at the limit must fit in a message; leave room for the rest.
            max_message_bytes: settings.max_message_bytes.unwrap_or_else(|| {
                settings
                    .max_value_bytes
                    .unwrap_or(MemoryLimits::default().max_value_bytes)
                    .saturating_mul(2)
                    .max(4 << 20)
            }),
        };
        anyhow::ensure!(
            config.limits.max_value_bytes > 0,
            "max_value_bytes must be positive"
        );
        anyhow::ensure!(
            config.store.max_connections > 0,
            "db_max_connections must be positive"
        );
        anyhow::ensure!(
            !config.health_check_interval.is_zero(),
            "health_check_interval_ms must be positive"
        );
        crate::store::Backend::of(config.database_url.expose()).map_err(anyhow::Error::msg)?;
        Ok(config)
    }
}

/// The tokens the settings configure, and whether auth is on at all.
fn authenticator(settings: &Settings, sources: &TokenSources) -> anyhow::Result<Authenticator> {
    let file_text = sources.read_file().map_err(anyhow::Error::msg)?;
    let auth = sources
        .parse(file_text.as_deref())
        .map_err(anyhow::Error::msg)?;
    let loopback = |addr: Option<SocketAddr>, default: &str| {
        addr.or_else(|| default.parse().ok())
            .is_some_and(|a| a.ip().is_loopback())
    };
    match settings.auth {
        Some(AuthMode::None) => Ok(Authenticator::off()),
        Some(AuthMode::Tokens) => {
            anyhow::ensure!(
                !auth.is_empty(),
                "auth=tokens but no tokens are configured (ENGRAM_TOKENS_FILE or ENGRAM_TOKENS)"
            );
            Ok(auth)
        }
        None if !auth.is_empty() => Ok(auth),
        None if loopback(settings.grpc_addr, DEFAULT_GRPC_ADDR)
            && loopback(settings.http_addr, DEFAULT_HTTP_ADDR) =>
        {
            Ok(Authenticator::off())
        }
        None => anyhow::bail!(
            "refusing to serve a non-loopback address without authentication: configure \
             tokens (ENGRAM_TOKENS_FILE or ENGRAM_TOKENS; `engram token new` makes one) or \
             set ENGRAM_AUTH=none explicitly"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let url = DatabaseUrl::new("postgres://engram:s3cret@db:5432/engram?sslmode=require");
        assert_eq!(
            format!("{url:?}"),
            "postgres://engram:***@db:5432/engram?sslmode=require"
        );
        assert_eq!(
            DatabaseUrl::new("sqlite://engram.db").redacted(),
            "sqlite://engram.db"
        );
        assert_eq!(
            DatabaseUrl::new("postgres://engram@db/x").redacted(),
            "postgres://engram@db/x"
        );
    }

    #[test]
    fn flags_win_over_the_file_and_defaults_fill_the_rest() {
        let file: Settings =
            toml::from_str("database_url = \"sqlite://from-file.db\"\nmax_value_bytes = 10")
                .expect("valid toml");
        let flags = Settings {
            max_value_bytes: Some(20),
            ..Settings::default()
        };
        let config = Config::resolve(flags.or(file)).expect("valid config");
        assert_eq!(config.database_url.expose(), "sqlite://from-file.db");
        assert_eq!(config.limits.max_value_bytes, 20);
        assert_eq!(config.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
        assert_eq!(config.migrate, MigrateMode::Auto);
    }

    #[test]
    fn unknown_file_settings_and_bad_urls_are_refused() {
        assert!(toml::from_str::<Settings>("databse_url = \"x\"").is_err());
        let bad = Settings {
            database_url: Some("mysql://x".to_owned()),
            ..Settings::default()
        };
        assert!(Config::resolve(bad).is_err());
        let no_model = Settings {
            summarizer_url: Some("http://localhost:8000/v1".to_owned()),
            ..Settings::default()
        };
        let err = Config::resolve(no_model).expect_err("a URL needs a model");
        assert!(err.to_string().contains("ENGRAM_SUMMARIZER_MODEL"));
    }
}
