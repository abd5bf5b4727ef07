//! [`IdempotentProducer`]: a thin rdkafka producer for the records Spillway writes itself —
//! dead letters and the `kafka` sink's replicated records.
//!
//! It is idempotent (`enable.idempotence=true`: no duplicates from internal retries, order kept
//! per partition) and [`send_all`](IdempotentProducer::send_all) returns only once the broker has
//! confirmed every record, because callers settle source records on that confirmation: a dead
//! letter must be written before its record is rejected, a replicated record before it is
//! accepted.

use std::borrow::Cow;
use std::error::Error;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::bindings as rdsys;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, ProducerContext};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::classic::GroupMetadata;
use crate::security::{rdkafka_config, SecurityContext};
use rdkafka::producer::Producer;
use rustc_hash::FxHashMap;
use spillway_core::Topic;

/// Why a record was not written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProduceError {
    #[error("cannot create a producer for {bootstrap}: {reason}")]
    Create { bootstrap: String, reason: String },
    #[error("record for {topic} (partition {partition:?}) was not written: {reason}")]
    Delivery {
        topic: String,
        partition: Option<i32>,
        reason: String,
        /// Whether sending it again may succeed (a timeout, an unavailable leader) or not
        /// (too large, no such partition, not authorized).
        retriable: bool,
        /// The cluster refuses the producer itself (not authorized for the topic or cluster,
        /// a refused login or certificate): no record would get through.
        refuses_the_configuration: bool,
    },
    #[error("the producer for {bootstrap} could not flush within {timeout:?}: {reason}")]
    Flush {
        bootstrap: String,
        timeout: Duration,
        reason: String,
    },
}

/// One record to write. `partition: None` lets the producer's partitioner (murmur2 of the key,
/// as the Java client) choose.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutRecord {
    /// Shared: records to one topic name it without a copy each.
    pub topic: Topic,
    pub partition: Option<i32>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// Names are mostly fixed (`spillway.source.offset`): borrowed, not a `String` per record.
    pub headers: Vec<(Cow<'static, str>, Option<Bytes>)>,
    /// Milliseconds since the epoch; `None` lets the producer stamp it.
    pub timestamp: Option<i64>,
}

/// Where the broker stored a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub partition: i32,
    pub offset: i64,
}

/// The rdkafka producer both producers wrap: a [`PollingThread`] runs its callbacks, and
/// delivery reports land in the sending batch ([`Reports`]).
type RdProducer = BaseProducer<ReportingContext>;

/// The rdkafka producer and the librdkafka topic handles records are produced with.
struct Native {
    /// Declared before `producer`, so every handle is released before the client is destroyed.
    topics: TopicHandles,
    /// Declared before `producer`: stopped before the producer is destroyed.
    _polling: PollingThread,
    producer: Arc<RdProducer>,
    flusher: Flusher,
}

impl Native {
    fn new(producer: RdProducer) -> Result<Native, KafkaError> {
        let producer = Arc::new(producer);
        Ok(Native {
            topics: TopicHandles::default(),
            _polling: PollingThread::start(Arc::clone(&producer))?,
            producer,
            flusher: Flusher::default(),
        })
    }
}

/// Serves a producer's events (delivery reports, logs, errors) on a thread of its own, waking
/// only when librdkafka has queued some.
///
/// rdkafka's `ThreadedProducer` polls for 100 ms in a loop, but its poll rounds the time left
/// down to whole milliseconds: in the last millisecond of every 100 ms it polls librdkafka's
/// queue with a timeout of 0 over and over. Each of a mirror flow's producers spent about 1% of a
/// core that way, idle or not (perf, bench/README.md). Here librdkafka writes a byte to a
/// socket when its queue gets an event after being served (`rd_kafka_queue_io_event_enable`),
/// and the thread serves exactly the events queued, then sleeps on the socket again.
struct PollingThread {
    stop: Arc<AtomicBool>,
    /// Declared before `wake`: its wake-ups are turned off before their socket is closed.
    _queue: EventQueue,
    /// The end librdkafka writes to; also how [`Drop`] wakes the thread.
    wake: std::os::unix::net::UnixStream,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A reference to a producer's main (event) queue, released on drop.
struct EventQueue(NonNull<rdsys::rd_kafka_queue_t>);

// SAFETY: librdkafka queues are locked inside librdkafka; a reference may be used from any thread.
unsafe impl Send for EventQueue {}
unsafe impl Sync for EventQueue {}

impl Drop for EventQueue {
    fn drop(&mut self) {
        // SAFETY: the reference came from `rd_kafka_queue_get_main` and is released once, here,
        // after its wake-ups are turned off (the socket they go to is closed next).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.0.as_ptr(), -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.0.as_ptr());
        }
    }
}

impl PollingThread {
    fn start(producer: Arc<RdProducer>) -> Result<PollingThread, KafkaError> {
        use std::os::fd::AsRawFd;
        let failed = |e: std::io::Error| {
            KafkaError::ClientCreation(format!("cannot start the producer's polling thread: {e}"))
        };
        let (wake, mut woken) = std::os::unix::net::UnixStream::pair().map_err(failed)?;
        // librdkafka writes from its own threads: never block them.
        wake.set_nonblocking(true).map_err(failed)?;
        // SAFETY: the producer is live; the reference is released by `EventQueue`'s drop.
        let queue =
            NonNull::new(unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) })
                .map(EventQueue)
                .ok_or_else(|| {
                    KafkaError::ClientCreation("the producer has no event queue".into())
                })?;
        const WAKE_UP: &[u8] = b"1";
        // SAFETY: `wake` stays open while the wake-ups are on (`EventQueue`'s drop turns them
        // off before `wake` is closed, the fields dropping in order); librdkafka copies the
        // payload.
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(
                queue.0.as_ptr(),
                wake.as_raw_fd(),
                WAKE_UP.as_ptr().cast(),
                WAKE_UP.len(),
            )
        };
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            let queue = EventQueue(queue.0);
            std::thread::Builder::new()
                .name("producer polling".into())
                .spawn(move || {
                    // Borrowed from the `PollingThread`, which joins this thread before it
                    // releases the queue: not released here.
                    let queue = std::mem::ManuallyDrop::new(queue);
                    let mut buffer = [0u8; 64];
                    loop {
                        // SAFETY: the queue reference is live until this thread is joined.
                        while unsafe { rdsys::rd_kafka_queue_length(queue.0.as_ptr()) } > 0 {
                            // Serves one event (a poll whose deadline has passed at once).
                            producer.poll(Duration::ZERO);
                        }
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        use std::io::Read;
                        match woken.read(&mut buffer) {
                            Ok(0) => return,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => return,
                        }
                    }
                })
                .map_err(failed)?
        };
        Ok(PollingThread {
            stop,
            _queue: queue,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for PollingThread {
    fn drop(&mut self) {
        use std::io::Write;
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the thread if it sleeps; a full socket already holds a wake-up.
        let _ = (&self.wake).write(b"0");
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sends what a caller queued at once rather than after `linger.ms`, in as few requests as
/// librdkafka can make of it.
///
/// Every caller waits for all it queued (a put for each of its records, a dead letter for its
/// confirmation, a transaction for each step), so lingering only waits; yet without a linger
/// librdkafka's broker thread sends the first record of a put alone and the rest in requests
/// as small as it can pick them up, at three times the C consume→produce loop's cost in that
/// thread (bench/README.md). So the producer keeps librdkafka's linger and, while a caller
/// waits for records it has queued, a blocking thread holds librdkafka's flush
/// (`rd_kafka_flush`, during which broker threads take `linger.ms` as elapsed). One such
/// thread per producer at most.
#[derive(Default)]
struct Flusher {
    /// Flushes asked for so far ([`FlushHold`]s taken).
    asked: AtomicU64,
    /// Callers waiting for records they queued ([`FlushHold`]s alive).
    waiting: AtomicUsize,
    /// A flushing thread runs.
    running: AtomicBool,
}

/// Longest one `rd_kafka_flush` call lasts: the flushing thread looks again after it whether
/// anyone still waits.
const FLUSH_SLICE: Duration = Duration::from_millis(100);

/// A caller waiting for records it queued: the producer flushes until it is dropped.
struct FlushHold(Arc<Native>);

impl Drop for FlushHold {
    fn drop(&mut self) {
        self.0.flusher.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Native {
    /// Flushes from now until the returned hold is dropped (see [`Flusher`]).
    fn hold_flush(self: &Arc<Native>) -> FlushHold {
        let flusher = &self.flusher;
        flusher.waiting.fetch_add(1, Ordering::SeqCst);
        flusher.asked.fetch_add(1, Ordering::SeqCst);
        let hold = FlushHold(Arc::clone(self));
        if !flusher.running.swap(true, Ordering::SeqCst) {
            let native = Arc::clone(self);
            let flush = move || native.flush_while_waited_for();
            // Off the async threads: a flush blocks until the records are delivered.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(flush);
                }
                Err(_) => {
                    std::thread::spawn(flush);
                }
            }
        }
        hold
    }

    /// The flushing thread: flushes while a caller waits for records not delivered yet.
    fn flush_while_waited_for(&self) {
        let flusher = &self.flusher;
        let client = self.producer.client().native_ptr();
        loop {
            let seen = flusher.asked.load(Ordering::SeqCst);
            // SAFETY: `client` is this live producer's; flushing is allowed from any thread
            // (it serves delivery reports as the polling thread does).
            let outcome = unsafe { rdsys::rd_kafka_flush(client, FLUSH_SLICE.as_millis() as i32) };
            // Not all delivered within the slice (no connection or producer id yet, a slow
            // broker): go on while a caller waits. All delivered: the callers waiting now have
            // their reports; go on only for callers that asked since.
            let undelivered = outcome != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
            if flusher.asked.load(Ordering::SeqCst) != seen
                || (undelivered && flusher.waiting.load(Ordering::SeqCst) != 0)
            {
                continue;
            }
            flusher.running.store(false, Ordering::SeqCst);
            // A caller that asked between the load and the store found `running` still set
            // and left the flush to this thread: go on unless another thread took it.
            if flusher.asked.load(Ordering::SeqCst) == seen
                || flusher.running.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }
}

/// librdkafka topic handles by name, each made the first time the producer writes to its topic
/// and kept while the producer lives (a producer writes to the few topics its configuration
/// names). Producing with a handle saves what producing with a name costs every record: the
/// name's copy into a C string, and librdkafka's lookup of the topic under its client-wide lock.
#[derive(Default)]
struct TopicHandles {
    by_name: Mutex<FxHashMap<Topic, Arc<TopicHandle>>>,
}

/// One application reference to a librdkafka topic, released on drop.
struct TopicHandle(NonNull<rdsys::rd_kafka_topic_t>);

// SAFETY: librdkafka topic handles may be used and released from any thread (the topic is
// reference-counted and locked inside librdkafka).
unsafe impl Send for TopicHandle {}
unsafe impl Sync for TopicHandle {}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from `rd_kafka_topic_new` and is released once, here.
        unsafe { rdsys::rd_kafka_topic_destroy(self.0.as_ptr()) };
    }
}

impl TopicHandles {
    /// `topic`'s handle on `client` (the client these handles belong to).
    fn get(
        &self,
        client: *mut rdsys::rd_kafka_t,
        topic: &Topic,
    ) -> Result<Arc<TopicHandle>, KafkaError> {
        let mut by_name = self.by_name.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(handle) = by_name.get(topic.as_str()) {
            return Ok(Arc::clone(handle));
        }
        let name = CString::new(topic.as_str())?;
        // SAFETY: `client` is a live producer; a null configuration takes the producer's
        // default topic configuration, as producing with the topic's name does.
        let handle = NonNull::new(unsafe {
            rdsys::rd_kafka_topic_new(client, name.as_ptr(), std::ptr::null_mut())
        })
        .map(TopicHandle)
        // librdkafka refuses a name longer than it allows (`rd_kafka_last_error`).
        .ok_or_else(|| {
            KafkaError::MessageProduction(RDKafkaErrorCode::from(unsafe {
                rdsys::rd_kafka_last_error()
            }))
        })?;
        let handle = Arc::new(handle);
        by_name.insert(topic.clone(), Arc::clone(&handle));
        Ok(handle)
    }
}

/// librdkafka's `RD_KAFKA_PARTITION_UA`: the partitioner chooses.
const PARTITION_UNASSIGNED: i32 = -1;

/// Offers `record` to `native`'s librdkafka on `topic` (a handle of `native`'s) with `opaque`
/// for its delivery report. librdkafka copies key and value (`RD_KAFKA_MSG_F_COPY`, as
/// rdkafka's `send`) and takes `headers` only when it accepts the record.
fn produce(
    native: &Native,
    topic: &TopicHandle,
    record: &OutRecord,
    headers: &mut Option<NativeHeaders>,
    opaque: usize,
) -> Result<(), KafkaError> {
    use rdsys::rd_kafka_vtype_t as V;
    use rdsys::rd_kafka_vu_s__bindgen_ty_1 as U;
    let vu = |vtype, u| rdsys::rd_kafka_vu_t { vtype, u };
    let mem = |bytes: &Option<Bytes>| U {
        mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
            ptr: bytes.as_ref().map_or(std::ptr::null_mut(), |b| {
                b.as_ptr() as *mut std::ffi::c_void
            }),
            size: bytes.as_ref().map_or(0, Bytes::len),
        },
    };
    let vus = [
        vu(
            V::RD_KAFKA_VTYPE_RKT,
            U {
                rkt: topic.0.as_ptr(),
            },
        ),
        vu(
            V::RD_KAFKA_VTYPE_PARTITION,
            U {
                i32_: record.partition.unwrap_or(PARTITION_UNASSIGNED),
            },
        ),
        vu(
            V::RD_KAFKA_VTYPE_MSGFLAGS,
            U {
                i: rdsys::RD_KAFKA_MSG_F_COPY as std::ffi::c_int,
            },
        ),
        vu(V::RD_KAFKA_VTYPE_VALUE, mem(&record.value)),
        vu(V::RD_KAFKA_VTYPE_KEY, mem(&record.key)),
        vu(
            V::RD_KAFKA_VTYPE_OPAQUE,
            U {
                ptr: opaque as *mut std::ffi::c_void,
            },
        ),
        // 0: librdkafka stamps the current time.
        vu(
            V::RD_KAFKA_VTYPE_TIMESTAMP,
            U {
                i64_: record.timestamp.unwrap_or(0),
            },
        ),
        vu(
            V::RD_KAFKA_VTYPE_HEADERS,
            U {
                headers: headers
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |h| h.0.as_ptr()),
            },
        ),
    ];
    // Without headers the last entry is left out (a null header list is not allowed).
    let count = if headers.is_some() {
        vus.len()
    } else {
        vus.len() - 1
    };
    let client = native.producer.client().native_ptr();
    // SAFETY: `client` and `topic` are live; every pointer in `vus` outlives the call (librdkafka
    // copies the bytes it keeps, and owns `headers` only on success).
    let error = unsafe { rdsys::rd_kafka_produceva(client, vus.as_ptr(), count) };
    if error.is_null() {
        // librdkafka owns the headers now and frees them with the message.
        if let Some(h) = headers.take() {
            std::mem::forget(h);
        }
        return Ok(());
    }
    // SAFETY: a non-null error is ours to read and destroy.
    let code = unsafe {
        let code = rdsys::rd_kafka_error_code(error);
        rdsys::rd_kafka_error_destroy(error);
        code
    };
    Err(KafkaError::MessageProduction(RDKafkaErrorCode::from(code)))
}

/// A record's headers in librdkafka's form, destroyed on drop unless librdkafka took them.
struct NativeHeaders(NonNull<rdsys::rd_kafka_headers_t>);

impl NativeHeaders {
    /// `None` for no headers (librdkafka then allocates no list).
    fn of(record: &OutRecord) -> Option<NativeHeaders> {
        if record.headers.is_empty() {
            return None;
        }
        // SAFETY: a new list of the exact size (librdkafka aborts rather than return null).
        let list = unsafe { rdsys::rd_kafka_headers_new(record.headers.len()) };
        let headers = NativeHeaders(NonNull::new(list)?);
        for (name, value) in &record.headers {
            let (ptr, len) = value.as_ref().map_or((std::ptr::null(), 0), |v| {
                (v.as_ptr() as *const std::ffi::c_void, v.len() as isize)
            });
            // SAFETY: librdkafka copies the name (its length given) and the value. It fails
            // only for a read-only list, which a new one is not.
            unsafe {
                rdsys::rd_kafka_header_add(
                    list,
                    name.as_ptr() as *const std::ffi::c_char,
                    name.len() as isize,
                    ptr,
                    len,
                )
            };
        }
        Some(headers)
    }
}

// SAFETY: the list is owned by this value alone until librdkafka takes it.
unsafe impl Send for NativeHeaders {}

impl Drop for NativeHeaders {
    fn drop(&mut self) {
        // SAFETY: still ours: `produce` forgets the value once librdkafka owns the list.
        unsafe { rdsys::rd_kafka_headers_destroy(self.0.as_ptr()) };
    }
}

/// An idempotent producer. Cheap to clone (the rdkafka handle is shared).
#[derive(Clone)]
pub struct IdempotentProducer {
    inner: Arc<Native>,
    context: SecurityContext,
    bootstrap: String,
}

impl std::fmt::Debug for IdempotentProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentProducer")
            .field("bootstrap", &self.bootstrap)
            .finish()
    }
}

/// The settings both producers start from, before overrides.
///
/// librdkafka's (and Kafka 4's Java producer's) 5 ms linger, which gathers a put's records into
/// few requests; callers do not wait it out, for their records are flushed once queued
/// ([`Flusher`]). A producer override still sets it.
fn producer_defaults(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000");
    config
}

impl IdempotentProducer {
    /// A producer for `bootstrap`; `overrides` are librdkafka/Java producer settings applied
    /// last (`producer.override.*` with the prefix removed), except that idempotence stays on.
    pub fn new<'a>(
        bootstrap: &str,
        overrides: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<IdempotentProducer, ProduceError> {
        let mut config = producer_defaults(bootstrap);
        // Security keys in either spelling are translated for librdkafka.
        let context = rdkafka_config(&mut config, overrides).map_err(|e| ProduceError::Create {
            bootstrap: bootstrap.to_owned(),
            reason: e.to_string(),
        })?;
        // Set last so an override cannot turn it off: callers rely on it.
        config.set("enable.idempotence", "true");
        let inner = config
            .create_with_context(ReportingContext {
                security: context.clone(),
            })
            .and_then(Native::new)
            .map_err(|e| ProduceError::Create {
                bootstrap: bootstrap.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(IdempotentProducer {
            inner: Arc::new(inner),
            context,
            bootstrap: bootstrap.to_owned(),
        })
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Writes one record and waits for the broker's confirmation.
    pub async fn send(&self, record: &OutRecord) -> Result<Written, ProduceError> {
        let mut all = self.send_all(std::slice::from_ref(record)).await;
        // send_all returns one result per input record, and there is exactly one.
        all.pop().unwrap_or_else(|| {
            Err(ProduceError::Delivery {
                topic: record.topic.to_string(),
                partition: record.partition,
                reason: "no delivery report".into(),
                retriable: true,
                refuses_the_configuration: false,
            })
        })
    }

    /// Writes `records` (pipelined) and returns one result per record, in input order, once
    /// every record is confirmed or failed.
    pub async fn send_all(&self, records: &[OutRecord]) -> Vec<Result<Written, ProduceError>> {
        send_all(&self.inner, &self.context, records).await
    }

    /// Waits until everything sent so far is confirmed (blocking: call it off the async path).
    pub fn flush(&self, timeout: Duration) -> Result<(), ProduceError> {
        self.inner
            .producer
            .flush(timeout)
            .map_err(|e| ProduceError::Flush {
                bootstrap: self.bootstrap.clone(),
                timeout,
                reason: e.to_string(),
            })
    }
}

/// How long a record waits before it is offered again to a full local queue.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(100);

/// How long a record for a partition the producer does not know yet waits for metadata that
/// names it (Kafka's Java producer waits up to `max.block.ms`, 60 s by default).
const NEW_PARTITION_WAIT: Duration = Duration::from_secs(10);

/// Between two metadata requests for a partition the producer does not know yet.
const NEW_PARTITION_BACKOFF: Duration = Duration::from_millis(250);

/// Asks the cluster for `topic`'s metadata through `native`'s producer, whose cached partition count
/// librdkafka updates from the answer; then waits a little before the caller tries again.
async fn refresh_topic_metadata(native: &Arc<Native>, topic: &str) {
    let native = Arc::clone(native);
    let topic = topic.to_owned();
    let refreshed = tokio::task::spawn_blocking(move || {
        native
            .producer
            .client()
            .fetch_metadata(Some(&topic), Duration::from_secs(5))
            .map(|_| ())
    })
    .await;
    if let Ok(Err(e)) = refreshed {
        tracing::debug!(error = %e, "refreshing a topic's metadata for a new partition failed");
    }
    tokio::time::sleep(NEW_PARTITION_BACKOFF).await;
}

/// The producer's context: the security context's callbacks, and each delivery report written
/// into its record's [`Slot`] of the sending batch. rdkafka's `FutureProducer` allocates a
/// oneshot channel and a box per record for its report, and copies a failed message; this
/// allocates nothing per record.
pub struct ReportingContext {
    security: SecurityContext,
}

impl ClientContext for ReportingContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool =
        <SecurityContext as ClientContext>::ENABLE_REFRESH_OAUTH_TOKEN;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.security.log(level, fac, log_message);
    }

    fn stats(&self, statistics: Statistics) {
        self.security.stats(statistics);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.security.stats_raw(statistics);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.security.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<OAuthToken, Box<dyn Error>> {
        self.security.generate_oauth_token(oauthbearer_config)
    }
}

impl ProducerContext for ReportingContext {
    /// The address of the record's [`Slot`] (0: no slot, nobody waits for the report).
    type DeliveryOpaque = usize;

    fn delivery(&self, delivery_result: &DeliveryResult<'_>, slot: usize) {
        if slot == 0 {
            return;
        }
        let result = match delivery_result {
            Ok(message) => Ok(Written {
                partition: message.partition(),
                offset: message.offset(),
            }),
            Err((e, _)) => Err(e.clone()),
        };
        // SAFETY: a non-zero opaque is only ever the address of a slot of a `Reports` that
        // is kept alive for this report: its callbacks' reference is released only once
        // every queued record is reported (`Reports::report`, `Reports::queued`).
        unsafe { Reports::report(slot as *const Slot, result) };
    }
}

/// The delivery reports of one `send_all`: a slot per record, and how many are still awaited.
///
/// Queueing a record touches nothing shared: `pending` starts at [`QUEUEING`], each report
/// takes one off, and once the batch is queued [`Reports::queued`] takes off the rest, which
/// leaves the reports still to come. The delivery callbacks share one strong reference,
/// released by whoever brings `pending` to 0. (A count and a reference per record were four
/// atomic operations per record on a cache line both threads write, bench/README.md.)
struct Reports {
    slots: Box<[Slot]>,
    pending: AtomicUsize,
    /// Failed deliveries by slot index: rare, so kept out of the slots.
    failed: Mutex<Vec<(usize, KafkaError)>>,
    all_reported: tokio::sync::Notify,
}

/// `pending` while a batch is being queued: more than a batch can hold, so that reports
/// arriving meanwhile never bring it to 0.
const QUEUEING: usize = 1 << (usize::BITS - 2);

/// One record's delivery report, set once by the producer's polling thread and read once
/// every report is in (`Reports::pending` at 0 orders the writes before the reads).
struct Slot {
    /// The `Reports` holding this slot (its address inside the `Arc`).
    reports: *const Reports,
    /// [`NOT_REPORTED`], [`WRITTEN`] (`partition` and `offset` hold where) or [`FAILED`]
    /// (`Reports::failed` holds why).
    state: AtomicU8,
    partition: AtomicI32,
    offset: AtomicI64,
}

const NOT_REPORTED: u8 = 0;
const WRITTEN: u8 = 1;
const FAILED: u8 = 2;

// SAFETY: `reports` points to the `Reports` owning the slot, which is itself Send + Sync (its
// other fields are); the pointer is only dereferenced while a strong reference is held.
unsafe impl Send for Slot {}
unsafe impl Sync for Slot {}

impl Reports {
    /// Reports for `records` records, with the callbacks' reference taken.
    fn new(records: usize) -> Arc<Reports> {
        let reports = Arc::new_cyclic(|this| Reports {
            slots: (0..records)
                .map(|_| Slot {
                    reports: this.as_ptr(),
                    state: AtomicU8::new(NOT_REPORTED),
                    partition: AtomicI32::new(0),
                    offset: AtomicI64::new(0),
                })
                .collect(),
            pending: AtomicUsize::new(QUEUEING),
            failed: Mutex::new(Vec::new()),
            all_reported: tokio::sync::Notify::new(),
        });
        // Released when `pending` reaches 0 (`report` or `queued`).
        let _ = Arc::into_raw(Arc::clone(&reports));
        reports
    }

    /// The opaque to queue record `i` with: its slot's address.
    fn opaque(&self, i: usize) -> usize {
        &self.slots[i] as *const Slot as usize
    }

    /// The batch is queued, `queued` of its records accepted by librdkafka: from now on
    /// `pending` counts the reports still to come. Called once per batch (by [`Queueing`]).
    fn queued(&self, queued: usize) {
        let rest = QUEUEING - queued;
        if self.pending.fetch_sub(rest, Ordering::AcqRel) == rest {
            // Every report came while the batch was being queued (or none was queued).
            self.all_reported.notify_one();
            // SAFETY: the callbacks' reference taken in `new`, released once: `pending`
            // reached 0 here, so no report will release it.
            unsafe { Arc::decrement_strong_count(self as *const Reports) };
        }
    }

    /// Stores a report in its slot; the last one releases the callbacks' reference.
    ///
    /// # Safety
    /// `slot` must come from [`Reports::opaque`] of a record librdkafka accepted, and each one
    /// be reported once.
    unsafe fn report(slot: *const Slot, result: Result<Written, KafkaError>) {
        let reports = &*(*slot).reports;
        let slot = &*slot;
        match result {
            Ok(written) => {
                slot.partition.store(written.partition, Ordering::Relaxed);
                slot.offset.store(written.offset, Ordering::Relaxed);
                slot.state.store(WRITTEN, Ordering::Release);
            }
            Err(e) => {
                let index = (slot as *const Slot).offset_from(reports.slots.as_ptr()) as usize;
                reports
                    .failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((index, e));
                slot.state.store(FAILED, Ordering::Release);
            }
        }
        // Past this, only the last report may touch `reports`: the others' references are
        // gone once it is released.
        if reports.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            reports.all_reported.notify_one();
            drop(Arc::from_raw(slot.reports));
        }
    }

    /// Each record's report, in order; `None` for a record with none.
    fn results(&self) -> impl Iterator<Item = Option<Result<Written, KafkaError>>> + '_ {
        let mut failed =
            std::mem::take(&mut *self.failed.lock().unwrap_or_else(|p| p.into_inner()));
        failed.sort_unstable_by_key(|(i, _)| *i);
        let mut failed = failed.into_iter().peekable();
        self.slots.iter().enumerate().map(move |(i, slot)| {
            match slot.state.load(Ordering::Acquire) {
                WRITTEN => Some(Ok(Written {
                    partition: slot.partition.load(Ordering::Relaxed),
                    offset: slot.offset.load(Ordering::Relaxed),
                })),
                FAILED => failed.next_if(|(at, _)| *at == i).map(|(_, e)| Err(e)),
                _ => None,
            }
        })
    }

    /// Waits until every queued record is reported.
    async fn all(&self) {
        while self.pending.load(Ordering::Acquire) != 0 {
            // `notify_one` leaves a permit when nobody waits yet: a report between the load
            // and this wait is not missed.
            self.all_reported.notified().await;
        }
    }
}

/// The queueing of one batch: on drop, tells its [`Reports`] how many records were queued.
struct Queueing<'a> {
    reports: &'a Reports,
    queued: usize,
}

impl Drop for Queueing<'_> {
    fn drop(&mut self) {
        self.reports.queued(self.queued);
    }
}

/// Sends `records` pipelined on `producer`; one result per record, in input order.
///
/// Every record is queued first (in order), then the batch waits once for all its delivery
/// reports: no future per record (a `join_all` of hundreds of futures cost more instructions
/// per record than queueing it, bench/README.md), and no channel per record.
async fn send_all(
    native: &Arc<Native>,
    context: &SecurityContext,
    records: &[OutRecord],
) -> Vec<Result<Written, ProduceError>> {
    let reports = Reports::new(records.len());
    // Ends the queueing on every way out of the loop below, this future dropped included,
    // so that the reports still to come release the callbacks' reference.
    let mut queueing = Queueing {
        reports: &reports,
        queued: 0,
    };
    // Records librdkafka refused, by index.
    let mut refused: Vec<(usize, KafkaError)> = Vec::new();
    // Taken once records are queued (or the queue is full), not before: records queued
    // while a flush runs go out one by one.
    let mut flushing: Option<FlushHold> = None;
    // The last record's topic and handle: a batch mostly writes to one topic.
    let mut current: Option<(&Topic, Arc<TopicHandle>)> = None;
    for (i, record) in records.iter().enumerate() {
        if !matches!(&current, Some((name, _)) if **name == record.topic) {
            match native
                .topics
                .get(native.producer.client().native_ptr(), &record.topic)
            {
                Ok(handle) => current = Some((&record.topic, handle)),
                Err(e) => {
                    refused.push((i, e));
                    continue;
                }
            }
        }
        let Some((_, topic)) = &current else {
            unreachable!("set above for this record's topic")
        };
        let mut headers = NativeHeaders::of(record);
        // Waits for queue space rather than failing when the local queue is full.
        let mut new_partition_wait: Option<Instant> = None;
        loop {
            // A report comes only for a record librdkafka accepts.
            let e = match produce(native, topic, record, &mut headers, reports.opaque(i)) {
                Ok(()) => {
                    queueing.queued += 1;
                    break;
                }
                Err(e) => e,
            };
            match e {
                KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => {
                    // What is queued drains sooner when it does not linger.
                    flushing.get_or_insert_with(|| native.hold_flush());
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                // librdkafka refuses at once a partition its cached metadata does not have (it
                // refreshes a topic's metadata only every `topic.metadata.refresh.interval.ms`,
                // 5 minutes by default), where Kafka's Java producer waits for metadata naming
                // it (`max.block.ms`). A topic that just gained partitions (a mirrored topic
                // grown by `spillway mirror`) looks like that: ask for its metadata again and
                // retry for a while before giving up.
                KafkaError::MessageProduction(RDKafkaErrorCode::UnknownPartition)
                    if record.partition.is_some()
                        && new_partition_wait
                            .get_or_insert_with(Instant::now)
                            .elapsed()
                            < NEW_PARTITION_WAIT =>
                {
                    refresh_topic_metadata(native, &record.topic).await;
                }
                e => {
                    refused.push((i, e));
                    break;
                }
            }
        }
    }
    if refused.len() < records.len() {
        flushing.get_or_insert_with(|| native.hold_flush());
    }
    drop(queueing);
    reports.all().await;
    drop(flushing);
    let mut refused = refused.into_iter().peekable();
    let mut results = Vec::with_capacity(records.len());
    for (i, (record, report)) in records.iter().zip(reports.results()).enumerate() {
        let result = match refused.next_if(|(at, _)| *at == i) {
            Some((_, e)) => Err(e),
            // Every queued record is reported before `all` returns; a missing report would
            // be librdkafka's loss, reported as such rather than taken for a success.
            None => report.unwrap_or(Err(KafkaError::Canceled)),
        };
        results.push(result.map_err(|e| {
            let mut reason = e.to_string();
            let mut retriable = !is_permanent(&e);
            let mut refuses_the_configuration = is_authorization_failure(&e);
            // A refused login or an untrusted certificate surfaces as timed-out
            // deliveries; say what it was, and that retrying cannot help.
            if let Some(failure) = context.security_failure_logged() {
                reason = format!("{reason} ({failure})");
                retriable = false;
                refuses_the_configuration = true;
            }
            ProduceError::Delivery {
                topic: record.topic.to_string(),
                partition: record.partition,
                retriable,
                reason,
                refuses_the_configuration,
            }
        }));
    }
    results
}

/// Why a transaction step failed, and what the caller may do about it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("transaction step '{step}' of producer '{transactional_id}' failed: {reason}")]
pub struct TxnError {
    pub step: &'static str,
    pub transactional_id: String,
    pub reason: String,
    pub kind: TxnErrorKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnErrorKind {
    /// Another producer with the same transactional id started (this one is a zombie), or
    /// librdkafka raised a fatal error: the producer is unusable; the task must stop.
    Fatal,
    /// The transaction must be aborted; after that the producer can begin a new one.
    Abortable,
    /// The same step may be tried again.
    Retriable,
}

impl TxnError {
    fn from_kafka(step: &'static str, transactional_id: &str, e: KafkaError) -> TxnError {
        let kind = match &e {
            KafkaError::Transaction(t) if t.is_fatal() => TxnErrorKind::Fatal,
            KafkaError::Transaction(t) if t.txn_requires_abort() => TxnErrorKind::Abortable,
            KafkaError::Transaction(t) if t.is_retriable() => TxnErrorKind::Retriable,
            KafkaError::Transaction(t) if t.code() == RDKafkaErrorCode::ProducerFenced => {
                TxnErrorKind::Fatal
            }
            // Anything else (a flush timeout, a state error): abort to be safe.
            _ => TxnErrorKind::Abortable,
        };
        TxnError {
            step,
            transactional_id: transactional_id.to_owned(),
            reason: e.to_string(),
            kind,
        }
    }

    pub fn is_fatal(&self) -> bool {
        self.kind == TxnErrorKind::Fatal
    }
}

/// A transactional producer (`transactional.id` set): what it writes between
/// [`begin`](Self::begin) and [`commit`](Self::commit) becomes visible to read_committed
/// readers all at once or, after [`abort`](Self::abort), never. Creating one with the
/// transactional id of a running producer fences that one (its next step fails with a fatal
/// error) and aborts its open transaction, so a restarted task cannot be overtaken by its zombie.
///
/// The transaction steps block inside librdkafka, so they run on tokio's blocking pool.
#[derive(Clone)]
pub struct TransactionalProducer {
    inner: Arc<Native>,
    context: SecurityContext,
    bootstrap: String,
    transactional_id: String,
    /// How long one transaction step may take.
    step_timeout: Duration,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("bootstrap", &self.bootstrap)
            .field("transactional_id", &self.transactional_id)
            .finish()
    }
}

impl TransactionalProducer {
    /// Creates the producer and registers its transactional id with the transaction
    /// coordinator (fencing any earlier producer with that id). `overrides` as for
    /// [`IdempotentProducer::new`]; `transactional.id` and idempotence are set last.
    pub async fn new<'a>(
        bootstrap: &str,
        transactional_id: &str,
        overrides: impl IntoIterator<Item = (&'a str, &'a str)>,
        step_timeout: Duration,
    ) -> Result<TransactionalProducer, TxnError> {
        let mut config = producer_defaults(bootstrap);
        config.set("transaction.timeout.ms", "60000");
        let context = rdkafka_config(&mut config, overrides).map_err(|e| TxnError {
            step: "create",
            transactional_id: transactional_id.to_owned(),
            reason: format!("cannot create a producer for {bootstrap}: {e}"),
            kind: TxnErrorKind::Fatal,
        })?;
        config
            .set("enable.idempotence", "true")
            .set("transactional.id", transactional_id);
        let inner = config
            .create_with_context(ReportingContext {
                security: context.clone(),
            })
            .and_then(Native::new)
            .map_err(|e| TxnError {
                step: "create",
                transactional_id: transactional_id.to_owned(),
                reason: format!("cannot create a producer for {bootstrap}: {e}"),
                kind: TxnErrorKind::Fatal,
            })?;
        let producer = TransactionalProducer {
            inner: Arc::new(inner),
            context,
            bootstrap: bootstrap.to_owned(),
            transactional_id: transactional_id.to_owned(),
            step_timeout,
        };
        producer
            .blocking("init_transactions", |p, t| p.init_transactions(t))
            .await?;
        Ok(producer)
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Runs one blocking transaction step off the async threads.
    async fn blocking(
        &self,
        step: &'static str,
        f: impl FnOnce(&RdProducer, Duration) -> Result<(), KafkaError> + Send + 'static,
    ) -> Result<(), TxnError> {
        let inner = Arc::clone(&self.inner);
        let timeout = self.step_timeout;
        let id = self.transactional_id.clone();
        tokio::task::spawn_blocking(move || f(&inner.producer, timeout))
            .await
            .map_err(|e| TxnError {
                step,
                transactional_id: id.clone(),
                reason: format!("the blocking step was cancelled: {e}"),
                kind: TxnErrorKind::Abortable,
            })?
            .map_err(|e| {
                let mut error = TxnError::from_kafka(step, &id, e);
                // A refused login shows as a timed-out step; it will not pass by retrying.
                if let Some(failure) = self.context.security_failure_logged() {
                    error.reason = format!("{} ({failure})", error.reason);
                    error.kind = TxnErrorKind::Fatal;
                }
                error
            })
    }

    pub async fn begin(&self) -> Result<(), TxnError> {
        // Local state change only; no need for the blocking pool.
        self.inner
            .producer
            .begin_transaction()
            .map_err(|e| TxnError::from_kafka("begin_transaction", &self.transactional_id, e))
    }

    /// Writes `records` in the open transaction and waits for every delivery report. A failed
    /// record leaves the transaction needing an abort.
    pub async fn send_all(&self, records: &[OutRecord]) -> Vec<Result<Written, ProduceError>> {
        send_all(&self.inner, &self.context, records).await
    }

    /// Adds the consumer group's next offsets (`(topic, partition) → offset`) to the open
    /// transaction: they are committed with it, and the group coordinator refuses them when
    /// `group` is no longer a current member (a rebalance fenced it).
    pub async fn send_offsets(
        &self,
        offsets: &[((String, i32), i64)],
        group: Arc<GroupMetadata>,
    ) -> Result<(), TxnError> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in offsets {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
                .map_err(|e| {
                    TxnError::from_kafka("send_offsets_to_transaction", &self.transactional_id, e)
                })?;
        }
        self.blocking("send_offsets_to_transaction", move |p, t| {
            p.send_offsets_to_transaction(&tpl, &group, t)
        })
        .await
    }

    /// Commits the open transaction (flushing what is still queued first).
    pub async fn commit(&self) -> Result<(), TxnError> {
        self.blocking("commit_transaction", |p, t| p.commit_transaction(t))
            .await
    }

    /// Aborts the open transaction: nothing it wrote becomes visible to read_committed readers.
    pub async fn abort(&self) -> Result<(), TxnError> {
        self.blocking("abort_transaction", |p, t| p.abort_transaction(t))
            .await
    }
}

impl ProduceError {
    pub fn is_retriable(&self) -> bool {
        match self {
            ProduceError::Delivery { retriable, .. } => *retriable,
            ProduceError::Create { .. } => false,
            ProduceError::Flush { .. } => true,
        }
    }

    /// The cluster refuses the producer (its credentials or ACLs), not this record: a sink
    /// fails its task rather than rejecting the record ([`spillway_core::SinkError::TaskLevel`]).
    pub fn is_task_level(&self) -> bool {
        matches!(
            self,
            ProduceError::Delivery {
                refuses_the_configuration: true,
                ..
            }
        )
    }
}

/// The cluster refuses the producer's principal, whatever the record.
fn is_authorization_failure(e: &rdkafka::error::KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed)
    )
}

/// Errors that sending the same record again cannot fix.
fn is_permanent(e: &rdkafka::error::KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::UnknownPartition
                | C::UnknownTopic
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::InvalidRecord
                | C::InvalidTimestamp
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authorization_failure_refuses_the_producer_not_the_record() {
        use rdkafka::error::KafkaError;
        let denied = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(is_authorization_failure(&denied));
        assert!(is_permanent(&denied));
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(!is_authorization_failure(&too_large));
        let e = ProduceError::Delivery {
            topic: "t".into(),
            partition: Some(1),
            reason: "denied".into(),
            retriable: false,
            refuses_the_configuration: true,
        };
        assert!(e.is_task_level() && !e.is_retriable());
    }

    #[test]
    fn producers_linger_as_librdkafka_does_unless_an_override_says_otherwise() {
        let config = producer_defaults("127.0.0.1:1");
        assert_eq!(config.get("linger.ms"), Some("5"));
        let mut overridden = producer_defaults("127.0.0.1:1");
        rdkafka_config(&mut overridden, [("linger.ms", "20")]).expect("a valid override");
        assert_eq!(overridden.get("linger.ms"), Some("20"));
    }

    fn written(offset: i64) -> Result<Written, KafkaError> {
        Ok(Written {
            partition: 3,
            offset,
        })
    }

    /// What the delivery callback does with a record's opaque.
    fn report(opaque: usize, result: Result<Written, KafkaError>) {
        // SAFETY: the opaque of a queued record, reported once (as librdkafka does).
        unsafe { Reports::report(opaque as *const Slot, result) };
    }

    #[tokio::test]
    async fn reports_during_and_after_queueing_all_count_and_land_in_their_slots() {
        let reports = Reports::new(4);
        let mut queueing = Queueing {
            reports: &reports,
            queued: 0,
        };
        let opaques: Vec<usize> = (0..4).map(|i| reports.opaque(i)).collect();
        // Record 0 is reported before the others are queued; record 2 is refused.
        report(opaques[0], written(10));
        queueing.queued = 3;
        drop(queueing);
        assert_ne!(reports.pending.load(Ordering::Acquire), 0);
        report(opaques[3], Err(KafkaError::Canceled));
        report(opaques[1], written(11));
        tokio::time::timeout(Duration::from_secs(5), reports.all())
            .await
            .expect("every queued record reported");
        let results: Vec<_> = reports.results().collect();
        assert!(matches!(results[0], Some(Ok(Written { offset: 10, .. }))));
        assert!(matches!(results[1], Some(Ok(Written { offset: 11, .. }))));
        assert!(results[2].is_none(), "a refused record has no report");
        assert!(matches!(results[3], Some(Err(KafkaError::Canceled))));
        // The callbacks' reference went with the last report.
        assert_eq!(Arc::strong_count(&reports), 1);
    }

    #[tokio::test]
    async fn reports_all_in_before_queueing_ends_release_the_callbacks_reference_at_its_end() {
        let reports = Reports::new(2);
        let queueing = Queueing {
            reports: &reports,
            queued: 2,
        };
        report(reports.opaque(0), written(1));
        report(reports.opaque(1), written(2));
        assert_eq!(Arc::strong_count(&reports), 2, "held until queueing ends");
        drop(queueing);
        assert_eq!(Arc::strong_count(&reports), 1);
        tokio::time::timeout(Duration::from_secs(5), reports.all())
            .await
            .expect("nothing left to wait for");
    }

    #[test]
    fn a_batch_abandoned_while_queueing_is_released_by_its_last_report() {
        let reports = Reports::new(3);
        let opaque = reports.opaque(0);
        // The sending future is dropped after one record was queued.
        drop(Queueing {
            reports: &reports,
            queued: 1,
        });
        let weak = Arc::downgrade(&reports);
        drop(reports);
        assert!(
            weak.upgrade().is_some(),
            "kept for the report still to come"
        );
        report(opaque, written(7));
        assert!(weak.upgrade().is_none(), "released by the last report");
    }

    #[test]
    fn an_unusable_override_is_refused_naming_the_bootstrap() {
        let err = IdempotentProducer::new("127.0.0.1:1", [("no.such.setting", "1")])
            .expect_err("librdkafka refuses unknown settings");
        let text = err.to_string();
        assert!(text.contains("127.0.0.1:1"), "{text}");
        assert!(text.contains("no.such.setting"), "{text}");
    }

    #[test]
    fn each_topic_gets_one_librdkafka_handle_kept_for_the_producer() {
        let producer = IdempotentProducer::new("127.0.0.1:1", []).expect("created");
        let native = &producer.inner;
        let client = native.producer.client().native_ptr();
        let orders = native
            .topics
            .get(client, &Topic::from("orders"))
            .expect("handle");
        let again = native
            .topics
            .get(client, &Topic::from("orders"))
            .expect("handle");
        let other = native
            .topics
            .get(client, &Topic::from("payments"))
            .expect("handle");
        assert!(Arc::ptr_eq(&orders, &again));
        assert_ne!(orders.0, other.0);
        let refused = native
            .topics
            .get(client, &Topic::from("bad\0topic"))
            .err()
            .expect("a NUL cannot name a topic");
        assert!(matches!(refused, KafkaError::Nul(_)), "{refused}");
    }

    #[tokio::test]
    async fn a_record_to_an_unreachable_cluster_fails_naming_its_topic() {
        let producer = IdempotentProducer::new("127.0.0.1:1", [("message.timeout.ms", "300")])
            .expect("created");
        let err = producer
            .send(&OutRecord {
                topic: "dlq".into(),
                value: Some(Bytes::from_static(b"x")),
                ..OutRecord::default()
            })
            .await
            .expect_err("nothing listens on port 1");
        assert!(err.to_string().starts_with("record for dlq"), "{err}");
    }

    #[tokio::test]
    async fn a_refused_record_and_an_undelivered_one_each_get_their_own_failure_in_order() {
        let producer = IdempotentProducer::new("127.0.0.1:1", [("message.timeout.ms", "300")])
            .expect("created");
        let record = |topic: &str| OutRecord {
            topic: topic.into(),
            value: Some(Bytes::from_static(b"x")),
            headers: vec![("h".into(), Some(Bytes::from_static(b"v")))],
            ..OutRecord::default()
        };
        // librdkafka refuses a topic name with a NUL at once; the others time out.
        let records = [record("first"), record("bad\0topic"), record("third")];
        let results = producer.send_all(&records).await;
        assert_eq!(results.len(), 3);
        let texts: Vec<String> = results
            .iter()
            .map(|r| r.as_ref().expect_err("nothing is written").to_string())
            .collect();
        assert!(texts[0].starts_with("record for first "), "{texts:?}");
        assert!(texts[1].starts_with("record for bad\0topic "), "{texts:?}");
        assert!(texts[2].starts_with("record for third "), "{texts:?}");
        assert!(texts[0].contains("timed out"), "{texts:?}");
        assert!(
            !texts[1].contains("timed out"),
            "refused, not sent: {texts:?}"
        );
    }
}
