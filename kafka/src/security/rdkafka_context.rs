//! What every rdkafka client Spillway makes carries in its context: OAUTHBEARER tokens from
//! the shared [`TokenFetcher`], and the last security failure librdkafka logged, so that a
//! refused login or an untrusted certificate ends the client with librdkafka's own words
//! instead of being retried forever.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::OAuthToken as RdToken;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};
use tracing::{debug, info, warn};

use super::{is_security_key, SecurityError, SecuritySettings, TokenFetcher};
use crate::connection::Connection;

/// How often [`SecurityContext::diagnose`] may open a connection of its own.
const DIAGNOSE_EVERY: Duration = Duration::from_secs(30);
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Log lines of librdkafka that tell a security failure.
const SECURITY_SIGNS: &[&str] = &[
    "SASL authentication error",
    "Authentication failed",
    "SSL handshake failed",
    "certificate verify failed",
    "incorrect security.protocol",
    "SASL handshake failed",
    "Unsupported SASL mechanism",
];

/// The context of Spillway's rdkafka clients; cheap to clone.
#[derive(Clone, Default)]
pub struct SecurityContext {
    oauth: Option<TokenFetcher>,
    description: String,
    last_failure: Arc<Mutex<Option<String>>>,
    settings: Arc<SecuritySettings>,
    /// When [`SecurityContext::diagnose`] last opened a connection of its own.
    diagnosed: Arc<Mutex<Option<Instant>>>,
}

impl SecurityContext {
    pub fn new(settings: &SecuritySettings) -> SecurityContext {
        SecurityContext {
            oauth: settings.token_fetcher(),
            description: settings.describe(),
            last_failure: Arc::default(),
            settings: Arc::new(settings.clone()),
            diagnosed: Arc::default(),
        }
    }

    /// When `e` is a failure that retrying cannot fix (credentials, certificate, listener
    /// kind), what happened and what to check.
    pub fn security_failure(&self, e: &KafkaError) -> Option<String> {
        let code = e.rdkafka_error_code()?;
        let logged = self
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let fatal = match code {
            RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL
            | RDKafkaErrorCode::UnsupportedSASLMechanism
            | RDKafkaErrorCode::IllegalSASLState => true,
            // A transport failure is news only, unless librdkafka said why it fails for good.
            RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown => {
                logged.is_some()
            }
            _ => false,
        };
        if !fatal {
            return None;
        }
        let detail = logged.unwrap_or_else(|| e.to_string());
        Some(format!(
            "{} failed: {detail}; check {}",
            self.description,
            what_to_check(&detail)
        ))
    }

    /// librdkafka reports some listener mismatches (a plaintext client at a TLS listener)
    /// only as "all brokers down", which a cluster that is down also gives. Open one
    /// connection to the first bootstrap server with the native client and the same
    /// settings: when it fails for a security reason, that is what to report. At most once
    /// per [`DIAGNOSE_EVERY`]; call it from a thread that may block.
    pub fn diagnose(&self, bootstrap: &str, e: &KafkaError) -> Option<String> {
        if e.rdkafka_error_code() != Some(RDKafkaErrorCode::AllBrokersDown) {
            return None;
        }
        {
            let mut last = self.diagnosed.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| at.elapsed() < DIAGNOSE_EVERY) {
                return None;
            }
            *last = Some(Instant::now());
        }
        let security = self.settings.client_security().ok()?;
        let addr = bootstrap
            .split(',')
            .map(str::trim)
            .find(|a| !a.is_empty())?
            .to_owned();
        let probe = async move {
            Connection::connect_secured(&addr, "spillway-diagnosis", DIAGNOSE_TIMEOUT, &security)
                .await
        };
        let result = match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle.block_on(probe),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?
                .block_on(probe),
        };
        match result {
            Err(e) if e.is_security_error() => Some(format!("{} failed: {e}", self.description)),
            _ => None,
        }
    }

    /// The security failure librdkafka logged, if any, with what to check.
    pub fn security_failure_logged(&self) -> Option<String> {
        let logged = self
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(format!(
            "{} failed: {logged}; check {}",
            self.description,
            what_to_check(&logged)
        ))
    }

    /// Remember a librdkafka log line that tells a security failure.
    fn note(&self, line: &str) {
        if SECURITY_SIGNS.iter().any(|s| line.contains(s)) {
            *self.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(line.to_owned());
        }
    }
}

fn what_to_check(detail: &str) -> &'static str {
    if detail.contains("incorrect security.protocol") {
        "security.protocol: the listener uses TLS (set SSL or SASL_SSL) or the reverse"
    } else if detail.contains("certificate verify failed") {
        "that ssl.truststore.location / ssl.ca.location holds the CA that signed the broker's certificate, \
         and ssl.endpoint.identification.algorithm"
    } else if detail.contains("SSL handshake failed") {
        "that the listener uses TLS, the CA in ssl.truststore.location / ssl.ca.location, and the client \
         certificate if the broker requires one"
    } else if detail.contains("Unsupported SASL mechanism")
        || detail.contains("SASL handshake failed")
    {
        "sasl.mechanism against the mechanisms the listener enables"
    } else {
        "the user name and password (sasl.jaas.config or sasl.username / sasl.password) and that the user \
         exists on the cluster for this mechanism"
    }
}

impl ClientContext for SecurityContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, line: &str) {
        self.note(line);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error
            | RDKafkaLogLevel::Warning => warn!(facility = fac, "librdkafka: {line}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(facility = fac, "librdkafka: {line}")
            }
            RDKafkaLogLevel::Debug => debug!(facility = fac, "librdkafka: {line}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.note(reason);
        warn!("librdkafka: {error}: {reason}");
    }

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<RdToken, Box<dyn Error>> {
        let fetcher = self
            .oauth
            .as_ref()
            .ok_or("sasl.mechanism=OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url")?;
        let token = fetcher.token_blocking()?;
        Ok(RdToken {
            token: token.token.expose().to_owned(),
            principal_name: token.principal,
            lifetime_ms: token.expires_at_ms,
        })
    }
}

impl ConsumerContext for SecurityContext {}

/// An rdkafka config from `keys` (client keys without prefix, as Connect gives them): the
/// security keys are translated, every other key is set as given. Returns the context the
/// client must be created with.
pub fn rdkafka_config<'a>(
    config: &mut ClientConfig,
    keys: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<SecurityContext, SecurityError> {
    let keys: BTreeMap<&str, &str> = keys.into_iter().collect();
    let settings = SecuritySettings::from_keys(keys.iter().map(|(k, v)| (*k, *v, *k)))?;
    for (k, v) in &keys {
        if !is_security_key(k) {
            config.set(*k, *v);
        }
    }
    settings.apply_to(config);
    Ok(SecurityContext::new(&settings))
}
