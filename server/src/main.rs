//! The `spillway` command: the worker and its tools.

mod dev_broker;
mod dev_cluster;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "spillway",
    version,
    about = "Kafka sink connectors on share groups and consumer groups"
)]
struct Cli {
    /// Log line format: text or json (default: SPILLWAY_LOG_FORMAT, else text).
    #[arg(long, global = true, value_parser = ["text", "json"])]
    log_format: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The demo: a dev broker, sample data, a share-group connector (3 tasks) and a classic one
    /// writing to files side by side, live progress, and a check that every record arrived.
    Demo {
        /// Records to produce (half before the connectors start, half while they run).
        #[arg(long, default_value_t = 20_000)]
        records: u64,
        /// Partitions of the demo topic.
        #[arg(long, default_value_t = 6)]
        partitions: i32,
        /// Tasks of the share-group connector.
        #[arg(long, default_value_t = 3)]
        share_tasks: usize,
        /// Where the two output files go (default: a spillway-demo folder in the temp dir).
        #[arg(long)]
        output_dir: Option<std::path::PathBuf>,
        /// Seconds to wait for every record before giving up.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
        /// Run the share connector on a cluster of worker processes instead, SIGKILL one while
        /// records flow, and show its tasks move with nothing lost (docs/distributed.md).
        #[arg(long)]
        cluster: bool,
        /// Worker processes of the cluster demo.
        #[arg(long, default_value_t = 3, requires = "cluster")]
        workers: u32,
    },
    /// Run connectors in one process, Kafka Connect standalone style, until SIGTERM or Ctrl-C
    /// (then stop gracefully within task.shutdown.graceful.timeout.ms and exit 0). Serves the
    /// REST API on rest.port (default 8083); its state is in memory.
    Standalone {
        /// The worker's configuration (.properties or JSON): bootstrap.servers, rest.port, ...
        worker_properties: std::path::PathBuf,
        /// One file per connector (.properties or JSON); more can be created over REST.
        connector_properties: Vec<std::path::PathBuf>,
    },
    /// Replicate between clusters as MirrorMaker 2's dedicated mode does, from its mm2.properties
    /// (clusters, A->B.enabled, topics, ...; docs/mirror.md), until SIGTERM or Ctrl-C.
    Mirror {
        /// The MirrorMaker 2 properties file.
        mm2_properties: std::path::PathBuf,
        /// Serve Prometheus text at http://ADDRESS/metrics (e.g. 0.0.0.0:9464).
        #[arg(long, value_name = "ADDRESS")]
        metrics_listen: Option<std::net::SocketAddr>,
    },
    /// Run a worker operated over Kafka Connect's REST API, its state kept under state.dir.
    Worker {
        /// The worker's configuration (.properties or JSON): bootstrap.servers, rest.port, state.dir, ...
        worker_properties: std::path::PathBuf,
    },
    /// Run the dev broker and N workers in distributed mode (one group, state in Kafka topics)
    /// until SIGTERM or Ctrl-C; prints every worker's REST URL (docs/distributed.md).
    DevCluster {
        /// Number of worker processes.
        #[arg(long, default_value_t = 3)]
        workers: u32,
        /// REST port of the first worker, the next ones count up; 0 picks free ports.
        #[arg(long, default_value_t = 0)]
        first_port: u16,
        /// Topic to create, as NAME:PARTITIONS; repeat for more.
        #[arg(long = "topic", value_name = "NAME:PARTITIONS")]
        topics: Vec<dev_broker::TopicSpec>,
    },
    /// Run the development Kafka cluster (librdkafka's mock brokers) until SIGTERM or Ctrl-C.
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
        /// PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; anything but PLAINTEXT puts the test-kit
        /// proxy (TLS with a generated CA, SASL) in front of the brokers.
        #[arg(long, default_value = "PLAINTEXT")]
        security: spillway_tests::ProxySecurity,
        /// The one SASL mechanism to accept (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); default all three.
        #[arg(long)]
        sasl_mechanism: Option<spillway_tests::SaslMechanism>,
        /// A SASL user, as NAME:PASSWORD; repeat for more.
        #[arg(long = "user", value_name = "NAME:PASSWORD")]
        users: Vec<dev_broker::UserSpec>,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    spillway_actors::allocator::use_jemalloc();
    let cli = Cli::parse();
    // Logs for every subcommand; traces (OTEL_* variables) for those that run connectors.
    let mut telemetry_config = spillway::telemetry::TelemetryConfig::from_env()?;
    if let Some(format) = &cli.log_format {
        telemetry_config.log_format = format.parse()?;
    }
    if matches!(
        cli.command,
        Command::DevBroker { .. } | Command::DevCluster { .. }
    ) {
        telemetry_config.traces = None;
    }
    let mut telemetry = spillway::telemetry::init(telemetry_config)?;
    let result = run(cli.command).await;
    // Export the last spans before the process ends.
    telemetry.shutdown();
    result
}

async fn run(command: Command) -> Result<()> {
    match command {
        Command::Demo {
            records,
            partitions,
            share_tasks,
            output_dir,
            timeout_secs,
            cluster,
            workers,
        } => {
            let defaults = spillway::demo::DemoOptions::default();
            if cluster {
                return dev_cluster::demo(dev_cluster::ClusterDemo {
                    workers,
                    records,
                    partitions,
                    tasks: share_tasks,
                    output_dir: output_dir.unwrap_or(defaults.output_dir),
                    timeout: std::time::Duration::from_secs(timeout_secs),
                })
                .await;
            }
            spillway::demo::run(spillway::demo::DemoOptions {
                records,
                partitions,
                share_tasks,
                output_dir: output_dir.unwrap_or(defaults.output_dir),
                timeout: std::time::Duration::from_secs(timeout_secs),
            })
            .await
        }
        Command::Standalone {
            worker_properties,
            connector_properties,
        } => spillway::standalone::run(worker_properties, connector_properties).await,
        Command::Mirror {
            mm2_properties,
            metrics_listen,
        } => spillway::mirror::run(&mm2_properties, metrics_listen).await,
        Command::Worker { worker_properties } => spillway::worker_cmd::run(worker_properties).await,
        Command::DevCluster {
            workers,
            first_port,
            topics,
        } => dev_cluster::run(workers, first_port, topics).await,
        Command::DevBroker {
            brokers,
            topics,
            share_auto_offset_reset,
            security,
            sasl_mechanism,
            users,
        } => {
            let security = dev_broker::Security {
                protocol: security,
                mechanism: sasl_mechanism,
                users,
            };
            dev_broker::run(brokers, topics, &share_auto_offset_reset, security).await
        }
    }
}
