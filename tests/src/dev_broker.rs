//! The dev broker: librdkafka's mock cluster, run by `tools/devbroker.py` in a child process.
//!
//! [`DevBroker::start`] launches it on free ports (the mock binds ephemeral ports), reads the
//! bootstrap list from its first stdout line, and then talks to it with one JSON command per line.
//! The child is killed when the `DevBroker` is dropped, and it exits by itself when our end of its
//! stdin closes, so a crashed test never leaves a broker behind.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::python::{tools_dir, venv_python};

/// An error from the dev broker or its launcher.
#[derive(Debug, thiserror::Error)]
pub enum DevBrokerError {
    #[error("could not start the dev broker launcher ({command}): {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("the dev broker launcher exited before printing its bootstrap list (stderr is inherited above)")]
    NoBootstrap,
    #[error("the dev broker launcher stopped answering while running {command}")]
    Gone { command: String },
    #[error("dev broker command {command} failed: {message}")]
    Command { command: String, message: String },
    #[error("could not prepare the launcher's Python environment: {0}")]
    Python(String),
}

type Channel = Arc<Mutex<(ChildStdin, BufReader<ChildStdout>)>>;

/// A running dev cluster of `brokers` mock brokers with ids 1..=brokers.
pub struct DevBroker {
    child: Child,
    control: DevBrokerControl,
}

/// A clonable handle on a dev broker's command channel, for code that must drive the launcher
/// without owning the cluster (the test-kit proxy's admin emulation). Once the `DevBroker` is
/// dropped, commands fail with [`DevBrokerError::Gone`].
#[derive(Clone)]
pub struct DevBrokerControl {
    /// Commands go out one at a time: each writes a line and reads exactly one reply line.
    channel: Channel,
    bootstrap: String,
    brokers: u32,
}

impl std::fmt::Debug for DevBrokerControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevBrokerControl")
            .field("bootstrap", &self.bootstrap)
            .field("brokers", &self.brokers)
            .finish_non_exhaustive()
    }
}

impl DevBrokerControl {
    /// The bootstrap list, `127.0.0.1:port,...`.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// How many brokers the cluster has (ids 1..=n).
    pub fn broker_count(&self) -> u32 {
        self.brokers
    }

    /// Sends one control command and returns the launcher's reply.
    pub fn command(&self, command: Value) -> Result<Value, DevBrokerError> {
        let text = command.to_string();
        let mut guard = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        let (stdin, stdout) = &mut *guard;
        let gone = || DevBrokerError::Gone {
            command: text.clone(),
        };
        writeln!(stdin, "{text}").map_err(|_| gone())?;
        stdin.flush().map_err(|_| gone())?;
        let mut line = String::new();
        if stdout.read_line(&mut line).map_err(|_| gone())? == 0 {
            return Err(gone());
        }
        let reply: Value = serde_json::from_str(&line).map_err(|e| DevBrokerError::Command {
            command: text.clone(),
            message: format!("unreadable reply {line:?}: {e}"),
        })?;
        if reply["ok"] == Value::Bool(true) {
            Ok(reply)
        } else {
            Err(DevBrokerError::Command {
                command: text.clone(),
                message: reply["error"]
                    .as_str()
                    .unwrap_or("no error text")
                    .to_string(),
            })
        }
    }

    /// The share settings in force (what `share_settings` last set, or the mock's defaults),
    /// keyed by the launcher's names (`auto_offset_reset`, `record_lock_duration_ms`, ...).
    pub fn share_settings_in_force(
        &self,
    ) -> Result<serde_json::Map<String, Value>, DevBrokerError> {
        let reply = self.command(json!({"cmd": "share_settings_in_force"}))?;
        Ok(reply["settings"].as_object().cloned().unwrap_or_default())
    }

    /// The members of share group `group`; `None` when the mock has never seen the group.
    pub fn share_group_members(&self, group: &str) -> Result<Option<Vec<String>>, DevBrokerError> {
        match self.command(json!({"cmd": "share_member_ids", "group": group})) {
            Ok(reply) => Ok(Some(
                reply["members"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|m| m.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default(),
            )),
            // GROUP_ID_NOT_FOUND: the mock does not know the group.
            Err(DevBrokerError::Command { message, .. }) if message.contains("(69)") => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl DevBroker {
    /// Starts a cluster of `brokers` brokers; panics with the reason when it cannot, since every
    /// caller is a test or the demo that cannot go on without one.
    pub fn start(brokers: u32) -> DevBroker {
        Self::try_start(brokers, &[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a cluster and creates `topics` (name, partitions) before returning.
    pub fn try_start(brokers: u32, topics: &[(&str, i32)]) -> Result<DevBroker, DevBrokerError> {
        Self::try_start_preloaded(brokers, topics, None)
    }

    /// As [`DevBroker::try_start`], with `preload` (a shared library, e.g. another `malloc`)
    /// loaded into the launcher before anything else (`LD_PRELOAD`), for the launcher alone.
    pub fn try_start_preloaded(
        brokers: u32,
        topics: &[(&str, i32)],
        preload: Option<&Path>,
    ) -> Result<DevBroker, DevBrokerError> {
        let (child, stdin, stdout, bootstrap) = launch(brokers, topics, preload)?;
        Ok(DevBroker {
            child,
            control: DevBrokerControl {
                channel: Arc::new(Mutex::new((stdin, stdout))),
                bootstrap,
                brokers,
            },
        })
    }

    /// A clonable handle on this broker's command channel (valid while `self` lives).
    pub fn control(&self) -> DevBrokerControl {
        self.control.clone()
    }

    /// The bootstrap list, `127.0.0.1:port,...`.
    pub fn bootstrap(&self) -> String {
        self.control.bootstrap()
    }

    /// How many brokers the cluster has (ids 1..=n).
    pub fn broker_count(&self) -> u32 {
        self.control.broker_count()
    }

    /// Sends one control command and returns the launcher's reply.
    pub fn command(&self, command: Value) -> Result<Value, DevBrokerError> {
        self.control.command(command)
    }

    fn must(&self, command: Value) -> Value {
        self.command(command).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn create_topic(&self, topic: &str, partitions: i32) {
        self.must(json!({"cmd": "create_topic", "topic": topic, "partitions": partitions}));
    }

    /// `earliest` or `latest` (the mock's default, like Apache Kafka's). Applies to share-partitions
    /// not yet initialised, so set it before the first member fetches.
    pub fn set_share_auto_offset_reset(&self, reset: &str) {
        self.must(json!({"cmd": "share_settings", "auto_offset_reset": reset}));
    }

    pub fn set_share_record_lock_duration(&self, millis: i32) {
        self.must(json!({"cmd": "share_settings", "record_lock_duration_ms": millis}));
    }

    pub fn set_share_max_delivery_attempts(&self, attempts: i32) {
        self.must(json!({"cmd": "share_settings", "max_delivery_attempts": attempts}));
    }

    /// Only affects groups created afterwards (a mock rule).
    pub fn set_share_session_timeout(&self, millis: i32) {
        self.must(json!({"cmd": "share_settings", "session_timeout_ms": millis}));
    }

    /// Only affects groups created afterwards (a mock rule).
    pub fn set_share_heartbeat_interval(&self, millis: i32) {
        self.must(json!({"cmd": "share_settings", "heartbeat_interval_ms": millis}));
    }

    pub fn set_share_isolation_level(&self, read_committed: bool) {
        let level = if read_committed {
            "read_committed"
        } else {
            "read_uncommitted"
        };
        self.must(json!({"cmd": "share_settings", "isolation_level": level}));
    }

    pub fn set_share_max_record_locks(&self, locks: i32) {
        self.must(json!({"cmd": "share_settings", "max_record_locks": locks}));
    }

    /// Switches the group to manual assignment for good (a mock rule) and gives each member the
    /// listed partitions; several members may share one partition, as on Apache Kafka.
    pub fn share_target_assignment(
        &self,
        group: &str,
        assignments: &[(String, Vec<(String, i32)>)],
    ) {
        let map: serde_json::Map<String, Value> = assignments
            .iter()
            .map(|(member, parts)| (member.clone(), json!(parts)))
            .collect();
        self.must(json!({"cmd": "share_target_assignment", "group": group, "assignments": map}));
    }

    pub fn share_member_ids(&self, group: &str) -> Vec<String> {
        // A group the mock has not seen (yet) has no members.
        self.control
            .share_group_members(group)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_default()
    }

    pub fn broker_down(&self, broker: i32) {
        self.must(json!({"cmd": "broker_down", "broker": broker}));
    }

    pub fn broker_up(&self, broker: i32) {
        self.must(json!({"cmd": "broker_up", "broker": broker}));
    }

    pub fn broker_rtt(&self, broker: i32, millis: i32) {
        self.must(json!({"cmd": "broker_rtt", "broker": broker, "rtt_ms": millis}));
    }

    /// The next requests with `api_key`, on any broker, fail with these top-level errors in turn.
    pub fn push_request_errors(&self, api_key: i16, errors: &[i16]) {
        self.must(json!({"cmd": "push_request_errors", "api_key": api_key, "errors": errors}));
    }

    /// The next requests with `api_key` fail for this one partition with these errors in turn.
    pub fn push_partition_request_errors(
        &self,
        topic: &str,
        partition: i32,
        api_key: i16,
        errors: &[i16],
    ) {
        self.must(
            json!({"cmd": "push_partition_request_errors", "topic": topic,
            "partition": partition, "api_key": api_key, "errors": errors}),
        );
    }

    /// The next requests with `api_key` to `broker` get (error, delay) in turn; error 0 = delay only.
    pub fn broker_push_request_error_rtts(&self, broker: i32, api_key: i16, errors: &[(i16, i32)]) {
        let pairs: Vec<[i32; 2]> = errors.iter().map(|(e, r)| [*e as i32, *r]).collect();
        self.must(
            json!({"cmd": "broker_push_request_error_rtts", "broker": broker,
            "api_key": api_key, "errors": pairs}),
        );
    }

    pub fn clear_request_errors(&self, api_key: i16) {
        self.must(json!({"cmd": "clear_request_errors", "api_key": api_key}));
    }

    /// From now on the brokers record every request they receive, for [`Self::request_counts`].
    pub fn start_request_tracking(&self) {
        self.must(json!({"cmd": "start_request_tracking"}));
    }

    /// Requests received per API key since tracking started or since the previous call.
    pub fn request_counts(&self) -> std::collections::BTreeMap<i16, u64> {
        let reply = self.must(json!({"cmd": "request_counts"}));
        reply["counts"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(key, n)| Some((key.parse().ok()?, n.as_u64()?)))
            .collect()
    }

    pub fn set_partition_leader(&self, topic: &str, partition: i32, broker: i32) {
        self.must(
            json!({"cmd": "set_partition_leader", "topic": topic, "partition": partition,
            "broker": broker}),
        );
    }

    /// Pins the group coordinator of `group` to `broker`.
    pub fn set_coordinator(&self, group: &str, broker: i32) {
        self.must(
            json!({"cmd": "set_coordinator", "key_type": "group", "key": group,
            "broker": broker}),
        );
    }

    /// The brokers' supported versions of `api_key`; `(-1, -1)` removes the API, as on a broker
    /// too old to know it (it is left out of ApiVersions).
    pub fn set_api_version(&self, api_key: i16, min_version: i16, max_version: i16) {
        self.must(json!({"cmd": "set_api_version", "api_key": api_key,
            "min_version": min_version, "max_version": max_version}));
    }

    /// Pins the transaction coordinator of `transactional_id` to `broker`.
    pub fn set_transaction_coordinator(&self, transactional_id: &str, broker: i32) {
        self.must(json!({"cmd": "set_coordinator", "key_type": "transaction",
            "key": transactional_id, "broker": broker}));
    }

    /// The launcher's process id (tests that need to prove it goes away use it).
    pub fn launcher_pid(&self) -> u32 {
        self.child.id()
    }

    pub fn tools_script(name: &str) -> std::path::PathBuf {
        tools_dir().join(name)
    }
}

impl Drop for DevBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type Launched = (Child, ChildStdin, BufReader<ChildStdout>, String);

/// Spawns the launcher and reads its bootstrap line.
fn launch(
    brokers: u32,
    topics: &[(&str, i32)],
    preload: Option<&Path>,
) -> Result<Launched, DevBrokerError> {
    let python = venv_python().map_err(DevBrokerError::Python)?;
    let script = tools_dir().join("devbroker.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .arg("--brokers")
        .arg(brokers.to_string());
    for (name, partitions) in topics {
        command.arg("--topic").arg(format!("{name}:{partitions}"));
    }
    if let Some(library) = preload {
        command.env("LD_PRELOAD", library);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| DevBrokerError::Spawn {
            command: format!("{} {}", python.display(), script.display()),
            source,
        })?;
    let stdin = child.stdin.take().expect("stdin was configured as piped");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout was configured as piped"));
    let mut first = String::new();
    let read = stdout.read_line(&mut first).unwrap_or(0);
    let bootstrap = first.trim().to_string();
    if read == 0 || bootstrap.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        return Err(DevBrokerError::NoBootstrap);
    }
    Ok((child, stdin, stdout, bootstrap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_broker_answers_commands_and_names_bad_ones() {
        let broker = DevBroker::try_start(2, &[("seed", 3)]).expect("dev broker starts");
        assert_eq!(broker.bootstrap().split(',').count(), 2);
        broker.create_topic("t", 4);
        broker.set_share_auto_offset_reset("earliest");
        let err = broker
            .command(json!({"cmd": "share_settings", "auto_offset_reset": "sideways"}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sideways") && err.contains("earliest"),
            "{err}"
        );
        let err = broker
            .command(json!({"cmd": "nope"}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown command"), "{err}");
        assert!(broker.share_member_ids("no-such-group").is_empty());
    }

    #[tokio::test]
    async fn request_tracking_counts_what_the_brokers_received() {
        let broker = DevBroker::try_start(1, &[("tracked", 1)]).expect("dev broker starts");
        assert!(broker.request_counts().is_empty(), "nothing tracked yet");
        broker.start_request_tracking();
        let produced = crate::produce(
            &broker.bootstrap(),
            "tracked",
            crate::numbered_records(10, 10, 1),
            "none",
        )
        .await;
        assert_eq!(produced.len(), 10);
        let counts = broker.request_counts();
        const PRODUCE: i16 = 0;
        assert!(
            counts.get(&PRODUCE).copied().unwrap_or(0) >= 1,
            "{counts:?}"
        );
        // Counted requests are forgotten once reported.
        let again = broker.request_counts();
        assert!(!again.contains_key(&PRODUCE), "{again:?}");
    }

    #[test]
    fn launcher_exits_when_its_stdin_closes() {
        let (mut child, stdin, _stdout, bootstrap) = launch(1, &[], None).expect("launcher starts");
        assert!(bootstrap.starts_with("127.0.0.1:"), "{bootstrap}");
        drop(stdin);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "launcher exit status {status}");
                break;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("launcher outlived its stdin");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}
