//! TLS and mTLS on the gRPC port, with certificates made in the test: a
//! client that trusts the CA calls; a plaintext client, one that trusts
//! another CA, and (under mTLS) one without a certificate or with one from
//! another CA cannot. A certificate replaced on disk is served without a
//! restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engram::api::convert::json_to_proto;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{ScopeType, SetRequest};
use engram::server::RunningServer;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::json;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::helpers::{Backend, TestDb, test_settings};

/// A certificate authority that signs server and client certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and its key.
struct Pem {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn sign(&self, names: &[&str]) -> Pem {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &self.issuer)
            .expect("signed");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file whole, by rename, as a Secret volume update does.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        let temp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&temp, text).expect("write");
        std::fs::rename(&temp, &path).expect("rename");
        path
    }
}

async fn serve(db: &TestDb, files: &Files, client_ca: Option<&Path>) -> RunningServer {
    let mut settings = test_settings(&db.url);
    settings.tls_cert_file = Some(files.path("server.crt"));
    settings.tls_key_file = Some(files.path("server.key"));
    settings.tls_client_ca_file = client_ca.map(Path::to_path_buf);
    settings.tls_reload_interval_ms = Some(50);
    engram::server::start(engram::config::Config::resolve(settings).expect("config"))
        .await
        .expect("server starts")
}

async fn channel(addr: SocketAddr, ca: &Ca, identity: Option<&Pem>) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some(pem) = identity {
        tls = tls.identity(Identity::from_pem(&pem.cert, &pem.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|err| format!("{err:?}"))
}

/// Whether a Set goes through on this channel.
async fn works(channel: Result<Channel, String>) -> bool {
    let Ok(channel) = channel else {
        return false;
    };
    MemoryServiceClient::new(channel)
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: "tls".into(),
            key: "k".into(),
            value: Some(json_to_proto(&json!("over TLS"))),
            ..SetRequest::default()
        })
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_trusting_clients_and_reloads_certificates() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (first, second) = (Ca::new("first"), Ca::new("second"));
    let files = Files {
        dir: tempfile::tempdir().expect("temp dir"),
    };
    let pem = first.sign(&["localhost"]);
    files.write("server.crt", &pem.cert);
    files.write("server.key", &pem.key);
    let server = serve(&db, &files, None).await;
    let addr = server.grpc_addr;

    assert!(works(channel(addr, &first, None).await).await, "TLS works");
    assert!(
        !works(channel(addr, &second, None).await).await,
        "a client trusting another CA refuses the server"
    );
    let plaintext = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await;
    assert!(
        !works(plaintext.map_err(|e| e.to_string())).await,
        "plaintext gets nowhere"
    );

    // Renewed by the second CA: served without a restart.
    let renewed = second.sign(&["localhost"]);
    files.write("server.key", &renewed.key);
    files.write("server.crt", &renewed.cert);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !works(channel(addr, &second, None).await).await {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!works(channel(addr, &first, None).await).await);

    server.shutdown();
    server.wait().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_from_the_client_ca() {
    let db = TestDb::new(Backend::Sqlite).await;
    let (servers, clients, strangers) = (Ca::new("servers"), Ca::new("clients"), Ca::new("x"));
    let files = Files {
        dir: tempfile::tempdir().expect("temp dir"),
    };
    let pem = servers.sign(&["localhost"]);
    files.write("server.crt", &pem.cert);
    files.write("server.key", &pem.key);
    let client_ca = files.write("client-ca.crt", &clients.pem());
    let server = serve(&db, &files, Some(&client_ca)).await;
    let addr = server.grpc_addr;

    let agent = clients.sign(&["agent-7"]);
    assert!(works(channel(addr, &servers, Some(&agent)).await).await);
    assert!(
        !works(channel(addr, &servers, None).await).await,
        "no client certificate"
    );
    let stranger = strangers.sign(&["agent-8"]);
    assert!(
        !works(channel(addr, &servers, Some(&stranger)).await).await,
        "a client certificate from another CA"
    );

    // The CLI, with and without its certificate.
    let ca = files.write("servers.crt", &servers.pem());
    let cert = files.write("agent.crt", &agent.cert);
    let key = files.write("agent.key", &agent.key);
    let cli = |identity: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
        command
            .args([
                "memory",
                "set",
                "k",
                "1",
                "--scope",
                "s",
                "--scope-type",
                "namespace",
            ])
            .args(["--server", &format!("https://localhost:{}", addr.port())])
            .arg("--ca-cert")
            .arg(&ca);
        if identity {
            command
                .arg("--client-cert")
                .arg(&cert)
                .arg("--client-key")
                .arg(&key);
        }
        command.output().expect("run engram")
    };
    let with = cli(true);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    assert!(!cli(false).status.success());

    server.shutdown();
    server.wait().await.expect("stops");
}

#[test]
fn tls_settings_go_together() {
    let settings = |cert: bool, key: bool, ca: bool| engram::config::Settings {
        tls_cert_file: cert.then(|| PathBuf::from("c.pem")),
        tls_key_file: key.then(|| PathBuf::from("k.pem")),
        tls_client_ca_file: ca.then(|| PathBuf::from("ca.pem")),
        ..engram::config::Settings::default()
    };
    for (cert, key, ca, message) in [
        (true, false, false, "go together"),
        (false, true, false, "go together"),
        (false, false, true, "needs tls_cert_file"),
    ] {
        let err = engram::config::Config::resolve(settings(cert, key, ca))
            .expect_err("refused")
            .to_string();
        assert!(err.contains(message), "{err}");
    }
    assert!(engram::config::Config::resolve(settings(true, true, true)).is_ok());
}
