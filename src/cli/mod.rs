//! Client subcommands: the `engram` binary talking gRPC to a server, for
//! people at a shell and for scripts (`--output json`, stable exit codes).

use std::io::IsTerminal;
use std::process::ExitCode;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::api::convert::json_from_proto;

pub mod consolidation;
pub mod data;
mod deltas;
mod follow;
pub mod health;
mod load;
pub mod mcp;
pub mod memory;
mod retry;
pub mod search;
pub mod sessions;
pub mod token;
pub mod working;

/// Where the server is and how to print.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// Output format: text for people, json (one document per result) for scripts
    #[arg(
        long,
        value_enum,
        default_value_t = Output::Text,
        global = true,
        help_heading = "Output"
    )]
    output: Output,

    /// The same as --output json
    #[arg(
        long,
        global = true,
        conflicts_with = "output",
        help_heading = "Output"
    )]
    json: bool,

    /// How many times a call is tried again after UNAVAILABLE (a database
    /// failover, a server restart) when repeating it is harmless (a read, a
    /// write that sets what it carries, such as a goal or a task's status, or
    /// a write with its --request-id or --id), or after a failure that wrote
    /// nothing (TRANSACTION_CONFLICT, SESSION_CHANGED, DATABASE_TIMEOUT);
    /// each waits what the server asks, or 0.1 to 2 s. 0: never
    #[arg(
        long,
        env = "ENGRAM_RETRIES",
        default_value_t = 3,
        global = true,
        help_heading = "Connection"
    )]
    retries: u32,
}

impl ClientArgs {
    /// How to print: `--json` or `--output`.
    pub fn output(&self) -> Output {
        if self.json { Output::Json } else { self.output }
    }
}

/// Where the server is and how to reach it: what a command that prints no
/// results of its own (`engram mcp`) takes.
///
/// Each flag names its heading: `next_help_heading` on a flattened struct
/// also heads the arguments declared after the flatten, so a command's own
/// flags were listed under "Connection".
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The server to talk to
    #[arg(
        long,
        env = "ENGRAM_SERVER",
        default_value = "http://127.0.0.1:50051",
        global = true,
        help_heading = "Connection"
    )]
    pub server: String,

    /// The bearer token to call with, when the server requires one
    #[arg(
        long,
        env = "ENGRAM_TOKEN",
        hide_env_values = true,
        global = true,
        help_heading = "Connection"
    )]
    pub token: Option<String>,

    /// A PEM CA certificate to trust for an https:// server (default: the
    /// public web roots)
    #[arg(
        long,
        env = "ENGRAM_CA_CERT",
        global = true,
        help_heading = "Connection"
    )]
    pub ca_cert: Option<std::path::PathBuf>,

    /// A PEM client certificate, for a server that requires one (mTLS)
    #[arg(
        long,
        env = "ENGRAM_CLIENT_CERT",
        global = true,
        requires = "client_key",
        help_heading = "Connection"
    )]
    pub client_cert: Option<std::path::PathBuf>,

    /// The PEM private key of --client-cert
    #[arg(
        long,
        env = "ENGRAM_CLIENT_KEY",
        global = true,
        requires = "client_cert",
        help_heading = "Connection"
    )]
    pub client_key: Option<std::path::PathBuf>,
}

impl ConnectArgs {
    /// TLS settings for an https:// server, from the flags.
    fn tls(&self) -> CliResult<Option<ClientTlsConfig>> {
        let secure = self.server.starts_with("https://");
        if !secure {
            if self.ca_cert.is_some() || self.client_cert.is_some() {
                return Err(CliError::usage(
                    "--ca-cert and --client-cert need an https:// --server",
                ));
            }
            return Ok(None);
        }
        let read = |path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|err| CliError::usage(format!("cannot read {}: {err}", path.display())))
        };
        let mut tls = ClientTlsConfig::new();
        tls = match &self.ca_cert {
            Some(path) => tls.ca_certificate(Certificate::from_pem(read(path)?)),
            None => tls.with_webpki_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Exit codes a script can rely on.
pub mod exit {
    /// Something failed that has no more specific code.
    pub const FAILURE: u8 = 1;
    /// The command line was wrong (clap uses 2 too).
    pub const USAGE: u8 = 2;
    /// The thing asked for does not exist.
    pub const NOT_FOUND: u8 = 3;
    /// A conflict: a compare-and-set lost, a source changed, an id is taken.
    pub const CONFLICT: u8 = 4;
    /// The server or its database is unreachable; retry later.
    pub const UNAVAILABLE: u8 = 5;
    /// No token, a wrong one, or one without the role the call needs.
    pub const DENIED: u8 = 6;
}

/// A failed command: a one-line message and its exit code.
#[derive(Debug)]
pub struct CliError {
    pub message: String,
    pub code: u8,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            code: exit::USAGE,
        }
    }
}

impl From<Status> for CliError {
    fn from(status: Status) -> Self {
        let code = match status.code() {
            Code::NotFound => exit::NOT_FOUND,
            Code::Aborted | Code::AlreadyExists => exit::CONFLICT,
            Code::Unavailable | Code::DeadlineExceeded => exit::UNAVAILABLE,
            Code::Unauthenticated | Code::PermissionDenied => exit::DENIED,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => exit::USAGE,
            _ => exit::FAILURE,
        };
        let reason = status
            .get_details_error_info()
            .map(|info| format!(" ({})", info.reason))
            .unwrap_or_default();
        CliError {
            message: format!("{:?}{reason}: {}", status.code(), status.message()),
            code,
        }
    }
}

impl CliError {
    pub fn report(self) -> ExitCode {
        eprintln!("engram: {}", self.message);
        ExitCode::from(self.code)
    }
}

pub type CliResult<T = ()> = Result<T, CliError>;

/// A channel to the server that sends the bearer token with every call.
pub type Authorized = InterceptedService<Channel, Bearer>;

/// The CLI's channel: [`Authorized`], and tries again what [`retry`] says
/// may be.
pub type Connection = retry::Retrying<Authorized>;

/// Adds `authorization: Bearer <token>` to each call, when there is a token.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> Result<Self, CliError> {
        token
            .map(|token| {
                format!("Bearer {token}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| CliError::usage("--token must be printable ASCII"))
            })
            .transpose()
            .map(Bearer)
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert(crate::auth::AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

pub async fn connect(client: &ClientArgs) -> CliResult<Connection> {
    let bearer = Bearer::new(client.connect.token.as_deref())?;
    Ok(retry::Retrying::new(
        InterceptedService::new(connect_channel(&client.connect).await?, bearer),
        client.retries,
    ))
}

/// A channel to the server with the TLS settings of the flags (no token).
pub async fn connect_channel(client: &ConnectArgs) -> CliResult<Channel> {
    let server = &client.server;
    // `localhost:50051` parses as a URI whose scheme is `localhost`, and
    // failed later as an unreachable server.
    if !server.contains("://") {
        return Err(CliError::usage(format!(
            "--server {server:?} needs its scheme: http://{server} (or https:// for TLS)"
        )));
    }
    let mut endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
        .map_err(|err| CliError::usage(format!("invalid --server {server:?}: {err}")))?;
    if let Some(tls) = client.tls()? {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|err| CliError::usage(format!("bad TLS settings: {err}")))?;
    }
    endpoint.connect().await.map_err(|err| CliError {
        // tonic says only "transport error"; the cause a person can act
        // on ("Connection refused", a certificate not trusted) is below.
        message: format!(
            "cannot reach the server at {server}: {}",
            crate::error::report(&err)
        ),
        code: exit::UNAVAILABLE,
    })
}

/// A progress line on stderr for long operations, only when a person is
/// watching (stderr is a terminal); scripts get clean output.
pub struct Progress {
    enabled: bool,
}

impl Progress {
    pub fn start(what: &str) -> Self {
        let enabled = std::io::stderr().is_terminal();
        if enabled {
            eprint!("{what}…");
        }
        Progress { enabled }
    }

    pub fn update(&self, what: &str) {
        if self.enabled {
            eprint!("\r\x1b[2K{what}");
        }
    }

    pub fn finish(self) {
        if self.enabled {
            eprint!("\r\x1b[2K");
        }
    }
}

pub fn print_json(value: &serde_json::Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Fetches every page of a list: `fetch` gets a page token and returns the
/// page's items and the next token (empty at the end).
pub async fn all_pages<T, F, Fut>(mut fetch: F) -> CliResult<Vec<T>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), tonic::Status>>,
{
    let mut items = Vec::new();
    let mut token = String::new();
    loop {
        let (page, next) = fetch(token).await?;
        items.extend(page);
        if next.is_empty() {
            return Ok(items);
        }
        token = next;
    }
}

/// A count with its noun: `1 entry`, `3 entries`.
pub fn plural<N: std::fmt::Display + PartialEq + From<u8>>(n: N, one: &str, many: &str) -> String {
    if n == N::from(1) {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Prints a table for people: a header and rows of `N` cells, each
/// column as wide as its widest cell (counted in characters), two spaces
/// between columns; the last column unpadded, for text of any length.
/// Cells are left-aligned: a caller pads numbers it wants on the right.
pub fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|cell| cell.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        outln!("{}", out.trim_end());
    };
    line(header);
    for row in rows {
        line(std::array::from_fn(|i| row[i].as_str()));
    }
}

/// Writes a line of output. When standard output is a pipe whose reader
/// has gone (`| head` took its lines), the command ends there with status
/// 0, as `grep` and `ripgrep` end: what was asked for has been read. Any
/// other failure to write ends it with status 1 and says why.
pub fn stdout_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(line)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush());
    if let Err(err) = written {
        end_if_reader_gone(&err);
        eprintln!("engram: cannot write to standard output: {err}");
        std::process::exit(exit::FAILURE.into());
    }
}

/// Ends the command with status 0 when `err` is a write to a pipe whose
/// reader has gone: what was asked for has been read.
pub fn end_if_reader_gone(err: &std::io::Error) {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
}

/// Text given on the command line, or read from standard input when it is
/// `-`, so that a file longer than a command line may take can be piped
/// in: whole when `exact` (a file's text to cache), else without its
/// trailing newlines, as a shell's `$(...)` gives a command's output.
pub fn given_or_stdin(text: String, exact: bool) -> Result<String, CliError> {
    if text != "-" {
        return Ok(text);
    }
    let mut read = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut read)
        .map_err(|err| CliError::usage(format!("cannot read standard input: {err}")))?;
    if !exact {
        read.truncate(read.trim_end_matches(['\n', '\r']).len());
    }
    Ok(read)
}

/// The text of a file named on the command line, or of standard input
/// when it is `-`, whole.
pub fn file_or_stdin(file: String) -> Result<String, CliError> {
    match file.as_str() {
        "-" => given_or_stdin(file, true),
        path => std::fs::read_to_string(path)
            .map_err(|err| CliError::usage(format!("cannot read {path}: {err}"))),
    }
}

/// A value from the command line: JSON when it parses, else a string.
/// Text that opens like a JSON object or array but does not parse is
/// most likely a typo, so stderr says it was taken as a string.
pub fn parse_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|err| {
        if text.trim_start().starts_with(['{', '[']) {
            eprintln!("engram: note: not valid JSON ({err}), so kept as a string");
        }
        serde_json::Value::String(text.to_owned())
    })
}

/// A timestamp as RFC 3339 with microseconds; empty when unset.
pub fn time(ts: Option<&prost_types::Timestamp>) -> String {
    ts.and_then(|ts| chrono::DateTime::from_timestamp(ts.seconds, ts.nanos.max(0) as u32))
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .unwrap_or_default()
}

/// A protobuf value as JSON (null when unset).
pub fn value_json(value: Option<prost_types::Value>) -> serde_json::Value {
    value
        .and_then(|v| json_from_proto(v).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The client flags a command's subtree takes anywhere (`global` there),
/// with whether each takes a value.
const CLIENT_FLAGS: [(&str, bool); 8] = [
    ("--server", true),
    ("--retries", true),
    ("--token", true),
    ("--ca-cert", true),
    ("--client-cert", true),
    ("--client-key", true),
    ("--output", true),
    ("--json", false),
];

/// The command line with client flags given before the subcommand
/// (`engram --server X memory get k`, as kubectl and grpcurl users type)
/// moved to just after it (`engram memory --server X get k`), where each
/// subcommand declares them. Clap cannot declare them at the top as well:
/// `engram bench` has a `--server` of its own. Anything else before the
/// subcommand stops the move, and clap reports it as before.
pub fn client_flags_after_subcommand<I>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    let mut args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let mut end = 1;
    while let Some(arg) = args.get(end).and_then(|a| a.to_str()) {
        let (name, inline) = arg.split_once('=').map_or((arg, false), |(n, _)| (n, true));
        let Some(&(_, takes_value)) = CLIENT_FLAGS.iter().find(|(flag, _)| *flag == name) else {
            break;
        };
        end += if takes_value && !inline { 2 } else { 1 };
    }
    let subcommand = args.get(end).and_then(|a| a.to_str());
    if end == 1 || subcommand.is_none_or(|name| name.starts_with('-')) {
        return args;
    }
    // [program, flags.., subcommand, rest..] -> [program, subcommand, flags.., rest..]
    args[1..=end].rotate_right(1);
    args
}

#[cfg(test)]
mod tests {
    use super::plural;

    #[test]
    fn counts_take_their_nouns_number() {
        assert_eq!(plural(1, "entry", "entries"), "1 entry");
        assert_eq!(plural(0, "entry", "entries"), "0 entries");
        assert_eq!(plural(2, "key", "keys"), "2 keys");
    }

    fn hoisted(line: &str) -> String {
        let moved =
            super::client_flags_after_subcommand(line.split(' ').map(std::ffi::OsString::from));
        moved
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn client_flags_before_the_subcommand_move_after_it() {
        for (given, expected) in [
            (
                "engram --server http://h:1 memory get k",
                "engram memory --server http://h:1 get k",
            ),
            (
                "engram --server=http://h:1 --json --token t sessions list",
                "engram sessions --server=http://h:1 --json --token t list",
            ),
            (
                "engram --output json --ca-cert ca.pem search x",
                "engram search --output json --ca-cert ca.pem x",
            ),
            (
                "engram --retries 0 episodes recent s",
                "engram episodes --retries 0 recent s",
            ),
            // Nothing to move, or something clap must report.
            (
                "engram memory --server http://h:1 get k",
                "engram memory --server http://h:1 get k",
            ),
            ("engram --version", "engram --version"),
            ("engram --server", "engram --server"),
            ("engram --server http://h:1", "engram --server http://h:1"),
            (
                "engram --verbose memory get k",
                "engram --verbose memory get k",
            ),
            (
                "engram --json --verbose memory get k",
                "engram --json --verbose memory get k",
            ),
        ] {
            assert_eq!(hoisted(given), expected, "{given}");
        }
    }
}
