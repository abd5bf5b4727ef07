//! `GET /metrics` on a worker running a share-group connector and a classic one: every counter
//! matches what happened to the records (support/pipelines.rs says what that is).

mod support;

use std::time::{Duration, Instant};

use support::pipelines::{
    self, parse, scrape, value, Sample, CLASSIC, CLASSIC_RECORDS, FLAKY_ONCE, SHARE, SHARE_RECORDS,
};

const SINK: &str = "kafka_connect_sink_task_metrics_";
const ERRORS: &str = "kafka_connect_task_error_metrics_";
const WORKER: &str = "kafka_connect_connect_worker_metrics_";

fn task_value(samples: &[Sample], name: &str, connector: &str) -> f64 {
    value(samples, name, &[("connector", connector), ("task", "0")])
        .unwrap_or_else(|| panic!("no {name} for {connector}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_happened_to_the_records_of_a_share_and_a_classic_connector() {
    let p = pipelines::start().await;
    let valid = SHARE_RECORDS as f64;
    let flaky_once = FLAKY_ONCE.len() as f64;
    // Every record settled: the valid ones accepted but the one that always fails, the poison
    // rejected, and the always-failing one released at its first delivery and dead-lettered
    // and rejected at its last.
    let settled = |s: &[Sample]| {
        let get = |name: &str| value(s, &format!("{SINK}{name}"), &[("connector", SHARE)]);
        get("sink_record_accepted_total") == Some(valid - 1.0)
            && get("sink_record_rejected_total") == Some(2.0)
            && get("sink_record_released_total") == Some(flaky_once + 1.0)
            && value(
                s,
                &format!("{SINK}sink_record_accepted_total"),
                &[("connector", CLASSIC)],
            ) == Some(CLASSIC_RECORDS as f64)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let samples = loop {
        let samples = parse(&scrape(&p.base).await);
        if settled(&samples) {
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "the records did not settle in time; last scrape:\n{}",
            scrape(&p.base).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Share mode: 41 records, two failing once, one failing at both of its two deliveries.
    let share = |name: &str| task_value(&samples, name, SHARE);
    let share_labels = [
        ("connector", SHARE),
        ("task", "0"),
        ("mode", "share"),
        ("tenant", "acme"),
    ];
    let deliveries = valid + 1.0 + flaky_once + 1.0;
    assert_eq!(
        value(
            &samples,
            &format!("{SINK}sink_record_read_total"),
            &share_labels
        ),
        Some(deliveries),
        "labelled with tenant, connector, task and mode"
    );
    assert_eq!(
        share(&format!("{SINK}sink_record_acquired_total")),
        deliveries
    );
    assert_eq!(
        share(&format!("{SINK}sink_record_send_total")),
        deliveries - 1.0,
        "everything but the record that is not JSON reaches put"
    );
    assert_eq!(
        share(&format!("{SINK}sink_record_redelivered_total")),
        flaky_once + 1.0
    );
    assert_eq!(
        share(&format!("{SINK}sink_record_archived_by_limit_total")),
        0.0,
        "never released at its last allowed delivery (the second, with a limit of 2)"
    );
    assert_eq!(share(&format!("{SINK}sink_record_lock_expired_total")), 0.0);
    assert_eq!(share(&format!("{SINK}sink_record_active_count")), 0.0);
    assert_eq!(share(&format!("{SINK}partition_count")), 1.0);
    let margins = share(&format!("{SINK}sink_record_lock_margin_ms_count"));
    assert!(
        margins >= 2.0 && margins <= deliveries,
        "one lock margin per lock deadline (fetch response) per commit, and a released record's redelivery comes in another fetch and commit: {margins} for {deliveries} deliveries"
    );
    let margin_sum = share(&format!("{SINK}sink_record_lock_margin_ms_sum"));
    assert!(
        margin_sum > 0.0 && margin_sum <= margins * 15_000.0,
        "margins within the 15 s lock: {margin_sum}"
    );
    assert_eq!(
        share(&format!("{SINK}sink_record_e2e_latency_ms_count")),
        valid + 1.0,
        "a latency per final verdict (ACCEPT or REJECT)"
    );
    assert!(share(&format!("{SINK}ack_commit_time_ms_count")) >= 1.0);
    assert!(share(&format!("{SINK}offset_commit_completion_total")) >= 1.0);
    assert_eq!(share(&format!("{SINK}offset_commit_skip_total")), 0.0);
    assert!(share(&format!("{SINK}put_batch_max_time_ms")) >= 0.0);
    assert_eq!(share(&format!("{ERRORS}total_record_errors")), 2.0);
    assert_eq!(share(&format!("{ERRORS}total_records_skipped")), 2.0);
    assert_eq!(
        share(&format!("{ERRORS}total_record_failures")),
        1.0 + flaky_once + 2.0,
        "the conversion failure and every failed put"
    );
    assert_eq!(share(&format!("{ERRORS}total_retries")), flaky_once + 1.0);
    assert_eq!(
        share(&format!("{ERRORS}deadletterqueue_produce_requests")),
        2.0
    );
    assert_eq!(
        share(&format!("{ERRORS}deadletterqueue_produce_failures")),
        0.0
    );
    let last_error = share(&format!("{ERRORS}last_error_timestamp"));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as f64;
    assert!(
        (now_ms - last_error).abs() < 120_000.0,
        "last error {last_error} vs now {now_ms}"
    );

    // Classic mode: every record read, put and committed once; no share metrics move.
    let classic = |name: &str| task_value(&samples, name, CLASSIC);
    let n = CLASSIC_RECORDS as f64;
    assert_eq!(
        value(
            &samples,
            &format!("{SINK}sink_record_read_total"),
            &[
                ("connector", CLASSIC),
                ("mode", "classic"),
                ("tenant", "default")
            ]
        ),
        Some(n)
    );
    assert_eq!(classic(&format!("{SINK}sink_record_send_total")), n);
    assert_eq!(classic(&format!("{SINK}sink_record_acquired_total")), 0.0);
    assert_eq!(
        classic(&format!("{SINK}sink_record_e2e_latency_ms_count")),
        n
    );
    assert_eq!(
        classic(&format!("{SINK}sink_record_lock_margin_ms_count")),
        0.0
    );
    assert_eq!(classic(&format!("{ERRORS}total_record_errors")), 0.0);
    assert_eq!(classic(&format!("{SINK}partition_count")), 1.0);

    // Connector and worker level.
    assert_eq!(
        value(
            &samples,
            "kafka_connect_connector_metrics_status",
            &[
                ("connector", SHARE),
                ("status", "running"),
                ("connector_class", "flaky"),
                ("connector_version", "2.1"),
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &samples,
            "kafka_connect_connector_task_metrics_status",
            &[("connector", CLASSIC), ("task", "0"), ("status", "running")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&samples, &format!("{WORKER}connector_count"), &[]),
        Some(2.0)
    );
    assert_eq!(
        value(&samples, &format!("{WORKER}task_count"), &[]),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            &format!("{WORKER}connector_startup_success_total"),
            &[]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            &format!("{WORKER}task_startup_success_total"),
            &[]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &samples,
            &format!("{WORKER}connector_running_task_count"),
            &[("connector", SHARE), ("tenant", "acme")]
        ),
        Some(1.0)
    );
    p.stop().await;
}
