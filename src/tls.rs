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

impl TlsFiles {
    fn read(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        let mut contents = Vec::with_capacity(3);
        for path in [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
        {
            contents.push(
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
            );
        }
        Ok(contents)
    }

    /// Builds a server configuration from the files as they are now.
    pub fn load(&self) -> anyhow::Result<Arc<ServerConfig>> {
        let certs = CertificateDer::pem_file_iter(&self.cert)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .with_context(|| format!("cannot read certificates from {}", self.cert.display()))?;
        anyhow::ensure!(
            !certs.is_empty(),
            "no certificate in {}",
            self.cert.display()
        );
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .with_context(|| format!("cannot read a private key from {}", self.key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(path)
                    .with_context(|| format!("cannot read client CA {}", path.display()))?
                {
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
        let config = self.load()?;
        let mut seen = self.read()?;
        let (sender, receiver) = watch::channel(config);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(self.reload_interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = ticker.tick() => {}
                }
                let now = match self.read() {
                    Ok(now) => now,
                    Err(err) => {
                        tracing::warn!(error = %format!("{err:#}"), "cannot read TLS files, keeping the loaded ones");
                        continue;
                    }
                };
                if now == seen {
                    continue;
                }
                match self.load() {
                    Ok(config) => {
                        seen = now;
                        sender.send_replace(config);
                        tracing::info!(cert = %self.cert.display(), "TLS certificates reloaded");
                    }
                    Err(err) => tracing::warn!(
                        error = %format!("{err:#}"),
                        "TLS files changed but do not load, keeping the previous ones"
                    ),
                }
            }
        });
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
