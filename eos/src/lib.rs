//! Exactly-once Kafka to Kafka (ledger mode and the `kip-1289` feature). Not built yet: see the
//! issue "Exactly-once Kafka → Kafka".

#[cfg(feature = "kip-1289")]
pub mod kip1289;
