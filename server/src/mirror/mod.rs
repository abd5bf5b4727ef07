//! `spillway mirror mm2.properties`: MirrorMaker 2's dedicated mode. Every flow of the file
//! runs in this process as kafka-sink connectors on a worker of its own (the record path is the
//! same as any connector's), plus MM2's policy around them: remote topic names and cycle
//! prevention ([`policy`]), topic discovery, creation, growth and config sync ([`topics`]),
//! and heartbeats ([`heartbeat`]). docs/mirror.md is the user's guide.

pub mod checkpoints;
mod cluster_client;
pub mod config;
pub mod connectors;
pub mod flow;
pub mod heartbeat;
pub mod policy;
pub mod topics;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

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

/// Runs the flows of `path` until SIGTERM or SIGINT, serving Prometheus text at
/// `http://<metrics_listen>/metrics` when given.
pub async fn run(path: &Path, metrics_listen: Option<SocketAddr>) -> Result<()> {
    let mut signals = StopSignals::listen()?;
    let config = read(path)?;
    let telemetry = Arc::new(crate::metrics::Telemetry::from_env()?);
    telemetry.install_global();
    let result = run_until(
        config,
        Arc::clone(&telemetry),
        metrics_listen,
        |_| {},
        async move {
            let signal = signals.recv().await;
            info!(signal, "stop requested");
        },
    )
    .await;
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    result
}

/// What a running mirror tells its caller once every flow started.
pub struct Started {
    /// Each flow's name (`A->B`) and progress.
    pub flows: Vec<(String, SharedProgress)>,
    /// Where `/metrics` is served, when asked for.
    pub metrics: Option<SocketAddr>,
}

/// Serves `GET /metrics` (Prometheus text of `telemetry`) on `listen`.
fn serve_metrics(
    listen: SocketAddr,
    telemetry: Arc<crate::metrics::Telemetry>,
) -> Result<(SocketAddr, actix_web::dev::Server)> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen for /metrics on {listen}"))?;
    let bound = listener.local_addr()?;
    let server = HttpServer::new(move || {
        let telemetry = Arc::clone(&telemetry);
        App::new().route(
            "/metrics",
            web::get().to(move || {
                let telemetry = Arc::clone(&telemetry);
                async move {
                    match telemetry.render() {
                        Ok(text) => HttpResponse::Ok()
                            .content_type("text/plain; version=0.0.4")
                            .body(text),
                        Err(e) => HttpResponse::InternalServerError().body(format!("{e:#}")),
                    }
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    Ok((bound, server))
}

/// Runs every flow of `config` that runs (replicating or only emitting heartbeats) until `stop`
/// completes, then stops them all gracefully. Metrics go through `telemetry` (the kafka sink's
/// MM2 metrics through the global provider: see [`crate::metrics::Telemetry::install_global`]);
/// `started` is told the flows' progress and the metrics address once all have started.
pub async fn run_until(
    config: MirrorConfig,
    telemetry: Arc<crate::metrics::Telemetry>,
    metrics_listen: Option<SocketAddr>,
    started: impl FnOnce(Started),
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let meter = telemetry.meter();
    let metrics = match metrics_listen {
        Some(listen) => {
            let (bound, server) = serve_metrics(listen, Arc::clone(&telemetry))?;
            info!(address = %bound, "serving /metrics");
            Some((bound, server.handle(), tokio::spawn(server)))
        }
        None => None,
    };
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
    started(Started {
        flows: runners
            .iter()
            .map(|r| (r.flow.name(), r.progress()))
            .collect(),
        metrics: metrics.as_ref().map(|(bound, _, _)| *bound),
    });
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
    if let Some((_, handle, serving)) = metrics {
        handle.stop(true).await;
        let _ = serving.await;
    }
    info!("mirror stopped");
    Ok(())
}
