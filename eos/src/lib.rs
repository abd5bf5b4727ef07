//! Exactly-once Kafka to Kafka: the kafka sink's transactions under
//! `delivery.guarantee=exactly_once` ([`writer`]), and in share mode the ledger of source
//! records whose output is committed ([`ledger`], [`ledger_reader`], [`ledger_cache`]).
//! docs/exactly-once.md explains the design and the window that can still duplicate.

pub mod ledger;
pub mod ledger_cache;
pub mod ledger_reader;
pub mod writer;
