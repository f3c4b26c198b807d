//! Shared test fixtures: a fresh database per test (a temp SQLite file, or a
//! new Postgres database dropped afterwards), a real server on port 0, typed
//! clients, and a TCP proxy that can cut the server off from Postgres.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engram::config::{Config, Settings};
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::session_service_client::SessionServiceClient;
use engram::server::RunningServer;
use engram::store::{PgStore, SqliteStore};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The Postgres server tests run against. `scripts/test` starts a throwaway
/// cluster and sets this; Postgres tests fail loudly without it rather than
/// pass without running.
pub fn pg_admin_url() -> String {
    std::env::var("ENGRAM_TEST_DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "ENGRAM_TEST_DATABASE_URL is not set: run the tests with scripts/test, which starts \
             a throwaway Postgres, or point it at a Postgres server (postgres://user@host:port/db)"
        )
    })
}

/// How the Postgres at `url` reads text as the server does
/// ([`PgStore::text_in_rust`]); the test databases lowercase ASCII as Rust
/// does.
pub async fn pg_reading(url: &str) -> engram::search::english::Reading {
    PgStore::connect(url, &Config::defaults().store)
        .await
        .expect("open postgres store")
        .text_in_rust()
        .await
        .expect("the text reading check")
        .expect("a database that lowercases ASCII as Rust does")
}

/// Replaces the database name of a Postgres URL.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

/// A fresh, empty database that is removed when dropped.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    pg_name: Option<String>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("engram.db").display());
                TestDb {
                    backend,
                    url,
                    _dir: Some(dir),
                    pg_name: None,
                }
            }
            Backend::Postgres => Self::postgres("").await,
        }
    }

    /// The SQLite file at `path`, made by the test (a backup, say), which
    /// the test removes.
    pub fn sqlite_file(path: &std::path::Path) -> TestDb {
        TestDb {
            backend: Backend::Sqlite,
            url: format!("sqlite://{}", path.display()),
            _dir: None,
            pg_name: None,
        }
    }

    /// A fresh SQLite file in a directory of its own under `parent` (on a
    /// filesystem a test means to fill, say).
    pub fn sqlite_in(parent: &std::path::Path) -> TestDb {
        let dir = tempfile::tempdir_in(parent).expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("engram.db").display());
        TestDb {
            backend: Backend::Sqlite,
            url,
            _dir: Some(dir),
            pg_name: None,
        }
    }

    /// A fresh Postgres database whose text is classified by `locale`
    /// (its `LC_CTYPE` and `LC_COLLATE`), which the operating system must
    /// have (`scripts/test` makes `tr_TR.UTF-8` with `localedef`).
    pub async fn postgres_with_locale(locale: &str) -> TestDb {
        Self::postgres(&format!(
            " TEMPLATE template0 LC_COLLATE '{locale}' LC_CTYPE '{locale}'"
        ))
        .await
    }

    /// A fresh Postgres database in `encoding` (with the `C` locale, which
    /// every encoding takes).
    pub async fn postgres_in_encoding(encoding: &str) -> TestDb {
        Self::postgres(&format!(
            " TEMPLATE template0 ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
        ))
        .await
    }

    async fn postgres(options: &str) -> TestDb {
        let admin = pg_admin_url();
        let name = format!("engram_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("connect to the test Postgres");
        sqlx::Executor::execute(
            &mut conn,
            sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}{options}")),
        )
        .await
        .expect("create test database (a locale must exist where Postgres runs)");
        TestDb {
            backend: Backend::Postgres,
            url: with_database(&admin, &name),
            _dir: None,
            pg_name: Some(name),
        }
    }

    pub async fn sqlite_store(&self) -> SqliteStore {
        SqliteStore::connect(&self.url, &engram::config::Config::defaults().store)
            .await
            .expect("open sqlite store")
    }

    pub async fn pg_store(&self) -> PgStore {
        PgStore::connect(&self.url, &engram::config::Config::defaults().store)
            .await
            .expect("open postgres store")
    }

    /// Runs statements straight on the database (its own connection, as
    /// its owner): setting up what no RPC writes.
    pub async fn execute(&self, sql: String) {
        let sql = sqlx::AssertSqlSafe(sql);
        match self.backend {
            Backend::Sqlite => execute_on::<sqlx::SqliteConnection>(&self.url, sql).await,
            Backend::Postgres => execute_on_postgres(&self.url, sql).await,
        }
    }
}

/// Runs statements on the Postgres database at `url`, on a connection of
/// their own.
pub async fn execute_on_postgres(url: &str, sql: sqlx::AssertSqlSafe<String>) {
    execute_on::<sqlx::PgConnection>(url, sql).await;
}

/// Runs statements on the database at `url` over a connection `C` of
/// their own.
async fn execute_on<C>(url: &str, sql: sqlx::AssertSqlSafe<String>)
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let mut conn = C::connect(url).await.expect("connect");
    sqlx::raw_sql(sql)
        .execute(&mut conn)
        .await
        .expect("execute");
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.pg_name.take() else {
            return;
        };
        // Drop runs outside any runtime we could await on; use a short-lived one.
        let admin = pg_admin_url();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok(mut conn) =
                        <sqlx::PgConnection as sqlx::Connection>::connect(&admin).await
                    {
                        let _ = sqlx::Executor::execute(
                            &mut conn,
                            sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )),
                        )
                        .await;
                    }
                });
            }
        })
        .join();
    }
}

/// The ordinary login role test servers run as on Postgres.
pub const APP_ROLE: &str = "engram_rls_app";

/// The URL with another user.
pub fn as_user(url: &str, user: &str) -> String {
    let start = url.find("://").expect("scheme") + 3;
    let at = url[start..].find('@').expect("user") + start;
    format!("{}{user}{}", &url[..start], &url[at..])
}

/// Creates the app role if no test has yet (roles are per cluster, and
/// tests run in parallel).
pub async fn create_app_role(owner: &mut sqlx::PgConnection) {
    use sqlx::Executor;
    owner
        .execute(sqlx::AssertSqlSafe(format!(
            "DO $$ BEGIN CREATE ROLE {APP_ROLE} LOGIN; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )))
        .await
        .expect("create the app role");
}

/// Settings for a test server on port 0 against `url`.
pub fn test_settings(url: &str) -> Settings {
    Settings {
        database_url: Some(url.to_owned()),
        grpc_addr: Some("127.0.0.1:0".parse().expect("addr")),
        http_addr: Some("127.0.0.1:0".parse().expect("addr")),
        db_max_connections: Some(8),
        shutdown_grace_secs: Some(5),
        ..Settings::default()
    }
}

/// A real server on an ephemeral port, with clients connected to it.
pub struct TestServer {
    pub db: TestDb,
    pub server: Option<RunningServer>,
    pub channel: Channel,
}

impl TestServer {
    pub async fn spawn(backend: Backend) -> TestServer {
        Self::spawn_with(backend, |_| {}).await
    }

    pub async fn spawn_with(backend: Backend, tweak: impl FnOnce(&mut Settings)) -> TestServer {
        Self::start(TestDb::new(backend).await, tweak).await
    }

    /// Starts a server on an existing database. On Postgres the server
    /// runs as an ordinary role that does not own the tables (the owner
    /// migrates first), so row-level security is enforced in every test,
    /// unless the test points the server elsewhere.
    pub async fn start(db: TestDb, tweak: impl FnOnce(&mut Settings)) -> TestServer {
        let mut settings = test_settings(&db.url);
        tweak(&mut settings);
        if db.backend == Backend::Postgres && settings.database_url.as_deref() == Some(&db.url) {
            use engram::ports::Database;
            let owner_store = db.pg_store().await;
            owner_store.migrate().await.expect("migrate as the owner");
            let mut owner = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
                .await
                .expect("connect as the owner");
            create_app_role(&mut owner).await;
            owner_store
                .grant_to(APP_ROLE)
                .await
                .expect("grant the app role");
            settings.database_url = Some(as_user(&db.url, APP_ROLE));
            settings.migrate = Some(engram::config::MigrateMode::Off);
        }
        let server = engram::server::start(Config::resolve(settings).expect("config"))
            .await
            .expect("server starts");
        let channel = connect(server.grpc_addr).await;
        TestServer {
            db,
            server: Some(server),
            channel,
        }
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").grpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.server.as_ref().expect("running").http_addr
    }

    /// A connection of the test's own to the server's Postgres database,
    /// to read what it stored or to wait for its locks; `what` names it in
    /// a failure.
    pub async fn db_connection(&self, what: &str) -> sqlx::PgConnection {
        use sqlx::Connection;
        sqlx::PgConnection::connect(&self.db.url)
            .await
            .unwrap_or_else(|err| panic!("connect {what}: {err}"))
    }

    pub fn memory(&self) -> MemoryServiceClient<Channel> {
        MemoryServiceClient::new(self.channel.clone())
    }

    pub fn sessions(&self) -> SessionServiceClient<Channel> {
        SessionServiceClient::new(self.channel.clone())
    }

    pub fn episodes(&self) -> EpisodeServiceClient<Channel> {
        EpisodeServiceClient::new(self.channel.clone())
    }

    pub fn consolidation(&self) -> ConsolidationServiceClient<Channel> {
        ConsolidationServiceClient::new(self.channel.clone())
    }

    /// A client that sends the given caller-context metadata on every call.
    pub fn memory_as(
        &self,
        metadata: &[(&'static str, &str)],
    ) -> MemoryServiceClient<InterceptedService<Channel, Metadata>> {
        MemoryServiceClient::with_interceptor(self.channel.clone(), Metadata::new(metadata))
    }

    pub async fn stop(mut self) {
        self.stop_serving().await;
    }

    /// Stops the server and keeps the database (a SQLite file is served by
    /// one process at a time, so another server may then open it).
    pub async fn stop_serving(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown();
            server.wait().await.expect("server stops cleanly");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.shutdown();
        }
    }
}

/// A GET with a real HTTP/1.1 client; the status and the JSON body.
/// Every kept version of a key, newest first, as `History` streams them.
pub async fn history_entries(
    memory: &mut MemoryServiceClient<Channel>,
    scope_type: engram::proto::ScopeType,
    scope: &str,
    key: &str,
) -> Vec<engram::proto::MemoryEntry> {
    use tokio_stream::StreamExt;
    let mut stream = memory
        .history(engram::proto::HistoryRequest {
            scope_type: scope_type as i32,
            scope: scope.to_owned(),
            key: key.to_owned(),
            from_version: 0,
        })
        .await
        .unwrap_or_else(|status| panic!("history of {scope}/{key}: {status:?}"))
        .into_inner();
    let mut entries = Vec::new();
    while let Some(reply) = stream.next().await {
        entries.push(reply.expect("a version").entry.expect("entry"));
    }
    entries
}

pub async fn http_get_json(addr: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    http_get_json_as(addr, path, None).await
}

/// [`http_get_json`] with a bearer token.
pub async fn http_get_json_as(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let (status, content_type, body) = http_get(addr, path, token).await;
    assert_eq!(
        content_type.as_deref(),
        Some("application/json"),
        "{path} answers JSON"
    );
    (status, serde_json::from_slice(&body).expect("a JSON body"))
}

/// A GET with a real HTTP/1.1 client: status, content type, body.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
) -> (u16, Option<String>, Vec<u8>) {
    let bearer = token.map(|token| format!("Bearer {token}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|value| ("authorization", value.as_str()))
        .collect();
    http_get_with(addr, path, &headers).await
}

/// [`http_get`] with these headers (a cookie, say) beside `host: localhost`.
pub async fn http_get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Vec<u8>) {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect http");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("http handshake");
    tokio::spawn(connection);
    let mut request = hyper::Request::get(path).header("host", "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Empty::<hyper::body::Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("http response");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .expect("http body")
        .to_bytes();
    (status, content_type, body.to_vec())
}

pub async fn connect(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the server")
}

/// Adds fixed metadata to every request.
#[derive(Clone)]
pub struct Metadata(
    Vec<(
        &'static str,
        tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
    )>,
);

impl Metadata {
    pub fn new(pairs: &[(&'static str, &str)]) -> Self {
        Metadata(
            pairs
                .iter()
                .map(|(k, v)| (*k, v.parse().expect("ascii metadata")))
                .collect(),
        )
    }
}

impl Interceptor for Metadata {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        for (key, value) in &self.0 {
            request.metadata_mut().insert(*key, value.clone());
        }
        Ok(request)
    }
}

/// The `ErrorInfo.reason` of a status, or "" without one.
/// The spans of the statements a server logged (JSON lines, with sqlx's
/// statements at debug): each `db.statement` event's `span`.
pub fn statement_spans(lines: &str) -> Vec<serde_json::Value> {
    lines
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event.get("db.statement").is_some())
        .filter_map(|event| event.get("span").cloned())
        .collect()
}

/// The value of the sample `name` (with its labels, as scraped) in the
/// server's `/metrics` at `addr`; `None` when it is not there.
pub async fn metric(addr: SocketAddr, name: &str) -> Option<f64> {
    let (status, _, body) = http_get(addr, "/metrics", None).await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body).expect("utf-8");
    text.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(sample, _)| *sample == name)
        .map(|(_, value)| value.parse().expect("a number"))
}

/// Scrapes until the sample `name` satisfies `done`, for at most 30
/// seconds; returns its value then.
pub async fn metric_until(addr: SocketAddr, name: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let value = metric(addr, name).await;
        if let Some(value) = value.filter(|v| done(*v)) {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} stayed at {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

/// The `ErrorInfo.metadata` entry `key` of a status.
pub fn error_metadata(status: &tonic::Status, key: &str) -> Option<String> {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .and_then(|info| info.metadata.get(key).cloned())
}

/// The fields named by the `BadRequest` violations of a status.
pub fn bad_fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .map(|bad| bad.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

/// A TCP proxy in front of Postgres. `cut` closes its listener and every
/// connection through it, so the server sees what it would see if Postgres
/// stopped (resets, then refused connections); `restore` listens again on
/// the same port. `stall` keeps every connection open but moves no bytes
/// until `resume`, as a network that drops packets would.
pub struct Proxy {
    pub addr: SocketAddr,
    upstream: SocketAddr,
    running: Mutex<CancellationToken>,
    stalled: tokio::sync::watch::Sender<bool>,
    connections: tokio::sync::watch::Sender<Connections>,
}

/// How many connections a [`Proxy`] has accepted, and how many of them
/// have ended (either side closed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Connections {
    pub accepted: usize,
    pub ended: usize,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (stalled, _) = tokio::sync::watch::channel(false);
        let (connections, _) = tokio::sync::watch::channel(Connections::default());
        let running = Self::serve(listener, upstream, stalled.clone(), connections.clone());
        Proxy {
            addr,
            upstream,
            running: Mutex::new(running),
            stalled,
            connections,
        }
    }

    /// The connections so far.
    pub fn connections(&self) -> Connections {
        *self.connections.borrow()
    }

    /// Waits (at most 30 seconds) until the connections are as `wanted`
    /// says, and returns them.
    pub async fn until_connections(&self, wanted: impl Fn(&Connections) -> bool) -> Connections {
        let mut seen = self.connections.subscribe();
        let reached = tokio::time::timeout(Duration::from_secs(30), seen.wait_for(wanted))
            .await
            .expect("the proxy's connections never got there")
            .expect("the proxy is gone");
        *reached
    }

    fn serve(
        listener: TcpListener,
        upstream: SocketAddr,
        stalled: tokio::sync::watch::Sender<bool>,
        connections: tokio::sync::watch::Sender<Connections>,
    ) -> CancellationToken {
        let running = CancellationToken::new();
        let stop = running.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return, // drops the listener
                    accepted = listener.accept() => accepted,
                };
                let Ok((client, _)) = accepted else {
                    continue;
                };
                let stop = stop.clone();
                let stalled = stalled.clone();
                let connections = connections.clone();
                connections.send_modify(|c| c.accepted += 1);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = Self::pump(client_read, server_write, stalled.subscribe()) => {}
                            _ = Self::pump(server_read, client_write, stalled.subscribe()) => {}
                        }
                    }
                    connections.send_modify(|c| c.ended += 1);
                });
            }
        });
        running
    }

    /// Copies one direction, holding each chunk while the proxy is stalled.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut stalled: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if stalled.wait_for(|stalled| !*stalled).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    pub fn cut(&self) {
        self.running.lock().expect("proxy").cancel();
    }

    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("listen again on the proxy port");
        *self.running.lock().expect("proxy") = Self::serve(
            listener,
            self.upstream,
            self.stalled.clone(),
            self.connections.clone(),
        );
    }

    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The host and port of a Postgres URL.
pub fn pg_socket_addr(url: &str) -> SocketAddr {
    let options: sqlx::postgres::PgConnectOptions = url.parse().expect("postgres url");
    let host = options.get_host();
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{}", options.get_port())
        .parse()
        .expect("postgres host must be an IP address")
}

/// Rewrites a Postgres URL to go through `addr`.
pub fn pg_url_via(url: &str, addr: SocketAddr) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    format!(
        "{}{userinfo}{addr}{}",
        &url[..scheme_end],
        &rest[authority_end..]
    )
}

/// Declares one test per backend for each named `async fn(Backend)`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Postgres).await
                }
            )*
        }
    };
}

/// The `engram` binary running as a child process, for what only a real
/// process shows: its memory, its exit on a signal, its command line.
pub struct ChildServer {
    pub child: tokio::process::Child,
    pub grpc_addr: SocketAddr,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    /// Runs `engram serve` with JSON logs and waits for the line saying
    /// where it listens.
    pub async fn spawn(
        args: &[&str],
        envs: &[(&str, &str)],
        cwd: Option<&std::path::Path>,
    ) -> ChildServer {
        use tokio::io::AsyncBufReadExt;
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_engram"));
        command
            .arg("serve")
            .args(args)
            .env("ENGRAM_GRPC_ADDR", "127.0.0.1:0")
            .env("ENGRAM_HTTP_ADDR", "127.0.0.1:0")
            .env("ENGRAM_LOG_FORMAT", "json")
            .env_remove("ENGRAM_DATABASE_URL")
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let mut child = command.spawn().expect("spawn engram");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let grpc_addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("read stderr") {
                seen.lock().expect("lines").push(line.clone());
                let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if let Some(addr) = event.get("grpc_addr").and_then(|a| a.as_str()) {
                    return addr.parse::<SocketAddr>().expect("grpc_addr");
                }
            }
            panic!(
                "engram exited before listening: {:?}",
                seen.lock().expect("lines")
            );
        })
        .await
        .expect("engram starts listening");
        let keep = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep.lock().expect("lines").push(line);
            }
        });
        ChildServer {
            child,
            grpc_addr,
            stderr: seen,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running child")
    }

    /// The HTTP address the server said it bound.
    pub fn http_addr(&self) -> SocketAddr {
        self.stderr
            .lock()
            .expect("lines")
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find_map(|event| event.get("http_addr")?.as_str()?.parse().ok())
            .expect("the line saying where the server listens")
    }

    /// The first JSON log event `wanted` holds for, waiting for it for at
    /// most 30 seconds (the lines are read as the server writes them).
    pub async fn logged(&self, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let found = self
                .stderr
                .lock()
                .expect("lines")
                .iter()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find(|event| wanted(event));
            if let Some(event) = found {
                return event;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never logged; the log: {:?}",
                self.stderr.lock().expect("lines")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("memory field")
    }

    /// Kills the process outright (SIGKILL): a crash, with no shutdown.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("kill engram");
        self.child.wait().await.expect("wait for engram");
    }

    /// Sends SIGTERM and waits for the exit status.
    /// Sends the server SIGTERM, as Kubernetes does to stop a pod.
    pub fn send_term(&self) {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(killed.success());
    }

    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.send_term();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("engram exits after SIGTERM")
            .expect("wait for engram")
    }
}

/// Reads `count` (a query of one number) until it is `want`, for at most
/// 30 seconds: what it waits for happens in the background.
pub async fn until_reads(db: &mut sqlx::PgConnection, count: &'static str, want: i64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let read: i64 = sqlx::query_scalar(count)
            .fetch_one(&mut *db)
            .await
            .expect("read the count");
        if read == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {count:?} still reads {read}, not {want}, after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many of the test database's backends wait for a lock; see
/// [`until_reads`].
pub const LOCK_WAITS: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE datname = current_database() AND wait_event_type = 'Lock'";

/// A connection to `url` inside a transaction that has run `sql`, so it
/// holds what `sql` locked (as a racing call would) until the test ends it
/// with `COMMIT` or `ROLLBACK`.
pub async fn holding(url: &str, sql: &'static str) -> sqlx::PgConnection {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("connect the holder");
    for statement in ["BEGIN", sql] {
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .unwrap_or_else(|err| panic!("{statement}: {err}"));
    }
    conn
}

/// Ends a [`holding`] transaction with `end` (`COMMIT` or `ROLLBACK`).
pub async fn release(mut holder: sqlx::PgConnection, end: &'static str) {
    sqlx::query(end)
        .execute(&mut holder)
        .await
        .unwrap_or_else(|err| panic!("{end}: {err}"));
}
