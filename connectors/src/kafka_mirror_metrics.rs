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
//! - `record-age-ms` with `-min`, `-max` and `-avg`: how old a record was when the flow
//!   received it (now - its timestamp);
//! - `replication-latency-ms` with `-min`, `-max` and `-avg`: from the record's timestamp to the
//!   target's acknowledgement.
//!
//! As MM2's sensors, the plain `record-age-ms` and `replication-latency-ms` are the last value
//! recorded and the others Kafka's sampled statistics over the last 30 to 60 s
//! ([`Windowed`]). A batch sums its values up per partition and adds them once
//! ([`Summary`]); the gauges read them when a reader collects ([`register_gauges`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::metrics::{BoundCounter, Counter, Meter};
use opentelemetry::KeyValue;
use spillway_core::windowed::{Stats, Summary, Windowed};
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

/// Registers the gauges of every mirror flow's ages and latencies on `meter` (the worker's
/// meter provider, once): they read the flows' statistics when a reader collects.
pub fn register_gauges(meter: &Meter) {
    Flows::global().register(meter);
}

/// The statistics of every target partition a live flow task writes to, read by the gauges
/// registered on a meter. One per flow and partition, shared by the tasks that write to it
/// (share mode spreads a partition's records over tasks): one series, as MM2's one sensor.
#[derive(Default)]
struct Flows {
    partitions: Mutex<HashMap<PartitionKey, Weak<PartitionStats>>>,
}

/// Source and target alias, target topic, partition.
type PartitionKey = (Arc<str>, Arc<str>, String, i32);

struct PartitionStats {
    labels: [KeyValue; 4],
    record_age: Windowed,
    latency: Windowed,
}

/// Which of a partition's statistics a gauge reads.
type StatisticOf = fn(&PartitionStats) -> &Windowed;

/// Which statistic a gauge reports.
#[derive(Clone, Copy)]
enum Read {
    Last,
    Min,
    Max,
    Avg,
}

impl Flows {
    /// The flows of this process, the ones [`register_gauges`] reports.
    fn global() -> &'static Arc<Flows> {
        static FLOWS: OnceLock<Arc<Flows>> = OnceLock::new();
        FLOWS.get_or_init(Arc::default)
    }

    /// The statistics of a flow's partition, shared with the tasks writing to it already.
    fn partition(&self, key: PartitionKey, labels: [KeyValue; 4]) -> Arc<PartitionStats> {
        let mut partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stats) = partitions.get(&key).and_then(Weak::upgrade) {
            return stats;
        }
        // Partitions no live task writes to any more are left out here, not on collection.
        partitions.retain(|_, p| p.strong_count() > 0);
        let stats = Arc::new(PartitionStats {
            labels,
            record_age: Windowed::default(),
            latency: Windowed::default(),
        });
        partitions.insert(key, Arc::downgrade(&stats));
        stats
    }

    /// Every live partition's statistics.
    fn each(&self, mut read: impl FnMut(&PartitionStats)) {
        let partitions: Vec<Arc<PartitionStats>> = {
            let partitions = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
            partitions.values().filter_map(Weak::upgrade).collect()
        };
        for p in &partitions {
            read(p);
        }
    }

    fn register(self: &Arc<Self>, meter: &Meter) {
        let metrics: [(&str, &str, StatisticOf); 2] = [
            (
                "record-age-ms",
                "age of a record when the flow received it",
                |p| &p.record_age,
            ),
            (
                "replication-latency-ms",
                "time from a record's timestamp to the target's acknowledgement",
                |p| &p.latency,
            ),
        ];
        for (name, what, windowed) in metrics {
            for (suffix, read, description) in [
                ("", Read::Last, format!("The last {what}")),
                (
                    "-min",
                    Read::Min,
                    format!("Least {what}, over the last 30-60 s"),
                ),
                (
                    "-max",
                    Read::Max,
                    format!("Greatest {what}, over the last 30-60 s"),
                ),
                (
                    "-avg",
                    Read::Avg,
                    format!("Average {what}, over the last 30-60 s"),
                ),
            ] {
                let flows = Arc::clone(self);
                meter
                    .f64_observable_gauge(format!("{PREFIX}{name}{suffix}"))
                    .with_description(description)
                    .with_unit("ms")
                    .with_callback(move |o| {
                        let now = Instant::now();
                        flows.each(|p| {
                            let w = windowed(p);
                            let value = match read {
                                Read::Last => w.last(),
                                Read::Min => w.read(now).map(|s: Stats| s.min),
                                Read::Max => w.read(now).map(|s| s.max),
                                Read::Avg => w.read(now).map(|s| s.avg),
                            };
                            if let Some(v) = value {
                                o.observe(v, &p.labels);
                            }
                        });
                    })
                    .build();
            }
        }
    }
}

/// The instruments of one task of a mirror flow.
pub struct MirrorMetrics {
    /// The flow's labels, shared: cloning one is a counter increment, not a copy.
    source: KeyValue,
    target: KeyValue,
    source_alias: Arc<str>,
    target_alias: Arc<str>,
    record_count: Counter<u64>,
    byte_count: Counter<u64>,
    flows: Arc<Flows>,
    /// Counters bound and statistics kept per target topic and partition written (bounded by
    /// the partitions the task writes to; kept for the task's life, as the SDK keeps a
    /// cumulative series).
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
            Flows::global(),
            source,
            target,
        ))
    }

    fn new(meter: &Meter, flows: &Arc<Flows>, source: String, target: String) -> Self {
        let (source_alias, target_alias) = (Arc::<str>::from(source), Arc::<str>::from(target));
        MirrorMetrics {
            source: KeyValue::new("source", Arc::clone(&source_alias)),
            target: KeyValue::new("target", Arc::clone(&target_alias)),
            source_alias,
            target_alias,
            record_count: meter
                .u64_counter(format!("{PREFIX}record-count"))
                .with_description("Records replicated to the target")
                .build(),
            byte_count: meter
                .u64_counter(format!("{PREFIX}byte-count"))
                .with_description("Key and value bytes replicated to the target")
                .with_unit("By")
                .build(),
            flows: Arc::clone(flows),
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

    /// The instruments of `topic`'s `partition`, made on its first record.
    fn bound(&mut self, topic: &str, partition: i32) -> &BoundPartition {
        if !self
            .bound
            .get(topic)
            .is_some_and(|p| p.contains_key(&partition))
        {
            let labels = self.labels(topic, partition);
            let key = (
                Arc::clone(&self.source_alias),
                Arc::clone(&self.target_alias),
                topic.to_owned(),
                partition,
            );
            let stats = self.flows.partition(key, labels.clone());
            let instruments = BoundPartition {
                record_count: self.record_count.bind(&labels),
                byte_count: self.byte_count.bind(&labels),
                stats,
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
    /// Per target partition of the batch, the instruments are looked up once, and the counts,
    /// ages and latencies added once: a record costs a few additions (an OpenTelemetry
    /// histogram took a lock per value, bench/README.md).
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
                            records: 0,
                            bytes: 0,
                            record_age: Summary::default(),
                            latency: Summary::default(),
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
                batch.record_age.add((received_ms - ts).max(0) as f64);
                batch.latency.add((acked - ts).max(0) as f64);
            }
        }
        let now = Instant::now();
        for batch in &partitions {
            let instruments = self.bound(batch.topic, batch.partition);
            instruments.record_count.add(batch.records);
            instruments.byte_count.add(batch.bytes);
            instruments
                .stats
                .record_age
                .record_all(&batch.record_age, now);
            instruments.stats.latency.record_all(&batch.latency, now);
        }
    }
}

/// One target partition's counters, bound to its labels, and its statistics.
struct BoundPartition {
    record_count: BoundCounter<u64>,
    byte_count: BoundCounter<u64>,
    stats: Arc<PartitionStats>,
}

/// One target partition's records in a batch.
struct PartitionBatch<'a> {
    topic: &'a str,
    partition: i32,
    records: u64,
    bytes: u64,
    record_age: Summary,
    latency: Summary,
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

    /// Every data point exported, as (metric name, partition label, value).
    fn exported(
        provider: &SdkMeterProvider,
        exporter: &InMemoryMetricExporter,
    ) -> Vec<(String, String, f64)> {
        provider.force_flush().expect("flush");
        let mut points = Vec::new();
        fn partition<'k>(mut attrs: impl Iterator<Item = &'k KeyValue>) -> String {
            attrs
                .find(|kv| kv.key.as_str() == "partition")
                .map(|kv| kv.value.to_string())
                .unwrap_or_default()
        }
        let metrics = exporter.get_finished_metrics().expect("metrics");
        // The last collection only: every series is cumulative or a current gauge.
        for scope in metrics.last().into_iter().flat_map(|rm| rm.scope_metrics()) {
            for metric in scope.metrics() {
                let name = metric.name().trim_start_matches(PREFIX).to_owned();
                match metric.data() {
                    AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                        for p in sum.data_points() {
                            points.push((
                                name.clone(),
                                partition(p.attributes()),
                                p.value() as f64,
                            ));
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Gauge(gauge)) => {
                        for p in gauge.data_points() {
                            points.push((name.clone(), partition(p.attributes()), p.value()));
                        }
                    }
                    other => panic!("{name}: unexpected data {other:?}"),
                }
            }
        }
        points.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        points
    }

    #[test]
    fn written_records_are_counted_and_their_ages_summed_up_per_target_partition() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let meter = provider.meter("t");
        let flows = Arc::new(Flows::default());
        flows.register(&meter);
        let mut metrics = MirrorMetrics::new(&meter, &flows, "A".into(), "B".into());
        let received = now_ms();
        let record = |p: i32, age: i64| OutRecord {
            topic: "A.orders".into(),
            partition: Some(p),
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"value")),
            headers: Vec::new(),
            timestamp: Some(received - age),
        };
        metrics.written(
            &[record(0, 1000), record(0, 3000), record(1, 2000)],
            received,
        );
        // A second batch adds to the same series; its last record's age is the plain value.
        metrics.written(
            &[record(1, 4000), record(1, 500), record(2, 7000)],
            received,
        );
        let points = exported(&provider, &exporter);
        let value = |name: &str, partition: &str| {
            points
                .iter()
                .find(|(n, p, _)| n == name && p == partition)
                .map(|(_, _, v)| *v)
                .unwrap_or_else(|| panic!("no {name} for partition {partition}: {points:?}"))
        };
        for (partition, count) in [("0", 2.0), ("1", 3.0), ("2", 1.0)] {
            assert_eq!(
                value("record-count", partition),
                count,
                "per target partition, over both batches"
            );
            assert_eq!(
                value("byte-count", partition),
                count * 6.0,
                "key and value bytes"
            );
        }
        assert_eq!(value("record-age-ms-min", "0"), 1000.0);
        assert_eq!(value("record-age-ms-max", "0"), 3000.0);
        assert_eq!(value("record-age-ms-avg", "0"), 2000.0);
        assert_eq!(value("record-age-ms-min", "1"), 500.0);
        assert_eq!(value("record-age-ms-max", "1"), 4000.0);
        assert_eq!(value("record-age-ms-avg", "1"), 6500.0 / 3.0);
        assert_eq!(value("record-age-ms", "1"), 500.0, "the last value");
        assert_eq!(value("record-age-ms", "2"), 7000.0);
        // The acknowledgement came after `received`: a latency is at least the record's age.
        for partition in ["0", "1", "2"] {
            assert!(
                value("replication-latency-ms-min", partition)
                    >= value("record-age-ms-min", partition)
            );
            assert!(
                value("replication-latency-ms-max", partition)
                    >= value("record-age-ms-max", partition)
            );
            assert!(
                value("replication-latency-ms-avg", partition)
                    >= value("record-age-ms-avg", partition)
            );
        }
        assert!(value("replication-latency-ms", "2") >= 7000.0);
        // Another task of the flow writing to partition 2 (share mode spreads a partition's
        // records over tasks) adds to its one series.
        let mut other_task = MirrorMetrics::new(&meter, &flows, "A".into(), "B".into());
        other_task.written(&[record(2, 1000)], received);
        let points = exported(&provider, &exporter);
        let series = |name: &str| {
            points
                .iter()
                .filter(|(n, p, _)| n == name && p == "2")
                .map(|(_, _, v)| *v)
                .collect::<Vec<_>>()
        };
        assert_eq!(series("record-age-ms-min"), vec![1000.0], "{points:?}");
        assert_eq!(series("record-age-ms-max"), vec![7000.0]);
        assert_eq!(series("record-age-ms-avg"), vec![4000.0]);
        // A partition is reported while a task writing to it lives.
        drop(metrics);
        let points = exported(&provider, &exporter);
        let partitions: Vec<&str> = points
            .iter()
            .filter(|(n, _, _)| n == "record-age-ms-max")
            .map(|(_, p, _)| p.as_str())
            .collect();
        assert_eq!(partitions, vec!["2"]);
        drop(other_task);
        let points = exported(&provider, &exporter);
        assert!(
            !points
                .iter()
                .any(|(n, _, _)| n.starts_with("record-age-ms")),
            "{points:?}"
        );
    }
}
