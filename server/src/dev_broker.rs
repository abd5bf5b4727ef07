//! `spillway dev-broker`: the development cluster (librdkafka's mock brokers) for people, not
//! tests. It prints the bootstrap list and runs until SIGTERM or SIGINT
//! (Ctrl-C), then stops its brokers.

use anyhow::{bail, Context, Result};
use spillway_tests::DevBroker;

/// A topic to create at start, given as `NAME:PARTITIONS`.
#[derive(Clone, Debug)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
}

impl std::str::FromStr for TopicSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, partitions) = text.split_once(':').unwrap_or((text, "1"));
        if name.is_empty() {
            return Err(format!(
                "topic '{text}' has no name; expected NAME:PARTITIONS, e.g. orders:8"
            ));
        }
        let partitions: i32 = partitions.parse().map_err(|_| {
            format!("topic '{text}': partitions '{partitions}' is not a number; expected NAME:PARTITIONS, e.g. orders:8")
        })?;
        if partitions < 1 {
            return Err(format!("topic '{text}': partitions must be at least 1"));
        }
        Ok(TopicSpec {
            name: name.to_string(),
            partitions,
        })
    }
}

pub async fn run(
    brokers: u32,
    topics: Vec<TopicSpec>,
    share_auto_offset_reset: &str,
) -> Result<()> {
    if brokers == 0 {
        bail!("--brokers must be at least 1");
    }
    let mut signals = spillway::signals::StopSignals::listen()?;
    let specs: Vec<(&str, i32)> = topics
        .iter()
        .map(|t| (t.name.as_str(), t.partitions))
        .collect();
    let broker = DevBroker::try_start(brokers, &specs).context("starting the dev broker")?;
    broker
        .command(serde_json::json!({"cmd": "share_settings", "auto_offset_reset": share_auto_offset_reset}))
        .with_context(|| format!("setting the share groups' auto offset reset to '{share_auto_offset_reset}'"))?;
    println!("{}", broker.bootstrap());
    eprintln!(
        "dev broker: {brokers} broker(s) at {}; share groups start at the {share_auto_offset_reset} offset. Ctrl-C or SIGTERM stops it.",
        broker.bootstrap()
    );
    // SIGTERM as well as Ctrl-C: dying by the signal would leave the broker process behind.
    let signal = signals.recv().await;
    eprintln!("dev broker: {signal}; stopping");
    Ok(())
}
