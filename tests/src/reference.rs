//! The reference share consumer (`confluent_kafka.ShareConsumer`, i.e. librdkafka) in a child
//! process, for interop tests and benchmarks. See `tools/reference_share_consumer.py`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::python::{tools_dir, venv_python};

/// One record the reference consumer received and accepted.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, Hash)]
pub struct ReferenceRecord {
    #[serde(rename = "t")]
    pub topic: String,
    #[serde(rename = "p")]
    pub partition: i32,
    #[serde(rename = "o")]
    pub offset: i64,
    #[serde(rename = "dc")]
    pub delivery_count: i64,
}

/// What the reference consumer reports when it stops.
#[derive(Clone, Debug, Deserialize)]
pub struct ReferenceSummary {
    pub records: u64,
    /// From the first record to the last.
    pub seconds: f64,
    pub cpu_seconds: f64,
}

#[derive(Default)]
struct Collected {
    ready: bool,
    records: Vec<ReferenceRecord>,
    summary: Option<ReferenceSummary>,
    errors: Vec<String>,
}

/// Options for a reference consumer run.
#[derive(Clone, Debug)]
pub struct ReferenceOptions {
    /// Report each record (for interop checks) or only count them (for benchmarks).
    pub report_records: bool,
    /// Stop after this many records (0: no limit).
    pub max_records: u64,
    /// Stop after this long without records, once the first one arrived (0: never).
    pub idle_exit: Duration,
}

impl Default for ReferenceOptions {
    fn default() -> Self {
        ReferenceOptions {
            report_records: true,
            max_records: 0,
            idle_exit: Duration::ZERO,
        }
    }
}

/// A running reference consumer; killed on drop.
pub struct ReferenceShareConsumer {
    child: Child,
    stdin: Option<ChildStdin>,
    collected: Arc<Mutex<Collected>>,
}

impl ReferenceShareConsumer {
    pub fn start(bootstrap: &str, group: &str, topics: &[&str]) -> ReferenceShareConsumer {
        Self::start_with(bootstrap, group, topics, ReferenceOptions::default())
    }

    pub fn start_with(
        bootstrap: &str,
        group: &str,
        topics: &[&str],
        options: ReferenceOptions,
    ) -> ReferenceShareConsumer {
        let python = venv_python().unwrap_or_else(|e| panic!("{e}"));
        let mut command = Command::new(python);
        command
            .arg(tools_dir().join("reference_share_consumer.py"))
            .args(["--bootstrap", bootstrap, "--group", group])
            .args([
                "--report",
                if options.report_records {
                    "records"
                } else {
                    "count"
                },
            ])
            .args(["--max-records", &options.max_records.to_string()])
            .args(["--idle-exit-ms", &options.idle_exit.as_millis().to_string()]);
        for topic in topics {
            command.args(["--topic", topic]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the reference share consumer: {e}"));
        let stdout = child.stdout.take().expect("stdout was configured as piped");
        let collected = Arc::new(Mutex::new(Collected::default()));
        let sink = collected.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: serde_json::Value = match serde_json::from_str(&line) {
                    Ok(v) => v,
                    Err(_) => continue,
                };
                let mut c = sink.lock().unwrap_or_else(|p| p.into_inner());
                if value.get("ready").is_some() {
                    c.ready = true;
                } else if let Some(summary) = value.get("summary") {
                    c.summary = serde_json::from_value(summary.clone()).ok();
                } else if let Some(error) = value.get("error") {
                    c.errors.push(error.to_string());
                } else if let Ok(record) = serde_json::from_value(value) {
                    c.records.push(record);
                }
            }
        });
        let stdin = child.stdin.take();
        ReferenceShareConsumer {
            child,
            stdin,
            collected,
        }
    }

    /// The records received so far.
    pub fn records(&self) -> Vec<ReferenceRecord> {
        self.collected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .clone()
    }

    pub fn record_count(&self) -> usize {
        self.collected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .len()
    }

    /// Errors the consumer reported for individual polls.
    pub fn errors(&self) -> Vec<String> {
        self.collected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .errors
            .clone()
    }

    /// Waits until the consumer has subscribed.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self
                .collected
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .ready
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Asks the consumer to stop (it closes cleanly: commits, leaves the group) and waits for
    /// its summary.
    pub fn stop(mut self, timeout: Duration) -> Option<ReferenceSummary> {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        self.wait_summary(timeout)
    }

    /// Waits for the consumer to stop by itself (max records or idle exit) and returns its summary.
    pub fn wait_summary(&mut self, timeout: Duration) -> Option<ReferenceSummary> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.collected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .summary
            .clone()
    }
}

impl Drop for ReferenceShareConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
