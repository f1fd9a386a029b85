//! TLS with rustls (the `ring` provider): the certificate chain and key
//! read from PEM files, optional client authentication against a CA file
//! (mutual TLS), and reloading on request (SIGHUP) without touching open
//! connections.
//!
//! Every handshake takes the configuration current when it starts, so a
//! reload changes what new connections see and nothing else. A reload that
//! cannot read or check the new files keeps the configuration in force and
//! says why, naming the setting and the path.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsSettings;

/// ALPN for gRPC: HTTP/2 only.
const ALPN_GRPC: &[&[u8]] = &[b"h2"];
/// ALPN for the metrics endpoint: HTTP/1.1 only.
const ALPN_METRICS: &[&[u8]] = &[b"http/1.1"];

/// A TLS file that could not be used: the setting, its path and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid setting {key} ({}): {message}", path.display())]
pub struct TlsError {
    /// The setting naming the file.
    pub key: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl TlsError {
    fn new(key: &'static str, path: &Path, message: impl Into<String>) -> TlsError {
        TlsError {
            key,
            path: path.to_owned(),
            message: message.into(),
        }
    }
}

/// The files TLS is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first (`tls_cert`).
    pub cert: PathBuf,
    /// The leaf's private key (`tls_key`).
    pub key: PathBuf,
    /// The CA certificates client certificates must chain to
    /// (`tls_client_ca`); `None` asks clients for no certificate.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files the settings name, when TLS is on.
    pub fn from_settings(settings: &TlsSettings) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: settings.tls_cert.clone()?,
            key: settings.tls_key.clone()?,
            client_ca: settings.tls_client_ca.clone(),
        })
    }
}

/// The configurations in force, one per protocol, swapped whole on reload.
#[derive(Debug)]
struct Configs {
    grpc: Arc<ServerConfig>,
    metrics: Arc<ServerConfig>,
}

/// The daemon's TLS: what handshakes use now, and how to read it again.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Configs>,
}

impl Tls {
    /// Reads and checks the files; any problem is an error naming the
    /// setting and the path.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let current = build(&files)?;
        Ok(Tls {
            files,
            current: RwLock::new(current),
        })
    }

    /// Reads the files again. On success new handshakes use them; on
    /// failure the configuration in force stays, and the error says why.
    /// Open connections are never touched.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = build(&self.files)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The files read.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// An acceptor for one gRPC handshake (ALPN `h2`), with the
    /// configuration in force now.
    pub fn grpc_acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        TlsAcceptor::from(current.grpc.clone())
    }

    /// An acceptor for one metrics handshake (ALPN `http/1.1`).
    pub fn metrics_acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        TlsAcceptor::from(current.metrics.clone())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(files: &TlsFiles) -> Result<Configs, TlsError> {
    let provider = provider();
    let chain = read_certs("tls_cert", &files.cert)?;
    let key = read_key(&files.key)?;
    let signer = provider
        .key_provider
        .load_private_key(key)
        .map_err(|err| TlsError::new("tls_key", &files.key, format!("unusable key: {err}")))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|err| {
        TlsError::new(
            "tls_key",
            &files.key,
            format!(
                "does not match the certificate of tls_cert ({}): {err}",
                files.cert.display()
            ),
        )
    })?;
    let certified = Arc::new(certified);
    let verifier = match &files.client_ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs("tls_client_ca", path)? {
                roots.add(cert).map_err(|err| {
                    TlsError::new("tls_client_ca", path, format!("unusable CA: {err}"))
                })?;
            }
            Some(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|err| {
                        TlsError::new("tls_client_ca", path, format!("unusable CA: {err}"))
                    })?,
            )
        }
        None => None,
    };
    let config = |alpn: &[&[u8]]| -> Result<Arc<ServerConfig>, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| TlsError::new("tls_cert", &files.cert, err.to_string()))?;
        let builder = match &verifier {
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let resolver = rustls::sign::SingleCertAndKey::from(certified.clone());
        let mut config = builder.with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    };
    Ok(Configs {
        grpc: config(ALPN_GRPC)?,
        metrics: config(ALPN_METRICS)?,
    })
}

fn read_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::new(key, path, format!("not PEM certificates: {err}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(key, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read("tls_key", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|err| {
        TlsError::new(
            "tls_key",
            path,
            format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {err}"),
        )
    })
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|err| TlsError::new(key, path, format!("cannot read: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Made {
        _dir: tempfile::TempDir,
        files: TlsFiles,
    }

    fn made() -> Made {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
            client_ca: None,
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        Made { _dir: dir, files }
    }

    #[test]
    fn good_files_load() {
        let made = made();
        Tls::load(made.files.clone()).unwrap();
    }

    #[test]
    fn each_bad_file_is_named_by_its_setting_and_path() {
        let made = made();
        let missing = TlsFiles {
            cert: made.files.cert.with_file_name("absent.pem"),
            ..made.files.clone()
        };
        let err = Tls::load(missing).unwrap_err();
        assert_eq!(err.key, "tls_cert");
        assert!(err.to_string().contains("absent.pem"), "{err}");
        assert!(err.to_string().contains("cannot read"), "{err}");

        let garbage = made.files.key.with_file_name("garbage.pem");
        std::fs::write(&garbage, "not a key").unwrap();
        let err = Tls::load(TlsFiles {
            key: garbage.clone(),
            ..made.files.clone()
        })
        .unwrap_err();
        assert_eq!(err.key, "tls_key", "{err}");
        let err = Tls::load(TlsFiles {
            cert: garbage,
            ..made.files.clone()
        })
        .unwrap_err();
        assert_eq!(err.key, "tls_cert", "{err}");

        let other = made.files.key.with_file_name("other-key.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&other, key.serialize_pem()).unwrap();
        let err = Tls::load(TlsFiles {
            key: other,
            ..made.files.clone()
        })
        .unwrap_err();
        assert_eq!(err.key, "tls_key", "{err}");
        assert!(err.to_string().contains("does not match"), "{err}");
    }

    #[test]
    fn a_failed_reload_keeps_the_configuration_in_force() {
        let made = made();
        let tls = Tls::load(made.files.clone()).unwrap();
        let before = tls.current.read().unwrap().grpc.clone();
        std::fs::write(&made.files.cert, "broken").unwrap();
        let err = tls.reload().unwrap_err();
        assert_eq!(err.key, "tls_cert");
        assert!(Arc::ptr_eq(&before, &tls.current.read().unwrap().grpc));
    }
}
