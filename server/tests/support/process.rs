//! A `spillway worker` process started by a test: its properties written to a file, its log
//! (standard error) kept in a file, its address read from its first line of output.

use std::io::{BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct WorkerProcess {
    child: Child,
    /// `http://HOST:PORT` (or `https://`) of the first listener.
    pub base: String,
    log: PathBuf,
}

impl WorkerProcess {
    /// Starts `spillway worker` with `properties` in `dir` (its working directory, where
    /// relative paths land), logging at `log_level` (`RUST_LOG`).
    pub fn start(properties: &[(&str, &str)], dir: &Path, log_level: &str) -> WorkerProcess {
        let file = write_properties(dir, "worker.properties", properties);
        Self::spawn(&["worker".as_ref(), file.as_os_str()], dir, log_level)
    }

    /// Starts `spillway standalone` with the worker `properties` and one file per entry of
    /// `connectors`, in `dir`, logging at `log_level`.
    pub fn standalone(
        properties: &[(&str, &str)],
        connectors: &[&[(&str, &str)]],
        dir: &Path,
        log_level: &str,
    ) -> WorkerProcess {
        let mut files = vec![write_properties(dir, "worker.properties", properties)];
        for (i, connector) in connectors.iter().enumerate() {
            files.push(write_properties(
                dir,
                &format!("connector-{i}.properties"),
                connector,
            ));
        }
        let mut args = vec![std::ffi::OsStr::new("standalone")];
        args.extend(files.iter().map(|f| f.as_os_str()));
        Self::spawn(&args, dir, log_level)
    }

    fn spawn(args: &[&std::ffi::OsStr], dir: &Path, log_level: &str) -> WorkerProcess {
        let log = dir.join("worker.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_spillway"))
            .args(args)
            .current_dir(dir)
            .env("RUST_LOG", log_level)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_METRICS_EXPORTER")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("the spillway binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the worker prints its address");
        let base = line
            .trim()
            .strip_prefix("REST API listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line '{line}'; log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
            .to_owned();
        WorkerProcess { child, base, log }
    }

    /// SIGTERM, waits for the exit, and returns its status and the whole log.
    pub fn stop_with_status(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("waitable") {
                return (status, self.log());
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                panic!("the worker did not stop within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL: no graceful stop, no LeaveGroup; the group notices only when the session
    /// times out.
    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("waitable").is_none()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        std::fs::File::open(&self.log)
            .and_then(|mut f| f.read_to_string(&mut text))
            .expect("log readable");
        text
    }

    /// SIGTERM, waits for the exit, and returns the whole log.
    pub fn stop(self) -> String {
        self.stop_with_status().1
    }
}

/// Writes `properties` as a `.properties` file `name` in `dir`.
fn write_properties(dir: &Path, name: &str, properties: &[(&str, &str)]) -> PathBuf {
    let file = dir.join(name);
    let text: String = properties
        .iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(&file, text).expect("properties written");
    file
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // A test that failed midway leaves no worker behind.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
