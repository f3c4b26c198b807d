//! Start-up and shutdown: open the store, migrate, bind both listeners
//! (before anything is served, so port 0 works and the real addresses can
//! be logged and returned), then serve gRPC and HTTP until told to stop.
//! A background task keeps the health service honest about the database.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::api::edge::EdgeLayer;
use crate::api::feed::FeedOptions;
use crate::api::{
    ConsolidationApi, DataApi, EpisodeApi, MemoryAdminApi, MemoryApi, SearchApi, SessionApi,
    WorkingMemoryApi,
};
use crate::config::{Config, MigrateMode};
use crate::consolidation::Consolidation;
use crate::data::Data;
use crate::memory::Memory;
use crate::memory::admin::MemoryAdmin;
use crate::ports::{Database, Store};
use crate::proto;
use crate::proto::consolidation_service_server::ConsolidationServiceServer;
use crate::proto::data_service_server::DataServiceServer;
use crate::proto::episode_service_server::EpisodeServiceServer;
use crate::proto::memory_admin_service_server::MemoryAdminServiceServer;
use crate::proto::memory_service_server::MemoryServiceServer;
use crate::proto::search_service_server::SearchServiceServer;
use crate::proto::session_service_server::SessionServiceServer;
use crate::proto::working_memory_service_server::WorkingMemoryServiceServer;
use crate::search::Search;
use crate::search::embedder::{Embedder, EmbedderConfig, OpenAiEmbedder};
use crate::search::turns::Turns;
use crate::search::worker::Worker;
use crate::sessions::Sessions;
use crate::store::{Backend, PgStore, SqliteStore};
use crate::summarizer::{Extractive, OpenAi, Summarizer};
use crate::working::WorkingMemory;

/// How often expired idempotency records, old changes and the lines of
/// unfinished imports are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// The health service name a liveness probe checks.
pub const LIVENESS: &str = "liveness";

/// The services the health service reports on, besides the server as a
/// whole (`""`). All of them depend on the database.
fn health_services() -> [&'static str; 9] {
    [
        "",
        <MemoryServiceServer<MemoryApi<SqliteStore>> as NamedService>::NAME,
        <MemoryAdminServiceServer<MemoryAdminApi<SqliteStore>> as NamedService>::NAME,
        <SessionServiceServer<SessionApi<SqliteStore>> as NamedService>::NAME,
        <EpisodeServiceServer<EpisodeApi<SqliteStore>> as NamedService>::NAME,
        <ConsolidationServiceServer<ConsolidationApi<SqliteStore>> as NamedService>::NAME,
        <WorkingMemoryServiceServer<WorkingMemoryApi<SqliteStore>> as NamedService>::NAME,
        <SearchServiceServer<SearchApi<SqliteStore>> as NamedService>::NAME,
        <DataServiceServer<DataApi<SqliteStore>> as NamedService>::NAME,
    ]
}

/// A server that is listening. Dropping it does not stop it; call
/// [`RunningServer::shutdown`] and [`RunningServer::wait`].
pub struct RunningServer {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    draining: CancellationToken,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl RunningServer {
    /// Stops being ready but goes on serving: health turns NOT_SERVING and
    /// `/readyz` answers 503, so load balancers and clients resolving the
    /// service stop sending new calls, while the listeners still accept and
    /// every call is still served. [`RunningServer::shutdown`] then stops.
    pub fn drain(&self) {
        self.draining.cancel();
    }

    /// Starts a graceful shutdown: health turns NOT_SERVING, the listeners
    /// stop accepting, in-flight calls finish.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Waits until the server has stopped.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("server task panicked")?
    }
}

/// Opens the store the URL names and runs the migrations; on Postgres,
/// then grants `grant_to` the use of the tables.
pub async fn migrate(config: &Config, grant_to: Option<&str>) -> anyhow::Result<()> {
    match backend(config)? {
        Backend::Postgres => {
            let store = open::<PgStore>(config).await?;
            store.migrate().await?;
            if let Some(role) = grant_to {
                store.grant_to(role).await.map_err(|err| {
                    let detail = std::error::Error::source(&err)
                        .map_or_else(|| err.to_string(), |s| s.to_string());
                    anyhow::anyhow!("cannot grant {role}: {detail}")
                })?;
            }
        }
        Backend::Sqlite => {
            anyhow::ensure!(
                grant_to.is_none(),
                "--grant-to is for Postgres; SQLite has no roles"
            );
            open::<SqliteStore>(config).await?.migrate().await?
        }
    }
    Ok(())
}

/// What the configured database holds of this binary's migrations,
/// changing nothing (an SQLite file that does not exist is not made).
pub async fn migrations(config: &Config) -> anyhow::Result<crate::store::Migrations> {
    let read = match backend(config)? {
        Backend::Postgres => {
            let store = open::<PgStore>(config).await?;
            let read = store.migrations().await;
            store.close().await;
            read
        }
        Backend::Sqlite => {
            if let Some(none) = SqliteStore::migrations_if_missing(config.database_url.expose()) {
                return Ok(none);
            }
            let store = open::<SqliteStore>(config).await?;
            let read = store.migrations().await;
            store.close().await;
            read
        }
    };
    read.map_err(|err| anyhow::anyhow!("cannot read the applied migrations: {err}"))
}

/// Copies the embedded store to a new file `to` while it may be serving
/// (see [`crate::store::sqlite_backup`]). A Postgres database is backed
/// up by Postgres's own means.
pub async fn backup(config: &Config, to: &std::path::Path) -> anyhow::Result<crate::store::Copied> {
    if backend(config)? == Backend::Postgres {
        anyhow::bail!(
            "backup copies the embedded SQLite store; back up Postgres with its own tools \
             (pg_dump, base backups, or the managed service's snapshots), or use `engram \
             export` for a portable copy of a tenant"
        );
    }
    Ok(crate::store::sqlite_backup(config.database_url.expose(), to).await?)
}

/// Embeds the live items with no vector of the configured embedder's model
/// (written before it was configured, or under another model), telling
/// `progress` after each batch.
pub async fn reembed(
    config: &Config,
    progress: impl FnMut(crate::search::worker::Progress),
) -> anyhow::Result<crate::search::worker::Backfilled> {
    let settings = config.embedder.clone().ok_or_else(|| {
        anyhow::anyhow!("reembed needs --embedder-url and --embedder-model (ENGRAM_EMBEDDER_URL)")
    })?;
    let batch = settings.batch;
    let embedder = OpenAiEmbedder::new(settings).map_err(anyhow::Error::msg)?;
    match backend(config)? {
        Backend::Postgres => {
            reembed_on(
                open::<PgStore>(config).await?,
                config,
                &embedder,
                batch,
                progress,
            )
            .await
        }
        Backend::Sqlite => {
            reembed_on(
                open::<SqliteStore>(config).await?,
                config,
                &embedder,
                batch,
                progress,
            )
            .await
        }
    }
}

async fn reembed_on<S: Store>(
    store: S,
    config: &Config,
    embedder: &OpenAiEmbedder,
    batch: usize,
    progress: impl FnMut(crate::search::worker::Progress),
) -> anyhow::Result<crate::search::worker::Backfilled> {
    match config.migrate {
        MigrateMode::Auto => store.migrate().await.context("cannot apply migrations")?,
        MigrateMode::Off => store
            .migrations()
            .await
            .and_then(|migrations| migrations.require_current())
            .map_err(|err| anyhow::anyhow!("{err}"))?,
    }
    let embedded = crate::search::worker::reembed(&store, embedder, batch, progress)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    store.close().await;
    Ok(embedded)
}

fn backend(config: &Config) -> anyhow::Result<Backend> {
    Backend::of(config.database_url.expose()).map_err(anyhow::Error::msg)
}

trait Open: Store + Sized {
    async fn open(config: &Config) -> crate::error::Result<Self>;
}

impl Open for PgStore {
    async fn open(config: &Config) -> crate::error::Result<Self> {
        PgStore::connect(config.database_url.expose(), &config.store).await
    }
}

impl Open for SqliteStore {
    async fn open(config: &Config) -> crate::error::Result<Self> {
        SqliteStore::connect(config.database_url.expose(), &config.store).await
    }
}

async fn open<S: Open>(config: &Config) -> anyhow::Result<S> {
    S::open(config).await.map_err(|err| {
        let detail =
            std::error::Error::source(&err).map_or_else(|| err.to_string(), |s| s.to_string());
        anyhow::anyhow!("cannot open database {}: {detail}", config.database_url)
    })
}

/// Starts a server and returns once it is listening.
pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
    match backend(&config)? {
        Backend::Postgres => start_with(open::<PgStore>(&config).await?, config).await,
        Backend::Sqlite => {
            let store = open::<SqliteStore>(&config).await?;
            let lock = store
                .lock_for_serving()
                .map_err(|err| anyhow::anyhow!("{err}"))?;
            let mut running = start_with(store, config).await?;
            // Held until the server stops (or the process dies).
            let task = running.task;
            running.task = tokio::spawn(async move {
                let result = task.await.context("server task panicked")?;
                drop(lock);
                result
            });
            Ok(running)
        }
    }
}

async fn start_with<S: Store>(store: S, config: Config) -> anyhow::Result<RunningServer> {
    match config.migrate {
        MigrateMode::Auto => store.migrate().await.context("cannot apply migrations")?,
        MigrateMode::Off => store
            .migrations()
            .await
            .and_then(|migrations| migrations.require_current())
            .map_err(|err| anyhow::anyhow!("{err}"))?,
    }

    if let Some(embedder) = &config.embedder {
        // Before serving: from here on every write queues its items.
        store
            .set_embedder(&embedder.model)
            .await
            .map_err(|err| anyhow::anyhow!("cannot record the embedder's model: {err}"))?;
    }

    let grpc_listener = TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("cannot bind the gRPC address {}", config.grpc_addr))?;
    let http_listener = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot bind the HTTP address {}", config.http_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    let http_addr = http_listener.local_addr()?;

    let shutdown = CancellationToken::new();
    // Shutdown drains too: once it starts nothing is ready.
    let draining = shutdown.child_token();
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    report(&health_reporter, ServingStatus::Serving).await;
    // For liveness probes: SERVING while the process runs, whatever the
    // database does (restarting a pod never brings a database back).
    health_reporter
        .set_service_status(LIVENESS, ServingStatus::Serving)
        .await;
    let readiness = Readiness {
        database: Arc::new(AtomicBool::new(true)),
        draining: draining.clone(),
    };

    let services = Services::build(&store, &config, &shutdown)?;
    spawn_background(
        &store,
        &config,
        &services,
        health_reporter,
        &readiness,
        &shutdown,
    );
    let serving = serve(
        store,
        &config,
        services,
        health_service,
        readiness,
        (grpc_listener, http_listener),
        shutdown.clone(),
    )?;

    tracing::info!(
        %grpc_addr,
        %http_addr,
        database = %config.database_url,
        auth = if config.auth.is_on() { "tokens" } else { "off" },
        tls = match &config.tls {
            None => "off",
            Some(files) if files.client_ca.is_some() => "mtls",
            Some(_) => "on",
        },
        tokens = config.auth.len(),
        "engram listening"
    );
    Ok(RunningServer {
        grpc_addr,
        http_addr,
        draining,
        shutdown,
        task: tokio::spawn(serving),
    })
}

/// The domain services over one store, as the gRPC and HTTP edges use them.
struct Services<S> {
    memory: Memory<S>,
    admin: MemoryAdmin<S>,
    sessions: Sessions<S>,
    consolidation: Consolidation<S>,
    working: WorkingMemory<S>,
    search: Search<S>,
    data: Data<S>,
    /// With `embedder`: the settings its worker runs with.
    embedder: Option<(Arc<dyn Embedder>, EmbedderConfig)>,
    feed: FeedOptions,
}

impl<S: Store> Services<S> {
    fn build(store: &S, config: &Config, shutdown: &CancellationToken) -> anyhow::Result<Self> {
        let summarizer: Arc<dyn Summarizer> = match &config.summarizer {
            Some(http) => Arc::new(OpenAi::new(http.clone()).map_err(anyhow::Error::msg)?),
            None => Arc::new(Extractive),
        };
        let embedder = match &config.embedder {
            Some(settings) => {
                let embedder: Arc<dyn Embedder> =
                    Arc::new(OpenAiEmbedder::new(settings.clone()).map_err(anyhow::Error::msg)?);
                Some((embedder, settings.clone()))
            }
            None => None,
        };
        let search = Search::new(
            store.clone(),
            embedder.as_ref().map(|(e, _)| e.clone()),
            Turns::new(config.search_concurrency),
        );
        let sessions = Sessions::new(store.clone(), config.sessions).redacting(
            config
                .redact_episodes
                .then(|| config.redactor.clone())
                .flatten(),
        );
        Ok(Services {
            memory: Memory::new(store.clone(), config.limits),
            data: Data::new(store.clone())
                .limited(config.limits.max_value_bytes)
                // A quarter of the pool: exports hold a connection each.
                .exports_at_once(config.store.max_connections as usize / 4),
            admin: MemoryAdmin::new(store.clone(), config.limits, summarizer),
            consolidation: match (&embedder, config.dedup_similarity) {
                (Some((embedder, _)), Some(threshold)) => {
                    Consolidation::new(store.clone()).deduplicating(embedder.clone(), threshold)
                }
                _ => Consolidation::new(store.clone()),
            },
            working: WorkingMemory::new(
                store.clone(),
                sessions.clone(),
                search.clone(),
                config.working,
                config.redactor.clone(),
            ),
            sessions,
            search,
            embedder,
            feed: FeedOptions {
                shutdown: shutdown.clone(),
                stall: config.watch_stall_timeout,
                buffer: config.watch_buffer,
            },
        })
    }
}

/// The work that runs beside the calls until shutdown: the database health
/// check (and pruning), the search indexes' merge, the rule scheduler, the
/// embedding worker, the tokens file reload.
fn spawn_background<S: Store>(
    store: &S,
    config: &Config,
    services: &Services<S>,
    health: HealthReporter,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) {
    tokio::spawn(watch_database(
        store.clone(),
        health,
        readiness.clone(),
        config.clone(),
        shutdown.clone(),
    ));
    if let Some(interval) = config.retention_interval {
        tokio::spawn(crate::memory::retention::run(
            store.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    if let Some(interval) = config.search_merge_interval {
        tokio::spawn(merge_search_pending(
            store.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    if let Some(interval) = config.analyze_interval {
        tokio::spawn(analyze_grown(store.clone(), interval, shutdown.clone()));
    }
    if let Some(interval) = config.scheduler_interval {
        tokio::spawn(crate::consolidation::scheduler::run(
            services.consolidation.clone(),
            interval,
            shutdown.clone(),
        ));
    }
    if let Some((embedder, settings)) = &services.embedder {
        let worker = Worker::new(
            store.clone(),
            embedder.clone(),
            settings.batch,
            settings.lease(),
        );
        tokio::spawn(worker.run(shutdown.clone()));
    }
    if config.auth.is_on() && config.tokens.file.is_some() {
        // A changed tokens file that parses replaces the tokens of every
        // clone of the authenticator (a Secret updated under a running pod
        // takes effect without a restart).
        let (auth, sources) = (config.auth.clone(), config.tokens.clone());
        let reader = sources.clone();
        crate::reload::spawn(
            "tokens",
            config.tokens_reload_interval,
            shutdown.clone(),
            sources.read_file().ok().flatten(),
            move || reader.read_file(),
            move |text| {
                auth.replace(&sources.parse(text.as_deref())?);
                Ok(())
            },
        );
    }
}

/// Serves gRPC and HTTP on the bound listeners until shutdown, then gives
/// open calls the grace period, and closes the database pool last.
fn serve<S: Store>(
    store: S,
    config: &Config,
    services: Services<S>,
    health_service: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    readiness: Readiness,
    (grpc_listener, http_listener): (TcpListener, TcpListener),
    shutdown: CancellationToken,
) -> anyhow::Result<impl Future<Output = anyhow::Result<()>> + Send + 'static> {
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let max_message = config.max_message_bytes;
    // A batch may carry many episodes or deltas at the size limit.
    let max_batch = max_message.saturating_mul(8);
    let Services {
        memory,
        admin,
        sessions,
        consolidation,
        working,
        search,
        data,
        feed,
        embedder: _,
    } = services;
    let turns = search.turns().clone();
    let endpoints = crate::api::http::Endpoints {
        sessions: sessions.clone(),
        auth: config.auth.clone(),
    };

    // Past the per-connection limit calls are refused (UNAVAILABLE) at
    // once rather than queued without bound.
    let mut builder = tonic::transport::Server::builder()
        .trace_fn(crate::telemetry::rpc_span)
        .http2_keepalive_interval(Some(Duration::from_secs(60)))
        .max_concurrent_streams(config.max_streams_per_connection)
        .concurrency_limit_per_connection(config.max_streams_per_connection as usize)
        .load_shed(true);
    if let Some(timeout) = config.request_timeout {
        builder = builder.timeout(timeout);
    }
    // A client keeps one connection, and a ClusterIP Service picks the pod
    // once per connection: without an age, replicas added by scaling get no
    // calls from clients already connected. tonic's grace (a forced close
    // after it) is left off: it would skip the GOAWAY and cut live tails.
    if let Some(age) = config.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(health_service)
        .add_service(
            MemoryServiceServer::new(MemoryApi::new(memory, feed.clone()))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
        .add_service(
            MemoryAdminServiceServer::new(MemoryAdminApi::new(admin))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
        .add_service(
            SessionServiceServer::new(SessionApi::new(sessions.clone()))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
        .add_service(
            EpisodeServiceServer::new(EpisodeApi::new(sessions, feed))
                .max_decoding_message_size(max_batch)
                .max_encoding_message_size(max_batch),
        )
        .add_service(
            ConsolidationServiceServer::new(ConsolidationApi::new(consolidation))
                .max_decoding_message_size(max_batch)
                .max_encoding_message_size(max_batch),
        )
        .add_service(
            WorkingMemoryServiceServer::new(WorkingMemoryApi::new(working))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        )
        .add_service(
            SearchServiceServer::new(SearchApi::new(search))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_batch),
        )
        .add_service(
            DataServiceServer::new(DataApi::new(data))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message),
        );
    if config.reflection {
        routes
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);
    }
    let routes = routes.routes();
    // MCP calls the same services in process, through the same edge.
    let mcp = config.mcp.then(|| {
        let grpc = crate::mcp::connection(
            tower::Layer::layer(&EdgeLayer::new(config.auth.clone()), routes.clone()),
            None,
        );
        crate::mcp::route::router(
            grpc,
            config.auth.clone(),
            config.mcp_allowed_hosts.clone(),
            shutdown.clone(),
        )
    });
    // The console calls them in process too, with the visitor's token.
    let console = config.console.then(|| {
        crate::console::router(
            crate::mcp::connection(
                tower::Layer::layer(&EdgeLayer::new(config.auth.clone()), routes.clone()),
                None,
            ),
            config.auth.clone(),
        )
    });
    let router = builder
        .layer(EdgeLayer::new(config.auth.clone()))
        .add_routes(routes);
    let grpc: Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> =
        match config.tls.clone() {
            Some(files) => {
                let configs = files.watch(shutdown.clone()).context("cannot set up TLS")?;
                Box::pin(router.serve_with_incoming_shutdown(
                    crate::tls::incoming(grpc_listener, configs, shutdown.clone()),
                    shutdown.clone().cancelled_owned(),
                ))
            }
            // Without TCP_NODELAY a response written as several segments
            // waits for the client's delayed ACK (~40 ms) between them.
            // Keepalive finds clients that vanished without closing.
            None => Box::pin(
                router.serve_with_incoming_shutdown(
                    TcpIncoming::from(grpc_listener)
                        .with_nodelay(Some(true))
                        .with_keepalive(Some(Duration::from_secs(60))),
                    shutdown.clone().cancelled_owned(),
                ),
            ),
        };
    let http = axum::serve(
        http_listener,
        http_router(readiness, store.clone(), turns)
            .merge(crate::api::http::router(endpoints))
            .merge(mcp.unwrap_or_default())
            .merge(console.unwrap_or_default()),
    )
    .with_graceful_shutdown(shutdown.clone().cancelled_owned());

    let grace = config.shutdown_grace;
    Ok(async move {
        let serve = async {
            let (grpc, http) = tokio::join!(grpc, async { http.await });
            grpc.context("gRPC server failed")?;
            http.context("HTTP server failed")
        };
        // Streams such as health watches never end on their own: once the
        // grace period is over, dropping the servers closes what is left.
        let forced = async {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            served = serve => served?,
            () = forced => tracing::warn!(?grace, "grace period over, closing open calls and streams"),
        }
        // Every call has ended: the pool's connections can go.
        store.close().await;
        tracing::info!("engram stopped");
        Ok(())
    })
}

/// Whether the server should be sent calls: the database reachable (kept
/// by [`watch_database`]), and no drain or shutdown begun.
#[derive(Clone)]
struct Readiness {
    database: Arc<AtomicBool>,
    draining: CancellationToken,
}

/// `/healthz` answers while the process runs; `/readyz` only while the
/// database is reachable and the server is not draining; `/metrics` in the
/// Prometheus text format. None needs a token: probes and scrapers reach
/// them on the cluster network.
fn http_router<S: Store>(readiness: Readiness, store: S, turns: Turns) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    let database = readiness.database.clone();
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let text = crate::metrics::global().render(&crate::metrics::ServerGauges {
                    pool: store.pool_status(),
                    waiting_searches: turns.waiting(),
                    database_reachable: database.load(Ordering::Relaxed),
                });
                async move { ([("content-type", "text/plain; version=0.0.4")], text) }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let answer = if readiness.draining.is_cancelled() {
                    (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
                } else if readiness.database.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n")
                };
                async move { answer }
            }),
        )
}

/// Merges the search indexes' pending lists once writes to the searchable
/// tables have stopped (the database's write count unchanged over
/// `QUIET_TICKS` ticks of `interval`), so searches after a burst of
/// writes read short lists. While writes go on, the write that fills a
/// list merges it, in the large batch that costs least: merging every
/// second under a steady load of appends halved their throughput, since a
/// forced merge also takes in what is added while it runs. Two ticks, not
/// one: each connection reports its writes about once a second, so one
/// tick may see none from a few busy ones. An error is logged and the next
/// tick tries again.
async fn merge_search_pending<S: Store>(store: S, interval: Duration, shutdown: CancellationToken) {
    const QUIET_TICKS: u32 = 2;
    let mut ticks = crate::ticks::Ticks::new(interval, shutdown);
    let mut last: Option<i64> = None;
    let mut unchanged = 0;
    let mut merged_at: Option<i64> = None;
    while ticks.next().await {
        let writes = match store.search_writes().await {
            Ok(writes) => writes,
            Err(err) => {
                tracing::warn!(error = %crate::error::report(&err), "cannot read the search tables' write count");
                continue;
            }
        };
        unchanged = if last == Some(writes) {
            unchanged + 1
        } else {
            0
        };
        last = Some(writes);
        if unchanged < QUIET_TICKS || merged_at == Some(writes) {
            continue;
        }
        match store.merge_search_pending().await {
            Ok(pages) => {
                merged_at = Some(writes);
                if pages > 0 {
                    tracing::debug!(pages, "merged the search indexes' pending lists");
                }
            }
            Err(err) => {
                tracing::warn!(error = %crate::error::report(&err), "cannot merge the search indexes' pending lists")
            }
        }
    }
}

/// Analyzes the tables that have doubled since their planner statistics
/// were taken, every `interval` (see [`Database::analyze_grown`]): a new
/// database's statements otherwise keep the plans made while its tables
/// were nearly empty until autovacuum's first analyze. An error is logged
/// and the next tick tries again.
async fn analyze_grown<S: Store>(store: S, interval: Duration, shutdown: CancellationToken) {
    let mut ticks = crate::ticks::Ticks::new(interval, shutdown);
    while ticks.next().await {
        match store.analyze_grown().await {
            Ok(0) => {}
            Ok(tables) => tracing::debug!(tables, "analyzed the tables that doubled"),
            Err(err) => {
                tracing::warn!(error = %crate::error::report(&err), "cannot analyze the tables that doubled")
            }
        }
    }
}

/// Pings the database on an interval and reports the result to the health
/// service: NOT_SERVING while it is unreachable, SERVING again when it comes
/// back, NOT_SERVING for good once a drain (or shutdown) starts. Also
/// prunes expired idempotency records, old changes and the lines of
/// unfinished imports every [`PRUNE_EVERY`].
async fn watch_database<S: Store>(
    store: S,
    reporter: HealthReporter,
    readiness: Readiness,
    config: Config,
    shutdown: CancellationToken,
) {
    let mut ticks = crate::ticks::Ticks::new(config.health_check_interval, shutdown);
    let ping_timeout = config.health_check_interval.max(Duration::from_secs(1));
    let mut serving = true;
    let mut drained = false;
    let mut last_prune: Option<Instant> = None;
    loop {
        tokio::select! {
            more = ticks.next() => if !more { break },
            () = readiness.draining.cancelled(), if !drained => {
                drained = true;
                report(&reporter, ServingStatus::NotServing).await;
                continue;
            }
        }
        let ping = tokio::time::timeout(ping_timeout, store.ping()).await;
        let healthy = matches!(ping, Ok(Ok(())));
        if healthy != serving {
            serving = healthy;
            readiness.database.store(healthy, Ordering::Relaxed);
            let status = if healthy {
                tracing::info!("database reachable again, serving");
                ServingStatus::Serving
            } else {
                let error = match ping {
                    Ok(Err(err)) => std::error::Error::source(&err)
                        .map_or_else(|| err.to_string(), |s| s.to_string()),
                    _ => "ping timed out".to_owned(),
                };
                tracing::warn!(%error, "database unreachable, not serving");
                ServingStatus::NotServing
            };
            if !drained {
                report(&reporter, status).await;
            }
        }
        if healthy && last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            last_prune = Some(Instant::now());
            let before = chrono::Utc::now()
                - chrono::Duration::from_std(config.request_id_ttl)
                    .unwrap_or(chrono::Duration::MAX);
            match store.prune_request_ids(before).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "pruned expired request ids"),
                Err(err) => {
                    tracing::warn!(error = %crate::error::report(&err), "cannot prune expired request ids")
                }
            }
            let before = chrono::Utc::now()
                - chrono::Duration::from_std(config.change_retention)
                    .unwrap_or(chrono::Duration::MAX);
            match store.prune_changes(before).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "pruned old changes"),
                Err(err) => {
                    tracing::warn!(error = %crate::error::report(&err), "cannot prune old changes")
                }
            }
            let before = chrono::Utc::now() - crate::data::STALE_IMPORT_AFTER;
            match store.prune_imports(before).await {
                Ok(0) => {}
                Ok(pruned) => tracing::info!(pruned, "pruned lines of unfinished imports"),
                Err(err) => {
                    tracing::warn!(error = %crate::error::report(&err), "cannot prune unfinished imports")
                }
            }
        }
    }
    readiness.database.store(false, Ordering::Relaxed);
    report(&reporter, ServingStatus::NotServing).await;
}

/// Sets every service the health service reports on (not liveness).
async fn report(reporter: &HealthReporter, status: ServingStatus) {
    for service in health_services() {
        reporter.set_service_status(service, status).await;
    }
}
