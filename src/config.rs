//! Configuration: one typed struct, filled from flags, then `ENGRAM_*`
//! environment variables, then an optional TOML file, then defaults (first
//! one wins). The same `Settings` struct is the clap arguments and the file
//! format, so a setting cannot exist in one and not the other; `settings!`
//! declares each once, with its default.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

use crate::auth::{Authenticator, TokenSources};
use crate::memory::MemoryLimits;
use crate::openai::HttpConfig;
use crate::redact::Redactor;
use crate::search::embedder::EmbedderConfig;
use crate::sessions::SessionLimits;
use crate::store::{SqliteSynchronous, StoreOptions};
use crate::summarizer::OpenAiConfig;
use crate::tls::TlsFiles;
use crate::working::WorkingLimits;

/// A count as the stores take it (for limits, 0 means unlimited).
fn count(name: &str, value: u64) -> anyhow::Result<i64> {
    i64::try_from(value).with_context(|| format!("{name} is too large"))
}

/// Whether `engram serve` applies pending migrations at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MigrateMode {
    /// Apply pending migrations, then serve.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors in containers.
    Json,
}

/// Declares every setting once: its doc, type, default and variable. From
/// that come the clap flags (the doc plus `[default: …]`), the TOML file
/// format (`Settings`, every field optional so sources can be layered),
/// the layering (`Settings::or`) and the values with defaults filled in
/// (`Values`). A setting without a default stays optional in `Values`.
///
/// Written as a macro rather than with a layering crate (figment, config):
/// clap already layers flags over environment, serde reads the file, and
/// what was left to write by hand was the per-field repetition, which this
/// removes without another dependency.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $ty:ty $(= $default:literal)?, env $env:literal $(, $hide:ident)?;
    )*) => {
        /// Every setting, each optional so that sources can be layered.
        #[derive(Debug, Clone, Default, Deserialize, clap::Args)]
        #[serde(deny_unknown_fields)]
        pub struct Settings {
            $(
                $(#[doc = $doc])*
                #[arg(long, env = $env $(, $hide = true)?, help = help!([$($doc),*] $(, $default)?).trim_start())]
                pub $name: Option<$ty>,
            )*
        }

        /// Each setting's name, variable and default, for documentation checks.
        pub const SETTINGS: &[(&str, &str, Option<&str>)] = &[
            $((stringify!($name), $env, default_text!($($default)?)),)*
        ];

        /// Every setting with its default filled in.
        #[derive(Debug, Clone)]
        pub struct Values {
            $(pub $name: value_type!($ty $(, $default)?),)*
        }

        impl Settings {
            /// Fills every unset setting from `other`.
            pub fn or(self, other: Settings) -> Settings {
                Settings { $($name: self.$name.or(other.$name),)* }
            }

            /// The settings with the defaults of those left unset.
            pub fn values(self) -> anyhow::Result<Values> {
                Ok(Values { $($name: value!(self.$name, stringify!($name), $ty $(, $default)?),)* })
            }
        }
    };
}

/// The doc of a setting with its default appended (clap reads only
/// literal doc comments, so the help is built here).
macro_rules! help {
    ([$($doc:literal),*], $default:literal) => {
        concat!($($doc,)* " [default: ", $default, "]")
    };
    ([$($doc:literal),*]) => { concat!($($doc),*) };
}

macro_rules! default_text {
    ($default:literal) => {
        Some($default)
    };
    () => {
        None
    };
}

macro_rules! value_type {
    ($ty:ty, $default:literal) => { $ty };
    ($ty:ty) => { Option<$ty> };
}

macro_rules! value {
    ($value:expr, $name:expr, $ty:ty, $default:literal) => {
        match $value {
            Some(value) => value,
            None => <$ty as FromDefault>::from_default($default)
                .with_context(|| format!("the default of {}", $name))?,
        }
    };
    ($value:expr, $name:expr, $ty:ty) => {
        $value
    };
}

/// A type whose default is written as text in `settings!`.
trait FromDefault: Sized {
    fn from_default(text: &str) -> anyhow::Result<Self>;
}

macro_rules! parsed_default {
    ($($ty:ty),*) => {$(
        impl FromDefault for $ty {
            fn from_default(text: &str) -> anyhow::Result<Self> {
                text.parse().map_err(|e| anyhow::anyhow!("{text:?}: {e}"))
            }
        }
    )*};
}
parsed_default!(String, SocketAddr, PathBuf, u64, u32, usize, f32, bool);

macro_rules! named_default {
    ($($ty:ty),*) => {$(
        impl FromDefault for $ty {
            fn from_default(text: &str) -> anyhow::Result<Self> {
                <$ty as clap::ValueEnum>::from_str(text, false).map_err(anyhow::Error::msg)
            }
        }
    )*};
}
named_default!(MigrateMode, LogFormat, AuthMode, SqliteSynchronous);

settings! {
    /// Database URL: sqlite://PATH (created on first start) or
    /// postgres://USER:PASSWORD@HOST/DB
    database_url: String = "sqlite://engram.db", env "ENGRAM_DATABASE_URL", hide_env_values;
    /// Address of the gRPC server; port 0 picks a free port
    grpc_addr: SocketAddr = "127.0.0.1:50051", env "ENGRAM_GRPC_ADDR";
    /// Address of the HTTP server (/healthz, /readyz); port 0 picks a free port
    http_addr: SocketAddr = "127.0.0.1:9090", env "ENGRAM_HTTP_ADDR";
    /// Apply pending migrations at start (auto) or refuse to start while any are
    /// pending (off)
    migrate: MigrateMode = "auto", env "ENGRAM_MIGRATE";
    /// Largest memory value accepted, in bytes of JSON
    max_value_bytes: usize = "1048576", env "ENGRAM_MAX_VALUE_BYTES";
    /// Most sessions per tenant; creating one more evicts the oldest 10% (0:
    /// unlimited)
    max_sessions: u64 = "0", env "ENGRAM_MAX_SESSIONS";
    /// Most episodes kept per session; appending past it evicts the oldest (0:
    /// unlimited)
    max_events_per_session: u64 = "0", env "ENGRAM_MAX_EVENTS_PER_SESSION";
    /// Most tasks a session's todo list may hold
    max_tasks_per_session: u64 = "100", env "ENGRAM_MAX_TASKS_PER_SESSION";
    /// Most live facts (remembered or procedures) per user and app
    max_facts_per_user: u64 = "1000", env "ENGRAM_MAX_FACTS_PER_USER";
    /// Most files in a session's content cache; the least recently cached go first
    max_cached_files: u64 = "32", env "ENGRAM_MAX_CACHED_FILES";
    /// Most bytes in a session's content cache
    max_cache_bytes: u64 = "1048576", env "ENGRAM_MAX_CACHE_BYTES";
    /// Replace secrets with `[REDACTED]` in working memory and remembered facts
    /// before they are stored
    redact_secrets: bool = "true", env "ENGRAM_REDACT_SECRETS";
    /// Extra words that make a key sensitive, comma-separated (e.g.
    /// api_key,slack_webhook); the defaults always apply
    sensitive_patterns: String, env "ENGRAM_SENSITIVE_PATTERNS";
    /// Also redact episode content and metadata on append
    redact_episodes: bool = "false", env "ENGRAM_REDACT_EPISODES";
    /// Most database connections the server opens for calls (Postgres also opens
    /// one LISTEN connection per feed a Watch or tail follows)
    db_max_connections: u32 = "16", env "ENGRAM_DB_MAX_CONNECTIONS";
    /// How long a call waits for a database connection before it fails with
    /// UNAVAILABLE, in milliseconds
    db_acquire_timeout_ms: u64 = "5000", env "ENGRAM_DB_ACQUIRE_TIMEOUT_MS";
    /// The most writes (Set, Delete, appends) of a tenant committed together in
    /// one transaction: writes that arrive while a commit is in flight share
    /// the next one (and on Postgres Gets and Recents are read together
    /// likewise). 1 turns it off
    group_commit_max: usize = "64", env "ENGRAM_GROUP_COMMIT_MAX";
    /// SQLite durability: full syncs every commit to disk, normal may lose the last
    /// commits on power loss
    sqlite_synchronous: SqliteSynchronous = "full", env "ENGRAM_SQLITE_SYNCHRONOUS";
    /// How often the database is checked for the health service, in milliseconds
    health_check_interval_ms: u64 = "1000", env "ENGRAM_HEALTH_CHECK_INTERVAL_MS";
    /// How long the request_id of a Set or Delete is remembered for idempotent
    /// retries, in seconds (a creation's is kept with what it created)
    request_id_ttl_secs: u64 = "86400", env "ENGRAM_REQUEST_ID_TTL_SECS";
    /// How long a shutdown waits for in-flight calls and open streams before
    /// closing them, in seconds
    shutdown_grace_secs: u64 = "10", env "ENGRAM_SHUTDOWN_GRACE_SECS";
    /// How long, after SIGTERM, the server goes on serving while reporting
    /// not ready, so load balancers stop sending calls before the listeners
    /// close, in seconds (a second signal ends the wait)
    shutdown_delay_secs: u64 = "0", env "ENGRAM_SHUTDOWN_DELAY_SECS";
    /// Base URL of an OpenAI-compatible API used by Compact, e.g.
    /// `https://api.openai.com/v1`; unset uses the built-in extractive summarizer
    summarizer_url: String, env "ENGRAM_SUMMARIZER_URL";
    /// The model Compact asks when a request names none (required with
    /// --summarizer-url)
    summarizer_model: String, env "ENGRAM_SUMMARIZER_MODEL";
    /// API key sent as a bearer token to the summarizer
    summarizer_api_key: String, env "ENGRAM_SUMMARIZER_API_KEY", hide_env_values;
    /// Timeout of one summarizer call, in milliseconds
    summarizer_timeout_ms: u64 = "60000", env "ENGRAM_SUMMARIZER_TIMEOUT_MS";
    /// Retries of a summarizer call on 429, 5xx and connection errors
    summarizer_retries: u32 = "3", env "ENGRAM_SUMMARIZER_RETRIES";
    /// With an embedder: a consolidation Add whose fact is at least this similar
    /// (cosine, 0 to 1, e.g. 0.9) to a live fact of the same app, user and kind
    /// becomes an Update of it; 0 turns merging off
    consolidation_dedup_similarity: f32 = "0", env "ENGRAM_CONSOLIDATION_DEDUP_SIMILARITY";
    /// Base URL of an OpenAI-compatible embeddings API (OpenAI, Ollama, vLLM,
    /// TEI), e.g. `https://api.openai.com/v1`; turns on semantic and hybrid search
    embedder_url: String, env "ENGRAM_EMBEDDER_URL";
    /// The embedding model (required with --embedder-url); vectors of another
    /// model are not compared (`engram reembed` after a change)
    embedder_model: String, env "ENGRAM_EMBEDDER_MODEL";
    /// API key sent as a bearer token to the embedder
    embedder_api_key: String, env "ENGRAM_EMBEDDER_API_KEY", hide_env_values;
    /// Vector dimensions asked of models that can shorten theirs; 0 keeps the
    /// model's own
    embedder_dimensions: u32 = "0", env "ENGRAM_EMBEDDER_DIMENSIONS";
    /// Texts sent to the embedder in one call
    embedder_batch: usize = "64", env "ENGRAM_EMBEDDER_BATCH";
    /// Timeout of one embedder call, in milliseconds
    embedder_timeout_ms: u64 = "30000", env "ENGRAM_EMBEDDER_TIMEOUT_MS";
    /// Retries of an embedder call on 429, 5xx and connection errors
    embedder_retries: u32 = "3", env "ENGRAM_EMBEDDER_RETRIES";
    /// How long a Watch or TailEpisodes stream waits for a client that does not
    /// read before it ends the stream with CONSUMER_TOO_SLOW, in milliseconds
    watch_stall_timeout_ms: u64 = "30000", env "ENGRAM_WATCH_STALL_TIMEOUT_MS";
    /// How long a feed's horizon (Postgres) may wait for transactions in the
    /// database to end before the log names them, in milliseconds (again each
    /// minute it still waits): a transaction left open holds back every Watch
    /// and TailEpisodes
    feed_wait_warn_ms: u64 = "10000", env "ENGRAM_FEED_WAIT_WARN_MS";
    /// Items buffered per Watch or TailEpisodes stream before the stall timeout
    /// starts (and at most about 2 MiB of them)
    watch_buffer: usize = "256", env "ENGRAM_WATCH_BUFFER";
    /// How long the change feed behind Watch is kept, in seconds (604800 is a
    /// week)
    change_retention_secs: u64 = "604800", env "ENGRAM_CHANGE_RETENTION_SECS";
    /// How often the consolidation scheduler looks for due rules, in milliseconds;
    /// 0 turns the scheduler off on this replica (RunRule still works)
    scheduler_interval_ms: u64 = "1000", env "ENGRAM_SCHEDULER_INTERVAL_MS";
    /// How often each scope's retention policy is applied, in seconds; 0 turns
    /// the retention scheduler off on this replica (ApplyRetention still works)
    retention_interval_secs: u64 = "3600", env "ENGRAM_RETENTION_INTERVAL_SECS";
    /// How often this replica checks whether writes to the searchable tables
    /// have paused, and then merges the Postgres search indexes' pending lists
    /// (recent writes' entries, which every search reads whole), in
    /// milliseconds; 0 leaves them to Postgres (merged by the write that fills
    /// one, or by vacuum)
    search_merge_interval_ms: u64 = "1000", env "ENGRAM_SEARCH_MERGE_INTERVAL_MS";
    /// Searches this replica runs at once; more wait their turn, in order of
    /// arrival (a search is the heaviest statement a call runs, and more at
    /// once than the cores that run them only switch between them). 0: twice
    /// the CPUs this replica may use
    search_concurrency: usize = "0", env "ENGRAM_SEARCH_CONCURRENCY";
    /// How often this replica looks for Postgres tables that have doubled
    /// since their planner statistics were taken, and analyzes them (plans
    /// made while a table was nearly empty read it whole), in milliseconds;
    /// 0 leaves that to autovacuum. On SQLite: tables of 1,000 rows or more
    /// with no statistics or grown tenfold since; 0 leaves them without
    analyze_interval_ms: u64 = "1000", env "ENGRAM_ANALYZE_INTERVAL_MS";
    /// Log format
    log_format: LogFormat = "text", env "ENGRAM_LOG_FORMAT";
    /// Authentication: `tokens` requires a bearer token on every call but health
    /// and reflection; `none` turns it off. Unset: `tokens` when any are
    /// configured; otherwise off on loopback addresses, and a refusal to start on
    /// any other address
    auth: AuthMode, env "ENGRAM_AUTH";
    /// A file of tokens, one per line: `<sha256 of the token in hex> <tenant>
    /// [admin]` (`engram token new` prints one)
    tokens_file: PathBuf, env "ENGRAM_TOKENS_FILE";
    /// Tokens in the same format as the file, entries separated by `;` or newlines
    /// (added to the file's)
    tokens: String, env "ENGRAM_TOKENS", hide_env_values;
    /// How often the tokens file is checked for changes (a changed file that parses
    /// replaces the tokens; one that does not is logged and ignored), in
    /// milliseconds
    tokens_reload_interval_ms: u64 = "10000", env "ENGRAM_TOKENS_RELOAD_INTERVAL_MS";
    /// Serve gRPC reflection (for grpcurl discovery, without a token)
    reflection: bool = "true", env "ENGRAM_REFLECTION";
    /// Serve MCP (streamable HTTP) at /mcp on the HTTP port, with the same
    /// bearer tokens as gRPC
    mcp: bool = "true", env "ENGRAM_MCP";
    /// Serve the web console at /ui on the HTTP port (read-only pages and,
    /// for admin tokens, purge and session deletion)
    console: bool = "true", env "ENGRAM_CONSOLE";
    /// Host headers /mcp accepts, comma-separated (DNS-rebinding protection).
    /// Unset: any host when tokens are required, only localhost, 127.0.0.1 and
    /// ::1 when authentication is off
    mcp_allowed_hosts: String, env "ENGRAM_MCP_ALLOWED_HOSTS";
    /// The longest a unary call may take before it fails with CANCELLED (a client
    /// deadline shorter than this wins), in milliseconds; 0: no limit (the default of
    /// five minutes leaves room for summarizing compactions)
    request_timeout_ms: u64 = "300000", env "ENGRAM_REQUEST_TIMEOUT_MS";
    /// Calls one connection may have in progress at once (HTTP/2 streams, live
    /// streams included)
    max_streams_per_connection: u32 = "256", env "ENGRAM_MAX_STREAMS_PER_CONNECTION";
    /// How long a client connection may last before the server asks the client
    /// to reconnect (HTTP/2 GOAWAY; calls and streams on it run to their end), so
    /// calls spread over replicas started since, in seconds; 0: no limit
    max_connection_age_secs: u64 = "0", env "ENGRAM_MAX_CONNECTION_AGE_SECS";
    /// Serve gRPC over TLS with this PEM certificate chain (with --tls-key-file);
    /// reloaded when the file changes
    tls_cert_file: PathBuf, env "ENGRAM_TLS_CERT_FILE";
    /// The PEM private key of --tls-cert-file
    tls_key_file: PathBuf, env "ENGRAM_TLS_KEY_FILE";
    /// Require client certificates signed by these PEM CA certificates (mTLS);
    /// needs --tls-cert-file
    tls_client_ca_file: PathBuf, env "ENGRAM_TLS_CLIENT_CA_FILE";
    /// How often the TLS files are checked for changes, in milliseconds
    tls_reload_interval_ms: u64 = "10000", env "ENGRAM_TLS_RELOAD_INTERVAL_MS";
    /// The largest gRPC message accepted, in bytes; unset: twice max_value_bytes,
    /// at least 4 MiB
    max_message_bytes: usize, env "ENGRAM_MAX_MESSAGE_BYTES";
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
    /// How long `engram serve` drains after SIGTERM before shutting down.
    pub shutdown_delay: Duration,
    pub watch_stall_timeout: Duration,
    pub watch_buffer: usize,
    pub change_retention: Duration,
    /// How often the consolidation scheduler runs; `None`: off.
    pub scheduler_interval: Option<Duration>,
    /// How often each scope's retention policy runs; `None`: off here.
    pub retention_interval: Option<Duration>,
    /// How often this replica looks for a pause in writes to merge the
    /// search indexes' pending lists; `None`: off.
    pub search_merge_interval: Option<Duration>,
    /// Searches this replica runs at once (see `search::turns`).
    pub search_concurrency: usize,
    /// How often this replica analyzes the tables that have doubled since
    /// their statistics were taken; `None`: off.
    pub analyze_interval: Option<Duration>,
    /// The HTTP summarizer; `None` uses the built-in extractive one.
    pub summarizer: Option<OpenAiConfig>,
    /// The embeddings endpoint; `None`: lexical search only.
    pub embedder: Option<EmbedderConfig>,
    /// Consolidation merges an Add into a live fact this similar (needs
    /// the embedder); `None`: off.
    pub dedup_similarity: Option<f32>,
    pub log_format: LogFormat,
    pub auth: Authenticator,
    /// Where the tokens came from; a tokens file is re-read on
    /// `tokens_reload_interval`.
    pub tokens: TokenSources,
    pub tokens_reload_interval: Duration,
    pub reflection: bool,
    /// Serve MCP at `/mcp` on the HTTP port.
    pub mcp: bool,
    /// Serve the web console at `/ui` on the HTTP port.
    pub console: bool,
    /// The `Host` headers `/mcp` accepts; `None`: the default (see
    /// [`crate::mcp::route`]).
    pub mcp_allowed_hosts: Option<Vec<String>>,
    /// `None`: no limit.
    pub request_timeout: Option<Duration>,
    pub max_streams_per_connection: u32,
    /// `None`: connections last as long as their clients keep them.
    pub max_connection_age: Option<Duration>,
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
        let v = settings.values()?;
        let tokens = TokenSources {
            file: v.tokens_file.clone(),
            inline: v.tokens.clone(),
        };
        let auth = authenticator(&v, &tokens)?;
        let tls = match (&v.tls_cert_file, &v.tls_key_file) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: v.tls_client_ca_file.clone(),
                reload_interval: millis(v.tls_reload_interval_ms.max(1)),
            }),
            (None, None) => {
                anyhow::ensure!(
                    v.tls_client_ca_file.is_none(),
                    "tls_client_ca_file needs tls_cert_file and tls_key_file"
                );
                None
            }
            _ => anyhow::bail!("tls_cert_file and tls_key_file go together"),
        };
        let summarizer = match v.summarizer_url {
            None => None,
            Some(url) => {
                let (http, model) = endpoint(
                    "summarizer",
                    url,
                    v.summarizer_api_key,
                    v.summarizer_timeout_ms,
                    v.summarizer_retries,
                    v.summarizer_model,
                )?;
                Some(OpenAiConfig { http, model })
            }
        };
        anyhow::ensure!(v.embedder_batch > 0, "embedder_batch must be positive");
        let embedder = match v.embedder_url {
            None => None,
            Some(url) => {
                let (http, model) = endpoint(
                    "embedder",
                    url,
                    v.embedder_api_key,
                    v.embedder_timeout_ms,
                    v.embedder_retries,
                    v.embedder_model,
                )?;
                Some(EmbedderConfig {
                    http,
                    model,
                    dimensions: (v.embedder_dimensions > 0).then_some(v.embedder_dimensions),
                    batch: v.embedder_batch,
                })
            }
        };
        let similarity = v.consolidation_dedup_similarity;
        anyhow::ensure!(
            (0.0..=1.0).contains(&similarity),
            "consolidation_dedup_similarity must be from 0 to 1, got {similarity}"
        );
        anyhow::ensure!(
            similarity == 0.0 || embedder.is_some(),
            "consolidation_dedup_similarity needs an embedder (embedder_url)"
        );
        let dedup_similarity = (similarity > 0.0).then_some(similarity);
        let redactor = v.redact_secrets.then(|| {
            let extra: Vec<String> = v
                .sensitive_patterns
                .as_deref()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect();
            Redactor::new(&extra)
        });
        anyhow::ensure!(v.max_value_bytes > 0, "max_value_bytes must be positive");
        anyhow::ensure!(
            v.db_max_connections > 0,
            "db_max_connections must be positive"
        );
        anyhow::ensure!(
            v.health_check_interval_ms > 0,
            "health_check_interval_ms must be positive"
        );
        crate::store::Backend::of(&v.database_url).map_err(anyhow::Error::msg)?;
        Ok(Config {
            database_url: DatabaseUrl::new(v.database_url),
            grpc_addr: v.grpc_addr,
            http_addr: v.http_addr,
            migrate: v.migrate,
            limits: MemoryLimits {
                max_value_bytes: v.max_value_bytes,
            },
            sessions: SessionLimits {
                max_sessions: count("max_sessions", v.max_sessions)?,
                max_events_per_session: count("max_events_per_session", v.max_events_per_session)?,
                max_episode_bytes: v.max_value_bytes,
            },
            working: WorkingLimits {
                max_tasks_per_session: count("max_tasks_per_session", v.max_tasks_per_session)?,
                max_facts_per_user: count("max_facts_per_user", v.max_facts_per_user)?,
                max_cached_files: count("max_cached_files", v.max_cached_files)?,
                max_cache_bytes: count("max_cache_bytes", v.max_cache_bytes)?,
            },
            redactor,
            redact_episodes: v.redact_episodes,
            store: StoreOptions {
                max_connections: v.db_max_connections,
                acquire_timeout: millis(v.db_acquire_timeout_ms),
                sqlite_synchronous: v.sqlite_synchronous,
                group_commit_max: v.group_commit_max.max(1),
                feed_wait_warn: millis(v.feed_wait_warn_ms),
            },
            health_check_interval: millis(v.health_check_interval_ms),
            request_id_ttl: Duration::from_secs(v.request_id_ttl_secs),
            shutdown_grace: Duration::from_secs(v.shutdown_grace_secs),
            shutdown_delay: Duration::from_secs(v.shutdown_delay_secs),
            watch_stall_timeout: millis(v.watch_stall_timeout_ms),
            watch_buffer: v.watch_buffer.max(1),
            change_retention: Duration::from_secs(v.change_retention_secs),
            scheduler_interval: (v.scheduler_interval_ms > 0)
                .then(|| millis(v.scheduler_interval_ms)),
            retention_interval: (v.retention_interval_secs > 0)
                .then(|| Duration::from_secs(v.retention_interval_secs)),
            search_merge_interval: (v.search_merge_interval_ms > 0)
                .then(|| millis(v.search_merge_interval_ms)),
            search_concurrency: match v.search_concurrency {
                0 => crate::search::turns::default_at_once(),
                n => n,
            },
            analyze_interval: (v.analyze_interval_ms > 0).then(|| millis(v.analyze_interval_ms)),
            summarizer,
            embedder,
            dedup_similarity,
            log_format: v.log_format,
            auth,
            tokens,
            tokens_reload_interval: millis(v.tokens_reload_interval_ms.max(1)),
            tls,
            reflection: v.reflection,
            mcp: v.mcp,
            console: v.console,
            mcp_allowed_hosts: v.mcp_allowed_hosts.map(|hosts| {
                hosts
                    .split(',')
                    .map(|host| host.trim().to_owned())
                    .filter(|host| !host.is_empty())
                    .collect()
            }),
            request_timeout: (v.request_timeout_ms > 0).then(|| millis(v.request_timeout_ms)),
            max_streams_per_connection: v.max_streams_per_connection.max(1),
            max_connection_age: (v.max_connection_age_secs > 0)
                .then(|| Duration::from_secs(v.max_connection_age_secs)),
            // A value at the limit must fit in a message; leave room for the rest.
            max_message_bytes: v
                .max_message_bytes
                .unwrap_or_else(|| v.max_value_bytes.saturating_mul(2).max(4 << 20)),
        })
    }

    /// The configuration with every default: what tests and tools that
    /// open a store directly start from.
    pub fn defaults() -> Config {
        Config::resolve(Settings::default()).expect("the defaults resolve")
    }
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// An OpenAI-compatible endpoint's connection and model from its settings
/// (`what`: "summarizer" or "embedder"); its URL is checked now, so that a
/// bad one stops the server before it opens the database.
fn endpoint(
    what: &str,
    url: String,
    api_key: Option<String>,
    timeout_ms: u64,
    retries: u32,
    model: Option<String>,
) -> anyhow::Result<(HttpConfig, String)> {
    crate::openai::check_url(&url, what).map_err(anyhow::Error::msg)?;
    let model = model.ok_or_else(|| {
        anyhow::anyhow!(
            "{what}_model (ENGRAM_{}_MODEL) is required with {what}_url",
            what.to_uppercase()
        )
    })?;
    let http = HttpConfig {
        url,
        api_key,
        timeout: millis(timeout_ms),
        retries,
    };
    Ok((http, model))
}

/// The tokens the settings configure, and whether auth is on at all.
fn authenticator(v: &Values, sources: &TokenSources) -> anyhow::Result<Authenticator> {
    let file_text = sources.read_file().map_err(anyhow::Error::msg)?;
    let auth = sources
        .parse(file_text.as_deref())
        .map_err(anyhow::Error::msg)?;
    match v.auth {
        Some(AuthMode::None) => Ok(Authenticator::off()),
        Some(AuthMode::Tokens) => {
            anyhow::ensure!(
                !auth.is_empty(),
                "auth=tokens but no tokens are configured (ENGRAM_TOKENS_FILE or ENGRAM_TOKENS)"
            );
            Ok(auth)
        }
        None if !auth.is_empty() => Ok(auth),
        None if v.grpc_addr.ip().is_loopback() && v.http_addr.ip().is_loopback() => {
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
        assert_eq!(config.grpc_addr.to_string(), "127.0.0.1:50051");
        assert_eq!(config.migrate, MigrateMode::Auto);
    }

    #[test]
    fn every_default_resolves_and_is_shown_in_the_help() {
        let config = Config::defaults();
        assert_eq!(config.database_url.expose(), "sqlite://engram.db");
        assert_eq!(config.limits.max_value_bytes, 1 << 20);
        assert_eq!(config.working.max_tasks_per_session, 100);
        assert_eq!(config.store.sqlite_synchronous, SqliteSynchronous::Full);
        assert_eq!(config.request_timeout, Some(Duration::from_secs(300)));
        assert_eq!(config.max_message_bytes, 4 << 20);
        assert!(config.summarizer.is_none() && config.tls.is_none());

        use clap::CommandFactory;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            settings: Settings,
        }
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("bytes of JSON [default: 1048576]"), "{help}");
        assert!(help.contains("[default: sqlite://engram.db]"), "{help}");
    }

    #[test]
    fn the_readme_lists_every_setting_with_its_default() {
        let readme = include_str!("../README.md");
        for (name, env, default) in SETTINGS {
            let row = readme
                .lines()
                .find(|l| l.starts_with("| `--") && l.contains(&format!("`{env}`")))
                .unwrap_or_else(|| panic!("README has no row for {name} ({env})"));
            if let Some(default) = default {
                assert!(
                    row.contains(&format!("| `{default}` |")),
                    "README shows another default for {name}: {row}"
                );
            }
        }
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
        // A URL no endpoint can have is refused before the server opens the
        // database, not at the first call.
        for (summarizer, embedder, said) in [
            (
                Some("localhost:8000/v1"),
                None,
                "the summarizer URL must be http:// or https://",
            ),
            (
                None,
                Some("ftp://models/v1"),
                "the embedder URL must be http:// or https://",
            ),
            (None, Some("http://"), "invalid embedder URL"),
        ] {
            let bad = Settings {
                summarizer_url: summarizer.map(str::to_owned),
                summarizer_model: Some("m".to_owned()),
                embedder_url: embedder.map(str::to_owned),
                embedder_model: Some("m".to_owned()),
                ..Settings::default()
            };
            let err = Config::resolve(bad).expect_err("a bad URL");
            assert!(err.to_string().contains(said), "{err}");
        }
    }
}
