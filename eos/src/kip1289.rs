//! Exactly-once share-group replication with KIP-1289 transactional acknowledgements
//! (cargo feature `kip-1289`, off by default).
//!
//! KIP-1289 lets a producer transaction carry a share consumer's acknowledgements, so the
//! output records and the ACCEPTs of their sources commit or abort together. **It is a draft:
//! no released broker implements it and its wire format may still change** (see
//! `docs/exactly-once-kip1289.md`).
//!
//! - [`wire`]: the draft TxnShareAcknowledge v0 request and response.
//! - [`settings`]: `exactly.once.kip1289.*` (the api key differs between drafts).
//! - [`producer_identity`]: how the producer id and epoch, which librdkafka keeps private, are
//!   learnt from the transaction's first record.
//! - [`transaction`]: [`Kip1289Producer`] / [`Kip1289Transaction`], the produce →
//!   TxnShareAcknowledge → commit (or abort) flow.

pub mod producer_identity;
pub mod settings;
pub mod transaction;
pub mod wire;

pub use producer_identity::ProducerIdentity;
pub use settings::Kip1289Settings;
pub use transaction::{CommitReport, Kip1289Producer, Kip1289Transaction};

use rdkafka::error::KafkaError;
use spillway_kafka::cluster::ClusterError;
use spillway_kafka::connection::ConnectionError;
use spillway_kafka::security::SecurityError;
use spillway_kafka::share::ShareError;
use thiserror::Error;

/// Errors of the KIP-1289 path.
#[derive(Debug, Error)]
pub enum Kip1289Error {
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error(transparent)]
    Security(#[from] SecurityError),
    #[error("transactional producer '{transactional_id}' failed while {during}: {source}")]
    Producer {
        transactional_id: String,
        during: &'static str,
        #[source]
        source: KafkaError,
    },
    #[error("the transaction coordinator {addr} does not support TxnShareAcknowledge with api key {api_key} ({reason}); KIP-1289 is a draft that no released broker implements, so this needs a broker built from the draft, and exactly.once.kip1289.api.key set to the key that build advertises")]
    NotSupported {
        addr: String,
        api_key: i16,
        reason: String,
    },
    #[error("cannot learn the producer id and epoch from {topic}-{partition}@{offset}, the transaction's first record: {reason}")]
    ProducerIdentity {
        topic: String,
        partition: i32,
        offset: i64,
        reason: String,
    },
    #[error("TxnShareAcknowledge was refused with error {code} ({name})")]
    Refused { code: i16, name: String },
    #[error("TxnShareAcknowledge was refused for some partitions: {details}")]
    PartitionsRefused { details: String },
    #[error("the transaction was aborted, so neither its records nor its acknowledgements took effect and the source records will be delivered again; cause: {cause}{abort_failure}")]
    Aborted {
        cause: Box<Kip1289Error>,
        /// Set when the abort itself failed (the producer must then be recreated).
        abort_failure: String,
    },
}

impl Kip1289Error {
    fn producer(transactional_id: &str, during: &'static str, source: KafkaError) -> Self {
        Kip1289Error::Producer {
            transactional_id: transactional_id.to_string(),
            during,
            source,
        }
    }
}
