//! One share-group batch replicated exactly once with KIP-1289: produce the output records in
//! a producer transaction, add the source records' acknowledgements to the same transaction
//! with TxnShareAcknowledge, then commit — or abort, after which the source records come back.
//!
//! ```no_run
//! # async fn demo(
//! #     consumer: &mut spillway_kafka::share::ShareConsumer,
//! # ) -> Result<(), spillway_eos::kip1289::Kip1289Error> {
//! use rdkafka::config::ClientConfig;
//! use rdkafka::producer::FutureRecord;
//! use spillway_eos::kip1289::{Kip1289Producer, Kip1289Settings};
//! use spillway_kafka::share::AcknowledgeType;
//!
//! let producer = Kip1289Producer::create(
//!     "127.0.0.1:9092", "connector-task-0", Kip1289Settings::default(), ClientConfig::new(),
//! ).await?;
//! let records = consumer.poll(std::time::Duration::from_secs(1)).await?;
//! let mut txn = producer.begin().await?;
//! for r in &records {
//!     txn.send(FutureRecord::<[u8], [u8]>::to("out").payload(r.value.as_deref().unwrap_or_default())).await?;
//!     consumer.acknowledge_for_transaction(r, AcknowledgeType::Accept)?;
//! }
//! txn.commit(consumer).await?;
//! # Ok(()) }
//! ```
//!
//! What happens to the acknowledgements on each path is decided here and carried out by
//! [`ShareConsumer::finish_transaction`]: committed → settled by the broker; aborted after the
//! broker staged them → the abort marker makes the records available again; aborted before →
//! the consumer RELEASEs them (they are still acquired by this member).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::ToBytes;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use spillway_kafka::cluster::{Cluster, CoordinatorKind};
use spillway_kafka::connection::{Connection, ConnectionError};
use spillway_kafka::error_name;
use spillway_kafka::security::{is_security_key, ClientSecurity, SecurityError, SecuritySettings};
use spillway_kafka::share::{
    PartitionAcknowledgements, ShareConsumer, TransactionAcknowledgements, TransactionOutcome,
};
use tracing::{debug, warn};

use super::producer_identity::producer_identity_at;
use super::settings::Kip1289Settings;
use super::wire::{TxnShareAcknowledgeRequest, TxnShareAcknowledgeResponse, VERSION};
use super::Kip1289Error;

/// A transactional rdkafka producer plus the connection to the cluster that TxnShareAcknowledge
/// needs (rdkafka cannot send requests it does not know).
pub struct Kip1289Producer {
    producer: FutureProducer,
    cluster: Arc<Cluster>,
    transactional_id: String,
    settings: Kip1289Settings,
}

/// What a committed transaction held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitReport {
    pub records_produced: u64,
    pub records_acknowledged: u64,
}

/// The native client's security from the rdkafka producer's settings (`config_map` hides
/// secrets, so each value is read with `get`).
fn native_security(config: &ClientConfig) -> Result<ClientSecurity, SecurityError> {
    let keys: BTreeMap<String, String> = config
        .config_map()
        .keys()
        .filter(|key| is_security_key(key))
        .filter_map(|key| Some(((*key).to_owned(), config.get(key)?.to_owned())))
        .collect();
    SecuritySettings::from_config(&keys)?.client_security()
}

impl Kip1289Producer {
    /// Create the producer with `transactional_id` (stable per connector task, so a restarted
    /// task fences its predecessor) and run `init_transactions`. `producer_config` carries any
    /// further rdkafka settings; `bootstrap.servers` and `transactional.id` are set here.
    pub async fn create(
        bootstrap: &str,
        transactional_id: &str,
        settings: Kip1289Settings,
        mut producer_config: ClientConfig,
    ) -> Result<Kip1289Producer, Kip1289Error> {
        producer_config
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", transactional_id);
        let producer: FutureProducer = producer_config
            .create()
            .map_err(|e| Kip1289Error::producer(transactional_id, "being created", e))?;
        let timeout = settings.request_timeout;
        blocking(
            &producer,
            transactional_id,
            "initialising transactions",
            move |p| p.init_transactions(timeout),
        )
        .await?;
        // The coordinator connection (TxnShareAcknowledge) is secured as the producer is: the
        // same keys, one translation.
        let security = native_security(&producer_config)?;
        let cluster =
            Cluster::connect_secured(bootstrap, "spillway-kip1289", timeout, security).await?;
        Ok(Kip1289Producer {
            producer,
            cluster,
            transactional_id: transactional_id.to_string(),
            settings,
        })
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// Start a transaction.
    pub async fn begin(&self) -> Result<Kip1289Transaction<'_>, Kip1289Error> {
        blocking(
            &self.producer,
            &self.transactional_id,
            "beginning a transaction",
            |p| p.begin_transaction(),
        )
        .await?;
        Ok(Kip1289Transaction {
            owner: self,
            first_record: None,
            produced: 0,
        })
    }

    /// Add `acks` to the producer's current transaction. Returns the partitions the broker
    /// staged (accepted into the transaction) even on failure, so the caller knows which
    /// records the abort marker will return and which the consumer must release itself.
    async fn add_acknowledgements(
        &self,
        first_record: &(String, i32, i64),
        consumer: &ShareConsumer,
        acks: &TransactionAcknowledgements,
    ) -> StagingResult {
        let timeout = self.settings.request_timeout;
        let prepared = async {
            let (topic, partition, offset) = first_record;
            let identity =
                producer_identity_at(&self.cluster, topic, *partition, *offset, timeout).await?;
            debug!(
                transactional_id = %self.transactional_id,
                producer_id = identity.producer_id,
                producer_epoch = identity.producer_epoch,
                "producer identity"
            );
            let request = TxnShareAcknowledgeRequest::new(
                &self.transactional_id,
                identity.producer_id,
                identity.producer_epoch,
                &consumer.share_group_metadata(),
                acks,
            )?
            .with_layout(self.settings.layout);
            let coordinator = self
                .cluster
                .find_coordinator_of(CoordinatorKind::Transaction, &self.transactional_id)
                .await?;
            let conn = self.cluster.broker(coordinator).await?;
            Ok::<_, Kip1289Error>((request, conn))
        };
        let (request, conn) = match prepared.await {
            Ok(ready) => ready,
            Err(e) => return (Vec::new(), Err(e)),
        };
        match send_txn_share_acknowledge(&conn, self.settings.api_key, &request, timeout).await {
            Ok(response) => staged_partitions(acks, &response),
            Err(e) => (Vec::new(), Err(e)),
        }
    }
}

/// The partitions the broker staged into the transaction (also when others failed), and
/// whether all of them were.
type StagingResult = (Vec<(Arc<str>, i32)>, Result<(), Kip1289Error>);

/// One open transaction of a [`Kip1289Producer`].
pub struct Kip1289Transaction<'a> {
    owner: &'a Kip1289Producer,
    /// The first delivered record: its batch tells the producer id and epoch.
    first_record: Option<(String, i32, i64)>,
    produced: u64,
}

impl Kip1289Transaction<'_> {
    /// Produce one record in the transaction and wait for its delivery. After an error, call
    /// [`Kip1289Transaction::abort`]: a transaction that is dropped stays open on the producer
    /// (until its timeout), and the next [`Kip1289Producer::begin`] fails.
    pub async fn send<K, P>(
        &mut self,
        record: FutureRecord<'_, K, P>,
    ) -> Result<(i32, i64), Kip1289Error>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let topic = record.topic.to_string();
        let owner = self.owner;
        let delivery = owner
            .producer
            .send(record, Timeout::After(owner.settings.request_timeout))
            .await
            .map_err(|(e, _)| Kip1289Error::producer(&owner.transactional_id, "producing", e))?;
        self.produced += 1;
        self.first_record
            .get_or_insert((topic, delivery.partition, delivery.offset));
        Ok((delivery.partition, delivery.offset))
    }

    /// Records produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// Add every acknowledgement `consumer` staged for a transaction (see
    /// [`ShareConsumer::acknowledge_for_transaction`]) to this transaction and commit it. On
    /// any failure the transaction is aborted and [`Kip1289Error::Aborted`] says why; the
    /// source records then come back.
    ///
    /// A transaction that produced nothing has no output to make atomic with its
    /// acknowledgements; they are then committed the normal way (ShareAcknowledge).
    pub async fn commit(self, consumer: &ShareConsumer) -> Result<CommitReport, Kip1289Error> {
        let owner = self.owner;
        let acks = match consumer.acknowledgements_for_transaction() {
            Ok(acks) => acks,
            Err(e) => {
                consumer.release_transaction_acknowledgements();
                return Err(self.abort_because(e.into()).await);
            }
        };
        let Some(first_record) = self.first_record.clone() else {
            consumer.finish_transaction(&acks, TransactionOutcome::NoOutput);
            self.commit_producer().await.map_err(|e| {
                warn!(%e, "committing a transaction without records failed");
                e
            })?;
            return Ok(CommitReport {
                records_produced: 0,
                records_acknowledged: acks.record_count(),
            });
        };
        if !acks.is_empty() {
            let (staged, added) = owner
                .add_acknowledgements(&first_record, consumer, &acks)
                .await;
            if let Err(cause) = added {
                finish_aborted(consumer, &acks, &staged);
                return Err(self.abort_because(cause).await);
            }
        }
        let produced = self.produced;
        if let Err(cause) = self.commit_producer().await {
            // The acknowledgements were all staged; the abort marker returns the records.
            consumer.finish_transaction(
                &acks,
                TransactionOutcome::Aborted {
                    staged_on_broker: true,
                },
            );
            return Err(abort(owner, cause).await);
        }
        consumer.finish_transaction(&acks, TransactionOutcome::Committed);
        Ok(CommitReport {
            records_produced: produced,
            records_acknowledged: acks.record_count(),
        })
    }

    /// Abort: the output records are never visible and every acknowledgement staged for this
    /// transaction is withdrawn (the records are released, so they come back).
    pub async fn abort(self, consumer: &ShareConsumer) -> Result<(), Kip1289Error> {
        consumer.release_transaction_acknowledgements();
        let owner = self.owner;
        let timeout = owner.settings.request_timeout;
        blocking(
            &owner.producer,
            &owner.transactional_id,
            "aborting a transaction",
            move |p| p.abort_transaction(timeout),
        )
        .await
    }

    async fn commit_producer(&self) -> Result<(), Kip1289Error> {
        let owner = self.owner;
        let timeout = owner.settings.request_timeout;
        blocking(
            &owner.producer,
            &owner.transactional_id,
            "committing a transaction",
            move |p| p.commit_transaction(timeout),
        )
        .await
    }

    async fn abort_because(self, cause: Kip1289Error) -> Kip1289Error {
        abort(self.owner, cause).await
    }
}

/// Abort the producer's transaction after `cause`; the error names both.
async fn abort(owner: &Kip1289Producer, cause: Kip1289Error) -> Kip1289Error {
    let timeout = owner.settings.request_timeout;
    let aborted = blocking(
        &owner.producer,
        &owner.transactional_id,
        "aborting a transaction",
        move |p| p.abort_transaction(timeout),
    )
    .await;
    Kip1289Error::Aborted {
        cause: Box::new(cause),
        abort_failure: match aborted {
            Ok(()) => String::new(),
            Err(e) => format!("; the abort failed too: {e}"),
        },
    }
}

/// Tell the consumer how an aborted transaction leaves each partition's records.
fn finish_aborted(
    consumer: &ShareConsumer,
    acks: &TransactionAcknowledgements,
    staged: &[(Arc<str>, i32)],
) {
    let (on_broker, ours): (
        Vec<PartitionAcknowledgements>,
        Vec<PartitionAcknowledgements>,
    ) = acks.partitions.iter().cloned().partition(|p| {
        staged
            .iter()
            .any(|(t, n)| *t == p.topic && *n == p.partition)
    });
    consumer.finish_transaction(
        &TransactionAcknowledgements {
            partitions: on_broker,
        },
        TransactionOutcome::Aborted {
            staged_on_broker: true,
        },
    );
    consumer.finish_transaction(
        &TransactionAcknowledgements { partitions: ours },
        TransactionOutcome::Aborted {
            staged_on_broker: false,
        },
    );
}

/// Which partitions of `acks` the broker staged, and whether all were.
fn staged_partitions(
    acks: &TransactionAcknowledgements,
    response: &TxnShareAcknowledgeResponse,
) -> StagingResult {
    if response.error_code != 0 {
        return (
            Vec::new(),
            Err(Kip1289Error::Refused {
                code: response.error_code,
                name: error_name(response.error_code),
            }),
        );
    }
    let mut staged = Vec::new();
    let mut refused = Vec::new();
    for p in &acks.partitions {
        let result = response
            .responses
            .iter()
            .filter(|t| t.topic_id == p.topic_id)
            .flat_map(|t| &t.partitions)
            .find(|r| r.partition_index == p.partition);
        match result {
            Some(r) if r.error_code == 0 => staged.push((p.topic.clone(), p.partition)),
            Some(r) => refused.push(format!(
                "{}-{}: error {} ({}){}",
                p.topic,
                p.partition,
                r.error_code,
                error_name(r.error_code),
                r.error_message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )),
            None => refused.push(format!(
                "{}-{}: missing from the response",
                p.topic, p.partition
            )),
        }
    }
    let result = if refused.is_empty() {
        Ok(())
    } else {
        Err(Kip1289Error::PartitionsRefused {
            details: refused.join("; "),
        })
    };
    (staged, result)
}

/// Send `request` as TxnShareAcknowledge v0 with `api_key` on `conn` and decode the answer.
/// Nothing is sent unless the broker advertises `api_key` at version 0 in ApiVersions: a
/// broker that does not know the key closes the connection (the dev broker too), which would
/// also end every share session on it.
pub async fn send_txn_share_acknowledge(
    conn: &Connection,
    api_key: i16,
    request: &TxnShareAcknowledgeRequest,
    timeout: Duration,
) -> Result<TxnShareAcknowledgeResponse, Kip1289Error> {
    request.validate()?;
    conn.pick(api_key, VERSION, VERSION).map_err(|e| match e {
        ConnectionError::UnsupportedApi { .. } | ConnectionError::NoCommonVersion { .. } => {
            Kip1289Error::NotSupported {
                addr: conn.addr().to_string(),
                api_key,
                reason: e.to_string(),
            }
        }
        other => other.into(),
    })?;
    let body = conn
        .request_raw(api_key, VERSION, true, request, timeout)
        .await?;
    Ok(TxnShareAcknowledgeResponse::from_bytes(
        body,
        request.layout,
    )?)
}

/// Run a blocking rdkafka transaction call off the async threads.
async fn blocking<F>(
    producer: &FutureProducer,
    transactional_id: &str,
    during: &'static str,
    call: F,
) -> Result<(), Kip1289Error>
where
    F: FnOnce(&FutureProducer) -> Result<(), KafkaError> + Send + 'static,
{
    let producer = producer.clone();
    match tokio::task::spawn_blocking(move || call(&producer)).await {
        Ok(result) => result.map_err(|e| Kip1289Error::producer(transactional_id, during, e)),
        Err(join) => {
            warn!(%join, during, "a blocking producer call panicked or was cancelled");
            Err(Kip1289Error::producer(
                transactional_id,
                during,
                KafkaError::Canceled,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_kafka::share::{AcknowledgementBatch, ShareGroupMetadata};
    use std::collections::HashMap;
    use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};
    use uuid::Uuid;

    const TOPIC: Uuid = Uuid::from_bytes([7; 16]);
    const T: Duration = Duration::from_secs(5);

    #[test]
    fn the_coordinator_connection_takes_the_producers_security_secrets_included() {
        use spillway_kafka::security::{SaslCredentials, SecurityProtocol};
        let mut config = ClientConfig::new();
        config
            .set("transaction.timeout.ms", "30000")
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", "alice")
            .set("sasl.password", "alice-secret");
        let security = native_security(&config).expect("translated");
        assert_eq!(security.protocol(), SecurityProtocol::SaslPlaintext);
        let sasl = security.sasl().expect("SASL");
        assert_eq!(sasl.principal(), "alice");
        match &sasl.credentials {
            SaslCredentials::UserPassword { password, .. } => {
                // rdkafka's config_map() shows a placeholder for secrets; the real one is used.
                assert_eq!(password.expose(), "alice-secret");
            }
            other => panic!("{other:?}"),
        }
        let plain = native_security(&ClientConfig::new()).expect("plaintext");
        assert_eq!(plain.protocol(), SecurityProtocol::Plaintext);
    }

    fn acks(partitions: &[i32]) -> TransactionAcknowledgements {
        TransactionAcknowledgements {
            partitions: partitions
                .iter()
                .map(|&partition| PartitionAcknowledgements {
                    topic: Arc::from("src"),
                    topic_id: TOPIC,
                    partition,
                    batches: vec![AcknowledgementBatch {
                        first_offset: 0,
                        last_offset: 9,
                        types: vec![1],
                    }],
                })
                .collect(),
        }
    }

    fn request(partitions: &[i32]) -> TxnShareAcknowledgeRequest {
        let member = ShareGroupMetadata {
            group_id: "g".into(),
            member_id: "m".into(),
            member_epoch: 3,
        };
        TxnShareAcknowledgeRequest::new("tx", 1000, 2, &member, &acks(partitions)).unwrap()
    }

    #[tokio::test]
    async fn the_request_goes_out_with_the_configured_api_key_and_its_answer_is_decoded() {
        let (client, mut broker) = duplex(1 << 16);
        let mut conn = Connection::from_stream(client, "fake:1", "cid");
        conn.set_versions(HashMap::from([(95, (0, 0))]));
        let sent = request(&[0]);
        let body = sent.to_bytes().unwrap();
        let call =
            tokio::spawn(
                async move { send_txn_share_acknowledge(&conn, 95, &request(&[0]), T).await },
            );
        let mut len = [0u8; 4];
        broker.read_exact(&mut len).await.unwrap();
        let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
        broker.read_exact(&mut frame).await.unwrap();
        assert_eq!(&frame[0..2], &95i16.to_be_bytes(), "api key");
        assert_eq!(&frame[2..4], &0i16.to_be_bytes(), "version 0");
        let correlation = [frame[4], frame[5], frame[6], frame[7]];
        // Header v2 after the correlation id: client id "cid" (int16 length) and no tags.
        assert_eq!(&frame[8..14], &[0, 3, b'c', b'i', b'd', 0]);
        assert_eq!(
            &frame[14..],
            body.as_ref(),
            "the body is the encoded request"
        );
        // Response: header v1 (correlation id, no tags), then throttle 0, error 0, one topic
        // with partition 0 refused with 121 and no message.
        let mut answer = correlation.to_vec();
        answer.push(0);
        answer.extend([0, 0, 0, 0, 0, 0, 2]);
        answer.extend(TOPIC.as_bytes());
        answer.extend([2, 0, 0, 0, 0, 0, 121, 0, 0, 0, 0]);
        let mut out = (answer.len() as i32).to_be_bytes().to_vec();
        out.extend(answer);
        broker.write_all(&out).await.unwrap();
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.responses[0].partitions[0].error_code, 121);
        let (staged, result) = staged_partitions(&acks(&[0]), &response);
        assert!(staged.is_empty());
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.contains("src-0: error 121 (InvalidRecordState)"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn nothing_is_sent_to_a_broker_that_does_not_advertise_the_api_key() {
        let (client, mut broker) = duplex(1 << 16);
        let mut conn = Connection::from_stream(client, "fake:2", "cid");
        // The dev broker's list has no 93; a draft build might advertise 94 instead.
        conn.set_versions(HashMap::from([(78, (1, 1)), (94, (0, 0))]));
        let err = send_txn_share_acknowledge(&conn, 93, &request(&[0]), T)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            Kip1289Error::NotSupported { api_key: 93, .. }
        ));
        let msg = err.to_string();
        assert!(msg.contains("no released broker implements"), "{msg}");
        assert!(msg.contains("exactly.once.kip1289.api.key"), "{msg}");
        drop(conn);
        let mut rest = Vec::new();
        broker.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "no bytes were written: {rest:?}");
    }

    #[tokio::test]
    async fn a_broker_that_hangs_up_on_the_request_gives_a_connection_error() {
        let (client, mut broker) = duplex(1 << 16);
        let mut conn = Connection::from_stream(client, "fake:3", "cid");
        // Advertised, yet the broker closes the connection, as one that does not know the key
        // would.
        conn.set_versions(HashMap::from([(93, (0, 0))]));
        let call =
            tokio::spawn(
                async move { send_txn_share_acknowledge(&conn, 93, &request(&[0]), T).await },
            );
        let mut len = [0u8; 4];
        broker.read_exact(&mut len).await.unwrap();
        drop(broker);
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, Kip1289Error::Connection(_)), "{err}");
        assert!(err.to_string().contains("closed the connection"), "{err}");
    }

    #[test]
    fn only_partitions_the_broker_accepted_count_as_staged() {
        let response = TxnShareAcknowledgeResponse {
            throttle_time_ms: 0,
            error_code: 0,
            responses: vec![super::super::wire::TopicResult {
                topic_id: TOPIC,
                partitions: vec![
                    super::super::wire::PartitionResult {
                        partition_index: 0,
                        error_code: 0,
                        error_message: None,
                    },
                    super::super::wire::PartitionResult {
                        partition_index: 1,
                        error_code: 110,
                        error_message: Some("stale member epoch".into()),
                    },
                ],
            }],
        };
        let (staged, result) = staged_partitions(&acks(&[0, 1, 2]), &response);
        assert_eq!(staged, vec![(Arc::from("src"), 0)]);
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.contains("src-1: error 110 (FencedMemberEpoch): stale member epoch")
                && msg.contains("src-2: missing from the response"),
            "{msg}"
        );
        let (staged, result) = staged_partitions(&acks(&[0]), &response);
        assert_eq!(staged.len(), 1);
        assert!(result.is_ok());
        let refused = TxnShareAcknowledgeResponse {
            error_code: 51,
            ..response
        };
        let (staged, result) = staged_partitions(&acks(&[0]), &refused);
        assert!(staged.is_empty());
        assert!(matches!(
            result,
            Err(Kip1289Error::Refused { code: 51, .. })
        ));
    }
}
