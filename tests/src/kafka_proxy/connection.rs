//! Listeners and client connections: TLS termination, the SASL exchange, and the pump that
//! passes requests to the broker and responses (rewritten) back in order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
    ShareGroupHeartbeatRequest,
};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use super::faults::{self, ProxyFaults};
use super::frame::{
    decode_request, encode_response, peek_request, produce_acks, raw, read_frame, response_header,
    write_frame, RequestMeta,
};
use super::groups::GroupNamespace;
use super::local::LocalApis;
use super::rewrite::{
    HeartbeatSeen, InFlight, Rewriter, API_VERSIONS, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE,
    SHARE_GROUP_HEARTBEAT,
};
use super::sasl::{Authenticator, SaslConfig, SaslMechanism, Step};
use super::share_sessions::ShareSessions;

/// Kafka error codes the SASL exchange answers with.
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const ILLEGAL_SASL_STATE: i16 = 34;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// What every connection of one proxy shares.
pub(crate) struct Shared {
    /// Broker id -> the broker's own address.
    pub upstream: HashMap<i32, String>,
    pub tls: Option<TlsAcceptor>,
    pub sasl: Option<SaslConfig>,
    pub rewriter: Rewriter,
    pub faults: ProxyFaults,
    pub counts: Mutex<HashMap<i16, u64>>,
    /// Requests the proxy answers itself.
    pub local: LocalApis,
    /// Connections to the dev broker opened for clients (each at a client's first forwarded
    /// request).
    pub upstream_opened: AtomicU64,
    next_connection: AtomicU64,
    /// Kafka's one namespace for group ids, when the proxy emulates it.
    pub groups: Option<Arc<GroupNamespace>>,
    /// Kafka's share-session reopen, when the proxy emulates it.
    pub share_sessions: Option<Arc<ShareSessions>>,
}

impl Shared {
    pub(crate) fn new(
        upstream: HashMap<i32, String>,
        tls: Option<TlsAcceptor>,
        sasl: Option<SaslConfig>,
        rewriter: Rewriter,
        faults: ProxyFaults,
        local: LocalApis,
    ) -> Shared {
        Shared {
            upstream,
            tls,
            sasl,
            rewriter,
            faults,
            counts: Mutex::new(HashMap::new()),
            local,
            upstream_opened: AtomicU64::new(0),
            next_connection: AtomicU64::new(1),
            groups: None,
            share_sessions: None,
        }
    }

    /// Emulates Kafka's one namespace for group ids (`groups.rs`).
    pub(crate) fn with_groups(mut self, groups: Option<Arc<GroupNamespace>>) -> Shared {
        self.groups = groups;
        self
    }

    /// Emulates Kafka's share-session reopen (`share_sessions.rs`).
    pub(crate) fn with_share_sessions(mut self, sessions: Option<Arc<ShareSessions>>) -> Shared {
        self.share_sessions = sessions;
        self
    }

    fn count(&self, api_key: i16) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(api_key)
            .or_default() += 1;
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Accepts clients for broker `node` until the runtime stops.
pub(crate) async fn accept_loop(listener: TcpListener, node: i32, shared: Arc<Shared>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                eprintln!("kafka proxy: accept on the listener for broker {node} failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        let task_shared = Arc::clone(&shared);
        let handle = tokio::spawn(async move {
            if let Err(e) = serve(tcp, node, &task_shared).await {
                eprintln!("kafka proxy: connection to broker {node} closed: {e}");
            }
            task_shared.faults.forget_connection(id);
        });
        shared.faults.register_connection(id, handle.abort_handle());
    }
}

/// What the response side sends next, in request order.
enum Pending {
    /// The connection to the broker was just opened: read forwarded answers from it.
    Connected(OwnedReadHalf),
    /// Read the broker's next response, rewrite it and pass it on.
    Forwarded(InFlight),
    /// A response the proxy made itself.
    Local(Bytes),
    /// A response the proxy made itself, after which the connection closes (as Kafka does after
    /// a failed authentication).
    LocalThenClose(Bytes),
}

/// Where a SASL listener's connection stands.
enum Auth {
    /// Not a SASL listener, or authenticated.
    Open,
    /// Only ApiVersions and SaslHandshake are allowed.
    AwaitHandshake,
    /// After SaslHandshake: SaslAuthenticate requests (v1 handshake) or raw tokens (v0).
    Authenticating {
        authenticator: Authenticator,
        raw_tokens: bool,
    },
}

async fn serve(tcp: TcpStream, node: i32, shared: &Shared) -> Result<(), String> {
    let _ = tcp.set_nodelay(true);
    let client: Box<dyn Stream> = match &shared.tls {
        Some(acceptor) => {
            let tls = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                .await
                .map_err(|_| "TLS handshake timed out after 10s".to_string())?
                .map_err(|e| format!("TLS handshake failed: {e}"))?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    let (client_read, client_write) = tokio::io::split(client);
    let (pending, pending_rx) = mpsc::unbounded_channel();
    let requests = requests(client_read, node, pending, shared);
    let responses = responses(client_write, pending_rx, shared);
    tokio::pin!(requests, responses);
    tokio::select! {
        result = &mut requests => {
            // Let the responses already owed (e.g. a failed authentication's answer) go out.
            let _ = responses.await;
            result
        }
        result = &mut responses => result,
    }
}

/// Opens the connection to broker `node`.
async fn connect_upstream(node: i32, shared: &Shared) -> Result<TcpStream, String> {
    let address = shared
        .upstream
        .get(&node)
        .ok_or_else(|| format!("no broker {node} upstream"))?;
    let upstream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(address))
        .await
        .map_err(|_| format!("connecting to broker {node} at {address} timed out"))?
        .map_err(|e| format!("cannot connect to broker {node} at {address}: {e}"))?;
    let _ = upstream.set_nodelay(true);
    shared.upstream_opened.fetch_add(1, Ordering::Relaxed);
    Ok(upstream)
}

/// Reads requests from the client, answers SASL, injected errors and emulated APIs itself and
/// forwards the rest. The connection to the broker opens at the first forwarded request, so a
/// client that only uses what the proxy answers never connects to (nor disconnects from) the
/// dev broker, which drops every share session of a broker when any connection to it closes.
/// Returns when the client closes, or when the connection must close.
async fn requests<R: AsyncRead + Unpin>(
    mut client: R,
    node: i32,
    pending: mpsc::UnboundedSender<Pending>,
    shared: &Shared,
) -> Result<(), String> {
    let mut upstream: Option<OwnedWriteHalf> = None;
    // Also runs when the connection task is aborted (`close_connections`).
    let mut closing = UpstreamClosed {
        node,
        shared,
        opened: false,
    };
    let mut auth = if shared.sasl.is_some() {
        Auth::AwaitHandshake
    } else {
        Auth::Open
    };
    let send = |p: Pending| {
        pending
            .send(p)
            .map_err(|_| "response side closed".to_string())
    };
    loop {
        let Some(mut frame) = read_frame(&mut client)
            .await
            .map_err(|e| format!("reading a request: {e}"))?
        else {
            return Ok(());
        };
        // After a v0 handshake the tokens come bare, without a Kafka header.
        if let Auth::Authenticating {
            authenticator,
            raw_tokens: true,
        } = &mut auth
        {
            match authenticator.step(&frame) {
                Step::Challenge(bytes) => send(Pending::Local(raw(&bytes)))?,
                Step::Done(bytes) => {
                    send(Pending::Local(raw(&bytes)))?;
                    auth = Auth::Open;
                }
                // No way to carry an error after a v0 handshake: Kafka just closes.
                Step::Failed(message) => return Err(format!("authentication failed: {message}")),
            }
            continue;
        }
        let meta = peek_request(&frame).ok_or("a request shorter than its header")?;
        shared.count(meta.api_key);
        match &mut auth {
            Auth::AwaitHandshake => match meta.api_key {
                API_VERSIONS => {}
                SASL_HANDSHAKE => {
                    let (reply, next) = handshake(&frame, meta, shared)?;
                    match next {
                        Some(next) => {
                            send(Pending::Local(reply))?;
                            auth = next;
                        }
                        None => {
                            send(Pending::LocalThenClose(reply))?;
                            return Ok(());
                        }
                    }
                    continue;
                }
                other => {
                    return Err(format!(
                        "request api_key={other} before SASL authentication; closing as Kafka does"
                    ))
                }
            },
            Auth::Authenticating { authenticator, .. } => {
                if meta.api_key != SASL_AUTHENTICATE {
                    return Err(format!(
                        "request api_key={} during SASL authentication; closing as Kafka does",
                        meta.api_key
                    ));
                }
                let (_, request) = decode_request::<SaslAuthenticateRequest>(&frame, meta.version)?;
                let mut response = SaslAuthenticateResponse::default();
                let step = authenticator.step(&request.auth_bytes);
                let failed = match step {
                    Step::Challenge(bytes) => {
                        response.auth_bytes = Bytes::from(bytes);
                        None
                    }
                    Step::Done(bytes) => {
                        response.auth_bytes = Bytes::from(bytes);
                        auth = Auth::Open;
                        None
                    }
                    Step::Failed(message) => {
                        response.error_code = SASL_AUTHENTICATION_FAILED;
                        response.error_message = Some(StrBytes::from_string(message.clone()));
                        Some(message)
                    }
                };
                let reply = encode_response(
                    &response_header(meta.correlation_id),
                    &response,
                    meta.version,
                )?;
                if let Some(message) = failed {
                    send(Pending::LocalThenClose(reply))?;
                    return Err(format!("authentication failed: {message}"));
                }
                send(Pending::Local(reply))?;
                continue;
            }
            Auth::Open => {}
        }
        // Outside the exchange the SASL APIs get Kafka's answer for a finished (or absent) one.
        if meta.api_key == SASL_HANDSHAKE || meta.api_key == SASL_AUTHENTICATE {
            send(Pending::Local(illegal_sasl_state(&meta)?))?;
            continue;
        }
        if let Some(code) = shared.faults.take_error(meta.api_key) {
            send(Pending::Local(faults::error_response(meta, &frame, code)?))?;
            continue;
        }
        // Group membership requests: learned, or refused as Kafka refuses another group type.
        if let Some(groups) = &shared.groups {
            if let Some(answer) = groups.on_request(meta, &frame)? {
                send(Pending::Local(answer))?;
                continue;
            }
        }
        if let Some(answer) = shared.local.answer(meta, &frame, node) {
            send(Pending::Local(answer.await?))?;
            continue;
        }
        // Partitions clients may not see yet never reach the dev broker.
        let hidden_produce = match &shared.rewriter.growth {
            Some(growth) if meta.api_key == PRODUCE => {
                let (rewritten, hidden) =
                    growth.produce_request(meta, frame, &|id| shared.rewriter.topic_name(id))?;
                frame = rewritten;
                Some(hidden).filter(|h| !h.is_empty())
            }
            _ => None,
        };
        let expects_response =
            meta.api_key != PRODUCE || produce_acks(&frame, meta.version) != Some(0);
        if expects_response {
            let heartbeat = if meta.api_key == SHARE_GROUP_HEARTBEAT && shared.rewriter.kafka42 {
                decode_request::<ShareGroupHeartbeatRequest>(&frame, meta.version)
                    .ok()
                    .map(|(_, r)| HeartbeatSeen {
                        member_id: r.member_id.to_string(),
                        member_epoch: r.member_epoch,
                        full: r.subscribed_topic_names.is_some(),
                    })
            } else {
                None
            };
            let share = match &shared.share_sessions {
                Some(sessions) => {
                    let (rewritten, seen) = sessions.on_request(node, meta, frame)?;
                    frame = rewritten;
                    seen
                }
                None => None,
            };
            if upstream.is_none() {
                let (read, write) = connect_upstream(node, shared).await?.into_split();
                closing.opened = true;
                send(Pending::Connected(read))?;
                upstream = Some(write);
            }
            send(Pending::Forwarded(InFlight {
                meta,
                heartbeat,
                share,
                hidden_produce,
            }))?;
        }
        let upstream = match &mut upstream {
            Some(upstream) => upstream,
            None => {
                let (read, write) = connect_upstream(node, shared).await?.into_split();
                closing.opened = true;
                send(Pending::Connected(read))?;
                upstream.insert(write)
            }
        };
        write_frame(upstream, &frame)
            .await
            .map_err(|e| format!("forwarding api_key={} to the broker: {e}", meta.api_key))?;
    }
}

/// The dev broker ends every share session on a broker when any connection to it closes; the
/// share-session emulation must forget them then.
struct UpstreamClosed<'a> {
    node: i32,
    shared: &'a Shared,
    opened: bool,
}

impl Drop for UpstreamClosed<'_> {
    fn drop(&mut self) {
        if let (true, Some(sessions)) = (self.opened, &self.shared.share_sessions) {
            sessions.connection_closed(self.node);
        }
    }
}

/// Answers SaslHandshake; the next state, or `None` when the connection must close.
fn handshake(
    frame: &Bytes,
    meta: RequestMeta,
    shared: &Shared,
) -> Result<(Bytes, Option<Auth>), String> {
    let config = shared.sasl.as_ref().ok_or("no SASL on this listener")?;
    let (_, request) = decode_request::<SaslHandshakeRequest>(frame, meta.version)?;
    let mut response = SaslHandshakeResponse::default();
    response.mechanisms = config
        .mechanisms
        .iter()
        .map(|m| StrBytes::from_static_str(m.name()))
        .collect();
    let chosen = request
        .mechanism
        .parse::<SaslMechanism>()
        .ok()
        .filter(|m| config.mechanisms.contains(m));
    let next = match chosen {
        Some(mechanism) => Some(Auth::Authenticating {
            authenticator: Authenticator::new(mechanism, config)?,
            raw_tokens: meta.version == 0,
        }),
        None => {
            response.error_code = UNSUPPORTED_SASL_MECHANISM;
            None
        }
    };
    let reply = encode_response(
        &response_header(meta.correlation_id),
        &response,
        meta.version,
    )?;
    Ok((reply, next))
}

fn illegal_sasl_state(meta: &RequestMeta) -> Result<Bytes, String> {
    let header = response_header(meta.correlation_id);
    if meta.api_key == SASL_HANDSHAKE {
        let mut r = SaslHandshakeResponse::default();
        r.error_code = ILLEGAL_SASL_STATE;
        encode_response(&header, &r, meta.version)
    } else {
        let mut r = SaslAuthenticateResponse::default();
        r.error_code = ILLEGAL_SASL_STATE;
        r.error_message = Some(StrBytes::from_static_str(
            "Unexpected SASL request: the connection is not in a SASL exchange",
        ));
        encode_response(&header, &r, meta.version)
    }
}

/// Sends responses to the client in request order.
async fn responses<W: AsyncWrite + Unpin>(
    mut client: W,
    mut pending: mpsc::UnboundedReceiver<Pending>,
    shared: &Shared,
) -> Result<(), String> {
    let mut upstream: Option<OwnedReadHalf> = None;
    while let Some(next) = pending.recv().await {
        let frame = match next {
            Pending::Connected(read) => {
                upstream = Some(read);
                continue;
            }
            Pending::Local(frame) => frame,
            Pending::LocalThenClose(frame) => {
                write_frame(&mut client, &frame)
                    .await
                    .map_err(|e| format!("writing to the client: {e}"))?;
                let _ = client.shutdown().await;
                return Ok(());
            }
            Pending::Forwarded(flight) => {
                let upstream = upstream
                    .as_mut()
                    .ok_or("a forwarded request before the broker connection opened")?;
                let Some(frame) = read_frame(upstream)
                    .await
                    .map_err(|e| format!("reading the broker's response: {e}"))?
                else {
                    return Err("the broker closed the connection".into());
                };
                let api_key = flight.meta.api_key;
                // Before any drop: the broker did answer.
                if let (Some(sessions), Some(seen)) = (&shared.share_sessions, &flight.share) {
                    sessions.on_response(seen, flight.meta.version, &frame);
                }
                let frame = match shared.rewriter.response(&flight, frame.clone()) {
                    Ok(out) => out,
                    Err(e) => {
                        eprintln!(
                            "kafka proxy: cannot rewrite the response to api_key={api_key} v{}: {e}; passing it on unchanged",
                            flight.meta.version
                        );
                        frame
                    }
                };
                if shared.faults.take_drop(api_key) {
                    continue;
                }
                if let Some(delay) = shared.faults.delay(api_key) {
                    tokio::time::sleep(delay).await;
                }
                frame
            }
        };
        write_frame(&mut client, &frame)
            .await
            .map_err(|e| format!("writing to the client: {e}"))?;
    }
    Ok(())
}
