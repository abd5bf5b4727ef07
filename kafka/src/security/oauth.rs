//! OAUTHBEARER tokens from an OIDC token endpoint (client-credentials grant), shared by the
//! native client (each new connection authenticates with the current token) and rdkafka (its
//! token-refresh callback). A token is used until 80% of its lifetime has passed, then a new
//! one is fetched, so no connection authenticates with a token about to expire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use spillway_core::config::Password;

use super::OAuthSettings;

/// How long fetching one token may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(15);
/// The part of a token's lifetime after which a fresh one is fetched.
const REFRESH_AT: f64 = 0.8;

/// One access token.
#[derive(Clone)]
pub struct OAuthToken {
    pub token: Password,
    /// `sub` of the token, else the client id.
    pub principal: String,
    /// Milliseconds since the epoch when the token expires.
    pub expires_at_ms: i64,
    /// Milliseconds since the epoch after which a fresh token is fetched.
    refresh_at_ms: i64,
}

impl std::fmt::Debug for OAuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthToken")
            .field("principal", &self.principal)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

/// Fetches and caches tokens; cheap to clone (clones share the cache).
#[derive(Clone)]
pub struct TokenFetcher {
    inner: Arc<Inner>,
}

struct Inner {
    settings: OAuthSettings,
    cache: Mutex<Option<OAuthToken>>,
}

impl std::fmt::Debug for TokenFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TokenFetcher({} as '{}')",
            self.inner.settings.token_endpoint, self.inner.settings.client_id
        )
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl TokenFetcher {
    pub fn new(settings: OAuthSettings) -> TokenFetcher {
        TokenFetcher {
            inner: Arc::new(Inner {
                settings,
                cache: Mutex::new(None),
            }),
        }
    }

    pub fn client_id(&self) -> &str {
        &self.inner.settings.client_id
    }

    pub fn endpoint(&self) -> &str {
        &self.inner.settings.token_endpoint
    }

    fn cached(&self) -> Option<OAuthToken> {
        let cache = self.inner.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .as_ref()
            .filter(|t| now_ms() < t.refresh_at_ms)
            .cloned()
    }

    fn store(&self, token: &OAuthToken) {
        *self.inner.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
    }

    /// The current token, fetched when there is none or 80% of its lifetime has passed.
    pub async fn token(&self) -> Result<OAuthToken, String> {
        if let Some(t) = self.cached() {
            return Ok(t);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let me = self.clone();
        // A thread of its own: the HTTP client runs on its own runtime, whichever runtime (or
        // librdkafka thread) asks.
        std::thread::Builder::new()
            .name("spillway-oauth".into())
            .spawn(move || {
                let _ = tx.send(me.fetch_blocking());
            })
            .map_err(|e| format!("cannot start the token fetch: {e}"))?;
        rx.await
            .map_err(|_| "the token fetch ended without an answer".to_owned())?
    }

    /// [`TokenFetcher::token`] for a thread outside any async runtime (librdkafka's).
    pub fn token_blocking(&self) -> Result<OAuthToken, String> {
        if let Some(t) = self.cached() {
            return Ok(t);
        }
        let me = self.clone();
        std::thread::Builder::new()
            .name("spillway-oauth".into())
            .spawn(move || me.fetch_blocking())
            .map_err(|e| format!("cannot start the token fetch: {e}"))?
            .join()
            .map_err(|_| "the token fetch panicked".to_owned())?
    }

    fn fetch_blocking(&self) -> Result<OAuthToken, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the token fetch: {e}"))?;
        let token = runtime.block_on(self.fetch())?;
        self.store(&token);
        Ok(token)
    }

    /// POST the client-credentials grant and read the answer.
    async fn fetch(&self) -> Result<OAuthToken, String> {
        let s = &self.inner.settings;
        let failed = |what: String| {
            format!(
                "cannot get an OAUTHBEARER token for client '{}' from {}: {what}; check \
                 sasl.oauthbearer.token.endpoint.url and the client id and secret",
                s.client_id, s.token_endpoint
            )
        };
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let mut form = vec![("grant_type", "client_credentials")];
        if let Some(scope) = &s.scope {
            form.push(("scope", scope.as_str()));
        }
        let started = now_ms();
        let response = client
            .post(&s.token_endpoint)
            // RFC 6749 §2.3.1: client id and secret by HTTP Basic, as Kafka's Java client does.
            .basic_auth(&s.client_id, Some(s.client_secret.expose()))
            .header("Accept", "application/json")
            .form(&form)
            .send()
            .await
            .map_err(|e| failed(e.without_url().to_string()))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| failed(e.without_url().to_string()))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.chars().take(300).collect();
            return Err(failed(format!("the endpoint answered {status}: {text}")));
        }
        let json: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| failed(format!("the answer is not JSON: {e}")))?;
        let token = json
            .get("access_token")
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| failed("the answer has no access_token".into()))?;
        let claims = jwt_claims(token);
        let expires_at_ms = match json.get("expires_in").and_then(|e| e.as_f64()) {
            Some(secs) => started + (secs * 1000.0) as i64,
            None => claims
                .as_ref()
                .and_then(|c| c.get("exp"))
                .and_then(|e| e.as_f64())
                .map(|e| (e * 1000.0) as i64)
                .ok_or_else(|| {
                    failed("the answer has neither expires_in nor a token with exp".into())
                })?,
        };
        let lifetime = (expires_at_ms - started).max(0);
        let principal = claims
            .as_ref()
            .and_then(|c| c.get("sub"))
            .and_then(|s| s.as_str())
            .unwrap_or(&s.client_id)
            .to_owned();
        Ok(OAuthToken {
            token: Password::new(token),
            principal,
            expires_at_ms,
            refresh_at_ms: started + (lifetime as f64 * REFRESH_AT) as i64,
        })
    }
}

/// The claims of a JWT-shaped token, if it is one.
fn jwt_claims(token: &str) -> Option<serde_json::Value> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A token endpoint answering each POST with a new token of `lifetime` seconds; returns
    /// its URL and the requests it saw.
    async fn endpoint(lifetime: f64) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/token", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let mut got = 0;
                // Headers and the small form body arrive together or shortly after.
                loop {
                    let k = s.read(&mut buf[got..]).await.unwrap();
                    got += k;
                    let text = String::from_utf8_lossy(&buf[..got]);
                    if k == 0 || text.contains("grant_type=") {
                        break;
                    }
                }
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..got]).into_owned());
                n += 1;
                let body = format!(
                    r#"{{"access_token":"eyJhbGciOiJub25lIn0.{}.sig","token_type":"bearer","expires_in":{lifetime}}}"#,
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode(format!(r#"{{"sub":"svc-{n}"}}"#))
                );
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        (url, seen)
    }

    fn fetcher(url: &str) -> TokenFetcher {
        TokenFetcher::new(OAuthSettings {
            token_endpoint: url.to_owned(),
            client_id: "spillway".into(),
            client_secret: Password::new("cs-secret"),
            scope: Some("kafka".into()),
        })
    }

    #[tokio::test]
    async fn a_token_is_fetched_with_client_credentials_and_reused_until_80_percent_of_its_life() {
        let (url, seen) = endpoint(1.0).await;
        let f = fetcher(&url);
        let first = f.token().await.expect("token");
        assert_eq!(first.principal, "svc-1");
        let again = f.token().await.expect("cached");
        assert_eq!(again.principal, "svc-1", "reused within its life");
        assert_eq!(seen.lock().unwrap().len(), 1);
        let request = seen.lock().unwrap()[0].clone();
        assert!(
            request.contains("grant_type=client_credentials"),
            "{request}"
        );
        assert!(request.contains("scope=kafka"), "{request}");
        // Basic base64("spillway:cs-secret")
        assert!(
            request.to_lowercase().contains("authorization: basic ")
                && request.contains("c3BpbGx3YXk6Y3Mtc2VjcmV0"),
            "{request}"
        );
        tokio::time::sleep(Duration::from_millis(850)).await;
        let fresh = f.token().await.expect("refreshed");
        assert_eq!(fresh.principal, "svc-2", "fetched anew after 80% of 1 s");
        assert!(fresh.expires_at_ms > first.expires_at_ms);
        let blocking = tokio::task::spawn_blocking(move || f.token_blocking())
            .await
            .unwrap();
        assert_eq!(blocking.expect("cached").principal, "svc-2");
        assert!(
            !format!("{fresh:?}").contains("eyJ"),
            "the token is never printed"
        );
    }

    #[tokio::test]
    async fn a_refused_request_names_the_client_and_endpoint_without_the_secret() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/token", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await;
            let body = r#"{"error":"invalid_client"}"#;
            let reply = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(reply.as_bytes()).await.unwrap();
        });
        let err = fetcher(&url).token().await.expect_err("refused");
        assert!(
            err.contains("client 'spillway'") && err.contains("401"),
            "{err}"
        );
        assert!(err.contains("invalid_client"), "{err}");
        assert!(!err.contains("cs-secret"), "{err}");
    }
}
