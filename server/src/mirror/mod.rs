//! `spillway mirror mm2.properties`: MirrorMaker 2's dedicated mode. Every flow of the file
//! runs in this process as kafka-sink connectors on a worker of its own (the record path is the
//! same as any connector's), plus MM2's policy around them: remote topic names and cycle
//! prevention ([`policy`]), topic discovery, creation, growth and config sync ([`topics`]),
//! and heartbeats ([`heartbeat`]). docs/mirror.md is the user's guide.

pub mod config;
pub mod flow;
pub mod heartbeat;
pub mod policy;
pub mod topics;

use std::path::Path;

use anyhow::{Context, Result};
use spillway_connectors::ConnectorRegistry;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::signals::StopSignals;
pub use config::MirrorConfig;
pub use flow::{FlowProgress, FlowRunner, SharedProgress};

/// Reads and checks an MM2 properties file; warnings are logged.
pub fn read(path: &Path) -> Result<MirrorConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the mirror configuration {}", path.display()))?;
    let props = spillway_core::config::parse_properties(&text)
        .with_context(|| format!("{} is not a valid properties file", path.display()))?;
    let config = MirrorConfig::parse(&props.to_map())
        .with_context(|| format!("{} cannot be run", path.display()))?;
    for warning in &config.warnings {
        warn!(file = %path.display(), "{warning}");
    }
    Ok(config)
}

/// Runs the flows of `path` until SIGTERM or SIGINT.
pub async fn run(path: &Path) -> Result<()> {
    let mut signals = StopSignals::listen()?;
    let config = read(path)?;
    run_until(config, |_| {}, async move {
        let signal = signals.recv().await;
        info!(signal, "stop requested");
    })
    .await
}

/// Runs every flow of `config` that runs (replicating or only emitting heartbeats) until `stop`
/// completes, then stops them all gracefully. `started` sees each flow's progress once all
/// have started (tests watch it).
pub async fn run_until(
    config: MirrorConfig,
    started: impl FnOnce(Vec<(String, SharedProgress)>),
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let telemetry = crate::metrics::Telemetry::from_env()?;
    let meter = telemetry.meter();
    let mut runners = Vec::new();
    for flow in config.flows.iter().filter(|f| f.runs()) {
        let runner = FlowRunner::start(
            flow.clone(),
            config.cluster(&flow.source).clone(),
            config.cluster(&flow.target).clone(),
            ConnectorRegistry::builtin(),
            &meter,
        )
        .await
        .with_context(|| format!("cannot start flow {}", flow.name()))?;
        info!(flow = %flow.name(), enabled = flow.enabled, mode = %flow.mode, heartbeats = flow.emit_heartbeats, "flow started");
        runners.push(runner);
    }
    started(
        runners
            .iter()
            .map(|r| (r.flow.name(), r.progress()))
            .collect(),
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let tasks: Vec<_> = runners
        .into_iter()
        .map(|r| tokio::spawn(r.run(stop_rx.clone())))
        .collect();
    stop.await;
    let _ = stop_tx.send(true);
    for task in tasks {
        task.await.context("a flow ended abnormally")?;
    }
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    info!("mirror stopped");
    Ok(())
}
