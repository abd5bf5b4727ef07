//! The `spillway` command: the worker and its tools.

mod dev_broker;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "spillway",
    version,
    about = "Kafka sink connectors on share groups and consumer groups"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the development Kafka cluster (librdkafka's mock brokers) until Ctrl-C.
    DevBroker {
        /// Number of brokers (ids 1..=N).
        #[arg(long, default_value_t = 1)]
        brokers: u32,
        /// Topic to create, as NAME:PARTITIONS; repeat for more.
        #[arg(long = "topic", value_name = "NAME:PARTITIONS")]
        topics: Vec<dev_broker::TopicSpec>,
        /// Where new share groups start reading: earliest or latest (Apache Kafka's default).
        #[arg(long, default_value = "earliest", value_parser = ["earliest", "latest"])]
        share_auto_offset_reset: String,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::DevBroker {
            brokers,
            topics,
            share_auto_offset_reset,
        } => dev_broker::run(brokers, topics, &share_auto_offset_reset).await,
    }
}
