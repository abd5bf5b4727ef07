//! [`MessageQueue`]: where a classic source's fetched records wait, apart from the group's
//! events, so that a poll takes them in one call.
//!
//! rust-rdkafka's `BaseConsumer::poll` takes one event per call from librdkafka's consumer
//! queue, and each fetched message is an event of its own: per record a call with a clock
//! read, an `Arc` and the event's destruction (issue 18). `rd_kafka_consume_batch_queue`
//! takes a poll's messages in one call, but not from the consumer queue: it would also take
//! the group's events there, serving a rebalance with a bare unassign (rust-rdkafka asks for
//! rebalance events, not callbacks) and asserting on an offset commit's answer. So every
//! partition's fetch queue is forwarded here before the partition is assigned (librdkafka
//! keeps a forward the application set), and the consumer queue is left with the group's
//! events: rebalances, errors, served by `BaseConsumer::poll` as before, revocation commit
//! included.
//!
//! The asynchronous offset commits answer here too, through a callback that the batch read
//! serves. An event arriving on the consumer queue wakes a batch read that is waiting (its
//! non-empty callback yields this queue), so a rebalance is never held up by a poll's wait.
//!
//! An idle poll waits in the caller's own runtime, not on a blocking thread
//! ([`MessageQueue::arrival`]): this queue's own non-empty callback, which librdkafka also calls
//! when the queue is yielded while empty, notifies the waiting poll. Handing a 200 ms wait to
//! a blocking thread and back cost an idle task five thread switches a poll, against the C
//! consumer's one (issue 18, bench/README.md "Idle tasks").

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rdkafka::bindings as rdsys;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use spillway_core::Topic;
use tokio::sync::Notify;

use super::{push_classic_record, ClassicRecord, OffsetTracker};
use crate::copies::Copies;

/// The queue every assigned partition's messages are forwarded to, and a handle of the
/// consumer queue whose arrivals wake it. Both are destroyed by [`shutdown`](Self::shutdown),
/// which must come before the consumer is closed and destroyed (librdkafka wants every
/// queue handle gone before `rd_kafka_destroy`).
pub(super) struct MessageQueue {
    messages: AtomicPtr<rdsys::rd_kafka_queue_t>,
    events: AtomicPtr<rdsys::rd_kafka_queue_t>,
    /// Notified by librdkafka ([`arrived`]) when the message queue gets its first message or
    /// is yielded while empty. Its callback is disabled in [`shutdown`](Self::shutdown),
    /// before this goes.
    arrivals: Arc<Notify>,
}

/// librdkafka's non-empty callback of the consumer queue: wakes a batch read of the message
/// queue (`opaque`), which then serves the event.
unsafe extern "C" fn wake(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the message queue, destroyed only after this callback is disabled
    // (under the consumer queue's lock, which librdkafka holds while calling it).
    unsafe { rdsys::rd_kafka_queue_yield(opaque.cast()) }
}

/// librdkafka's non-empty callback of the message queue, called from its threads: a message
/// or a commit's answer arrived, or the queue was yielded (an event on the consumer queue).
unsafe extern "C" fn arrived(_rk: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the queue's `arrivals`, alive until after this callback is disabled
    // (under the message queue's lock, which librdkafka holds while calling it). A waiter
    // absent, the notification is kept for the next wait.
    unsafe { (*opaque.cast::<Notify>()).notify_one() }
}

impl MessageQueue {
    /// A message queue for the consumer `rk`; `None` when it has no consumer queue (no
    /// `group.id`).
    pub(super) fn new(rk: *mut rdsys::rd_kafka_t) -> Option<MessageQueue> {
        // SAFETY: `rk` is a live consumer; both handles are destroyed in `shutdown`.
        unsafe {
            let events = rdsys::rd_kafka_queue_get_consumer(rk);
            if events.is_null() {
                return None;
            }
            let messages = rdsys::rd_kafka_queue_new(rk);
            rdsys::rd_kafka_queue_cb_event_enable(events, Some(wake), messages.cast());
            let arrivals = Arc::new(Notify::new());
            let opaque = Arc::as_ptr(&arrivals).cast_mut().cast();
            rdsys::rd_kafka_queue_cb_event_enable(messages, Some(arrived), opaque);
            Some(MessageQueue {
                messages: AtomicPtr::new(messages),
                events: AtomicPtr::new(events),
                arrivals,
            })
        }
    }

    /// Forwards the fetch queues of `partitions` here. Called before they are assigned, so
    /// that none of their messages reaches the consumer queue; forwarding again is harmless.
    pub(super) fn route<'a>(
        &self,
        rk: *mut rdsys::rd_kafka_t,
        partitions: impl IntoIterator<Item = (&'a str, i32)>,
    ) {
        let messages = self.messages.load(Ordering::Acquire);
        if messages.is_null() {
            return;
        }
        for (topic, partition) in partitions {
            let Ok(name) = CString::new(topic) else {
                continue;
            };
            // SAFETY: `rk` is live; the partition's handle is only a reference, dropped here.
            unsafe {
                let queue = rdsys::rd_kafka_queue_get_partition(rk, name.as_ptr(), partition);
                if !queue.is_null() {
                    rdsys::rd_kafka_queue_forward(queue, messages);
                    rdsys::rd_kafka_queue_destroy(queue);
                }
            }
        }
    }

    /// Whether the consumer queue holds an event (a rebalance, an error) to serve.
    pub(super) fn events_waiting(&self) -> bool {
        let events = self.events.load(Ordering::Acquire);
        // SAFETY: a live handle (not shut down: the caller holds the consumer).
        !events.is_null() && unsafe { rdsys::rd_kafka_queue_length(events) } > 0
    }

    /// Waits up to `timeout`, in the caller's runtime, for the message queue to get a message
    /// or a commit's answer, or to be woken by an event on the consumer queue: true then,
    /// false once `timeout` passed. What came is read by the caller afterwards, and a wake-up
    /// may find nothing: one kept from an arrival that a read already took. Needs a runtime
    /// with timers, as actix's arbiters and `#[tokio::test]` have.
    pub(super) async fn arrival(&self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.arrivals.notified())
            .await
            .is_ok()
    }

    /// Takes up to `max` messages, waiting up to `timeout` for the first (less when an event
    /// arrives on the consumer queue meanwhile). Serves the commit answers it meets.
    pub(super) fn take(&self, timeout: Duration, max: usize) -> Batch {
        let mut batch = Batch(Vec::with_capacity(max));
        let messages = self.messages.load(Ordering::Acquire);
        if messages.is_null() || max == 0 {
            return batch;
        }
        let millis = if timeout.is_zero() {
            0
        } else {
            // Never rounded down to no wait at all.
            timeout.as_millis().clamp(1, i32::MAX as u128) as i32
        };
        // SAFETY: the vector has room for `max` pointers; librdkafka writes `n <= max`.
        unsafe {
            let n =
                rdsys::rd_kafka_consume_batch_queue(messages, millis, batch.0.as_mut_ptr(), max);
            if n > 0 {
                batch.0.set_len(n as usize);
            }
        }
        batch
    }

    /// Queues an asynchronous commit of `offsets`, answered through `answers` by a later
    /// [`take`](Self::take).
    pub(super) fn commit(
        &self,
        rk: *mut rdsys::rd_kafka_t,
        offsets: &rdkafka::TopicPartitionList,
        answers: &Arc<CommitAnswers>,
    ) -> Result<(), KafkaError> {
        let messages = self.messages.load(Ordering::Acquire);
        let opaque = Arc::into_raw(Arc::clone(answers)) as *mut c_void;
        // SAFETY: `rk` and the queue are live; `opaque` is taken back by `answered` or here.
        let err = unsafe {
            rdsys::rd_kafka_commit_queue(rk, offsets.ptr(), messages, Some(answered), opaque)
        };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Ok(());
        }
        // SAFETY: refused before the request was made: no answer will come.
        drop(unsafe { Arc::from_raw(opaque as *const CommitAnswers) });
        Err(KafkaError::ConsumerCommit(err.into()))
    }

    /// Destroys both queue handles; later calls find nothing. Messages still queued, or
    /// forwarded here later, are dropped by librdkafka (not handed out: read again by whoever
    /// owns the partition next, from its last commit).
    pub(super) fn shutdown(&self) {
        let events = self.events.swap(ptr::null_mut(), Ordering::AcqRel);
        let messages = self.messages.swap(ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: the handles came from `new` and are destroyed once (swapped out above).
        unsafe {
            if !events.is_null() {
                rdsys::rd_kafka_queue_cb_event_enable(events, None, ptr::null_mut());
                rdsys::rd_kafka_queue_destroy(events);
            }
            if !messages.is_null() {
                // Before the handle goes: partitions forwarded here keep the queue itself
                // alive, and their arrivals must not reach `arrivals` once it is dropped.
                rdsys::rd_kafka_queue_cb_event_enable(messages, None, ptr::null_mut());
                rdsys::rd_kafka_queue_destroy(messages);
            }
        }
    }
}

impl Drop for MessageQueue {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Who hears the answers of a source's asynchronous commits.
pub(super) struct CommitAnswers {
    pub(super) group: String,
    pub(super) tracker: Arc<Mutex<OffsetTracker>>,
}

/// The answer to a commit queued by [`MessageQueue::commit`].
unsafe extern "C" fn answered(
    _rk: *mut rdsys::rd_kafka_t,
    err: rdsys::rd_kafka_resp_err_t,
    offsets: *mut rdsys::rd_kafka_topic_partition_list_t,
    opaque: *mut c_void,
) {
    // SAFETY: `opaque` is the `Arc` that `commit` gave away, taken back once.
    let answers = unsafe { Arc::from_raw(opaque as *const CommitAnswers) };
    let request_error = (err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
        .then(|| KafkaError::ConsumerCommit(err.into()));
    let mut failed = Vec::new();
    // SAFETY: librdkafka's list of the commit's partitions, alive during the callback.
    if let Some(list) = unsafe { offsets.as_ref() } {
        let elems: &[rdsys::rd_kafka_topic_partition_t] = if list.elems.is_null() {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(list.elems, list.cnt.max(0) as usize) }
        };
        for e in elems {
            let partition_failed = e.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
            if (request_error.is_some() || partition_failed) && e.offset >= 0 && !e.topic.is_null()
            {
                let topic = unsafe { CStr::from_ptr(e.topic) }
                    .to_string_lossy()
                    .into_owned();
                failed.push(((topic, e.partition), e.offset));
            }
        }
    }
    super::commit_answered(&answers.group, &answers.tracker, request_error, &failed);
}

/// Messages taken from librdkafka in one call, destroyed together when dropped (their
/// topics stay alive while the batch is read, so a topic is recognised by its handle).
pub(super) struct Batch(Vec<*mut rdsys::rd_kafka_message_t>);

impl Batch {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Appends each message's record to `out`; a message that is an error librdkafka put in
    /// place of a record goes to `on_error`, which stops the reading by returning an error.
    /// Without `headers`, the records' headers are left unread.
    ///
    /// Every key and value of the batch is copied into one buffer, which the records share:
    /// one allocation per batch, and a record's parts are slices of it (issue 18: cheaper than
    /// splitting a chunk per record). Header values go to `copies`. Each record is built in
    /// its slot of `out` (not returned and moved there: a copy of the record per record).
    pub(super) fn read_into<E>(
        &self,
        copies: &mut Copies,
        headers: bool,
        out: &mut Vec<ClassicRecord>,
        mut on_error: impl FnMut(KafkaError) -> Result<(), E>,
    ) -> Result<(), E> {
        let is_record = |m: &rdsys::rd_kafka_message_t| {
            m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        };
        let parts = |m: &rdsys::rd_kafka_message_t| {
            // SAFETY: key and payload live as long as the message, which the batch holds.
            unsafe { (slice(m.key, m.key_len), slice(m.payload, m.len)) }
        };
        let messages = || {
            // SAFETY: messages of this batch, alive until the batch is dropped.
            self.0.iter().map(|&m| unsafe { &*m })
        };
        // An error's payload is its text, not a record's: it is not copied.
        let total: usize = messages()
            .filter(|m| is_record(m))
            .map(|m| m.key_len + m.len)
            .sum();
        let mut buffer = Vec::with_capacity(total);
        for m in messages().filter(|m| is_record(m)) {
            let (key, value) = parts(m);
            buffer.extend_from_slice(key.unwrap_or_default());
            buffer.extend_from_slice(value.unwrap_or_default());
        }
        let buffer = Bytes::from(buffer);
        let mut at = 0;
        let mut part = |data: Option<&[u8]>| {
            data.map(|d| {
                at += d.len();
                buffer.slice(at - d.len()..at)
            })
        };
        let mut last_topic: Option<(*mut rdsys::rd_kafka_topic_t, Topic)> = None;
        out.reserve(self.0.len());
        for m in messages() {
            if !is_record(m) {
                on_error(error_of(m))?;
                continue;
            }
            let (key, value) = parts(m);
            let key = part(key);
            let value = part(value);
            push_record_of(out, m, &mut last_topic, copies, headers, key, value);
        }
        Ok(())
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        for &m in &self.0 {
            // SAFETY: each message was handed to us by librdkafka once.
            unsafe { rdsys::rd_kafka_message_destroy(m) }
        }
    }
}

/// `bytes` of a message, `None` for a null pointer.
///
/// # Safety
/// `data` is null or points to `len` readable bytes that outlive the returned slice.
unsafe fn slice<'a>(data: *const c_void, len: usize) -> Option<&'a [u8]> {
    if data.is_null() {
        None
    } else {
        Some(unsafe { std::slice::from_raw_parts(data.cast(), len) })
    }
}

/// What librdkafka put in place of a record.
fn error_of(m: &rdsys::rd_kafka_message_t) -> KafkaError {
    if m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
        KafkaError::PartitionEOF(m.partition)
    } else {
        KafkaError::MessageConsumption(RDKafkaErrorCode::from(m.err))
    }
}

/// The record of `m`, whose key and value were copied already, built in its slot at the end
/// of `out` ([`push_in_place!`](spillway_core::push_in_place)).
#[inline(always)]
fn push_record_of(
    out: &mut Vec<ClassicRecord>,
    m: &rdsys::rd_kafka_message_t,
    last_topic: &mut Option<(*mut rdsys::rd_kafka_topic_t, Topic)>,
    copies: &mut Copies,
    read_headers: bool,
    key: Option<Bytes>,
    value: Option<Bytes>,
) {
    let topic = match last_topic {
        Some((rkt, topic)) if *rkt == m.rkt => topic.clone(),
        _ => {
            // SAFETY: a fetched message has a topic, alive with the message.
            let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(m.rkt)) };
            let topic = Topic::interned(&name.to_string_lossy());
            last_topic.insert((m.rkt, topic)).1.clone()
        }
    };
    let mut headers = Vec::new();
    let mut native: *mut rdsys::rd_kafka_headers_t = ptr::null_mut();
    if read_headers {
        // SAFETY: the headers belong to the message and live as long as it.
        unsafe {
            let ptr = m as *const rdsys::rd_kafka_message_t as *mut rdsys::rd_kafka_message_t;
            if rdsys::rd_kafka_message_headers(ptr, &mut native)
                == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                let mut idx = 0;
                loop {
                    let mut name = ptr::null();
                    let mut value = ptr::null();
                    let mut size = 0;
                    if rdsys::rd_kafka_header_get_all(native, idx, &mut name, &mut value, &mut size)
                        != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    {
                        break;
                    }
                    let key = CStr::from_ptr(name).to_string_lossy().into_owned();
                    headers.push((key, slice(value, size).map(|v| copies.copy(v))));
                    idx += 1;
                }
            }
        }
    }
    let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: reads the message's own fields.
    let stamp = unsafe { rdsys::rd_kafka_message_timestamp(m, &mut kind) };
    let timestamp = match kind {
        _ if stamp == -1 => None,
        rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => Some((stamp, false)),
        rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => Some((stamp, true)),
        _ => None,
    };
    push_classic_record(
        out,
        topic,
        m.partition,
        m.offset,
        (key, value),
        headers,
        timestamp,
    );
}
