//! The `file` sink, Kafka Connect's FileStreamSink: one line per record (the value's text form)
//! appended to `file`, or written to standard output when `file` is not set.
//!
//! Each `put` appends its whole batch with a single write on a file opened for appending, so
//! several tasks writing to one file never interleave inside a line. `flush` syncs the file to
//! disk when `file.fsync` is on; otherwise a line is in the page cache once `put` returns.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use async_trait::async_trait;
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Reach};
use spillway_core::connector::replicate_task_configs;
use spillway_core::{
    ConfigError, ConfigMap, PutOutcome, SinkConnector, SinkError, SinkRecord, SinkTask,
    TopicPartition, Value,
};

pub const FILE: &str = "file";
pub const FILE_FSYNC: &str = "file.fsync";

/// Names `connector.class` may use for this sink.
pub const NAMES: &[&str] = &[
    "file",
    "FileStreamSink",
    "FileStreamSinkConnector",
    "org.apache.kafka.connect.file.FileStreamSinkConnector",
];

fn config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(FILE, ConfigType::String, Importance::High, "Destination file; standard output when not set. A tenant's path is relative to its directory (docs/tenants.md).")
                .null_default()
                .reaches(Reach::FilePath)
                .display_name("File"),
        )
        .define(
            ConfigKey::new(FILE_FSYNC, ConfigType::Boolean, Importance::Low, "Sync the file to disk on every flush, so accepted records survive a machine crash.")
                .default("false")
                .display_name("Sync on flush"),
        )
}

/// The connector: every task gets the same configuration.
#[derive(Default)]
pub struct FileSinkConnector {
    config: ConfigMap,
}

impl SinkConnector for FileSinkConnector {
    fn version(&self) -> &str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_def(&self) -> ConfigDef {
        config_def()
    }

    fn start(&mut self, config: &ConfigMap) -> Result<(), ConfigError> {
        config_def().parse(config)?;
        self.config = config.clone();
        Ok(())
    }

    fn task_configs(&self, max_tasks: usize) -> Result<Vec<ConfigMap>, ConfigError> {
        Ok(replicate_task_configs(&self.config, max_tasks))
    }

    fn create_task(&self) -> Box<dyn SinkTask> {
        Box::new(FileSinkTask::default())
    }

    /// A line per record holds its value only (Connect's `FileStreamSinkTask`).
    fn tasks_read_headers(&self) -> bool {
        false
    }
}

enum Output {
    Stdout,
    File { path: PathBuf, file: std::fs::File },
}

/// One writer of lines.
#[derive(Default)]
pub struct FileSinkTask {
    output: Option<Output>,
    fsync: bool,
    /// Bytes per line of the last batch, to size the next batch's buffer at once.
    line_hint: usize,
}

/// Appends the text written for a value to `out`, straight from the record (no line of its
/// own): strings as they are, bytes that are UTF-8 as they are (Connect would print the
/// array's identity, which helps nobody), other bytes as base64, anything else as Connect's
/// `toString`.
fn push_line(out: &mut String, value: &Value) {
    use std::fmt::Write as _;
    match value {
        Value::String(text) => out.push_str(text),
        Value::Bytes(b) => match std::str::from_utf8(b) {
            Ok(text) => out.push_str(text),
            // Writing to a String cannot fail.
            Err(_) => drop(write!(out, "{value}")),
        },
        other => drop(write!(out, "{other}")),
    }
    out.push('\n');
}

#[async_trait]
impl SinkTask for FileSinkTask {
    async fn start(&mut self, config: &ConfigMap) -> Result<(), SinkError> {
        let parsed = config_def()
            .parse(config)
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        self.fsync = parsed
            .boolean(FILE_FSYNC)
            .map_err(|e| SinkError::fatal(e.to_string()))?;
        let path = parsed
            .string(FILE)
            .map_err(|e| SinkError::fatal(e.to_string()))?
            .filter(|p| !p.is_empty());
        self.output = Some(match path {
            None => Output::Stdout,
            Some(written) => {
                // A confined tenant's path resolves inside its directory (crate::paths).
                let path = crate::paths::resolve(config, FILE, written)
                    .map_err(|e| SinkError::fatal(e.to_string()))?;
                crate::paths::prepare(config, &path).map_err(|e| {
                    SinkError::fatal(format!("cannot create the directory of '{written}'"))
                        .caused_by(e)
                })?;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| {
                        SinkError::fatal(format!("cannot open '{written}' for appending"))
                            .caused_by(e)
                    })?;
                Output::File { path, file }
            }
        });
        Ok(())
    }

    async fn put(&mut self, records: &[SinkRecord]) -> Result<Vec<PutOutcome>, SinkError> {
        // One buffer for the batch, sized for the common case of short lines.
        let mut text = String::with_capacity(self.line_hint.saturating_mul(records.len()));
        for record in records {
            push_line(&mut text, &record.value);
        }
        if let Some(n) = text.len().checked_div(records.len()) {
            self.line_hint = n + 1;
        }
        match &mut self.output {
            None => return Err(SinkError::fatal("put before start")),
            Some(Output::Stdout) => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())
                    .map_err(|e| SinkError::retriable("cannot write to stdout").caused_by(e))?;
            }
            Some(Output::File { path, file }) => {
                file.write_all(text.as_bytes()).map_err(|e| {
                    SinkError::retriable(format!("cannot append to '{}'", path.display()))
                        .caused_by(e)
                })?;
            }
        }
        // Built in place: cloning an outcome per record costs more than making it.
        Ok(records.iter().map(|_| PutOutcome::Ok).collect())
    }

    async fn flush(&mut self, _offsets: &BTreeMap<TopicPartition, i64>) -> Result<(), SinkError> {
        match &mut self.output {
            Some(Output::File { path, file }) if self.fsync => file.sync_data().map_err(|e| {
                SinkError::retriable(format!("cannot sync '{}'", path.display())).caused_by(e)
            }),
            Some(Output::Stdout) => std::io::stdout()
                .flush()
                .map_err(|e| SinkError::retriable("cannot flush stdout").caused_by(e)),
            _ => Ok(()),
        }
    }

    async fn stop(&mut self) -> Result<(), SinkError> {
        self.output = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str, fsync: bool) -> ConfigMap {
        [
            (FILE.to_owned(), path.to_owned()),
            (FILE_FSYNC.to_owned(), fsync.to_string()),
        ]
        .into_iter()
        .collect()
    }

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("spillway-file-{}-{name}", std::process::id()))
    }

    #[tokio::test]
    async fn each_record_becomes_one_line_appended_to_the_file() {
        let path = temp_path("lines");
        let _ = std::fs::remove_file(&path);
        let mut task = FileSinkTask::default();
        task.start(&config(path.to_str().expect("utf-8 temp path"), true))
            .await
            .expect("starts");
        let records = vec![
            SinkRecord::new("t", 0, 0, "first".into()),
            SinkRecord::new("t", 0, 1, Value::Bytes(b"second".to_vec().into())),
            SinkRecord::new("t", 0, 2, Value::Int32(3)),
        ];
        let outcomes = task.put(&records).await.expect("writes");
        assert!(outcomes.iter().all(PutOutcome::is_ok));
        task.flush(&BTreeMap::new()).await.expect("syncs");
        task.put(&records[..1]).await.expect("appends");
        task.stop().await.expect("stops");
        let text = std::fs::read_to_string(&path).expect("file written");
        assert_eq!(text, "first\nsecond\n3\nfirst\n");
        let _ = std::fs::remove_file(&path);
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_opened_fails_start_naming_it() {
        let mut task = FileSinkTask::default();
        let err = task
            .start(&config("/nonexistent-dir/out.txt", false))
            .await
            .expect_err("no such directory");
        assert!(!err.is_retriable());
        assert!(err.message().contains("/nonexistent-dir/out.txt"), "{err}");
    }

    #[test]
    fn lines_are_written_from_the_values_as_they_are_or_in_text_form() {
        let mut text = String::new();
        push_line(&mut text, &"plain".into());
        push_line(&mut text, &Value::Bytes(b"utf8".to_vec().into()));
        push_line(&mut text, &Value::Bytes(vec![0xff, 0xfe].into()));
        push_line(&mut text, &Value::Null);
        push_line(&mut text, &Value::Int64(-7));
        assert_eq!(text, "plain\nutf8\n//4=\nnull\n-7\n");
    }

    #[test]
    fn connect_class_names_are_accepted() {
        assert!(NAMES.contains(&"org.apache.kafka.connect.file.FileStreamSinkConnector"));
        assert!(NAMES.contains(&"FileStreamSink"));
    }
}
