//! The test kit against the dev broker: produced records reach the reference share consumer
//! exactly once. Every other dev-broker test builds on this.

use std::time::Duration;

use spillway_tests::{
    numbered_records, produce, DeliveryReport, DevBroker, ReferenceOptions, ReferenceShareConsumer,
};

#[tokio::test(flavor = "multi_thread")]
async fn reference_share_consumer_receives_every_produced_record_once() {
    let broker = DevBroker::start(3);
    broker.create_topic("kit", 4);
    broker.set_share_auto_offset_reset("earliest");
    let produced = produce(
        &broker.bootstrap(),
        "kit",
        numbered_records(2_000, 100, 4),
        "lz4",
    )
    .await;
    assert_eq!(produced.len(), 2_000);

    let mut reference = ReferenceShareConsumer::start_with(
        &broker.bootstrap(),
        "kit-group",
        &["kit"],
        ReferenceOptions {
            max_records: 2_000,
            idle_exit: Duration::from_secs(10),
            ..ReferenceOptions::default()
        },
    );
    let summary = reference
        .wait_summary(Duration::from_secs(60))
        .expect("reference consumer summary");
    assert_eq!(summary.records, 2_000);
    let report = DeliveryReport::compare(
        produced
            .iter()
            .map(|p| (p.topic.clone(), p.partition, p.offset)),
        reference
            .records()
            .into_iter()
            .map(|r| (r.topic, r.partition, r.offset)),
    );
    assert!(report.exactly_once(), "{}", report.summary());
}
