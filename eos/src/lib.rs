//! Exactly-once Kafka to Kafka: the kafka sink's transactions under
//! `delivery.guarantee=exactly_once` ([`writer`]), and in share mode the ledger of source
//! records whose output is committed ([`ledger`], [`ledger_reader`], [`ledger_cache`]) and the
//! check of its entries against other writers' before a commit ([`claims`]).
//! docs/exactly-once.md explains the design and the window that can still duplicate; the
//! `kip-1289` feature adds the draft transactional acknowledgements (docs/exactly-once-kip1289.md).

pub mod claims;
#[cfg(feature = "kip-1289")]
pub mod kip1289;
pub mod ledger;
pub mod ledger_cache;
pub mod ledger_reader;
pub mod writer;
