//! Everything that speaks to Kafka.
