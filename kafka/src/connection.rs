//! One TCP connection to one broker.
//!
//! Requests are pipelined: each gets a correlation id, its response is matched back through a
//! map of oneshot senders, so many requests can be outstanding on one socket. Two background
//! tasks own the socket halves. The writer task receives whole frames through a channel, so a
//! caller whose future is dropped half-way can never leave half a frame on the wire. The reader
//! task splits the byte stream into frames; any framing problem (bad length, closed socket)
//! *poisons* the connection: every pending and every later request fails with the cause.
//!
//! The connection is also where versions are negotiated: [`Connection::connect`] runs ApiVersions
//! and keeps the broker's ranges, and [`Connection::pick`] intersects them with ours.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::security::ClientSecurity;
use spillway_core::egress::{EgressPolicy, EgressRefusal};

/// Largest response frame we accept. Kafka's default `socket.request.max.bytes` is 100 MiB; a
/// length beyond that is far more likely a desynchronised stream than a real response.
pub const MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// Api key of ApiVersions.
const API_VERSIONS_KEY: i16 = 18;
/// Error code UNSUPPORTED_VERSION.
const UNSUPPORTED_VERSION: i16 = 35;

/// Everything that can go wrong on one broker connection.
#[derive(Debug, Error)]
pub enum ConnectionError {
    #[error("cannot connect to broker {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS to broker {addr} failed: {reason}")]
    Tls { addr: String, reason: String },
    #[error("SASL {mechanism} authentication of '{principal}' to broker {addr} failed: {message}")]
    Authentication {
        addr: String,
        mechanism: &'static str,
        principal: String,
        message: String,
    },
    /// The broker's listener speaks another protocol than `security.protocol` says.
    #[error("broker {addr}: {message}")]
    SecurityMismatch { addr: String, message: String },
    /// The egress policy (a confined tenant's, for a cluster it named) refused the broker.
    #[error("broker {addr} refused by the worker's egress policy: {refusal}")]
    Egress {
        addr: String,
        refusal: Box<EgressRefusal>,
    },
    #[error("connecting to broker {addr} timed out after {after:?}")]
    ConnectTimeout { addr: String, after: Duration },
    #[error("i/o error on the connection to broker {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("broker {addr} closed the connection")]
    Closed { addr: String },
    #[error("broker {addr} sent a frame of {size} bytes; the limit is {max} bytes")]
    FrameTooLarge { addr: String, size: i64, max: usize },
    #[error(
        "broker {addr} sent a frame of {size} bytes, too short to hold a correlation id (4 bytes)"
    )]
    FrameTooShort { addr: String, size: i64 },
    #[error("connection to broker {addr} is unusable: {cause}")]
    Poisoned {
        addr: String,
        cause: Arc<ConnectionError>,
    },
    #[error("cannot encode request api_key={api_key} v{version}: {reason}")]
    Encode {
        api_key: i16,
        version: i16,
        reason: String,
    },
    #[error("cannot decode response to api_key={api_key} v{version} from broker {addr}: {reason}")]
    Decode {
        addr: String,
        api_key: i16,
        version: i16,
        reason: String,
    },
    #[error("response to api_key={api_key} from broker {addr} carries correlation id {got}, expected {expected}")]
    CorrelationMismatch {
        addr: String,
        api_key: i16,
        expected: i32,
        got: i32,
    },
    #[error("broker {addr} supports api_key={api_key} only in versions {broker_min}..={broker_max}; we support {our_min}..={our_max}")]
    NoCommonVersion {
        addr: String,
        api_key: i16,
        our_min: i16,
        our_max: i16,
        broker_min: i16,
        broker_max: i16,
    },
    #[error("broker {addr} does not support api_key={api_key} at all")]
    UnsupportedApi { addr: String, api_key: i16 },
    #[error("ApiVersions to broker {addr} failed with error code {code}")]
    ApiVersions { addr: String, code: i16 },
    #[error("request api_key={api_key} to broker {addr} got no response within {after:?}")]
    Timeout {
        addr: String,
        api_key: i16,
        after: Duration,
    },
}

impl ConnectionError {
    /// Whether this error is the client's security setting not matching the broker's (bad
    /// credentials, untrusted certificate, TLS against plaintext or the reverse): trying again
    /// cannot help, the configuration must change.
    pub fn is_security_error(&self) -> bool {
        match self {
            ConnectionError::Tls { .. }
            | ConnectionError::Authentication { .. }
            | ConnectionError::SecurityMismatch { .. } => true,
            ConnectionError::Poisoned { cause, .. } => cause.is_security_error(),
            _ => false,
        }
    }

    /// Whether the egress policy refused the broker: no retry helps, the worker admin's
    /// `tenant.egress.allow` or the cluster's advertised listeners must change.
    pub fn is_egress_refusal(&self) -> bool {
        match self {
            ConnectionError::Egress { refusal, .. } => refusal.is_internal(),
            ConnectionError::Poisoned { cause, .. } => cause.is_egress_refusal(),
            _ => false,
        }
    }

    /// Whether this error means the connection can no longer carry requests.
    pub fn is_fatal_for_connection(&self) -> bool {
        !matches!(
            self,
            ConnectionError::Encode { .. }
                | ConnectionError::Decode { .. }
                | ConnectionError::NoCommonVersion { .. }
                | ConnectionError::UnsupportedApi { .. }
                | ConnectionError::Timeout { .. }
        )
    }
}

/// A response frame on its way to the request that waits for it.
type ResponseSlot = oneshot::Sender<Result<Bytes, Arc<ConnectionError>>>;

/// Requests waiting for their response, or the reason no more will arrive.
enum State {
    Open(HashMap<i32, ResponseSlot>),
    Poisoned(Arc<ConnectionError>),
}

impl State {
    /// Fail every pending request and refuse all later ones. The first cause wins.
    fn poison(&mut self, cause: ConnectionError) -> Arc<ConnectionError> {
        match self {
            State::Open(pending) => {
                let cause = Arc::new(cause);
                for (_, slot) in pending.drain() {
                    // The waiter may have been cancelled; nobody to tell then.
                    let _ = slot.send(Err(Arc::clone(&cause)));
                }
                *self = State::Poisoned(Arc::clone(&cause));
                cause
            }
            State::Poisoned(cause) => Arc::clone(cause),
        }
    }
}

type SharedState = Arc<Mutex<State>>;

fn lock(state: &SharedState) -> std::sync::MutexGuard<'_, State> {
    // A panic while holding this lock cannot leave the map half-updated (every critical section
    // is a single insert/remove/drain), so a poisoned mutex is still safe to use.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// One connection to one broker; cheap to share behind an `Arc`.
pub struct Connection {
    addr: String,
    client_id: StrBytes,
    next_correlation_id: AtomicI32,
    state: SharedState,
    /// Whole frames for the writer task.
    frames: mpsc::UnboundedSender<Bytes>,
    /// The broker's supported version range per api key, from ApiVersions.
    versions: HashMap<i16, (i16, i16)>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Connection {
    /// Open a plaintext TCP connection to `addr` and negotiate versions with ApiVersions.
    pub async fn connect(
        addr: &str,
        client_id: &str,
        timeout: Duration,
    ) -> Result<Connection, ConnectionError> {
        Connection::connect_secured(addr, client_id, timeout, &ClientSecurity::plaintext()).await
    }

    /// Open a connection to `addr` as `security` says: TCP, the TLS handshake when TLS is on,
    /// ApiVersions, then SASL authentication when SASL is on. A mismatch with the broker's
    /// listener (TLS against plaintext or the reverse), an untrusted certificate or refused
    /// credentials come back as errors for which [`ConnectionError::is_security_error`] holds.
    pub async fn connect_secured(
        addr: &str,
        client_id: &str,
        timeout: Duration,
        security: &ClientSecurity,
    ) -> Result<Connection, ConnectionError> {
        Connection::dial(addr, client_id, timeout, timeout, security).await
    }

    /// [`Connection::connect_secured`] with its own limit for the dial (TCP connect and TLS
    /// handshake; Kafka's `socket.connection.setup.timeout.ms`): an unreachable broker is
    /// given up on in seconds, while ApiVersions and SASL get the request timeout.
    pub async fn dial(
        addr: &str,
        client_id: &str,
        dial_timeout: Duration,
        timeout: Duration,
        security: &ClientSecurity,
    ) -> Result<Connection, ConnectionError> {
        let connect = async {
            match security.egress() {
                None => tokio::net::TcpStream::connect(addr).await,
                // Connect to the addresses the policy judged, never to the name again (a name
                // rebound between the check and the connect would slip through).
                Some(policy) => {
                    let vetted = vet(policy, addr).await?;
                    tokio::net::TcpStream::connect(&vetted[..]).await
                }
            }
        };
        let stream = match tokio::time::timeout(dial_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => {
                if let Some(refusal) = source
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<EgressRefusal>())
                {
                    return Err(ConnectionError::Egress {
                        addr: addr.to_string(),
                        refusal: Box::new(refusal.clone()),
                    });
                }
                return Err(ConnectionError::Connect {
                    addr: addr.to_string(),
                    source,
                });
            }
            Err(_) => {
                return Err(ConnectionError::ConnectTimeout {
                    addr: addr.to_string(),
                    after: dial_timeout,
                })
            }
        };
        // Requests are small and latency matters more than packet count.
        let _ = stream.set_nodelay(true);
        let mut conn = match security.tls() {
            None => Connection::from_stream(stream, addr, client_id),
            Some(tls) => {
                let host = host_of(addr);
                let tls_stream =
                    match tokio::time::timeout(dial_timeout, tls.connect(host, stream)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(reason)) => {
                            return Err(ConnectionError::Tls {
                                addr: addr.to_string(),
                                reason,
                            })
                        }
                        Err(_) => {
                            return Err(ConnectionError::Tls {
                                addr: addr.to_string(),
                                reason: format!(
                            "no TLS handshake within {dial_timeout:?}; is this a TLS listener? \
                                 security.protocol={} needs one",
                            security.protocol().name()
                        ),
                            })
                        }
                    };
                Connection::from_stream(tls_stream, addr, client_id)
            }
        };
        if let Err(e) = conn.negotiate_versions(timeout).await {
            return Err(explain_first_answer(e, addr, security));
        }
        crate::security::authenticate(&conn, security, timeout).await?;
        Ok(conn)
    }

    /// Wrap an already connected byte stream. Versions are not negotiated yet: call
    /// [`Connection::negotiate_versions`] or use [`Connection::request`] with explicit versions.
    pub fn from_stream<S>(stream: S, addr: &str, client_id: &str) -> Connection
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(stream);
        let state: SharedState = Arc::new(Mutex::new(State::Open(HashMap::new())));
        let (frames, frames_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(read_half, Arc::clone(&state), addr.to_string()));
        let writer = tokio::spawn(write_loop(
            write_half,
            frames_rx,
            Arc::clone(&state),
            addr.to_string(),
        ));
        Connection {
            addr: addr.to_string(),
            client_id: StrBytes::from_string(client_id.to_string()),
            next_correlation_id: AtomicI32::new(1),
            state,
            frames,
            versions: HashMap::new(),
            reader,
            writer,
        }
    }

    /// The `host:port` this connection goes to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the connection has failed and must be replaced.
    pub fn is_poisoned(&self) -> bool {
        matches!(*lock(&self.state), State::Poisoned(_))
    }

    /// Ask the broker which versions it supports. Tries ApiVersions v3 first; a broker that does
    /// not know v3 answers UNSUPPORTED_VERSION in a v0-shaped body (the dev broker does this,
    /// brief §1), and we retry with v2, then v0.
    pub async fn negotiate_versions(&mut self, timeout: Duration) -> Result<(), ConnectionError> {
        let mut last_code = UNSUPPORTED_VERSION;
        for version in [3i16, 2, 0] {
            let mut request = ApiVersionsRequest::default();
            if version >= 3 {
                request.client_software_name = StrBytes::from_static_str("spillway");
                request.client_software_version =
                    StrBytes::from_static_str(env!("CARGO_PKG_VERSION"));
            }
            let frame = self
                .request_frame::<ApiVersionsRequest>(&request, version, timeout)
                .await?;
            let mut body = skip_response_header::<ApiVersionsResponse>(
                frame,
                version,
                API_VERSIONS_KEY,
                &self.addr,
            )?;
            // The error code is the first field in every version; read it before decoding the
            // rest, because an error body may be shaped for an older version.
            if body.len() < 2 {
                return Err(ConnectionError::Decode {
                    addr: self.addr.clone(),
                    api_key: API_VERSIONS_KEY,
                    version,
                    reason: format!("body of {} bytes has no error code", body.len()),
                });
            }
            let code = i16::from_be_bytes([body[0], body[1]]);
            if code == UNSUPPORTED_VERSION {
                debug!(addr = %self.addr, version, "ApiVersions version refused; falling back");
                last_code = code;
                continue;
            }
            if code != 0 {
                return Err(ConnectionError::ApiVersions {
                    addr: self.addr.clone(),
                    code,
                });
            }
            let response = ApiVersionsResponse::decode(&mut body, version).map_err(|e| {
                ConnectionError::Decode {
                    addr: self.addr.clone(),
                    api_key: API_VERSIONS_KEY,
                    version,
                    reason: e.to_string(),
                }
            })?;
            self.versions = response
                .api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect();
            return Ok(());
        }
        Err(ConnectionError::ApiVersions {
            addr: self.addr.clone(),
            code: last_code,
        })
    }

    /// Record the broker's version ranges without asking it (tests, or a broker known in advance).
    pub fn set_versions(&mut self, versions: HashMap<i16, (i16, i16)>) {
        self.versions = versions;
    }

    /// The highest version both sides support for `api_key`, given our range.
    pub fn pick(&self, api_key: i16, our_min: i16, our_max: i16) -> Result<i16, ConnectionError> {
        pick_version(&self.addr, &self.versions, api_key, our_min, our_max)
    }

    /// Send `request` at `version` and wait for its response (at most `timeout`).
    ///
    /// The response decoder ignores trailing bytes: the dev broker appends an extra byte to some
    /// responses (brief §8.6 #29) and newer brokers may append fields we do not know.
    pub async fn request<R: Request>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ConnectionError> {
        let frame = self.request_frame(request, version, timeout).await?;
        let mut body = skip_response_header::<R::Response>(frame, version, R::KEY, &self.addr)?;
        R::Response::decode(&mut body, version).map_err(|e| ConnectionError::Decode {
            addr: self.addr.clone(),
            api_key: R::KEY,
            version,
            reason: e.to_string(),
        })
    }

    /// Like [`Connection::request`], choosing the version with [`Connection::pick`].
    pub async fn request_in_range<R: Request>(
        &self,
        request: &R,
        our_min: i16,
        our_max: i16,
        timeout: Duration,
    ) -> Result<(R::Response, i16), ConnectionError> {
        let version = self.pick(R::KEY, our_min, our_max)?;
        Ok((self.request(request, version, timeout).await?, version))
    }

    /// Send a request whose api key is only known at run time, such as a draft API whose key
    /// differs between drafts (KIP-1289's TxnShareAcknowledge), and return the response body
    /// with the response header stripped. `flexible` picks request header v2 / response
    /// header v1 (a flexible version) or v1 / v0.
    ///
    /// The caller checks [`Connection::pick`] first: a broker that does not know `api_key`
    /// closes the connection instead of answering.
    pub async fn request_raw<T: Encodable>(
        &self,
        api_key: i16,
        version: i16,
        flexible: bool,
        body: &T,
        timeout: Duration,
    ) -> Result<Bytes, ConnectionError> {
        let (request_header, response_header) = if flexible { (2, 1) } else { (1, 0) };
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let frame =
            self.encode_frame_with(api_key, version, request_header, body, correlation_id)?;
        let mut frame = self
            .exchange(api_key, correlation_id, frame, timeout)
            .await?;
        ResponseHeader::decode(&mut frame, response_header).map_err(|e| {
            ConnectionError::Decode {
                addr: self.addr.clone(),
                api_key,
                version,
                reason: format!("response header: {e}"),
            }
        })?;
        Ok(frame)
    }

    /// Send one request and return the whole response frame (header included).
    async fn request_frame<R: Request>(
        &self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<Bytes, ConnectionError> {
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let frame = self.encode_frame(request, version, correlation_id)?;
        self.exchange(R::KEY, correlation_id, frame, timeout).await
    }

    /// Hand `frame` to the writer and wait for the response with `correlation_id`.
    async fn exchange(
        &self,
        api_key: i16,
        correlation_id: i32,
        frame: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, ConnectionError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = lock(&self.state);
            match &mut *state {
                State::Open(pending) => {
                    pending.insert(correlation_id, tx);
                }
                State::Poisoned(cause) => return Err(self.poisoned(cause)),
            }
        }
        // Handing the frame to the writer task is synchronous: a cancelled caller cannot cut
        // it in half.
        if self.frames.send(frame).is_err() {
            let cause = lock(&self.state).poison(ConnectionError::Closed {
                addr: self.addr.clone(),
            });
            return Err(self.poisoned(&cause));
        }
        let result = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            // The reader dropped our slot without an answer: it is gone.
            Ok(Err(_)) => Err(Arc::new(ConnectionError::Closed {
                addr: self.addr.clone(),
            })),
            Err(_) => {
                // A broker serves one request per connection at a time, so later requests
                // would queue behind the stuck one: close the connection, as Kafka's Java
                // client and librdkafka do; the next request dials anew.
                lock(&self.state).poison(ConnectionError::Timeout {
                    addr: self.addr.clone(),
                    api_key,
                    after: timeout,
                });
                self.reader.abort();
                self.writer.abort();
                return Err(ConnectionError::Timeout {
                    addr: self.addr.clone(),
                    api_key,
                    after: timeout,
                });
            }
        };
        let frame = result.map_err(|cause| self.poisoned(&cause))?;
        let got = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        if got != correlation_id {
            return Err(ConnectionError::CorrelationMismatch {
                addr: self.addr.clone(),
                api_key,
                expected: correlation_id,
                got,
            });
        }
        Ok(frame)
    }

    fn poisoned(&self, cause: &Arc<ConnectionError>) -> ConnectionError {
        ConnectionError::Poisoned {
            addr: self.addr.clone(),
            cause: Arc::clone(cause),
        }
    }

    fn encode_frame<R: Request>(
        &self,
        request: &R,
        version: i16,
        correlation_id: i32,
    ) -> Result<Bytes, ConnectionError> {
        self.encode_frame_with(
            R::KEY,
            version,
            R::header_version(version),
            request,
            correlation_id,
        )
    }

    fn encode_frame_with<T: Encodable>(
        &self,
        api_key: i16,
        version: i16,
        header_version: i16,
        request: &T,
        correlation_id: i32,
    ) -> Result<Bytes, ConnectionError> {
        let encode_err = |e: anyhow::Error| ConnectionError::Encode {
            api_key,
            version,
            reason: e.to_string(),
        };
        let mut header = RequestHeader::default();
        header.request_api_key = api_key;
        header.request_api_version = version;
        header.correlation_id = correlation_id;
        header.client_id = Some(self.client_id.clone());
        let size = header
            .compute_size(header_version)
            .map_err(encode_err)?
            .saturating_add(request.compute_size(version).map_err(encode_err)?);
        let mut buf = BytesMut::with_capacity(4 + size);
        buf.put_i32(0);
        header
            .encode(&mut buf, header_version)
            .map_err(encode_err)?;
        request.encode(&mut buf, version).map_err(encode_err)?;
        let len = i32::try_from(buf.len() - 4).map_err(|_| ConnectionError::Encode {
            api_key,
            version,
            reason: format!("request of {} bytes does not fit a frame", buf.len() - 4),
        })?;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        Ok(buf.freeze())
    }
}

/// The host part of "host:port" (IPv6 in brackets or not).
/// The socket addresses `addr` (`host:port`) may be connected at under `policy`, judged now
/// (resolution may block: off the runtime's threads). A refusal travels as the i/o error's
/// inner error.
async fn vet(policy: &Arc<EgressPolicy>, addr: &str) -> std::io::Result<Vec<std::net::SocketAddr>> {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("'{addr}' is not host:port"),
            )
        })?;
    let policy = Arc::clone(policy);
    tokio::task::spawn_blocking(move || policy.vet(&host, port))
        .await
        .map_err(std::io::Error::other)?
        .map_err(|refusal| std::io::Error::new(std::io::ErrorKind::PermissionDenied, refusal))
}

fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The first exchange on a connection is where a listener of another kind shows: a TLS
/// listener closes a plaintext client or answers with a TLS alert (not a Kafka frame); a TLS
/// session that the broker ends at once (e.g. no client certificate under TLS 1.3) shows here
/// too.
fn explain_first_answer(
    e: ConnectionError,
    addr: &str,
    security: &ClientSecurity,
) -> ConnectionError {
    let root: &ConnectionError = match &e {
        ConnectionError::Poisoned { cause, .. } => cause,
        other => other,
    };
    if let Some(tls) = security.tls() {
        if let ConnectionError::Io { source, .. } = root {
            if source
                .get_ref()
                .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
            {
                return ConnectionError::Tls {
                    addr: addr.to_string(),
                    reason: tls.explain(host_of(addr), source),
                };
            }
        }
        return e;
    }
    let not_kafka = match root {
        ConnectionError::Closed { .. } => Some("closed the connection".to_owned()),
        ConnectionError::Io { source, .. } => Some(format!("failed the connection ({source})")),
        ConnectionError::FrameTooLarge { size, .. }
        | ConnectionError::FrameTooShort { size, .. } => {
            // A TLS record starts 0x15 (alert) or 0x16 (handshake), 0x03.
            let looks_tls = matches!((size >> 24) & 0xff, 0x15 | 0x16);
            Some(format!(
                "answered with bytes that are not a Kafka frame{}",
                if looks_tls { " (a TLS record)" } else { "" }
            ))
        }
        _ => None,
    };
    match not_kafka {
        Some(what) => ConnectionError::SecurityMismatch {
            addr: addr.to_string(),
            message: format!(
                "the broker {what} on the first request (ApiVersions) sent in plaintext \
                 (security.protocol={}); if this listener uses TLS, set security.protocol=SSL or SASL_SSL \
                 with the CA in ssl.truststore.location or ssl.ca.location",
                security.protocol().name()
            ),
        },
        None => e,
    }
}

/// Intersect the broker's range for `api_key` with ours.
pub(crate) fn pick_version(
    addr: &str,
    versions: &HashMap<i16, (i16, i16)>,
    api_key: i16,
    our_min: i16,
    our_max: i16,
) -> Result<i16, ConnectionError> {
    let Some(&(broker_min, broker_max)) = versions.get(&api_key) else {
        return Err(ConnectionError::UnsupportedApi {
            addr: addr.to_string(),
            api_key,
        });
    };
    let high = our_max.min(broker_max);
    let low = our_min.max(broker_min);
    if high < low {
        return Err(ConnectionError::NoCommonVersion {
            addr: addr.to_string(),
            api_key,
            our_min,
            our_max,
            broker_min,
            broker_max,
        });
    }
    Ok(high)
}

/// Strip the response header (its version follows from the request version) and return the body.
fn skip_response_header<T: HeaderVersion>(
    frame: Bytes,
    version: i16,
    api_key: i16,
    addr: &str,
) -> Result<Bytes, ConnectionError> {
    let mut buf = frame;
    ResponseHeader::decode(&mut buf, T::header_version(version)).map_err(|e| {
        ConnectionError::Decode {
            addr: addr.to_string(),
            api_key,
            version,
            reason: format!("response header: {e}"),
        }
    })?;
    Ok(buf)
}

/// Split the inbound byte stream into frames and hand each to the request waiting for it.
async fn read_loop<R: AsyncRead + Send + Unpin>(mut read: R, state: SharedState, addr: String) {
    let cause = loop {
        match read_frame(&mut read, &addr).await {
            Ok(frame) => {
                let correlation_id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                let slot = match &mut *lock(&state) {
                    State::Open(pending) => pending.remove(&correlation_id),
                    State::Poisoned(_) => return,
                };
                match slot {
                    Some(slot) => {
                        let _ = slot.send(Ok(frame));
                    }
                    // Its waiter timed out and gave up; the stream itself is still in sync.
                    None => warn!(%addr, correlation_id, "response for no pending request"),
                }
            }
            Err(cause) => break cause,
        }
    };
    debug!(%addr, %cause, "connection reader stops");
    lock(&state).poison(cause);
}

/// Read one length-prefixed frame. The frame returned starts with the correlation id.
async fn read_frame<R: AsyncRead + Unpin>(
    read: &mut R,
    addr: &str,
) -> Result<Bytes, ConnectionError> {
    let mut len = [0u8; 4];
    if let Err(source) = read.read_exact(&mut len).await {
        return Err(if source.kind() == std::io::ErrorKind::UnexpectedEof {
            ConnectionError::Closed {
                addr: addr.to_string(),
            }
        } else {
            ConnectionError::Io {
                addr: addr.to_string(),
                source,
            }
        });
    }
    let size = i32::from_be_bytes(len) as i64;
    if size < 4 {
        return Err(ConnectionError::FrameTooShort {
            addr: addr.to_string(),
            size,
        });
    }
    if size as usize > MAX_FRAME_BYTES {
        return Err(ConnectionError::FrameTooLarge {
            addr: addr.to_string(),
            size,
            max: MAX_FRAME_BYTES,
        });
    }
    // Read into the buffer's spare capacity: zeroing it first (`BytesMut::zeroed`) cost a
    // `memset` of every response, which jemalloc's reused memory does not spare (bench/README).
    let size = size as usize;
    let mut frame = BytesMut::with_capacity(size);
    let mut body = read.take(size as u64);
    while frame.len() < size {
        match body.read_buf(&mut frame).await {
            Ok(0) => {
                return Err(ConnectionError::Io {
                    addr: addr.to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("stream ended inside a frame of {size} bytes (truncated frame)"),
                    ),
                })
            }
            Ok(_) => {}
            Err(source) => {
                return Err(ConnectionError::Io {
                    addr: addr.to_string(),
                    source,
                })
            }
        }
    }
    Ok(frame.freeze())
}

/// Write whole frames in the order they were queued.
async fn write_loop<W: AsyncWrite + Send + Unpin>(
    mut write: W,
    mut frames: mpsc::UnboundedReceiver<Bytes>,
    state: SharedState,
    addr: String,
) {
    while let Some(frame) = frames.recv().await {
        let mut result = write.write_all(&frame).await;
        // Coalesce whatever else is queued before flushing.
        while result.is_ok() {
            match frames.try_recv() {
                Ok(next) => result = write.write_all(&next).await,
                Err(_) => break,
            }
        }
        if result.is_ok() {
            result = write.flush().await;
        }
        if let Err(source) = result {
            lock(&state).poison(ConnectionError::Io { addr, source });
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::MetadataRequest;
    use tokio::io::{duplex, DuplexStream};

    const T: Duration = Duration::from_secs(5);

    /// Under an egress policy a broker at an internal address is refused before any packet
    /// is sent (a listener there would see an accept), naming the address and the worker key;
    /// an allowed one is connected.
    #[tokio::test]
    async fn a_dial_under_an_egress_policy_is_vetted_first() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let refused = ClientSecurity::plaintext()
            .with_egress(Some(Arc::new(EgressPolicy::parse("10.0.0.0/8").unwrap())));
        let err = Connection::dial(&addr, "c", T, T, &refused)
            .await
            .unwrap_err();
        assert!(err.is_egress_refusal(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&addr) && text.contains("tenant.egress.allow"),
            "{text}"
        );
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "nothing may be dialled");

        let allowed = ClientSecurity::plaintext()
            .with_egress(Some(Arc::new(EgressPolicy::parse("127.0.0.1/32").unwrap())));
        let dial = tokio::spawn(async move { Connection::dial(&addr, "c", T, T, &allowed).await });
        let (_broker, _) = tokio::time::timeout(T, listener.accept())
            .await
            .expect("an allowed broker is dialled")
            .unwrap();
        dial.abort();
    }

    /// Read one request frame from the fake broker's side; returns (api_version, correlation id).
    async fn read_request(broker: &mut DuplexStream) -> (i16, i32) {
        let mut len = [0u8; 4];
        broker.read_exact(&mut len).await.unwrap();
        let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
        broker.read_exact(&mut frame).await.unwrap();
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        (version, correlation)
    }

    async fn write_frame(broker: &mut DuplexStream, correlation: i32, body: &[u8]) {
        let mut out = Vec::new();
        out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        out.extend_from_slice(&correlation.to_be_bytes());
        out.extend_from_slice(body);
        broker.write_all(&out).await.unwrap();
    }

    #[tokio::test]
    async fn frames_arriving_in_pieces_are_read_whole_and_no_further() {
        // A 7-byte pipe hands the reader every frame in several pieces, and the second frame
        // follows the first at once: each read must stop at its frame's end.
        let (mut reader, mut writer) = duplex(7);
        let first: Vec<u8> = (0..40u8).collect();
        let second = b"next frame".to_vec();
        let mut wire = Vec::new();
        for body in [&first, &second] {
            wire.extend_from_slice(&(body.len() as i32).to_be_bytes());
            wire.extend_from_slice(body);
        }
        let writing = tokio::spawn(async move { writer.write_all(&wire).await.unwrap() });
        assert_eq!(
            &read_frame(&mut reader, "pipe").await.unwrap()[..],
            &first[..]
        );
        assert_eq!(
            &read_frame(&mut reader, "pipe").await.unwrap()[..],
            &second[..]
        );
        writing.await.unwrap();
    }

    #[tokio::test]
    async fn a_truncated_frame_poisons_the_connection_with_a_named_error() {
        let (client, mut broker) = duplex(4096);
        let mut conn = Connection::from_stream(client, "fake:1", "test");
        conn.set_versions(HashMap::from([(3, (0, 12))]));
        let pending = tokio::spawn(async move {
            let r = conn.request(&MetadataRequest::default(), 12, T).await;
            (r, conn)
        });
        let (_, correlation) = read_request(&mut broker).await;
        // Announce 100 bytes, send 10, hang up.
        let mut out = 100i32.to_be_bytes().to_vec();
        out.extend_from_slice(&correlation.to_be_bytes());
        out.extend_from_slice(&[0u8; 6]);
        broker.write_all(&out).await.unwrap();
        drop(broker);
        let (result, conn) = pending.await.unwrap();
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.contains("fake:1") && msg.contains("truncated frame"),
            "{msg}"
        );
        assert!(conn.is_poisoned());
        let later = conn
            .request(&MetadataRequest::default(), 12, T)
            .await
            .unwrap_err();
        assert!(later.to_string().contains("unusable"), "{later}");
    }

    #[tokio::test]
    async fn a_timed_out_request_closes_the_connection() {
        let (client, mut broker) = duplex(4096);
        let conn = Connection::from_stream(client, "fake:9", "test");
        let pending = tokio::spawn(async move {
            let r = conn
                .request(&MetadataRequest::default(), 12, Duration::from_millis(200))
                .await;
            (r, conn)
        });
        read_request(&mut broker).await;
        let (result, conn) = pending.await.unwrap();
        let msg = result.unwrap_err().to_string();
        assert!(msg.contains("fake:9"), "{msg}");
        assert!(conn.is_poisoned(), "a timed-out connection stays in use");
        // The socket is closed: the broker side reads end of stream.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(T, broker.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0))), "{read:?}");
    }

    #[tokio::test]
    async fn an_absurd_frame_length_poisons_the_connection() {
        let (client, mut broker) = duplex(4096);
        let conn = Connection::from_stream(client, "fake:2", "test");
        let pending =
            tokio::spawn(async move { conn.request(&MetadataRequest::default(), 12, T).await });
        read_request(&mut broker).await;
        broker.write_all(&(-5i32).to_be_bytes()).await.unwrap();
        let msg = pending.await.unwrap().unwrap_err().to_string();
        assert!(msg.contains("frame of -5 bytes"), "{msg}");
    }

    #[tokio::test]
    async fn an_undecodable_body_is_an_error_not_a_panic() {
        let (client, mut broker) = duplex(4096);
        let conn = Connection::from_stream(client, "fake:3", "test");
        let pending =
            tokio::spawn(async move { conn.request(&MetadataRequest::default(), 12, T).await });
        let (_, correlation) = read_request(&mut broker).await;
        // v12 is flexible: header tag section, then a body cut short after 3 bytes.
        write_frame(&mut broker, correlation, &[0, 0, 0, 1]).await;
        let msg = pending.await.unwrap().unwrap_err().to_string();
        assert!(
            msg.contains("cannot decode response to api_key=3 v12"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn pipelined_responses_reach_their_requests_out_of_order() {
        let (client, mut broker) = duplex(1 << 16);
        let conn = Arc::new(Connection::from_stream(client, "fake:4", "test"));
        let mut calls = Vec::new();
        for _ in 0..2 {
            let c = Arc::clone(&conn);
            calls.push(tokio::spawn(async move {
                c.request(&ApiVersionsRequest::default(), 0, T).await
            }));
        }
        let (_, first) = read_request(&mut broker).await;
        let (_, second) = read_request(&mut broker).await;
        for (correlation, key) in [(second, 77i16), (first, 66i16)] {
            let mut body = ApiVersionsResponse::default();
            let mut v = ApiVersion::default();
            v.api_key = key;
            body.api_keys.push(v);
            let mut buf = BytesMut::new();
            body.encode(&mut buf, 0).unwrap();
            write_frame(&mut broker, correlation, &buf).await;
        }
        let mut keys = Vec::new();
        for call in calls {
            keys.push(call.await.unwrap().unwrap().api_keys[0].api_key);
        }
        keys.sort();
        assert_eq!(keys, vec![66, 77]);
    }

    /// A body that is just these bytes, for [`Connection::request_raw`].
    struct RawBody(Vec<u8>);

    impl Encodable for RawBody {
        fn encode<B: kafka_protocol::protocol::buf::ByteBufMut>(
            &self,
            buf: &mut B,
            _version: i16,
        ) -> anyhow::Result<()> {
            buf.put_slice(&self.0);
            Ok(())
        }
        fn compute_size(&self, _version: i16) -> anyhow::Result<usize> {
            Ok(self.0.len())
        }
    }

    #[tokio::test]
    async fn a_raw_request_carries_a_flexible_header_and_gets_its_body_back_without_one() {
        let (client, mut broker) = duplex(4096);
        let conn = Connection::from_stream(client, "fake:6", "cid");
        let pending = tokio::spawn(async move {
            conn.request_raw(94, 0, true, &RawBody(vec![0xAB, 0xCD]), T)
                .await
        });
        let mut len = [0u8; 4];
        broker.read_exact(&mut len).await.unwrap();
        let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
        broker.read_exact(&mut frame).await.unwrap();
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let mut expected = Vec::new();
        expected.extend_from_slice(&94i16.to_be_bytes()); // api key, as given at run time
        expected.extend_from_slice(&0i16.to_be_bytes()); // api version
        expected.extend_from_slice(&correlation.to_be_bytes());
        expected.extend_from_slice(&3i16.to_be_bytes()); // client id: int16 length (not compact)
        expected.extend_from_slice(b"cid");
        expected.push(0); // header v2: empty tagged fields
        expected.extend_from_slice(&[0xAB, 0xCD]); // the body
        assert_eq!(frame, expected);
        // Response header v1: correlation id, then an empty tagged-field section.
        write_frame(&mut broker, correlation, &[0, 0x12, 0x34]).await;
        let body = pending.await.unwrap().unwrap();
        assert_eq!(&body[..], &[0x12, 0x34]);
    }

    #[tokio::test]
    async fn api_versions_falls_back_from_v3_when_the_broker_answers_unsupported_version() {
        let (client, mut broker) = duplex(1 << 16);
        let mut conn = Connection::from_stream(client, "fake:5", "test");
        let fake = tokio::spawn(async move {
            let (version, correlation) = read_request(&mut broker).await;
            assert_eq!(version, 3);
            // UNSUPPORTED_VERSION in a v0-shaped body, as the dev broker sends.
            let mut refusal = ApiVersionsResponse::default();
            refusal.error_code = UNSUPPORTED_VERSION;
            let mut buf = BytesMut::new();
            refusal.encode(&mut buf, 0).unwrap();
            write_frame(&mut broker, correlation, &buf).await;
            let (version, correlation) = read_request(&mut broker).await;
            assert_eq!(version, 2);
            let mut ok = ApiVersionsResponse::default();
            let mut v = ApiVersion::default();
            v.api_key = 78;
            v.min_version = 1;
            v.max_version = 1;
            ok.api_keys.push(v);
            let mut buf = BytesMut::new();
            ok.encode(&mut buf, 2).unwrap();
            // One stray trailing byte must not matter.
            buf.put_u8(0);
            write_frame(&mut broker, correlation, &buf).await;
            broker
        });
        conn.negotiate_versions(T).await.unwrap();
        let _broker = fake.await.unwrap();
        assert_eq!(conn.pick(78, 1, 1).unwrap(), 1);
        let err = conn.pick(78, 2, 2).unwrap_err().to_string();
        assert!(err.contains("only in versions 1..=1"), "{err}");
        assert!(conn
            .pick(76, 1, 1)
            .unwrap_err()
            .to_string()
            .contains("does not support"));
    }

    #[test]
    fn the_version_picked_is_the_highest_both_sides_support() {
        let versions = HashMap::from([(3, (0, 13)), (10, (0, 3))]);
        assert_eq!(pick_version("b", &versions, 3, 10, 12).unwrap(), 12);
        assert_eq!(pick_version("b", &versions, 10, 0, 6).unwrap(), 3);
        assert!(pick_version("b", &versions, 10, 4, 6).is_err());
    }
}
