//! Certificates made per proxy with rcgen, and the rustls server configuration built from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use super::ProxyError;

/// Certificates made for one proxy: a CA, a server certificate for 127.0.0.1 and localhost
/// signed by it, a client certificate for mTLS signed by it, and an unrelated CA (with a client
/// certificate of its own) for failure tests. All PEM, kept in memory and written to files in a
/// temporary directory that is removed when this is dropped.
pub struct TestPki {
    pub ca_pem: String,
    pub ca_path: PathBuf,
    pub client_cert_pem: String,
    pub client_cert_path: PathBuf,
    pub client_key_pem: String,
    pub client_key_path: PathBuf,
    /// A CA that did NOT sign the server certificate.
    pub untrusted_ca_path: PathBuf,
    /// A client certificate (and key) signed by the untrusted CA: refused where mTLS is required.
    pub untrusted_client_cert_path: PathBuf,
    pub untrusted_client_key_path: PathBuf,
    server_cert: CertificateDer<'static>,
    server_key: Vec<u8>,
    ca_cert: CertificateDer<'static>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// A CA: its certificate and the issuer that signs with its key.
struct Ca {
    cert: rcgen::Certificate,
    issuer: Issuer<'static, KeyPair>,
}

fn pki_error(what: &str) -> impl Fn(rcgen::Error) -> ProxyError + '_ {
    move |e| ProxyError::Pki(format!("{what}: {e}"))
}

fn new_ca(name: &str) -> Result<Ca, ProxyError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().map_err(pki_error("CA key"))?;
    let cert = params
        .self_signed(&key)
        .map_err(pki_error("CA certificate"))?;
    Ok(Ca {
        cert,
        issuer: Issuer::new(params, key),
    })
}

fn new_leaf(
    ca: &Ca,
    name: &str,
    server: bool,
) -> Result<(rcgen::Certificate, KeyPair), ProxyError> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if server {
        params.subject_alt_names = vec![
            SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])),
            SanType::DnsName("localhost".try_into().map_err(pki_error("SAN localhost"))?),
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    let key = KeyPair::generate().map_err(pki_error("leaf key"))?;
    let cert = params
        .signed_by(&key, &ca.issuer)
        .map_err(pki_error("leaf certificate"))?;
    Ok((cert, key))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, ProxyError> {
    let path = dir.join(name);
    std::fs::write(&path, text)
        .map_err(|e| ProxyError::Pki(format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}

impl TestPki {
    /// Makes a fresh set of certificates and writes them under a new temporary directory.
    pub fn generate() -> Result<TestPki, ProxyError> {
        let ca = new_ca("Spillway test CA")?;
        let (server, server_key) = new_leaf(&ca, "localhost", true)?;
        let (client, client_key) = new_leaf(&ca, "spillway-test-client", false)?;
        let untrusted = new_ca("Untrusted test CA")?;
        let (untrusted_client, untrusted_client_key) =
            new_leaf(&untrusted, "untrusted-client", false)?;
        let dir = tempfile::Builder::new()
            .prefix("spillway-proxy-pki-")
            .tempdir()
            .map_err(|e| ProxyError::Pki(format!("cannot create a temporary directory: {e}")))?;
        let ca_pem = ca.cert.pem();
        let client_cert_pem = client.pem();
        let client_key_pem = client_key.serialize_pem();
        Ok(TestPki {
            ca_path: write(dir.path(), "ca.pem", &ca_pem)?,
            client_cert_path: write(dir.path(), "client.pem", &client_cert_pem)?,
            client_key_path: write(dir.path(), "client.key", &client_key_pem)?,
            untrusted_ca_path: write(dir.path(), "untrusted-ca.pem", &untrusted.cert.pem())?,
            untrusted_client_cert_path: write(
                dir.path(),
                "untrusted-client.pem",
                &untrusted_client.pem(),
            )?,
            untrusted_client_key_path: write(
                dir.path(),
                "untrusted-client.key",
                &untrusted_client_key.serialize_pem(),
            )?,
            ca_pem,
            client_cert_pem,
            client_key_pem,
            server_cert: server.der().clone(),
            server_key: server_key.serialize_der(),
            ca_cert: ca.cert.der().clone(),
            dir,
        })
    }

    /// The directory holding the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A rustls server configuration presenting the server certificate; with
    /// `require_client_certificate`, clients must present a certificate signed by the test CA.
    pub(crate) fn server_config(
        &self,
        require_client_certificate: bool,
    ) -> Result<ServerConfig, ProxyError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ProxyError::Tls(format!("protocol versions: {e}")))?;
        let builder = if require_client_certificate {
            let mut roots = RootCertStore::empty();
            roots
                .add(self.ca_cert.clone())
                .map_err(|e| ProxyError::Tls(format!("test CA as client trust root: {e}")))?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ProxyError::Tls(format!("client certificate verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key.clone()));
        builder
            .with_single_cert(vec![self.server_cert.clone()], key)
            .map_err(|e| ProxyError::Tls(format!("server certificate: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_exist_while_the_pki_lives_and_go_with_it() {
        let pki = TestPki::generate().unwrap();
        let dir = pki.dir().to_path_buf();
        for path in [
            &pki.ca_path,
            &pki.client_cert_path,
            &pki.client_key_path,
            &pki.untrusted_ca_path,
        ] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with("-----BEGIN"), "{}", path.display());
        }
        assert_eq!(std::fs::read_to_string(&pki.ca_path).unwrap(), pki.ca_pem);
        assert!(pki.server_config(true).is_ok());
        assert!(pki.server_config(false).is_ok());
        drop(pki);
        assert!(!dir.exists(), "{} outlived the pki", dir.display());
    }
}
