//! Registers every instrument on an OpenTelemetry meter, observing the worker's status board;
//! the exporters (Prometheus, OTLP) read them from there.

use std::time::Instant;

use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;

use super::telemetry::Histograms;
use super::worker::{register_statuses, register_worker};
use super::{instrument_name, task_metrics, Kind, TaskMetric, TaskView};
use crate::status::StatusBoard;

/// Registers every instrument on `meter`, observing `board`. Instruments stop reporting once
/// the board (the worker) is gone.
pub fn register(meter: &Meter, board: &StatusBoard) {
    let _ = board.telemetry().histograms.set(Histograms::new(meter));
    for metric in task_metrics() {
        let weak = board.downgrade();
        let name = instrument_name(metric.group, metric.name);
        let TaskMetric {
            kind,
            unit,
            help,
            value,
            name: metric_name,
            ..
        } = metric;
        let each = move |observe: &mut dyn FnMut(f64, &[KeyValue])| {
            let Some(board) = weak.upgrade() else {
                return;
            };
            let now = Instant::now();
            for (_, labels, tasks) in board.metric_view() {
                for (task, _, counters) in tasks {
                    let view = TaskView {
                        counts: counters.snapshot(),
                        metrics: &counters.metrics,
                        now,
                    };
                    let Some(v) = value(&view) else { continue };
                    let v = match kind {
                        Kind::Rate => counters.metrics.rates.rate(metric_name, v as u64, now),
                        _ => v,
                    };
                    observe(v, &labels.of_task(task));
                }
            }
        };
        match kind {
            Kind::Counter => {
                meter
                    .u64_observable_counter(name)
                    .with_unit(unit)
                    .with_description(help)
                    .with_callback(move |o| each(&mut |v, attrs| o.observe(v as u64, attrs)))
                    .build();
            }
            Kind::Gauge | Kind::Rate => {
                meter
                    .f64_observable_gauge(name)
                    .with_unit(unit)
                    .with_description(help)
                    .with_callback(move |o| each(&mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
        }
    }
    register_statuses(meter, board);
    register_worker(meter, board);
}

#[cfg(test)]
mod tests {
    use super::super::testing::{exported, sample, Exported};

    #[test]
    fn metrics_stop_once_the_worker_is_gone() {
        let e = exported();
        assert!(sample(
            &e.registry,
            "kafka_connect_connect_worker_metrics_task_count"
        )
        .is_some());
        let Exported {
            registry,
            board,
            task,
            _provider,
        } = e;
        drop((board, task));
        assert_eq!(
            sample(&registry, "kafka_connect_connect_worker_metrics_task_count"),
            None
        );
    }
}
