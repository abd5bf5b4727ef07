//! A status board with one share connector whose metrics are exported as Prometheus text, for
//! the metrics' unit tests.

use std::sync::Arc;

use super::{register, task_labels, ConnectorLabels};
use crate::status::{State, StatusBoard, TaskCounters};

/// A board with one share connector (tenant `acme`) and one task, its metrics exported
/// as Prometheus text.
pub(super) struct Exported {
    pub registry: prometheus::Registry,
    pub _provider: opentelemetry_sdk::metrics::SdkMeterProvider,
    pub board: StatusBoard,
    pub task: Arc<TaskCounters>,
}

pub(super) fn exported() -> Exported {
    use opentelemetry::metrics::MeterProvider as _;
    let registry = prometheus::Registry::new();
    let exporter = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .without_units()
        .without_counter_suffixes()
        .scope_info_enabled(false)
        .build()
        .expect("exporter");
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(exporter)
        .build();
    let board = StatusBoard::default();
    register(&provider.meter("spillway"), &board);
    board.connector_started("c", "share (default)".into(), "connect-c".into());
    let labels = ConnectorLabels {
        tenant: "acme".into(),
        connector: "c".into(),
        mode: "share",
        connector_class: "file".into(),
        connector_version: "1.0".into(),
    };
    board.set_labels("c", labels.clone());
    let task = board.task_counters("c", 0);
    task.metrics
        .bind(board.telemetry(), &task_labels(&labels, 0));
    board.set_task("c", 0, State::Running, None);
    Exported {
        registry,
        _provider: provider,
        board,
        task,
    }
}

/// The value of the sample `name` of tenant `acme` (the one task), or the unlabelled one.
pub(super) fn sample(registry: &prometheus::Registry, name: &str) -> Option<f64> {
    use prometheus::Encoder as _;
    let mut out = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut out)
        .expect("encodes");
    let text = String::from_utf8(out).expect("utf-8");
    text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (n, labels) = series.split_once('{').unwrap_or((series, ""));
        let wanted = labels.is_empty() || labels.contains("tenant=\"acme\"");
        (n == name && wanted).then(|| value.parse().expect("a number"))
    })
}
