//! TLS for the native client: rustls with the ring provider, trust and client certificates
//! from PEM (rustls-pki-types), hostname verification unless turned off.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{Password, PemSource, SecurityError, TlsSettings};

/// Opens TLS sessions over TCP connections; cheap to clone.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
    /// The key the trusted CAs came from, for error messages.
    trust_key: String,
    has_client_cert: bool,
}

impl TlsConnector {
    /// Read and check the certificates now, so a bad file fails the config, not a connection.
    pub fn new(settings: &TlsSettings) -> Result<TlsConnector, SecurityError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let trust_key = match &settings.trust {
            None => {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                "the public web CAs (no ssl.truststore.location / ssl.ca.location set)".to_owned()
            }
            Some(source) => {
                let certs = certificates(source)?;
                for cert in certs {
                    roots.add(cert).map_err(|e| SecurityError::Pem {
                        key: source.key().to_owned(),
                        what: "CA certificate",
                        reason: e.to_string(),
                    })?;
                }
                source.key().to_owned()
            }
        };
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| SecurityError::Pem {
                    key: trust_key.clone(),
                    what: "CA certificate",
                    reason: e.to_string(),
                })?;
        let verifier: Arc<dyn ServerCertVerifier> = if settings.verify_hostname {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| SecurityError::Conflict(format!("cannot set up TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &settings.client {
            None => builder.with_no_client_auth(),
            Some(client) => {
                let chain = certificates(&client.chain)?;
                let key = private_key(&client.key, client.key_password.as_ref())?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| SecurityError::Pem {
                        key: client.key.key().to_owned(),
                        what: "private key matching the client certificate",
                        reason: e.to_string(),
                    })?
            }
        };
        Ok(TlsConnector {
            config: Arc::new(config),
            trust_key,
            has_client_cert: settings.client.is_some(),
        })
    }

    /// Run the TLS handshake with `host` over `tcp`; the error says what to check.
    pub async fn connect(
        &self,
        host: &str,
        tcp: TcpStream,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("'{host}' is not a valid TLS server name: {e}"))?;
        tokio_rustls::TlsConnector::from(Arc::clone(&self.config))
            .connect(name, tcp)
            .await
            .map_err(|e| self.explain(host, &e))
    }

    /// What a TLS failure (during or right after the handshake) means for the user.
    pub fn explain(&self, host: &str, e: &std::io::Error) -> String {
        let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
        match inner {
            Some(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => format!(
                "the broker's TLS certificate does not name '{host}' ({e}); connect with a host name the \
                 certificate lists, or set ssl.endpoint.identification.algorithm= (empty) to skip the host name check"
            ),
            Some(rustls::Error::InvalidCertificate(c)) => format!(
                "the broker's TLS certificate is not trusted ({c:?}); check that {} holds the CA that signed it",
                self.trust_key
            ),
            Some(rustls::Error::AlertReceived(alert)) => format!(
                "the broker refused the TLS session (alert {alert:?}); {}",
                if self.has_client_cert {
                    "check that the broker trusts the CA of the client certificate (ssl.keystore.* / ssl.certificate.location)"
                } else {
                    "if the listener requires a client certificate (mTLS), set ssl.keystore.location \
                     (PEM with key and chain) or ssl.certificate.location and ssl.key.location"
                }
            ),
            Some(rustls::Error::InvalidMessage(_)) | Some(rustls::Error::InappropriateMessage { .. }) => format!(
                "the broker did not answer in TLS ({e}); is this a PLAINTEXT or SASL_PLAINTEXT listener? \
                 security.protocol=SSL/SASL_SSL needs the broker's TLS listener"
            ),
            Some(other) => format!("TLS failed: {other}"),
            None => match e.kind() {
                std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe => format!(
                    "the broker closed the connection during the TLS handshake ({e}); is this a PLAINTEXT or \
                     SASL_PLAINTEXT listener? security.protocol=SSL/SASL_SSL needs the broker's TLS listener"
                ),
                _ => format!("TLS handshake failed: {e}"),
            },
        }
    }
}

/// Every certificate in a PEM source.
fn certificates(source: &PemSource) -> Result<Vec<CertificateDer<'static>>, SecurityError> {
    let text = source.read()?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<_, _>>()
        .map_err(|e| SecurityError::Pem {
            key: source.key().to_owned(),
            what: "certificate",
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(SecurityError::Pem {
            key: source.key().to_owned(),
            what: "certificate",
            reason: "no -----BEGIN CERTIFICATE----- block found (only PEM is read)".into(),
        });
    }
    Ok(certs)
}

/// The private key in a PEM source; an encrypted PKCS#8 key (`ENCRYPTED PRIVATE KEY`, what
/// `openssl pkcs8 -topk8` writes and Kafka's PEM keystores read) is decrypted with
/// `ssl.key.password`.
fn private_key(
    source: &PemSource,
    password: Option<&Password>,
) -> Result<PrivateKeyDer<'static>, SecurityError> {
    let text = source.read()?;
    let pem_error = |reason: String| SecurityError::Pem {
        key: source.key().to_owned(),
        what: "private key",
        reason,
    };
    if let Some(block) = encrypted_block(&text) {
        let Some(password) = password else {
            return Err(pem_error(
                "the key is encrypted: set ssl.key.password to its password".into(),
            ));
        };
        let (_, document) = pkcs8::Document::from_pem(block).map_err(|e| {
            pem_error(format!(
                "the ENCRYPTED PRIVATE KEY block cannot be read: {e}"
            ))
        })?;
        let info = pkcs8::EncryptedPrivateKeyInfo::try_from(document.as_bytes()).map_err(|e| {
            pem_error(format!(
                "the ENCRYPTED PRIVATE KEY block is not PKCS#8: {e}"
            ))
        })?;
        let decrypted = info.decrypt(password.expose()).map_err(|e| {
            pem_error(format!(
                "ssl.key.password does not decrypt the key ({e}); check the password, and that the \
                 key was encrypted with PBES2 (AES) or 3DES"
            ))
        })?;
        return Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            decrypted.as_bytes().to_vec(),
        )));
    }
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| {
        pem_error(format!(
            "{e}; expected a -----BEGIN PRIVATE KEY----- (PKCS#8), RSA, EC or ENCRYPTED PRIVATE KEY block"
        ))
    })
}

/// The `ENCRYPTED PRIVATE KEY` PEM block of a file that may also hold certificates.
fn encrypted_block(text: &[u8]) -> Option<&str> {
    const BEGIN: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
    const END: &str = "-----END ENCRYPTED PRIVATE KEY-----";
    let text = std::str::from_utf8(text).ok()?;
    let start = text.find(BEGIN)?;
    let end = start + text[start..].find(END)? + END.len();
    Some(&text[start..end])
}

/// Checks the chain against the trusted CAs but not the host name
/// (`ssl.endpoint.identification.algorithm` empty).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
