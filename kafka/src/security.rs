//! One translation of the security keys users bring — Kafka/Connect Java style
//! (`ssl.truststore.*`, `ssl.keystore.*`, `sasl.jaas.config`) and librdkafka style
//! (`ssl.ca.location`, `sasl.username`, ...) — into a [`SecuritySettings`] value. The same value
//! gives rdkafka its `ClientConfig` entries ([`SecuritySettings::rdkafka_entries`]) and the
//! native share client its [`ClientSecurity`] ([`SecuritySettings::client_security`]), so a
//! connector reaches a secured cluster the same way in share and classic mode.
//!
//! Secrets (passwords, client secrets, private keys given inline) are held as
//! [`Password`]s: their `Debug`/`Display` print `[hidden]`.

mod oauth;
mod rdkafka_context;
mod sasl;
mod tls;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use spillway_core::config::Password;
use spillway_core::egress::EgressPolicy;
use spillway_core::ConfigError;
use thiserror::Error;

pub use oauth::{OAuthToken, TokenFetcher};
pub use rdkafka_context::{rdkafka_config, SecurityContext};
pub use sasl::authenticate;
pub use tls::TlsConnector;

/// Why the security keys do not make a usable setting. Every message names the key as the
/// user wrote it and what to do.
#[derive(Debug, Error)]
pub enum SecurityError {
    #[error("invalid value '{value}' for {key}: {reason}")]
    Invalid {
        key: String,
        /// `[hidden]` for secrets.
        value: String,
        reason: String,
    },
    #[error("{key} is required: {reason}")]
    Missing { key: String, reason: String },
    #[error("cannot read {key} file '{path}': {reason}")]
    File {
        key: String,
        path: String,
        reason: String,
    },
    #[error("{key} holds no usable PEM {what}: {reason}")]
    Pem {
        key: String,
        what: &'static str,
        reason: String,
    },
    #[error("{0}")]
    Conflict(String),
}

impl SecurityError {
    /// The same message as a config error, for the layers that report [`ConfigError`]s.
    pub fn into_config_error(self) -> ConfigError {
        match self {
            SecurityError::Invalid { key, value, reason } => {
                ConfigError::InvalidValue { key, value, reason }
            }
            // On the key, so `validate` shows the error where it is to be fixed.
            SecurityError::File { key, path, reason } => ConfigError::InvalidValue {
                key,
                value: path,
                reason: format!("cannot read the file: {reason}"),
            },
            other => ConfigError::Conflict(other.to_string()),
        }
    }
}

/// `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// `sasl.mechanism` (Java) / `sasl.mechanisms` (librdkafka).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl SaslMechanism {
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    fn parse(key: &str, value: &str) -> Result<SaslMechanism, SecurityError> {
        match value.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            "OAUTHBEARER" => Ok(SaslMechanism::OAuthBearer),
            _ => Err(SecurityError::Invalid {
                key: key.to_owned(),
                value: value.to_owned(),
                reason: "expected PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER \
                         (GSSAPI/Kerberos is not supported)"
                    .into(),
            }),
        }
    }
}

/// PEM text from a file or given inline, with the key it came from (for errors).
#[derive(Clone, PartialEq, Eq)]
pub enum PemSource {
    File {
        key: String,
        path: PathBuf,
    },
    /// Inline PEM; held as a secret because it may be a private key.
    Inline {
        key: String,
        pem: Password,
    },
}

impl PemSource {
    pub fn key(&self) -> &str {
        match self {
            PemSource::File { key, .. } | PemSource::Inline { key, .. } => key,
        }
    }

    /// The PEM text.
    pub fn read(&self) -> Result<Vec<u8>, SecurityError> {
        match self {
            PemSource::File { key, path } => std::fs::read(path).map_err(|e| SecurityError::File {
                key: key.clone(),
                path: path.display().to_string(),
                reason: e.to_string(),
            }),
            PemSource::Inline { pem, .. } => Ok(pem.expose().as_bytes().to_vec()),
        }
    }
}

impl fmt::Debug for PemSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PemSource::File { key, path } => write!(f, "{key}={}", path.display()),
            PemSource::Inline { key, .. } => write!(f, "{key}=[inline PEM]"),
        }
    }
}

/// The client certificate for mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The certificate chain, leaf first.
    pub chain: PemSource,
    /// The private key (may be the same file as the chain).
    pub key: PemSource,
    /// `ssl.key.password`: the password of an encrypted private key.
    pub key_password: Option<Password>,
}

/// TLS settings (`security.protocol` SSL or SASL_SSL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// CA certificates to trust; `None`: the public web roots (webpki-roots) for the native
    /// client, the system's CA store for librdkafka.
    pub trust: Option<PemSource>,
    pub client: Option<ClientCertificate>,
    /// Check that the broker's certificate names the host connected to (Kafka's default,
    /// off when `ssl.endpoint.identification.algorithm` is empty).
    pub verify_hostname: bool,
}

/// OIDC client-credentials settings for OAUTHBEARER.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    pub token_endpoint: String,
    pub client_id: String,
    pub client_secret: Password,
    pub scope: Option<String>,
}

impl fmt::Debug for OAuthSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthSettings")
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("scope", &self.scope)
            .finish()
    }
}

/// What the client proves itself with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslCredentials {
    /// PLAIN and SCRAM.
    UserPassword {
        username: String,
        password: Password,
    },
    /// OAUTHBEARER with tokens from an OIDC token endpoint.
    OAuth(OAuthSettings),
}

/// SASL settings (`security.protocol` SASL_PLAINTEXT or SASL_SSL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslSettings {
    pub mechanism: SaslMechanism,
    pub credentials: SaslCredentials,
}

impl SaslSettings {
    /// Who authenticates: the user name, or the OAuth client id.
    pub fn principal(&self) -> &str {
        match &self.credentials {
            SaslCredentials::UserPassword { username, .. } => username,
            SaslCredentials::OAuth(o) => &o.client_id,
        }
    }
}

/// The security of one Kafka client, from whichever spelling the user wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecuritySettings {
    pub protocol: SecurityProtocol,
    pub tls: Option<TlsSettings>,
    pub sasl: Option<SaslSettings>,
    /// `ssl.*`/`sasl.*` keys this translation does not read, passed to librdkafka unchanged
    /// (e.g. `ssl.cipher.suites`); the native client names them in [`Self::warnings`].
    pub passthrough: Vec<(String, String)>,
    /// Keys read but without effect, to be logged once (they name keys, never values).
    pub warnings: Vec<String>,
}

/// Java client keys that have no meaning for these clients (JVM TLS providers, Kerberos,
/// login retry tuning); accepted and not passed to librdkafka, which would refuse them.
const JAVA_ONLY: &[&str] = &[
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.provider",
    "ssl.keymanager.algorithm",
    "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation",
    "ssl.engine.factory.class",
    "ssl.truststore.password",
    "ssl.keystore.password",
    "sasl.login.callback.handler.class",
    "sasl.login.class",
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.buffer.seconds",
    "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms",
    "sasl.login.retry.backoff.ms",
    "sasl.login.retry.backoff.max.ms",
    "sasl.client.callback.handler.class",
    "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.scope.claim.name",
];

/// The one OAuth login callback handler we stand in for.
const OAUTH_CALLBACK_HANDLERS: &[&str] = &[
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
];

/// Whether `name` (a client key without any prefix) is a security key.
pub fn is_security_key(name: &str) -> bool {
    name == "security.protocol" || name.starts_with("ssl.") || name.starts_with("sasl.")
}

/// Whether the value of `name` is secret (masked in errors).
pub fn is_secret_key(name: &str) -> bool {
    name.contains("password")
        || name.ends_with("jaas.config")
        || name.ends_with("secret")
        || name == "ssl.keystore.key"
        || name == "ssl.key.pem"
}

/// One key as given: its name without prefix, the value, and the key as the user wrote it.
#[derive(Clone, Copy)]
struct Given<'a> {
    value: &'a str,
    key: &'a str,
}

impl Given<'_> {
    fn shown(&self, name: &str) -> String {
        if is_secret_key(name) {
            "[hidden]".into()
        } else {
            self.value.to_owned()
        }
    }
}

impl SecuritySettings {
    /// Plaintext, no SASL.
    pub fn plaintext() -> SecuritySettings {
        SecuritySettings::default()
    }

    /// Translate a client config whose keys have no prefix (every non-security key is skipped).
    pub fn from_config(
        config: &BTreeMap<String, String>,
    ) -> Result<SecuritySettings, SecurityError> {
        SecuritySettings::from_keys(
            config
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str(), k.as_str())),
        )
    }

    /// Translate `(name, value, key as written)` triples; a later triple for the same name
    /// wins (pass the worker's keys first, the connector's overrides last). Non-security
    /// names are skipped.
    pub fn from_keys<'a>(
        keys: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> Result<SecuritySettings, SecurityError> {
        let mut given: BTreeMap<&'a str, Given<'a>> = BTreeMap::new();
        for (name, value, key) in keys {
            if is_security_key(name) {
                // librdkafka's plural spelling of the mechanism is the same setting.
                let name = if name == "sasl.mechanisms" {
                    "sasl.mechanism"
                } else {
                    name
                };
                given.insert(
                    name,
                    Given {
                        value: value.trim(),
                        key,
                    },
                );
            }
        }
        Translation {
            given,
            used: Vec::new(),
        }
        .run()
    }

    /// Whether anything but plaintext is configured.
    pub fn is_secured(&self) -> bool {
        self.protocol != SecurityProtocol::Plaintext
    }

    /// One line for logs and errors: protocol, mechanism and principal, never a secret.
    pub fn describe(&self) -> String {
        match &self.sasl {
            Some(s) => format!(
                "{} with SASL {} as '{}'",
                self.protocol.name(),
                s.mechanism.name(),
                s.principal()
            ),
            None => self.protocol.name().to_owned(),
        }
    }

    /// The librdkafka settings (its key names). OAUTHBEARER needs the client's context to
    /// hand over tokens too ([`SecurityContext`]).
    pub fn rdkafka_entries(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = vec![(
            "security.protocol".into(),
            self.protocol.name().to_ascii_lowercase(),
        )];
        if let Some(tls) = &self.tls {
            match &tls.trust {
                Some(PemSource::File { path, .. }) => {
                    out.push(("ssl.ca.location".into(), path.display().to_string()))
                }
                Some(PemSource::Inline { pem, .. }) => {
                    out.push(("ssl.ca.pem".into(), pem.expose().to_owned()))
                }
                None => {}
            }
            if let Some(client) = &tls.client {
                match &client.chain {
                    PemSource::File { path, .. } => out.push((
                        "ssl.certificate.location".into(),
                        path.display().to_string(),
                    )),
                    PemSource::Inline { pem, .. } => {
                        out.push(("ssl.certificate.pem".into(), pem.expose().to_owned()))
                    }
                }
                match &client.key {
                    PemSource::File { path, .. } => {
                        out.push(("ssl.key.location".into(), path.display().to_string()))
                    }
                    PemSource::Inline { pem, .. } => {
                        out.push(("ssl.key.pem".into(), pem.expose().to_owned()))
                    }
                }
                if let Some(p) = &client.key_password {
                    out.push(("ssl.key.password".into(), p.expose().to_owned()));
                }
            }
            out.push((
                "ssl.endpoint.identification.algorithm".into(),
                if tls.verify_hostname { "https" } else { "none" }.into(),
            ));
        }
        if let Some(sasl) = &self.sasl {
            out.push(("sasl.mechanisms".into(), sasl.mechanism.name().into()));
            if let SaslCredentials::UserPassword { username, password } = &sasl.credentials {
                out.push(("sasl.username".into(), username.clone()));
                out.push(("sasl.password".into(), password.expose().to_owned()));
            }
        }
        out.extend(self.passthrough.iter().cloned());
        out
    }

    /// Set [`Self::rdkafka_entries`] on an rdkafka config.
    pub fn apply_to(&self, config: &mut rdkafka::ClientConfig) {
        for (k, v) in self.rdkafka_entries() {
            config.set(k, v);
        }
    }

    /// What the native client connects with: the TLS connector (certificates read and
    /// checked now) and the SASL login.
    pub fn client_security(&self) -> Result<ClientSecurity, SecurityError> {
        let tls = match &self.tls {
            Some(t) => Some(TlsConnector::new(t)?),
            None => None,
        };
        let oauth = match &self.sasl {
            Some(SaslSettings {
                credentials: SaslCredentials::OAuth(o),
                ..
            }) => Some(TokenFetcher::new(o.clone())),
            _ => None,
        };
        Ok(ClientSecurity {
            description: self.describe(),
            protocol: self.protocol,
            tls,
            sasl: self.sasl.clone(),
            oauth,
            egress: None,
        })
    }

    /// The token fetcher for OAUTHBEARER, shared by all clients made from these settings.
    pub fn token_fetcher(&self) -> Option<TokenFetcher> {
        match &self.sasl {
            Some(SaslSettings {
                credentials: SaslCredentials::OAuth(o),
                ..
            }) => Some(TokenFetcher::new(o.clone())),
            _ => None,
        }
    }
}

/// What the native client needs to open a secured connection; cheap to clone.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    description: String,
    protocol: SecurityProtocol,
    tls: Option<TlsConnector>,
    sasl: Option<SaslSettings>,
    oauth: Option<TokenFetcher>,
    /// A confined tenant's egress policy: every broker dialled (bootstrap and advertised) is
    /// vetted by it and connected at the vetted address.
    egress: Option<Arc<EgressPolicy>>,
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.description.is_empty() {
            f.write_str("PLAINTEXT")
        } else {
            f.write_str(&self.description)
        }
    }
}

impl ClientSecurity {
    pub fn plaintext() -> ClientSecurity {
        ClientSecurity::default()
    }

    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    pub fn tls(&self) -> Option<&TlsConnector> {
        self.tls.as_ref()
    }

    pub fn sasl(&self) -> Option<&SaslSettings> {
        self.sasl.as_ref()
    }

    pub fn token_fetcher(&self) -> Option<&TokenFetcher> {
        self.oauth.as_ref()
    }

    /// The same security, every dial vetted by `egress` (a confined tenant's policy for a
    /// cluster it named) when given.
    pub fn with_egress(mut self, egress: Option<Arc<EgressPolicy>>) -> ClientSecurity {
        self.egress = egress;
        self
    }

    /// The egress policy every dial is vetted by, if any.
    pub fn egress(&self) -> Option<&Arc<EgressPolicy>> {
        self.egress.as_ref()
    }

    /// `security.protocol` plus mechanism and principal, for messages.
    pub fn describe(&self) -> &str {
        if self.description.is_empty() {
            "PLAINTEXT"
        } else {
            &self.description
        }
    }
}

/// Shared handle.
pub type SharedSecurity = Arc<ClientSecurity>;

/// The translation of one set of given keys; `used` collects the names read.
struct Translation<'a> {
    given: BTreeMap<&'a str, Given<'a>>,
    used: Vec<&'static str>,
}

impl<'a> Translation<'a> {
    fn get(&mut self, name: &'static str) -> Option<Given<'a>> {
        self.used.push(name);
        self.given.get(name).copied()
    }

    fn invalid(&self, name: &str, reason: impl Into<String>) -> SecurityError {
        let g = &self.given[name];
        SecurityError::Invalid {
            key: g.key.to_owned(),
            value: g.shown(name),
            reason: reason.into(),
        }
    }

    fn written(&self, name: &str) -> String {
        self.given
            .get(name)
            .map_or_else(|| name.to_owned(), |g| g.key.to_owned())
    }

    fn run(mut self) -> Result<SecuritySettings, SecurityError> {
        let protocol = match self.get("security.protocol") {
            None => SecurityProtocol::Plaintext,
            Some(g) => match g.value.to_ascii_uppercase().as_str() {
                "PLAINTEXT" => SecurityProtocol::Plaintext,
                "SSL" => SecurityProtocol::Ssl,
                "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
                "SASL_SSL" => SecurityProtocol::SaslSsl,
                _ => {
                    return Err(self.invalid(
                        "security.protocol",
                        "expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
                    ))
                }
            },
        };
        let tls = self.tls(protocol)?;
        let sasl = self.sasl(protocol)?;
        let mut passthrough = Vec::new();
        let mut warnings = Vec::new();
        for (name, g) in &self.given {
            if self.used.contains(name) {
                continue;
            }
            if JAVA_ONLY.contains(name) {
                warnings.push(format!(
                    "{} is a Java client setting without effect here; it is ignored",
                    g.key
                ));
            } else {
                warnings.push(format!(
                    "{} is passed to librdkafka only; Spillway's share consumer does not apply it",
                    g.key
                ));
                passthrough.push(((*name).to_owned(), g.value.to_owned()));
            }
        }
        Ok(SecuritySettings {
            protocol,
            tls,
            sasl,
            passthrough,
            warnings,
        })
    }

    /// A PEM file key, or `None`.
    fn file(&mut self, name: &'static str) -> Option<PemSource> {
        self.get(name).map(|g| PemSource::File {
            key: g.key.to_owned(),
            path: PathBuf::from(g.value),
        })
    }

    /// An inline PEM key, or `None`.
    fn inline(&mut self, name: &'static str) -> Option<PemSource> {
        self.get(name).map(|g| PemSource::Inline {
            key: g.key.to_owned(),
            pem: Password::new(g.value),
        })
    }

    /// Store types other than PEM cannot be read here.
    fn require_pem_type(
        &mut self,
        name: &'static str,
        location: &'static str,
    ) -> Result<(), SecurityError> {
        let Some(g) = self.get(name) else {
            return Ok(());
        };
        if g.value.eq_ignore_ascii_case("PEM") {
            return Ok(());
        }
        Err(self.invalid(
            name,
            format!(
                "only PEM is supported; convert the store to PEM (e.g. `keytool -exportcert -rfc` \
                 or `openssl pkcs12 -in store.p12 -nodes`), set {name}=PEM and point {} at the file",
                location
            ),
        ))
    }

    fn tls(&mut self, protocol: SecurityProtocol) -> Result<Option<TlsSettings>, SecurityError> {
        // Read even when TLS is off so they count as used (librdkafka must not get them).
        self.require_pem_type("ssl.truststore.type", "ssl.truststore.location")?;
        self.require_pem_type("ssl.keystore.type", "ssl.keystore.location")?;
        let trust_candidates = [
            self.file("ssl.truststore.location"),
            self.inline("ssl.truststore.certificates"),
            self.file("ssl.ca.location"),
            self.inline("ssl.ca.pem"),
        ];
        let mut trust_given: Vec<PemSource> = trust_candidates.into_iter().flatten().collect();
        if trust_given.len() > 1 {
            let keys: Vec<&str> = trust_given.iter().map(PemSource::key).collect();
            return Err(SecurityError::Conflict(format!(
                "the CA certificates to trust are given twice ({}); keep one of them",
                keys.join(", ")
            )));
        }
        let trust = trust_given.pop();
        let client = self.client_certificate()?;
        let verify_hostname = match self.get("ssl.endpoint.identification.algorithm") {
            None => true,
            Some(g) => match g.value.to_ascii_lowercase().as_str() {
                "https" => true,
                "" | "none" => false,
                _ => {
                    return Err(self.invalid(
                        "ssl.endpoint.identification.algorithm",
                        "expected https (check the broker's host name, the default) or an empty value (do not)",
                    ))
                }
            },
        };
        if !protocol.tls() {
            let set: Vec<String> = self
                .given
                .iter()
                .filter(|(n, _)| n.starts_with("ssl.") && !JAVA_ONLY.contains(n))
                .map(|(_, g)| g.key.to_owned())
                .collect();
            if !set.is_empty() {
                return Err(SecurityError::Conflict(format!(
                    "{} set but {} is {}: TLS settings apply only with security.protocol=SSL or SASL_SSL; \
                     set that, or remove them",
                    set.join(", "),
                    self.written("security.protocol"),
                    protocol.name()
                )));
            }
            return Ok(None);
        }
        Ok(Some(TlsSettings {
            trust,
            client,
            verify_hostname,
        }))
    }

    fn client_certificate(&mut self) -> Result<Option<ClientCertificate>, SecurityError> {
        let key_password = self.get("ssl.key.password").map(|g| Password::new(g.value));
        let keystore = self.file("ssl.keystore.location");
        let java_key = self.inline("ssl.keystore.key");
        let java_chain = self.inline("ssl.keystore.certificate.chain");
        let rd_cert = self.file("ssl.certificate.location");
        let rd_key = self.file("ssl.key.location");
        let rd_cert_pem = self.inline("ssl.certificate.pem");
        let rd_key_pem = self.inline("ssl.key.pem");
        let mut forms: Vec<(PemSource, PemSource)> = Vec::new();
        let mut pair = |chain: Option<PemSource>,
                        key: Option<PemSource>,
                        chain_name: &str,
                        key_name: &str|
         -> Result<(), SecurityError> {
            match (chain, key) {
                (Some(c), Some(k)) => {
                    forms.push((c, k));
                    Ok(())
                }
                (Some(c), None) => Err(SecurityError::Missing {
                    key: key_name.to_owned(),
                    reason: format!(
                        "{} gives the client certificate, so the private key is needed too",
                        c.key()
                    ),
                }),
                (None, Some(k)) => Err(SecurityError::Missing {
                    key: chain_name.to_owned(),
                    reason: format!(
                        "{} gives the private key, so the client certificate is needed too",
                        k.key()
                    ),
                }),
                (None, None) => Ok(()),
            }
        };
        pair(
            java_chain,
            java_key,
            "ssl.keystore.certificate.chain",
            "ssl.keystore.key",
        )?;
        pair(
            rd_cert,
            rd_key,
            "ssl.certificate.location",
            "ssl.key.location",
        )?;
        pair(
            rd_cert_pem,
            rd_key_pem,
            "ssl.certificate.pem",
            "ssl.key.pem",
        )?;
        if let Some(store) = keystore {
            // A PEM keystore file holds the key and the chain.
            forms.push((store.clone(), store));
        }
        if forms.len() > 1 {
            let keys: Vec<&str> = forms.iter().map(|(c, _)| c.key()).collect();
            return Err(SecurityError::Conflict(format!(
                "the client certificate is given twice ({}); keep one of them",
                keys.join(", ")
            )));
        }
        Ok(forms.pop().map(|(chain, key)| ClientCertificate {
            chain,
            key,
            key_password,
        }))
    }

    fn sasl(&mut self, protocol: SecurityProtocol) -> Result<Option<SaslSettings>, SecurityError> {
        let mechanism = match self.get("sasl.mechanism") {
            None => None,
            Some(g) => Some(SaslMechanism::parse(g.key, g.value)?),
        };
        let jaas = match self.get("sasl.jaas.config") {
            None => None,
            Some(g) => Some(parse_jaas(g.key, g.value)?),
        };
        let username = self.get("sasl.username").map(|g| g.value.to_owned());
        let password = self.get("sasl.password").map(|g| Password::new(g.value));
        let endpoint = self
            .get("sasl.oauthbearer.token.endpoint.url")
            .map(|g| g.value.to_owned());
        let method = self
            .get("sasl.oauthbearer.method")
            .map(|g| g.value.to_ascii_lowercase());
        let java_id = self
            .get("sasl.oauthbearer.client.credentials.client.id")
            .map(|g| g.value.to_owned());
        let java_secret = self
            .get("sasl.oauthbearer.client.credentials.client.secret")
            .map(|g| Password::new(g.value));
        let rd_id = self
            .get("sasl.oauthbearer.client.id")
            .map(|g| g.value.to_owned());
        let rd_secret = self
            .get("sasl.oauthbearer.client.secret")
            .map(|g| Password::new(g.value));
        let scope_key = self
            .get("sasl.oauthbearer.scope")
            .map(|g| g.value.to_owned());
        let handler = self
            .get("sasl.login.callback.handler.class")
            .map(|g| (g.key.to_owned(), g.value.to_owned()));
        self.used.push("sasl.oauthbearer.config");
        if let Some(m) = method.as_deref() {
            if m != "oidc" && m != "default" {
                return Err(self.invalid(
                    "sasl.oauthbearer.method",
                    "expected oidc (tokens from sasl.oauthbearer.token.endpoint.url)",
                ));
            }
        }
        if !protocol.sasl() {
            let set: Vec<String> = self
                .given
                .iter()
                .filter(|(n, _)| n.starts_with("sasl.") && !JAVA_ONLY.contains(n))
                .map(|(_, g)| g.key.to_owned())
                .collect();
            if !set.is_empty() {
                return Err(SecurityError::Conflict(format!(
                    "{} set but {} is {}: SASL settings apply only with security.protocol=SASL_PLAINTEXT or SASL_SSL; \
                     set that, or remove them",
                    set.join(", "),
                    self.written("security.protocol"),
                    protocol.name()
                )));
            }
            return Ok(None);
        }
        let mechanism_key = self.written("sasl.mechanism");
        let mechanism = match (mechanism, &jaas) {
            (Some(m), _) => m,
            // Java's default is GSSAPI; a login module alone says what was meant.
            (None, Some(j)) if j.module == LoginModule::Plain => SaslMechanism::Plain,
            (None, Some(j)) if j.module == LoginModule::OAuthBearer => SaslMechanism::OAuthBearer,
            (None, _) => {
                return Err(SecurityError::Missing {
                    key: "sasl.mechanism".into(),
                    reason: format!(
                        "{} is {}; set sasl.mechanism to PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER \
                         (Kafka's default, GSSAPI, is not supported)",
                        self.written("security.protocol"),
                        protocol.name()
                    ),
                })
            }
        };
        if let Some(j) = &jaas {
            let fits = match j.module {
                LoginModule::Plain => mechanism == SaslMechanism::Plain,
                LoginModule::Scram => matches!(
                    mechanism,
                    SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512
                ),
                LoginModule::OAuthBearer => mechanism == SaslMechanism::OAuthBearer,
            };
            if !fits {
                return Err(SecurityError::Conflict(format!(
                    "{} uses {} but {mechanism_key} is {}; use {} in the JAAS config",
                    self.written("sasl.jaas.config"),
                    j.module.class(),
                    mechanism.name(),
                    LoginModule::for_mechanism(mechanism).class()
                )));
            }
        }
        let credentials = if mechanism == SaslMechanism::OAuthBearer {
            if let Some((key, class)) = handler {
                if !OAUTH_CALLBACK_HANDLERS.contains(&class.as_str()) {
                    return Err(SecurityError::Invalid {
                        key,
                        value: class,
                        reason:
                            "only Kafka's OAuthBearerLoginCallbackHandler (client credentials from \
                                 sasl.oauthbearer.token.endpoint.url) is supported"
                                .into(),
                    });
                }
            }
            let token_endpoint = endpoint.ok_or_else(|| SecurityError::Missing {
                key: "sasl.oauthbearer.token.endpoint.url".into(),
                reason:
                    "OAUTHBEARER fetches tokens from an OIDC token endpoint (client credentials); \
                         set it to the endpoint's https URL"
                        .into(),
            })?;
            if !(token_endpoint.starts_with("https://") || token_endpoint.starts_with("http://")) {
                return Err(self.invalid(
                    "sasl.oauthbearer.token.endpoint.url",
                    "expected an http(s):// URL of the OIDC token endpoint",
                ));
            }
            let jaas_opt = |name: &str| jaas.as_ref().and_then(|j| j.options.get(name).cloned());
            let client_id = java_id
                .or(rd_id)
                .or_else(|| jaas_opt("clientId"))
                .ok_or_else(|| SecurityError::Missing {
                    key: "sasl.oauthbearer.client.credentials.client.id".into(),
                    reason: "OAUTHBEARER needs the OAuth client id: set it, or sasl.oauthbearer.client.id, \
                             or clientId=\"...\" in sasl.jaas.config"
                        .into(),
                })?;
            let client_secret = java_secret
                .or(rd_secret)
                .or_else(|| jaas_opt("clientSecret").map(Password::new))
                .ok_or_else(|| SecurityError::Missing {
                    key: "sasl.oauthbearer.client.credentials.client.secret".into(),
                    reason: "OAUTHBEARER needs the OAuth client secret: set it, or sasl.oauthbearer.client.secret, \
                             or clientSecret=\"...\" in sasl.jaas.config"
                        .into(),
                })?;
            let scope = scope_key
                .or_else(|| jaas_opt("scope"))
                .filter(|s| !s.is_empty());
            SaslCredentials::OAuth(OAuthSettings {
                token_endpoint,
                client_id,
                client_secret,
                scope,
            })
        } else {
            let from_jaas = jaas.as_ref().map(|j| {
                (
                    j.options.get("username").cloned(),
                    j.options.get("password").cloned().map(Password::new),
                )
            });
            if from_jaas.is_some() && (username.is_some() || password.is_some()) {
                return Err(SecurityError::Conflict(format!(
                    "the SASL credentials are given twice ({} and {}); keep one of them",
                    self.written("sasl.jaas.config"),
                    if username.is_some() {
                        self.written("sasl.username")
                    } else {
                        self.written("sasl.password")
                    }
                )));
            }
            let (username, password) = from_jaas.unwrap_or((username, password));
            let what = if jaas.is_some() {
                format!(
                    "username=\"...\" password=\"...\" in {}",
                    self.written("sasl.jaas.config")
                )
            } else {
                "sasl.jaas.config (Java) or sasl.username and sasl.password (librdkafka)".to_owned()
            };
            let username =
                username
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| SecurityError::Missing {
                        key: if jaas.is_some() {
                            self.written("sasl.jaas.config")
                        } else {
                            "sasl.username".into()
                        },
                        reason: format!("SASL {} needs a user name: set {what}", mechanism.name()),
                    })?;
            let password = password.ok_or_else(|| SecurityError::Missing {
                key: if jaas.is_some() {
                    self.written("sasl.jaas.config")
                } else {
                    "sasl.password".into()
                },
                reason: format!("SASL {} needs a password: set {what}", mechanism.name()),
            })?;
            SaslCredentials::UserPassword { username, password }
        };
        Ok(Some(SaslSettings {
            mechanism,
            credentials,
        }))
    }
}

/// The login modules of `sasl.jaas.config` we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoginModule {
    Plain,
    Scram,
    OAuthBearer,
}

impl LoginModule {
    fn class(self) -> &'static str {
        match self {
            LoginModule::Plain => "org.apache.kafka.common.security.plain.PlainLoginModule",
            LoginModule::Scram => "org.apache.kafka.common.security.scram.ScramLoginModule",
            LoginModule::OAuthBearer => {
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
            }
        }
    }

    fn for_mechanism(m: SaslMechanism) -> LoginModule {
        match m {
            SaslMechanism::Plain => LoginModule::Plain,
            SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => LoginModule::Scram,
            SaslMechanism::OAuthBearer => LoginModule::OAuthBearer,
        }
    }
}

struct Jaas {
    module: LoginModule,
    options: BTreeMap<String, String>,
}

/// Parse `<LoginModule class> <flag> (name=value)* ;` as Kafka's JaasConfig does: values are
/// quoted strings (with `\` escapes) or bare tokens; one login module.
fn parse_jaas(key: &str, text: &str) -> Result<Jaas, SecurityError> {
    let bad = |reason: String| SecurityError::Invalid {
        key: key.to_owned(),
        value: "[hidden]".into(),
        reason,
    };
    let mut tokens = JaasTokens {
        chars: text.chars().peekable(),
    };
    let class = tokens
        .word()
        .ok_or_else(|| bad("expected a login module class name first, e.g. org.apache.kafka.common.security.plain.PlainLoginModule".into()))?;
    let module = match class.rsplit('.').next().unwrap_or_default() {
        "PlainLoginModule" => LoginModule::Plain,
        "ScramLoginModule" => LoginModule::Scram,
        "OAuthBearerLoginModule" => LoginModule::OAuthBearer,
        other => {
            return Err(bad(format!(
                "login module '{other}' is not supported; use PlainLoginModule, ScramLoginModule or OAuthBearerLoginModule"
            )))
        }
    };
    let flag = tokens.word().unwrap_or_default();
    if !["required", "requisite", "sufficient", "optional"]
        .contains(&flag.to_ascii_lowercase().as_str())
    {
        return Err(bad(format!(
            "expected a control flag (required) after {class}, found '{flag}'"
        )));
    }
    let mut options = BTreeMap::new();
    loop {
        tokens.skip_space();
        match tokens.chars.peek() {
            Some(';') => {
                tokens.chars.next();
                tokens.skip_space();
                if tokens.chars.peek().is_some() {
                    return Err(bad(
                        "only one login module may be given; remove what follows the first ';'"
                            .into(),
                    ));
                }
                break;
            }
            None => return Err(bad("the JAAS config must end with ';'".into())),
            _ => {}
        }
        let name = tokens
            .word_until('=')
            .ok_or_else(|| bad("expected name=\"value\" options".into()))?;
        tokens.skip_space();
        if tokens.chars.next() != Some('=') {
            return Err(bad(format!("option '{name}' has no '=' and value")));
        }
        tokens.skip_space();
        let value = if tokens.chars.peek() == Some(&'"') {
            tokens.chars.next();
            let mut v = String::new();
            loop {
                match tokens.chars.next() {
                    None => {
                        return Err(bad(format!(
                            "the value of option '{name}' has no closing quote"
                        )))
                    }
                    Some('"') => break,
                    Some('\\') => match tokens.chars.next() {
                        Some(c) => v.push(c),
                        None => {
                            return Err(bad(format!("the value of option '{name}' ends in '\\'")))
                        }
                    },
                    Some(c) => v.push(c),
                }
            }
            v
        } else {
            tokens
                .word_until(';')
                .ok_or_else(|| bad(format!("option '{name}' has no value")))?
        };
        options.insert(name, value);
    }
    Ok(Jaas { module, options })
}

struct JaasTokens<I: Iterator<Item = char>> {
    chars: std::iter::Peekable<I>,
}

impl<I: Iterator<Item = char>> JaasTokens<I> {
    fn skip_space(&mut self) {
        while self.chars.peek().is_some_and(|c| c.is_whitespace()) {
            self.chars.next();
        }
    }

    fn word(&mut self) -> Option<String> {
        self.word_until(';')
    }

    /// A bare token ending at whitespace, `stop` or `;`.
    fn word_until(&mut self, stop: char) -> Option<String> {
        self.skip_space();
        let mut w = String::new();
        while let Some(&c) = self.chars.peek() {
            if c.is_whitespace() || c == stop || c == ';' || c == '=' {
                break;
            }
            w.push(c);
            self.chars.next();
        }
        (!w.is_empty()).then_some(w)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod handshake_tests;
