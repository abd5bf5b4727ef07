//! The signals that stop a long-running command: SIGTERM (what systemd, Kubernetes and Docker
//! send) and SIGINT (Ctrl-C). Listening replaces the default action (die at once), so listen
//! as early as possible: a signal that arrives while the command starts up is kept and answered
//! by a graceful stop, not by a death by signal.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// SIGTERM and SIGINT, listened to from the moment this is made.
pub struct StopSignals {
    terminate: Signal,
    interrupt: Signal,
}

impl StopSignals {
    pub fn listen() -> Result<StopSignals> {
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
        })
    }

    /// Waits for the next SIGTERM or SIGINT; returns its name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}
