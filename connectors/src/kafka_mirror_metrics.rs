//! MirrorMaker 2's replication metrics for a kafka sink that runs a mirror flow (the connector
//! config names the flow with MM2's `source.cluster.alias` and `target.cluster.alias`, as
//! `spillway mirror` sets them). MM2 keeps them per target topic-partition under
//! `kafka.connect.mirror:type=MirrorSourceConnector`; here they are OpenTelemetry instruments
//! named `kafka.connect.mirror-source-connector.<MM2 name>` (Prometheus:
//! `kafka_connect_mirror_source_connector_record_count`, ...), labelled `source`, `target`, `topic`
//! (the target topic, as MM2) and `partition`:
//!
//! - `record-count`: records written to the target;
//! - `byte-count`: their key and value bytes (MM2's `byte-rate` is its rate);
//! - `record-age-ms`: how old a record was when the flow received it (now - its timestamp);
//! - `replication-latency-ms`: from the record's timestamp to the target's acknowledgement.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{BoundCounter, BoundHistogram, Counter, Histogram};
use opentelemetry::KeyValue;
use spillway_core::ConfigMap;
use spillway_kafka::producer::OutRecord;

/// MM2's connector keys naming the flow.
pub const SOURCE_CLUSTER_ALIAS: &str = "source.cluster.alias";
pub const TARGET_CLUSTER_ALIAS: &str = "target.cluster.alias";

const PREFIX: &str = "kafka.connect.mirror-source-connector.";

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The instruments of one task of a mirror flow.
pub struct MirrorMetrics {
    /// The flow's labels, shared: cloning one is a counter increment, not a copy.
    source: KeyValue,
    target: KeyValue,
    record_count: Counter<u64>,
    byte_count: Counter<u64>,
    record_age: Histogram<f64>,
    latency: Histogram<f64>,
    /// Instruments bound per target topic and partition written (bounded by the partitions
    /// the task writes to; kept for the task's life, as the SDK keeps a cumulative series).
    bound: HashMap<String, HashMap<i32, BoundPartition>>,
}

impl MirrorMetrics {
    /// The metrics of a flow, `None` when the config names no flow (a plain kafka sink).
    pub fn from_config(config: &ConfigMap) -> Option<MirrorMetrics> {
        let alias = |key: &str| {
            config
                .get(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let (source, target) = (alias(SOURCE_CLUSTER_ALIAS)?, alias(TARGET_CLUSTER_ALIAS)?);
        Some(Self::new(
            &opentelemetry::global::meter("spillway"),
            source,
            target,
        ))
    }

    pub fn new(meter: &opentelemetry::metrics::Meter, source: String, target: String) -> Self {
        MirrorMetrics {
            source: KeyValue::new("source", Arc::<str>::from(source)),
            target: KeyValue::new("target", Arc::<str>::from(target)),
            record_count: meter
                .u64_counter(format!("{PREFIX}record-count"))
                .with_description("Records replicated to the target")
                .build(),
            byte_count: meter
                .u64_counter(format!("{PREFIX}byte-count"))
                .with_description("Key and value bytes replicated to the target")
                .with_unit("By")
                .build(),
            record_age: meter
                .f64_histogram(format!("{PREFIX}record-age-ms"))
                .with_description("Age of a record when the flow received it")
                .with_unit("ms")
                .build(),
            latency: meter
                .f64_histogram(format!("{PREFIX}replication-latency-ms"))
                .with_description("From a record's timestamp to the target's acknowledgement")
                .with_unit("ms")
                .build(),
            bound: HashMap::new(),
        }
    }

    fn labels(&self, topic: &str, partition: i32) -> [KeyValue; 4] {
        [
            self.source.clone(),
            self.target.clone(),
            KeyValue::new("topic", Arc::<str>::from(topic)),
            KeyValue::new("partition", i64::from(partition)),
        ]
    }

    /// The instruments bound to `topic`'s `partition`, bound on its first record.
    fn bound(&mut self, topic: &str, partition: i32) -> &BoundPartition {
        if !self
            .bound
            .get(topic)
            .is_some_and(|p| p.contains_key(&partition))
        {
            let labels = self.labels(topic, partition);
            let instruments = BoundPartition {
                record_count: self.record_count.bind(&labels),
                byte_count: self.byte_count.bind(&labels),
                record_age: self.record_age.bind(&labels),
                latency: self.latency.bind(&labels),
            };
            self.bound
                .entry(topic.to_owned())
                .or_default()
                .insert(partition, instruments);
        }
        &self.bound[topic][&partition]
    }

    /// Records `written` (confirmed by the target); `received_ms` is when `put` got them.
    ///
    /// Per target partition of the batch, the bound instruments are looked up once and the
    /// counts added once; only the histograms take a value per record, through instruments
    /// bound to the partition's labels (an unbound `record` hashes the four labels each time:
    /// bench/README.md).
    pub fn written<'a>(
        &mut self,
        written: impl IntoIterator<Item = &'a OutRecord>,
        received_ms: i64,
    ) {
        let acked = now_ms();
        let mut partitions: Vec<PartitionBatch<'a>> = Vec::new();
        let mut last = 0;
        for record in written {
            let partition = record.partition.unwrap_or(-1);
            // Batches run by partition more often than not: try the last one first.
            let at = match partitions.get(last) {
                Some(p) if p.partition == partition && p.topic == record.topic => last,
                _ => match partitions
                    .iter()
                    .position(|p| p.partition == partition && p.topic == record.topic)
                {
                    Some(i) => i,
                    None => {
                        partitions.push(PartitionBatch {
                            topic: &record.topic,
                            partition,
                            instruments: self.bound(&record.topic, partition).clone(),
                            records: 0,
                            bytes: 0,
                        });
                        partitions.len() - 1
                    }
                },
            };
            last = at;
            let batch = &mut partitions[at];
            batch.records += 1;
            batch.bytes += (record.key.as_ref().map_or(0, |k| k.len())
                + record.value.as_ref().map_or(0, |v| v.len())) as u64;
            if let Some(ts) = record.timestamp {
                let instruments = &batch.instruments;
                instruments
                    .record_age
                    .record((received_ms - ts).max(0) as f64);
                instruments.latency.record((acked - ts).max(0) as f64);
            }
        }
        for batch in &partitions {
            batch.instruments.record_count.add(batch.records);
            batch.instruments.byte_count.add(batch.bytes);
        }
    }
}

/// One target partition's instruments, bound to its labels.
#[derive(Clone)]
struct BoundPartition {
    record_count: BoundCounter<u64>,
    byte_count: BoundCounter<u64>,
    record_age: BoundHistogram<f64>,
    latency: BoundHistogram<f64>,
}

/// One target partition's records in a batch.
struct PartitionBatch<'a> {
    topic: &'a str,
    partition: i32,
    instruments: BoundPartition,
    records: u64,
    bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::{
        data::{AggregatedMetrics, MetricData},
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    };

    #[test]
    fn only_a_config_naming_both_clusters_gets_mirror_metrics() {
        let mut config = ConfigMap::new();
        assert!(MirrorMetrics::from_config(&config).is_none());
        config.insert(SOURCE_CLUSTER_ALIAS.into(), "A".into());
        assert!(MirrorMetrics::from_config(&config).is_none());
        config.insert(TARGET_CLUSTER_ALIAS.into(), "B".into());
        assert!(MirrorMetrics::from_config(&config).is_some());
    }

    #[test]
    fn written_records_are_counted_per_target_partition_with_their_bytes() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let mut metrics = MirrorMetrics::new(&provider.meter("t"), "A".into(), "B".into());
        let record = |p: i32| OutRecord {
            topic: "A.orders".into(),
            partition: Some(p),
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"value")),
            headers: Vec::new(),
            timestamp: Some(now_ms() - 1000),
        };
        let records = [record(0), record(0), record(1)];
        metrics.written(&records, now_ms());
        // A second batch adds to the same series (the instruments bound by the first).
        metrics.written(&[record(1), record(2)], now_ms());
        provider.force_flush().expect("flush");
        let exported = exporter.get_finished_metrics().expect("metrics");
        let mut counts = Vec::new();
        let mut bytes = 0;
        let mut ages = Vec::new();
        for scope in exported.iter().flat_map(|rm| rm.scope_metrics()) {
            for metric in scope.metrics() {
                match (metric.name(), metric.data()) {
                    (
                        "kafka.connect.mirror-source-connector.record-count",
                        AggregatedMetrics::U64(MetricData::Sum(sum)),
                    ) => {
                        for point in sum.data_points() {
                            let partition = point
                                .attributes()
                                .find(|kv| kv.key.as_str() == "partition")
                                .map(|kv| kv.value.to_string());
                            counts.push((partition, point.value()));
                        }
                    }
                    (
                        "kafka.connect.mirror-source-connector.byte-count",
                        AggregatedMetrics::U64(MetricData::Sum(sum)),
                    ) => bytes += sum.data_points().map(|p| p.value()).sum::<u64>(),
                    (
                        "kafka.connect.mirror-source-connector.record-age-ms",
                        AggregatedMetrics::F64(MetricData::Histogram(h)),
                    ) => ages.extend(h.data_points().map(|p| (p.count(), p.min()))),
                    _ => {}
                }
            }
        }
        counts.sort();
        assert_eq!(
            counts,
            vec![
                (Some("0".into()), 2),
                (Some("1".into()), 2),
                (Some("2".into()), 1)
            ],
            "per target partition, over both batches"
        );
        assert_eq!(bytes, 5 * 6, "key and value bytes");
        assert_eq!(ages.iter().map(|(c, _)| c).sum::<u64>(), 5);
        assert_eq!(ages.len(), 3, "one age series per target partition");
        assert!(
            ages.iter().all(|(_, min)| min.is_some_and(|m| m >= 1000.0)),
            "{ages:?}"
        );
    }
}
