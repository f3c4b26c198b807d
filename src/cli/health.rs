//! `engram health`: asks a server on this machine whether it is ready and
//! answers with its exit code, for a container's `HEALTHCHECK` (Docker,
//! ECS, Nomad): the image has no shell and no `curl` to ask with. It reads
//! `/readyz` (or `/healthz`) on the HTTP port, which is plaintext even when
//! gRPC is served over TLS, so it needs no certificate.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::{CliError, CliResult, exit};

#[derive(Debug, clap::Args)]
pub struct HealthCommand {
    /// The server's HTTP address, as it was given to `engram serve` (a
    /// wildcard address such as the image's 0.0.0.0 is asked on loopback)
    #[arg(
        long,
        env = "ENGRAM_HTTP_ADDR",
        default_value = "127.0.0.1:9090",
        value_name = "ADDR"
    )]
    http_addr: SocketAddr,
    /// Ask only whether the server process runs (`/healthz`), not whether
    /// it can serve calls (`/readyz`: its database reachable, no shutdown
    /// begun)
    #[arg(long)]
    live: bool,
    /// How long to wait for the answer, in milliseconds
    #[arg(long, default_value = "5000", value_name = "MS")]
    timeout_ms: u64,
}

impl HealthCommand {
    /// Prints the server's answer; an error (exit 1, what a health check
    /// reads as unhealthy) when it is not ready or cannot be reached.
    pub async fn run(self) -> CliResult {
        let mut addr = self.http_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        let path = if self.live { "/healthz" } else { "/readyz" };
        let timeout = Duration::from_millis(self.timeout_ms);
        let unhealthy = |message: String| CliError {
            message,
            code: exit::FAILURE,
        };
        let (status, body) = tokio::time::timeout(timeout, get(addr, path))
            .await
            .map_err(|_| unhealthy(format!("no answer from {addr}{path} in {timeout:?}")))?
            .map_err(|err| unhealthy(format!("cannot ask {addr}{path}: {err}")))?;
        let body = body.trim();
        if status != 200 {
            return Err(unhealthy(format!("not ready ({status}): {body}")));
        }
        println!("{body}");
        Ok(())
    }
}

/// One HTTP/1.1 GET: the status and the body as text.
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|err| err.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(|err| err.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| err.to_string())?;
    let status = response.status().as_u16();
    let body = http_body_util::Limited::new(response.into_body(), 4096)
        .collect()
        .await
        .map_err(|err| err.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
