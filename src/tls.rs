//! TLS for the gRPC port, with optional client certificates (mTLS), and
//! certificates reloaded from their files while the server runs: a
//! Kubernetes Secret mounted as files changes under a running pod when
//! cert-manager renews it.
//!
//! Each accepted connection is handshaken with the newest configuration;
//! connections already open keep the one they started with. A reload that
//! fails (a half-written file) keeps the previous configuration and says
//! why in the log.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// The longest a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server's certificate, key and (for mTLS) client CA live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate
    /// one of them signed.
    pub client_ca: Option<PathBuf>,
    /// How often the files are read again to see whether they changed.
    pub reload_interval: Duration,
}

/// The contents of the TLS files at one moment.
#[derive(PartialEq, Eq)]
struct TlsPem {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    fn read(&self) -> anyhow::Result<TlsPem> {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(TlsPem {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_ref().map(read).transpose()?,
        })
    }

    /// Builds a server configuration from the files' contents.
    fn load(&self, pem: &TlsPem) -> anyhow::Result<Arc<ServerConfig>> {
        let certs = CertificateDer::pem_slice_iter(&pem.cert)
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("cannot read certificates from {}", self.cert.display()))?;
        anyhow::ensure!(
            !certs.is_empty(),
            "no certificate in {}",
            self.cert.display()
        );
        let key = PrivateKeyDer::from_pem_slice(&pem.key)
            .with_context(|| format!("cannot read a private key from {}", self.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match (&self.client_ca, &pem.client_ca) {
            (Some(path), Some(ca)) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    roots
                        .add(cert.with_context(|| format!("bad PEM in {}", path.display()))?)
                        .with_context(|| format!("bad CA certificate in {}", path.display()))?;
                }
                anyhow::ensure!(!roots.is_empty(), "no certificate in {}", path.display());
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("cannot use the client CA")?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .context("the certificate and key do not make a TLS identity")?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// Loads the configuration now (failing start-up if it is bad), then
    /// keeps it current until shutdown.
    pub fn watch(
        self,
        shutdown: CancellationToken,
    ) -> anyhow::Result<watch::Receiver<Arc<ServerConfig>>> {
        let pem = self.read()?;
        let (sender, receiver) = watch::channel(self.load(&pem)?);
        let files = Arc::new(self);
        let reader = files.clone();
        crate::reload::spawn(
            "TLS certificates",
            files.reload_interval,
            shutdown,
            pem,
            move || reader.read().map_err(|err| format!("{err:#}")),
            move |pem| {
                let config = files.load(pem).map_err(|err| format!("{err:#}"))?;
                sender.send_replace(config);
                Ok(())
            },
        );
        Ok(receiver)
    }
}

/// The TLS connections of a listener, handshaken concurrently (one slow
/// client holds up no other), for `serve_with_incoming_shutdown`.
pub fn incoming(
    listener: TcpListener,
    configs: watch::Receiver<Arc<ServerConfig>>,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of file descriptors and the like: back off a little.
                        tracing::warn!(error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = TlsAcceptor::from(configs.borrow().clone());
            let sender = sender.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = sender.send(Ok(tls)).await;
                    }
                    Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(receiver)
}
