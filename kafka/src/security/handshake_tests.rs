//! The native client's TLS and SASL handshakes against an in-process broker stand-in: a
//! rustls server (optionally requiring a client certificate) that answers ApiVersions,
//! SaslHandshake and SaslAuthenticate (PLAIN, and SCRAM with scram-rs's server), then Metadata.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse, RequestHeader,
    ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use scram_rs::scram_sync::{ScramServerDyn, SyncScramServer};
use scram_rs::{
    ScramAuthServer, ScramCbHelper, ScramNonce, ScramPassword, ScramResult, ScramResultServer,
    ScramSha256Ring, ScramSha512Ring, SCRAM_TYPES,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use super::SecuritySettings;
use crate::connection::{Connection, ConnectionError};

const T: Duration = Duration::from_secs(5);
const ENCRYPTED_KEY_PASSWORD: &str = "key-secret";

/// A CA, a server certificate for 127.0.0.1 signed by it, and a client certificate.
struct Pki {
    dir: tempfile::TempDir,
    ca_pem: String,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
    ca_der: CertificateDer<'static>,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&server_key, &*ca)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let client = CertificateParams::new(vec!["client".to_owned()])
            .unwrap()
            .signed_by(&client_key, &*ca)
            .unwrap();
        let other_key = KeyPair::generate().unwrap();
        let mut other_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let other = other_params.self_signed(&other_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("other-ca.pem"), other.pem()).unwrap();
        std::fs::write(
            dir.path().join("client.pem"),
            format!("{}{}", client_key.serialize_pem(), client.pem()),
        )
        .unwrap();
        // The same key encrypted as `openssl pkcs8 -topk8 -v2 aes-256-cbc` writes it.
        let der = client_key.serialize_der();
        let encrypted = pkcs8::PrivateKeyInfo::try_from(der.as_slice())
            .unwrap()
            .encrypt_with_params(
                pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(
                    2048,
                    b"spillway-test-salt",
                    &[7u8; 16],
                )
                .unwrap(),
                ENCRYPTED_KEY_PASSWORD,
            )
            .unwrap()
            .to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)
            .unwrap();
        std::fs::write(
            dir.path().join("client-encrypted.pem"),
            format!("{}{}", client.pem(), &*encrypted),
        )
        .unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            server_chain: vec![server.der().clone()],
            server_key: PrivateKeyDer::from_pem_slice(server_key.serialize_pem().as_bytes())
                .unwrap(),
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn server_config(&self, require_client_cert: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca_der.clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(
            builder
                .with_single_cert(self.server_chain.clone(), self.server_key.clone_key())
                .unwrap(),
        )
    }
}

/// What the stand-in broker's listener does.
#[derive(Clone)]
struct Listener {
    tls: Option<Arc<rustls::ServerConfig>>,
    /// SASL mechanism enabled, with the one user it knows.
    sasl: Option<(&'static str, &'static str, &'static str)>,
}

#[derive(Debug)]
struct Users(&'static str, &'static str);

impl ScramCbHelper for &Users {}

impl<S: scram_rs::ScramHashing> ScramAuthServer<S> for &Users {
    fn get_password_for_user(
        &self,
        user: &str,
        _authzid: Option<&str>,
    ) -> ScramResult<ScramPassword> {
        if user == self.0 {
            ScramPassword::found_plaintext_password::<S>(self.1.as_bytes(), None)
        } else {
            ScramPassword::not_found::<S>()
        }
    }
}

/// Start the listener; returns its address.
async fn broker(listener: Listener) -> String {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tcp.accept().await.unwrap();
            let l = listener.clone();
            tokio::spawn(async move {
                match &l.tls {
                    None => serve(stream, l.sasl).await,
                    Some(config) => {
                        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::clone(config));
                        if let Ok(s) = acceptor.accept(stream).await {
                            serve(s, l.sasl).await
                        }
                    }
                }
            });
        }
    });
    addr
}

fn respond<T: Encodable + HeaderVersion>(correlation: i32, version: i16, body: &T) -> Bytes {
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation;
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, T::header_version(version)).unwrap();
    body.encode(&mut buf, version).unwrap();
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    sasl: Option<(&'static str, &'static str, &'static str)>,
) {
    let users = sasl.map(|(_, u, p)| Users(u, p));
    let mut scram: Option<Box<dyn ScramServerDyn + Send + '_>> = None;
    let mut authenticated = sasl.is_none();
    loop {
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).await.is_err() {
            return;
        }
        let size = i32::from_be_bytes(len);
        if !(0..1 << 20).contains(&size) {
            // Not a Kafka frame (a TLS ClientHello on a plaintext listener): hang up, as Kafka does.
            return;
        }
        let mut frame = vec![0u8; size as usize];
        if s.read_exact(&mut frame).await.is_err() {
            return;
        }
        let mut buf = Bytes::from(frame);
        let key = i16::from_be_bytes([buf[0], buf[1]]);
        let version = i16::from_be_bytes([buf[2], buf[3]]);
        let out = match key {
            18 => {
                let h =
                    RequestHeader::decode(&mut buf, ApiVersionsRequest::header_version(version))
                        .unwrap();
                let mut r = ApiVersionsResponse::default();
                for (k, min, max) in [(3i16, 0i16, 12i16), (17, 0, 1), (36, 0, 2), (18, 0, 3)] {
                    let mut v = ApiVersion::default();
                    v.api_key = k;
                    v.min_version = min;
                    v.max_version = max;
                    r.api_keys.push(v);
                }
                respond(h.correlation_id, version, &r)
            }
            17 => {
                let h =
                    RequestHeader::decode(&mut buf, SaslHandshakeRequest::header_version(version))
                        .unwrap();
                let req = SaslHandshakeRequest::decode(&mut buf, version).unwrap();
                let mut r = SaslHandshakeResponse::default();
                match sasl {
                    None => r.error_code = 34,
                    Some((mechanism, ..)) => {
                        r.mechanisms = vec![StrBytes::from_static_str(mechanism)];
                        if req.mechanism.as_str() != mechanism {
                            r.error_code = 33;
                        } else if mechanism.starts_with("SCRAM") {
                            let users: &Users = users.as_ref().unwrap();
                            let t = SCRAM_TYPES.get_scramtype(mechanism).unwrap();
                            scram = Some(if mechanism == "SCRAM-SHA-256" {
                                Box::new(
                                    SyncScramServer::<ScramSha256Ring, &Users, &Users>::new(
                                        users,
                                        users,
                                        ScramNonce::none().unwrap(),
                                        t,
                                        true,
                                    )
                                    .unwrap(),
                                )
                            } else {
                                Box::new(
                                    SyncScramServer::<ScramSha512Ring, &Users, &Users>::new(
                                        users,
                                        users,
                                        ScramNonce::none().unwrap(),
                                        t,
                                        true,
                                    )
                                    .unwrap(),
                                )
                            });
                        }
                    }
                }
                respond(h.correlation_id, version, &r)
            }
            36 => {
                let h = RequestHeader::decode(
                    &mut buf,
                    SaslAuthenticateRequest::header_version(version),
                )
                .unwrap();
                let req = SaslAuthenticateRequest::decode(&mut buf, version).unwrap();
                let mut r = SaslAuthenticateResponse::default();
                let (mechanism, user, password) = sasl.unwrap();
                if mechanism == "PLAIN" {
                    let expected = format!("\0{user}\0{password}");
                    if req.auth_bytes[..] == *expected.as_bytes() {
                        authenticated = true;
                    } else {
                        r.error_code = 58;
                        r.error_message = Some(StrBytes::from_static_str(
                            "Authentication failed: Invalid username or password",
                        ));
                    }
                } else {
                    let server = scram.as_mut().unwrap();
                    match server.parse_response(&String::from_utf8_lossy(&req.auth_bytes)) {
                        ScramResultServer::Data(d) => r.auth_bytes = Bytes::from(d),
                        ScramResultServer::Final(d) => {
                            authenticated = true;
                            r.auth_bytes = Bytes::from(d);
                        }
                        ScramResultServer::Error(_) => {
                            r.error_code = 58;
                            r.error_message = Some(StrBytes::from_string(format!(
                                "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
                            )));
                        }
                    }
                }
                respond(h.correlation_id, version, &r)
            }
            3 if authenticated => {
                let h = RequestHeader::decode(&mut buf, MetadataRequest::header_version(version))
                    .unwrap();
                respond(h.correlation_id, version, &MetadataResponse::default())
            }
            // Anything else before authentication: Kafka closes the connection.
            _ => return,
        };
        let _ = buf.remaining();
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn client(pairs: &[(&str, &str)]) -> super::ClientSecurity {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    SecuritySettings::from_config(&map)
        .unwrap()
        .client_security()
        .unwrap()
}

async fn connect(
    addr: &str,
    security: &super::ClientSecurity,
) -> Result<Connection, ConnectionError> {
    let conn = Connection::connect_secured(addr, "test", T, security).await?;
    // A request after the handshake goes through.
    conn.request(&MetadataRequest::default(), 12, T).await?;
    Ok(conn)
}

#[tokio::test]
async fn tls_with_a_pem_truststore_and_the_host_name_checked() {
    let pki = Pki::new();
    let addr = broker(Listener {
        tls: Some(pki.server_config(false)),
        sasl: None,
    })
    .await;
    let ca = pki.path("ca.pem");
    connect(
        &addr,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.location", &ca),
        ]),
    )
    .await
    .expect("TLS");
    connect(
        &addr,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.truststore.certificates", &pki.ca_pem),
        ]),
    )
    .await
    .expect("inline CA");
    // The certificate names 127.0.0.1 and localhost, not 127.0.0.2.
    let other_host = addr.replace("127.0.0.1", "localhost");
    connect(
        &other_host,
        &client(&[("security.protocol", "SSL"), ("ssl.ca.location", &ca)]),
    )
    .await
    .expect("localhost is named");
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_security_error_naming_the_trust_key() {
    let pki = Pki::new();
    let addr = broker(Listener {
        tls: Some(pki.server_config(false)),
        sasl: None,
    })
    .await;
    let err = connect(
        &addr,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", &pki.path("other-ca.pem")),
        ]),
    )
    .await
    .expect_err("untrusted");
    let text = err.to_string();
    assert!(err.is_security_error(), "{text}");
    assert!(
        text.contains("not trusted") && text.contains("ssl.ca.location"),
        "{text}"
    );
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = Pki::new();
    let addr = broker(Listener {
        tls: Some(pki.server_config(true)),
        sasl: None,
    })
    .await;
    let ca = pki.path("ca.pem");
    connect(
        &addr,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.truststore.location", &ca),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", &pki.path("client.pem")),
        ]),
    )
    .await
    .expect("mTLS");
    let err = connect(
        &addr,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.truststore.location", &ca),
        ]),
    )
    .await
    .expect_err("no client certificate");
    let text = err.to_string();
    assert!(err.is_security_error(), "{text}");
    assert!(text.contains("client certificate"), "{text}");
}

#[tokio::test]
async fn plaintext_to_a_tls_listener_and_tls_to_a_plaintext_listener_say_so() {
    let pki = Pki::new();
    let tls = broker(Listener {
        tls: Some(pki.server_config(false)),
        sasl: None,
    })
    .await;
    let err = connect(&tls, &client(&[]))
        .await
        .expect_err("plaintext to TLS");
    let text = err.to_string();
    assert!(err.is_security_error(), "{text}");
    assert!(text.contains("security.protocol=SSL"), "{text}");
    let plain = broker(Listener {
        tls: None,
        sasl: None,
    })
    .await;
    let err = connect(
        &plain,
        &client(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", &pki.path("ca.pem")),
        ]),
    )
    .await
    .expect_err("TLS to plaintext");
    let text = err.to_string();
    assert!(err.is_security_error(), "{text}");
    assert!(text.contains("PLAINTEXT"), "{text}");
}

#[tokio::test]
async fn sasl_plain_and_scram_over_tls_and_refused_credentials() {
    let pki = Pki::new();
    let ca = pki.path("ca.pem");
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let module = if mechanism == "PLAIN" {
            "plain.PlainLoginModule"
        } else {
            "scram.ScramLoginModule"
        };
        let addr = broker(Listener {
            tls: Some(pki.server_config(false)),
            sasl: Some((mechanism, "alice", "alice-secret")),
        })
        .await;
        let jaas = |password: &str| {
            format!("org.apache.kafka.common.security.{module} required username=\"alice\" password=\"{password}\";")
        };
        let good = jaas("alice-secret");
        connect(
            &addr,
            &client(&[
                ("security.protocol", "SASL_SSL"),
                ("ssl.ca.location", &ca),
                ("sasl.mechanism", mechanism),
                ("sasl.jaas.config", &good),
            ]),
        )
        .await
        .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        let bad = jaas("wrong-secret");
        let err = connect(
            &addr,
            &client(&[
                ("security.protocol", "SASL_SSL"),
                ("ssl.ca.location", &ca),
                ("sasl.mechanism", mechanism),
                ("sasl.jaas.config", &bad),
            ]),
        )
        .await
        .expect_err("wrong password");
        let text = err.to_string();
        assert!(err.is_security_error(), "{text}");
        assert!(
            text.contains(&format!("SASL {mechanism} authentication of 'alice'"))
                && text.contains("check the user name and password"),
            "{text}"
        );
        assert!(!text.contains("wrong-secret"), "{text}");
        // librdkafka spelling, and a mechanism the listener does not enable.
        let other = if mechanism == "PLAIN" {
            "SCRAM-SHA-256"
        } else {
            "PLAIN"
        };
        let err = connect(
            &addr,
            &client(&[
                ("security.protocol", "SASL_SSL"),
                ("ssl.ca.location", &ca),
                ("sasl.mechanisms", other),
                ("sasl.username", "alice"),
                ("sasl.password", "alice-secret"),
            ]),
        )
        .await
        .expect_err("mechanism not enabled");
        assert!(
            err.to_string().contains(&format!("it offers: {mechanism}")),
            "{err}"
        );
    }
}

#[tokio::test]
async fn sasl_against_a_listener_without_it_says_so() {
    let addr = broker(Listener {
        tls: None,
        sasl: None,
    })
    .await;
    let err = connect(
        &addr,
        &client(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ]),
    )
    .await
    .expect_err("no SASL there");
    assert!(err.is_security_error(), "{err}");
    assert!(err.to_string().contains("does not expect SASL"), "{err}");
}

#[tokio::test]
async fn mutual_tls_with_an_encrypted_key_and_ssl_key_password() {
    let pki = Pki::new();
    let addr = broker(Listener {
        tls: Some(pki.server_config(true)),
        sasl: None,
    })
    .await;
    let ca = pki.path("ca.pem");
    let keystore = pki.path("client-encrypted.pem");
    let keys = |password: Option<&str>| {
        let mut map: BTreeMap<String, String> = [
            ("security.protocol", "SSL"),
            ("ssl.truststore.location", ca.as_str()),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", keystore.as_str()),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        if let Some(p) = password {
            map.insert("ssl.key.password".into(), p.into());
        }
        SecuritySettings::from_config(&map)
            .unwrap()
            .client_security()
    };
    let security = keys(Some(ENCRYPTED_KEY_PASSWORD)).expect("the password decrypts the key");
    connect(&addr, &security)
        .await
        .expect("mTLS with the decrypted key");

    let missing = keys(None)
        .expect_err("an encrypted key without its password")
        .to_string();
    assert!(missing.contains("set ssl.key.password"), "{missing}");
    let wrong = keys(Some("not-the-password"))
        .expect_err("a wrong password")
        .to_string();
    assert!(
        wrong.contains("ssl.key.password does not decrypt"),
        "{wrong}"
    );
    assert!(
        !wrong.contains("not-the-password"),
        "the password is never shown: {wrong}"
    );
}
