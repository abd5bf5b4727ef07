//! A local OIDC token endpoint for OAUTHBEARER tests: the client-credentials grant over plain
//! HTTP on 127.0.0.1, answering JWT-shaped tokens (HMAC-SHA256 signed with a key made per
//! issuer) that the proxy accepts while they are unexpired.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::hmac;
use serde_json::{json, Value};

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token is not a JWT (header.payload.signature)")]
    Malformed,
    #[error(
        "the token's signature does not match this issuer's key (issued elsewhere or altered)"
    )]
    BadSignature,
    #[error("the token's payload is not JSON with a numeric exp: {0}")]
    BadPayload(String),
    #[error("the token expired at {exp} (unix seconds); it is now {now}")]
    Expired { exp: u64, now: u64 },
}

struct IssuerState {
    client_id: String,
    client_secret: String,
    lifetime: Duration,
    key: hmac::Key,
    issued: AtomicUsize,
    stop: AtomicBool,
}

struct IssuerInner {
    state: Arc<IssuerState>,
    addr: SocketAddr,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for IssuerInner {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// A local OIDC token endpoint (client-credentials grant: `POST` form
/// `grant_type=client_credentials`, client id/secret in the form or by HTTP Basic, optional
/// `scope`) answering `{"access_token","token_type":"bearer","expires_in"}`. Stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct TokenIssuer {
    inner: Arc<IssuerInner>,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("url", &self.token_endpoint_url())
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl TokenIssuer {
    /// Starts the endpoint on a free port; tokens live `lifetime` (whole seconds, at least 1).
    /// Panics when no port can be bound: a test cannot go on without it.
    pub fn start(client_id: &str, client_secret: &str, lifetime: Duration) -> TokenIssuer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("token issuer cannot bind 127.0.0.1: {e}"));
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let mut key_bytes = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key_bytes)
            .expect("the system random source works");
        let state = Arc::new(IssuerState {
            client_id: client_id.to_string(),
            client_secret: client_secret.to_string(),
            lifetime: lifetime.max(Duration::from_secs(1)),
            key: hmac::Key::new(hmac::HMAC_SHA256, &key_bytes),
            issued: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let serving = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("token-issuer".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if serving.stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = serve(stream, &serving);
                    }
                }
            })
            .expect("a thread can be spawned");
        TokenIssuer {
            inner: Arc::new(IssuerInner {
                state,
                addr,
                thread: Mutex::new(Some(thread)),
            }),
        }
    }

    /// `http://127.0.0.1:<port>/oauth2/token`.
    pub fn token_endpoint_url(&self) -> String {
        format!("http://{}/oauth2/token", self.inner.addr)
    }

    /// How many tokens the endpoint handed out.
    pub fn tokens_issued(&self) -> usize {
        self.inner.state.issued.load(Ordering::SeqCst)
    }

    /// Makes a token as the endpoint would (without counting it), for tests that need one directly.
    pub fn issue(&self, scope: Option<&str>) -> String {
        make_token(&self.inner.state, scope)
    }

    /// Checks that this issuer signed `token` and that it has not expired; returns its subject.
    pub fn validate(&self, token: &str) -> Result<String, TokenError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        hmac::verify(
            &self.inner.state.key,
            format!("{header}.{payload}").as_bytes(),
            &signature,
        )
        .map_err(|_| TokenError::BadSignature)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|e| TokenError::BadPayload(e.to_string()))?;
        let claims: Value =
            serde_json::from_slice(&payload).map_err(|e| TokenError::BadPayload(e.to_string()))?;
        let exp = claims["exp"]
            .as_u64()
            .ok_or_else(|| TokenError::BadPayload("no exp".into()))?;
        let now = now_secs();
        if exp <= now {
            return Err(TokenError::Expired { exp, now });
        }
        Ok(claims["sub"].as_str().unwrap_or_default().to_string())
    }
}

fn make_token(state: &IssuerState, scope: Option<&str>) -> String {
    let iat = now_secs();
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "HS256", "typ": "JWT"}).to_string());
    let payload = URL_SAFE_NO_PAD.encode(
        json!({
            "sub": state.client_id,
            "iss": "spillway-test-issuer",
            "iat": iat,
            "exp": iat + state.lifetime.as_secs(),
            "scope": scope.unwrap_or(""),
        })
        .to_string(),
    );
    let signed = format!("{header}.{payload}");
    let signature = URL_SAFE_NO_PAD.encode(hmac::sign(&state.key, signed.as_bytes()).as_ref());
    format!("{signed}.{signature}")
}

/// Answers one HTTP/1.1 request and closes the connection.
fn serve(stream: TcpStream, state: &IssuerState) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut content_length = 0usize;
    let mut basic = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = value.parse().unwrap_or(0),
                "authorization" => {
                    basic = value
                        .strip_prefix("Basic ")
                        .and_then(|b| STANDARD.decode(b.trim()).ok())
                        .and_then(|b| String::from_utf8(b).ok())
                }
                _ => {}
            }
        }
    }
    let mut body = vec![0u8; content_length.min(64 * 1024)];
    reader.read_exact(&mut body)?;
    let (status, reply) = answer(&request_line, &body, basic.as_deref(), state);
    let text = reply.to_string();
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

fn answer(
    request_line: &str,
    body: &[u8],
    basic: Option<&str>,
    state: &IssuerState,
) -> (&'static str, Value) {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if path.split('?').next() != Some("/oauth2/token") {
        return ("404 Not Found", json!({"error": "not_found"}));
    }
    if method != "POST" {
        return (
            "405 Method Not Allowed",
            json!({"error": "invalid_request", "error_description": "use POST"}),
        );
    }
    let form: std::collections::HashMap<String, String> = form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return (
            "400 Bad Request",
            json!({"error": "unsupported_grant_type",
                "error_description": "only grant_type=client_credentials is supported"}),
        );
    }
    let (id, secret) = match basic.and_then(|b| b.split_once(':')) {
        Some((id, secret)) => (id.to_string(), secret.to_string()),
        None => (
            form.get("client_id").cloned().unwrap_or_default(),
            form.get("client_secret").cloned().unwrap_or_default(),
        ),
    };
    if id != state.client_id || secret != state.client_secret {
        return (
            "401 Unauthorized",
            json!({"error": "invalid_client", "error_description": "unknown client or wrong secret"}),
        );
    }
    let token = make_token(state, form.get("scope").map(String::as_str));
    state.issued.fetch_add(1, Ordering::SeqCst);
    (
        "200 OK",
        json!({"access_token": token, "token_type": "bearer",
            "expires_in": state.lifetime.as_secs()}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One raw HTTP exchange with the issuer; returns (status line, JSON body).
    fn post(issuer: &TokenIssuer, body: &str, basic: Option<&str>) -> (String, Value) {
        let mut stream = TcpStream::connect(issuer.inner.addr).unwrap();
        let auth = basic
            .map(|b| format!("Authorization: Basic {}\r\n", STANDARD.encode(b)))
            .unwrap_or_default();
        write!(
            stream,
            "POST /oauth2/token HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let (head, json) = text.split_once("\r\n\r\n").unwrap();
        (
            head.lines().next().unwrap().to_string(),
            serde_json::from_str(json).unwrap(),
        )
    }

    #[test]
    fn tokens_come_for_the_right_client_and_validate_until_they_expire() {
        let issuer = TokenIssuer::start("app", "s3cret", Duration::from_secs(1));
        let (status, reply) = post(
            &issuer,
            "grant_type=client_credentials&client_id=app&client_secret=s3cret&scope=kafka",
            None,
        );
        assert!(status.contains("200"), "{status} {reply}");
        let token = reply["access_token"].as_str().unwrap().to_string();
        assert_eq!(reply["token_type"], "bearer");
        assert_eq!(issuer.validate(&token), Ok("app".to_string()));
        let (status, _) = post(&issuer, "grant_type=client_credentials", Some("app:s3cret"));
        assert!(status.contains("200"), "{status}");
        assert_eq!(issuer.tokens_issued(), 2);

        let (status, reply) = post(
            &issuer,
            "grant_type=client_credentials&client_id=app&client_secret=wrong",
            None,
        );
        assert!(status.contains("401"), "{status}");
        assert_eq!(reply["error"], "invalid_client");
        let (status, _) = post(&issuer, "grant_type=password", Some("app:s3cret"));
        assert!(status.contains("400"), "{status}");
        assert_eq!(issuer.tokens_issued(), 2);

        let other = TokenIssuer::start("app", "s3cret", Duration::from_secs(60));
        assert_eq!(other.validate(&token), Err(TokenError::BadSignature));
        std::thread::sleep(Duration::from_millis(2100));
        assert!(matches!(
            issuer.validate(&token),
            Err(TokenError::Expired { .. })
        ));
    }
}
