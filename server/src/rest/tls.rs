//! HTTPS on the REST port: Kafka Connect's `listeners=https://HOST:PORT` with its
//! `listeners.https.ssl.*` keys (else the worker's plain `ssl.*` keys, as Connect falls back),
//! certificates and keys as PEM, served by rustls (ring). Clients may be asked for a
//! certificate (`ssl.client.auth=requested|required`, mutual TLS) checked against the
//! truststore.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use spillway_core::ConfigMap;

/// The prefix of the HTTPS listener's keys.
pub const HTTPS_PREFIX: &str = "listeners.https.";

/// Why the HTTPS listener cannot be set up; each names the key to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key}={value} is not supported: the REST listener reads PEM; set {key}=PEM (convert a JKS or PKCS12 store with keytool/openssl)")]
    NotPem { key: String, value: String },
    #[error("an https listener needs a certificate and its private key: set {HTTPS_PREFIX}ssl.keystore.location (a PEM file with the private key and the certificate chain), or {HTTPS_PREFIX}ssl.keystore.certificate.chain and {HTTPS_PREFIX}ssl.keystore.key (PEM text)")]
    NoKeystore,
    #[error("cannot read {key} '{path}': {reason}")]
    Read {
        key: String,
        path: String,
        reason: String,
    },
    #[error("{key} holds no PEM {what}; it must contain '-----BEGIN {what}-----' blocks")]
    NoPem { key: String, what: &'static str },
    #[error("{key}: {reason}")]
    BadPem { key: String, reason: String },
    #[error("{key} is set, but encrypted private keys are not supported; give the key unencrypted in a file only the worker may read")]
    EncryptedKey { key: String },
    #[error("{key}={value} is not valid; use none, requested or required")]
    ClientAuth { key: String, value: String },
    #[error("{key}={value} is not supported; use TLSv1.2 and/or TLSv1.3")]
    Protocol { key: String, value: String },
    #[error("{key} is not supported: the REST listener uses rustls' cipher suites (TLS 1.2 and 1.3, forward secrecy only); remove the key")]
    CipherSuites { key: String },
    #[error("{key}={value} needs a truststore to check client certificates: set {HTTPS_PREFIX}ssl.truststore.location (PEM CA certificates)")]
    NoTruststore { key: String, value: String },
    #[error("the TLS settings are not usable: {0}")]
    Rustls(String),
}

/// Connect's client authentication setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

/// The `ssl.*` settings of the HTTPS listener: `listeners.https.ssl.X`, else `ssl.X`.
struct Settings<'a>(&'a ConfigMap);

impl Settings<'_> {
    /// The value of `ssl.X` and the key it was read from.
    fn get(&self, key: &str) -> Option<(String, &str)> {
        let prefixed = format!("{HTTPS_PREFIX}{key}");
        if let Some(v) = self.0.get(&prefixed).filter(|v| !v.trim().is_empty()) {
            return Some((prefixed, v.trim()));
        }
        self.0
            .get(key)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (key.to_owned(), v.trim()))
    }
}

fn read(key: &str, path: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        key: key.to_owned(),
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn check_pem_type(settings: &Settings, key: &str) -> Result<(), TlsError> {
    match settings.get(key) {
        Some((k, v)) if !v.eq_ignore_ascii_case("PEM") => Err(TlsError::NotPem {
            key: k,
            value: v.to_owned(),
        }),
        _ => Ok(()),
    }
}

fn certificates(key: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoPem {
            key: key.to_owned(),
            what: "CERTIFICATE",
        });
    }
    Ok(certs)
}

fn private_key(key: &str, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    if String::from_utf8_lossy(pem).contains("ENCRYPTED PRIVATE KEY") {
        return Err(TlsError::EncryptedKey {
            key: key.to_owned(),
        });
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoPem {
            key: key.to_owned(),
            what: "PRIVATE KEY",
        },
        other => TlsError::BadPem {
            key: key.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// The certificate chain and private key of the listener.
fn keystore(
    settings: &Settings,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    check_pem_type(settings, "ssl.keystore.type")?;
    if let Some((key, _)) = settings.get("ssl.key.password") {
        return Err(TlsError::EncryptedKey { key });
    }
    if let Some((key, _)) = settings.get("ssl.keystore.password") {
        return Err(TlsError::EncryptedKey { key });
    }
    match (
        settings.get("ssl.keystore.location"),
        settings.get("ssl.keystore.certificate.chain"),
        settings.get("ssl.keystore.key"),
    ) {
        (Some((key, path)), _, _) => {
            let pem = read(&key, path)?;
            Ok((certificates(&key, &pem)?, private_key(&key, &pem)?))
        }
        (None, Some((chain_key, chain)), Some((key_key, pem_key))) => Ok((
            certificates(&chain_key, chain.as_bytes())?,
            private_key(&key_key, pem_key.as_bytes())?,
        )),
        _ => Err(TlsError::NoKeystore),
    }
}

/// The CA certificates client certificates are checked against, if any are set.
fn truststore(settings: &Settings) -> Result<Option<RootCertStore>, TlsError> {
    check_pem_type(settings, "ssl.truststore.type")?;
    let (key, pem) = match (
        settings.get("ssl.truststore.location"),
        settings.get("ssl.truststore.certificates"),
    ) {
        (Some((key, path)), _) => {
            let pem = read(&key, path)?;
            (key, pem)
        }
        (None, Some((key, text))) => (key, text.as_bytes().to_vec()),
        (None, None) => return Ok(None),
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(&key, &pem)? {
        roots.add(cert).map_err(|e| TlsError::BadPem {
            key: key.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok(Some(roots))
}

fn client_auth(settings: &Settings) -> Result<(ClientAuth, String), TlsError> {
    let Some((key, value)) = settings.get("ssl.client.auth") else {
        return Ok((ClientAuth::None, format!("{HTTPS_PREFIX}ssl.client.auth")));
    };
    let auth = match value.to_ascii_lowercase().as_str() {
        "none" => ClientAuth::None,
        "requested" => ClientAuth::Requested,
        "required" => ClientAuth::Required,
        _ => {
            return Err(TlsError::ClientAuth {
                key,
                value: value.to_owned(),
            })
        }
    };
    Ok((auth, key))
}

fn protocol_versions(
    settings: &Settings,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
    let Some((key, value)) = settings.get("ssl.enabled.protocols") else {
        return Ok(rustls::DEFAULT_VERSIONS.to_vec());
    };
    let mut versions = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        versions.push(match name {
            "TLSv1.2" => &rustls::version::TLS12,
            "TLSv1.3" => &rustls::version::TLS13,
            other => {
                return Err(TlsError::Protocol {
                    key,
                    value: other.to_owned(),
                })
            }
        });
    }
    if versions.is_empty() {
        return Err(TlsError::Protocol {
            key,
            value: value.to_owned(),
        });
    }
    Ok(versions)
}

/// What a worker trusts and presents when it calls another worker's https REST API
/// (forwarding a write to the leader), as Connect's workers use their listener's `ssl.*` keys
/// for requests to each other: the listener's truststore CAs (besides the system's) and,
/// when the listener asks clients for a certificate (`ssl.client.auth=requested|required`,
/// so the other workers ask too), its own certificate chain and key.
pub struct PeerTls {
    /// CA certificates, DER.
    pub roots: Vec<CertificateDer<'static>>,
    /// The private key and certificate chain, PEM (reqwest's identity).
    pub identity_pem: Option<Vec<u8>>,
}

/// [`PeerTls`] from the worker configuration of a worker with an https listener.
pub fn peer_tls(config: &ConfigMap) -> Result<PeerTls, TlsError> {
    let settings = Settings(config);
    // Checked as the listener checks it, then read as certificates.
    truststore(&settings)?;
    let roots = truststore_pem(&settings)?;
    let (auth, _) = client_auth(&settings)?;
    let identity_pem = if auth == ClientAuth::None {
        None
    } else {
        // Checked (and so readable, unencrypted PEM) by `keystore` first.
        keystore(&settings)?;
        Some(match settings.get("ssl.keystore.location") {
            Some((key, path)) => read(&key, path)?,
            None => {
                let chain = settings
                    .get("ssl.keystore.certificate.chain")
                    .map(|(_, v)| v.to_owned())
                    .unwrap_or_default();
                let key = settings
                    .get("ssl.keystore.key")
                    .map(|(_, v)| v.to_owned())
                    .unwrap_or_default();
                format!("{key}\n{chain}\n").into_bytes()
            }
        })
    };
    Ok(PeerTls {
        roots,
        identity_pem,
    })
}

/// The truststore's certificates (it was checked to be readable PEM).
fn truststore_pem(settings: &Settings) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    match (
        settings.get("ssl.truststore.location"),
        settings.get("ssl.truststore.certificates"),
    ) {
        (Some((key, path)), _) => certificates(&key, &read(&key, path)?),
        (None, Some((key, text))) => certificates(&key, text.as_bytes()),
        (None, None) => Ok(Vec::new()),
    }
}

/// The rustls configuration of the HTTPS listener, from the worker configuration.
pub fn server_config(config: &ConfigMap) -> Result<ServerConfig, TlsError> {
    let settings = Settings(config);
    if let Some((key, _)) = settings.get("ssl.cipher.suites") {
        return Err(TlsError::CipherSuites { key });
    }
    let (chain, key) = keystore(&settings)?;
    let roots = truststore(&settings)?;
    let (auth, auth_key) = client_auth(&settings)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&protocol_versions(&settings)?)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match (auth, roots) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (auth, None) => {
            return Err(TlsError::NoTruststore {
                key: auth_key,
                value: if auth == ClientAuth::Required {
                    "required".into()
                } else {
                    "requested".into()
                },
            })
        }
        (auth, Some(roots)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?,
            )
        }
    };
    builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls(format!("the certificate and private key do not fit: {e}")))
}
