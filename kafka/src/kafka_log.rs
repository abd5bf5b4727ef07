//! [`KafkaLog`]: a topic used as a replicated log of keyed records, the way Kafka Connect's
//! distributed workers keep configs and status (its `KafkaBasedLog`): every worker writes
//! keyed records with an idempotent producer, and reads the whole topic from the beginning,
//! then [`read_to_end`](KafkaLog::read_to_end) again whenever it must be sure it has seen every
//! write that was confirmed before — it asks for the end offsets and reads until its position
//! reaches them.
//!
//! The topics are compacted ([`ensure_compacted_topic`]): the latest record of each key is kept
//! for ever, and a record with no value (a tombstone) deletes the key. Readers must therefore
//! never depend on a record that a later one of the same key replaces.
//!
//! The reader is an rdkafka consumer that joins no group (partitions assigned, no commits):
//! every worker reads everything. Its calls block, so they run on tokio's blocking pool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use spillway_core::Topic;
use tracing::{debug, info, warn};

use crate::admin::{AdminClient, AdminError, ConfigResource, NewTopic, TopicCreation};
use crate::producer::{IdempotentProducer, OutRecord, ProduceError, Written};
use crate::security::{rdkafka_config, SecurityContext};

/// Errors of the log.
#[derive(Debug, thiserror::Error)]
pub enum KafkaLogError {
    #[error("cannot create a reader of topic '{topic}' on {bootstrap}: {reason}")]
    Reader {
        topic: String,
        bootstrap: String,
        reason: String,
    },
    #[error("topic '{topic}' was not found on {bootstrap} within {waited:?}; create it or let the worker create it (it needs CREATE on the cluster or the topic)")]
    NoTopic {
        topic: String,
        bootstrap: String,
        waited: Duration,
    },
    #[error("reading topic '{topic}' to its end failed: {reason}")]
    Read { topic: String, reason: String },
    #[error("topic '{topic}' was not read to its end within {timeout:?} (at {positions:?}, end {ends:?}); is the broker reachable?")]
    ReadTimeout {
        topic: String,
        timeout: Duration,
        positions: BTreeMap<i32, i64>,
        ends: BTreeMap<i32, i64>,
    },
    #[error(transparent)]
    Write(#[from] ProduceError),
    #[error("{0}")]
    Topic(#[from] AdminError),
    #[error("topic '{topic}' has cleanup.policy={policy}; {purpose} must be compacted, or old records are deleted and workers forget what they hold. Set cleanup.policy=compact on it (kafka-configs --alter --add-config cleanup.policy=compact)")]
    NotCompacted {
        topic: String,
        policy: String,
        purpose: &'static str,
    },
}

/// One record read from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Bytes>,
    /// `None`: a tombstone.
    pub value: Option<Bytes>,
}

/// A topic read and written as a log; see the module docs.
pub struct KafkaLog {
    topic: String,
    bootstrap: String,
    producer: IdempotentProducer,
    reader: Arc<Mutex<BaseConsumer<SecurityContext>>>,
    partitions: Vec<i32>,
    read_timeout: Duration,
}

impl std::fmt::Debug for KafkaLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLog")
            .field("topic", &self.topic)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl KafkaLog {
    /// Opens the log on `topic` (which must exist) at `bootstrap`; `client` holds the worker's
    /// client settings (security keys in Java or librdkafka spelling). Nothing is read yet:
    /// the first [`read_to_end`](Self::read_to_end) returns the whole topic.
    pub async fn open<'a>(
        bootstrap: &str,
        topic: &str,
        client: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
        read_timeout: Duration,
    ) -> Result<KafkaLog, KafkaLogError> {
        let producer = IdempotentProducer::new(bootstrap, client.clone())?;
        let reader_error = |reason: String| KafkaLogError::Reader {
            topic: topic.to_owned(),
            bootstrap: bootstrap.to_owned(),
            reason,
        };
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            // librdkafka refuses assign() without a group id. This one is never joined and
            // never committed to, so no group is created on the broker.
            .set("group.id", "spillway-kafka-log-reader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        let context =
            rdkafka_config(&mut config, client).map_err(|e| reader_error(e.to_string()))?;
        let consumer: BaseConsumer<SecurityContext> = config
            .create_with_context(context)
            .map_err(|e| reader_error(e.to_string()))?;
        let reader = Arc::new(Mutex::new(consumer));
        let topic_name = topic.to_owned();
        let bootstrap_name = bootstrap.to_owned();
        let partitions = blocking(Arc::clone(&reader), move |consumer| {
            partitions_of(consumer, &topic_name, &bootstrap_name, read_timeout)
        })
        .await??;
        let mut assignment = TopicPartitionList::new();
        for p in &partitions {
            assignment
                .add_partition_offset(topic, *p, Offset::Beginning)
                .map_err(|e| reader_error(e.to_string()))?;
        }
        lock(&reader)
            .assign(&assignment)
            .map_err(|e| reader_error(e.to_string()))?;
        info!(topic, ?partitions, "log opened");
        Ok(KafkaLog {
            topic: topic.to_owned(),
            bootstrap: bootstrap.to_owned(),
            producer,
            reader,
            partitions,
            read_timeout,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The topic's partitions, as found when the log was opened.
    pub fn partitions(&self) -> &[i32] {
        &self.partitions
    }

    /// Writes `key` → `value` (`None`: a tombstone) and returns once the broker confirmed it.
    pub async fn send(&self, key: Bytes, value: Option<Bytes>) -> Result<Written, KafkaLogError> {
        let written = self
            .producer
            .send(&OutRecord {
                topic: Topic::from(&self.topic),
                key: Some(key),
                value,
                ..OutRecord::default()
            })
            .await?;
        Ok(written)
    }

    /// Writes `records` in order (one partition per key, and the idempotent producer keeps
    /// their order within it), returning once all are confirmed; the first failure is returned.
    pub async fn send_all(
        &self,
        records: Vec<(Bytes, Option<Bytes>)>,
    ) -> Result<Vec<Written>, KafkaLogError> {
        let topic = Topic::from(&self.topic);
        let records: Vec<OutRecord> = records
            .into_iter()
            .map(|(key, value)| OutRecord {
                topic: topic.clone(),
                key: Some(key),
                value,
                ..OutRecord::default()
            })
            .collect();
        let mut written = Vec::with_capacity(records.len());
        for result in self.producer.send_all(&records).await {
            written.push(result?);
        }
        Ok(written)
    }

    /// Every record written since the last call (the whole topic on the first), up to the end
    /// offsets as they were when the call began: after it returns, every write confirmed
    /// before the call has been seen.
    pub async fn read_to_end(&self) -> Result<Vec<LogRecord>, KafkaLogError> {
        let topic = self.topic.clone();
        let partitions = self.partitions.clone();
        let timeout = self.read_timeout;
        blocking(Arc::clone(&self.reader), move |consumer| {
            read_to_end(consumer, &topic, &partitions, timeout)
        })
        .await?
    }

    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The consumer is only used through whole calls; a panic cannot leave it half-changed.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn blocking<T: Send + 'static>(
    reader: Arc<Mutex<BaseConsumer<SecurityContext>>>,
    call: impl FnOnce(&BaseConsumer<SecurityContext>) -> T + Send + 'static,
) -> Result<T, KafkaLogError> {
    tokio::task::spawn_blocking(move || call(&lock(&reader)))
        .await
        .map_err(|e| KafkaLogError::Read {
            topic: String::new(),
            reason: format!("the reader's thread failed: {e}"),
        })
}

fn partitions_of(
    consumer: &BaseConsumer<SecurityContext>,
    topic: &str,
    bootstrap: &str,
    timeout: Duration,
) -> Result<Vec<i32>, KafkaLogError> {
    let started = Instant::now();
    loop {
        match consumer.fetch_metadata(Some(topic), timeout) {
            Ok(metadata) => {
                if let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) {
                    if t.error().is_none() && !t.partitions().is_empty() {
                        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                        ids.sort_unstable();
                        return Ok(ids);
                    }
                }
            }
            Err(e) => debug!(topic, error = %e, "metadata for the log's topic failed"),
        }
        if started.elapsed() >= timeout {
            return Err(KafkaLogError::NoTopic {
                topic: topic.to_owned(),
                bootstrap: bootstrap.to_owned(),
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn read_to_end(
    consumer: &BaseConsumer<SecurityContext>,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<LogRecord>, KafkaLogError> {
    let started = Instant::now();
    let read_error = |reason: String| KafkaLogError::Read {
        topic: topic.to_owned(),
        reason,
    };
    let mut ends = BTreeMap::new();
    let mut starts = BTreeMap::new();
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, *p, timeout)
            .map_err(|e| read_error(format!("end offset of partition {p}: {e}")))?;
        ends.insert(*p, high);
        starts.insert(*p, low);
    }
    let mut records = Vec::new();
    loop {
        // The position is past control records and compacted gaps, unlike the last offset
        // seen, so it is what is compared with the end offset.
        // Before its first record a partition has no position yet: it is at its start.
        let positions = positions(consumer, topic, partitions)?;
        let behind = ends.iter().any(|(p, end)| {
            let position = positions.get(p).copied().unwrap_or(-1);
            let position = if position < 0 { starts[p] } else { position };
            position < *end
        });
        if !behind {
            return Ok(records);
        }
        if started.elapsed() >= timeout {
            return Err(KafkaLogError::ReadTimeout {
                topic: topic.to_owned(),
                timeout,
                positions,
                ends,
            });
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(message)) => records.push(LogRecord {
                partition: message.partition(),
                offset: message.offset(),
                key: message.key().map(Bytes::copy_from_slice),
                value: message.payload().map(Bytes::copy_from_slice),
            }),
            Some(Err(e)) => warn!(topic, error = %e, "reading the log"),
        }
    }
}

/// The reader's position per partition (-1 before its first fetch answered).
fn positions(
    consumer: &BaseConsumer<SecurityContext>,
    topic: &str,
    partitions: &[i32],
) -> Result<BTreeMap<i32, i64>, KafkaLogError> {
    let list = consumer.position().map_err(|e| KafkaLogError::Read {
        topic: topic.to_owned(),
        reason: format!("position: {e}"),
    })?;
    let mut out = BTreeMap::new();
    for p in partitions {
        let offset = match list.find_partition(topic, *p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => -1,
        };
        out.insert(*p, offset);
    }
    Ok(out)
}

/// How a worker topic is created when missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactedTopic {
    pub name: String,
    /// -1: the broker's default.
    pub partitions: i32,
    /// -1: the broker's default.
    pub replication_factor: i16,
    /// What the topic is for, for messages ("the config topic").
    pub purpose: &'static str,
}

/// Creates `topic` compacted when it is missing; when it exists, checks that it is compacted.
/// A broker without the admin APIs (CreateTopics, DescribeConfigs) gets a warning: the topic
/// must then exist, compacted, before the worker starts.
pub async fn ensure_compacted_topic(
    admin: &AdminClient,
    topic: &CompactedTopic,
) -> Result<TopicCreation, KafkaLogError> {
    let created = admin
        .create_topic(&NewTopic {
            name: topic.name.clone(),
            partitions: topic.partitions,
            replication_factor: topic.replication_factor,
            configs: vec![("cleanup.policy".to_owned(), "compact".to_owned())],
        })
        .await;
    let created = match created {
        Ok(c) => c,
        Err(e) if e.is_unsupported() => {
            warn!(topic = %topic.name, error = %e, "cannot create {}; it must exist, compacted, before the worker starts", topic.purpose);
            return Ok(TopicCreation::AlreadyExists);
        }
        Err(e) => return Err(e.into()),
    };
    if created == TopicCreation::Created {
        info!(topic = %topic.name, "created {} (cleanup.policy=compact)", topic.purpose);
        return Ok(created);
    }
    match admin
        .describe_configs(
            &ConfigResource::Topic(topic.name.clone()),
            &["cleanup.policy"],
        )
        .await
    {
        Ok(configs) => {
            let policy = configs
                .get("cleanup.policy")
                .and_then(|e| e.value.clone())
                .unwrap_or_default();
            if !policy.split(',').any(|p| p.trim() == "compact") {
                return Err(KafkaLogError::NotCompacted {
                    topic: topic.name.clone(),
                    policy,
                    purpose: topic.purpose,
                });
            }
        }
        Err(e) if e.is_unsupported() => {
            warn!(topic = %topic.name, error = %e, "cannot check that {} is compacted", topic.purpose)
        }
        Err(e) => return Err(e.into()),
    }
    Ok(created)
}
