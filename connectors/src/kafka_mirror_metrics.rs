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

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{Counter, Histogram};
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
    source: String,
    target: String,
    record_count: Counter<u64>,
    byte_count: Counter<u64>,
    record_age: Histogram<f64>,
    latency: Histogram<f64>,
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
            source,
            target,
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
        }
    }

    fn labels(&self, record: &OutRecord) -> [KeyValue; 4] {
        [
            KeyValue::new("source", self.source.clone()),
            KeyValue::new("target", self.target.clone()),
            KeyValue::new("topic", record.topic.clone()),
            KeyValue::new("partition", i64::from(record.partition.unwrap_or(-1))),
        ]
    }

    /// Records `written` (confirmed by the target); `received_ms` is when `put` got them.
    pub fn written<'a>(&self, written: impl IntoIterator<Item = &'a OutRecord>, received_ms: i64) {
        let acked = now_ms();
        for record in written {
            let labels = self.labels(record);
            self.record_count.add(1, &labels);
            let bytes = record.key.as_ref().map_or(0, |k| k.len())
                + record.value.as_ref().map_or(0, |v| v.len());
            self.byte_count.add(bytes as u64, &labels);
            if let Some(ts) = record.timestamp {
                self.record_age
                    .record((received_ms - ts).max(0) as f64, &labels);
                self.latency.record((acked - ts).max(0) as f64, &labels);
            }
        }
    }
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
        let metrics = MirrorMetrics::new(&provider.meter("t"), "A".into(), "B".into());
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
            vec![(Some("0".into()), 2), (Some("1".into()), 1)],
            "per target partition"
        );
        assert_eq!(bytes, 3 * 6, "key and value bytes");
        assert_eq!(ages.iter().map(|(c, _)| c).sum::<u64>(), 3);
        assert!(
            ages.iter().all(|(_, min)| min.is_some_and(|m| m >= 1000.0)),
            "{ages:?}"
        );
    }
}
