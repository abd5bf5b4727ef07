//! Bounds that keep one connector from hurting the others on a worker: how many tasks a
//! connector and the whole worker may run, how long a connector name and a configuration value
//! may be. Checked on validate and create (400 naming the limit) and again when a connector
//! starts, so a stored configuration beyond them (written by an older version) becomes a FAILED
//! connector instead of taking the worker down.

use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::{ConfigError, ConfigMap};

/// Worker key: the most tasks one connector may run (`tasks.max` above it is refused).
pub const TASKS_MAX_PER_CONNECTOR: &str = "tasks.max.per.connector";
/// Worker key: the most tasks all the worker's connectors may run together.
pub const TASKS_MAX_PER_WORKER: &str = "tasks.max.per.worker";
pub const DEFAULT_TASKS_PER_CONNECTOR: u64 = 64;
/// File descriptors an idle task holds, with a margin: measured 13 for a classic-mode task
/// (librdkafka: 7 threads, its sockets and wake-up pipes); a share-mode task on the worker's
/// thread pool holds about 1 per broker it fetches from (`bench/src/bin/idle_tasks.rs`,
/// docs/tenants.md). The cap holds for the worst case.
pub const FDS_PER_TASK: u64 = 16;
/// Descriptors kept for everything but tasks: the REST server and its clients, the state
/// store, logs, the dead letter queue producers.
pub const FDS_RESERVED: u64 = 256;
/// The default of `tasks.max.per.worker` is what the process's open-file limit holds at
/// [`FDS_PER_TASK`] each after [`FDS_RESERVED`], within these bounds.
pub const DEFAULT_TASKS_PER_WORKER_BOUNDS: (u64, u64) = (16, 2000);

/// Raises this process's soft open-file limit to its hard limit, as the JVM does for a Kafka
/// Connect worker (HotSpot's `MaxFDLimit`, on by default on Linux): the soft limit (1024 on
/// most distributions) is a guard for programs that use `select`, the hard limit (4096 from
/// the kernel, 524,288 under systemd since v240) is what the administrator allows. Returns
/// the limits before and after, or why it could not.
pub fn raise_open_files_limit() -> Result<(u64, u64), String> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own; no other memory is touched.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok((before, before));
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit only reads the struct we pass.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok((before, raised.rlim_cur))
}

/// The default `tasks.max.per.worker`: as many tasks as the soft open-file limit holds at a
/// classic task's cost (the worker raises the soft limit to the hard one first: 240 at the
/// kernel's 4096, 2000 under systemd's 524,288), so a full worker does not run out of file
/// descriptors in either mode; 128 when the limit cannot be read.
pub fn default_tasks_per_worker() -> u64 {
    let (low, high) = DEFAULT_TASKS_PER_WORKER_BOUNDS;
    match open_files_limit() {
        Some(limit) => (limit.saturating_sub(FDS_RESERVED) / FDS_PER_TASK).clamp(low, high),
        None => 128,
    }
}

/// The soft limit of open files of this process (`Max open files` in /proc/self/limits).
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    match soft {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

/// The longest connector name, in bytes. Every name derived from it stays valid for Kafka:
/// the ledger topic `<tenant>.__spillway_eos_ledger.<name>` (a tenant name is at most 64) is
/// at most 215 of the 249 characters a topic name may have; group, client and transactional
/// ids stay far below Kafka's 32,767-byte strings.
pub const CONNECTOR_NAME_MAX_BYTES: usize = 128;
/// The longest configuration value, in bytes: a value handed to a Kafka client is sent as a
/// Kafka string (at most 32,767 bytes).
pub const CONFIG_VALUE_MAX_BYTES: usize = 32_767;
/// The longest configuration key, in bytes.
pub const CONFIG_KEY_MAX_BYTES: usize = 255;

/// The worker's task limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    pub tasks_per_connector: u64,
    pub tasks_per_worker: u64,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            tasks_per_connector: DEFAULT_TASKS_PER_CONNECTOR,
            tasks_per_worker: default_tasks_per_worker(),
        }
    }
}

/// The worker keys of the limits.
pub fn limits_config_def() -> ConfigDef {
    ConfigDef::new()
        .define(
            ConfigKey::new(
                TASKS_MAX_PER_CONNECTOR,
                ConfigType::Long,
                Importance::Medium,
                "The most tasks one connector may run: a larger tasks.max is refused (400), and \
                 a stored one makes the connector FAILED.",
            )
            .default(DEFAULT_TASKS_PER_CONNECTOR.to_string())
            .validator(Validator::Between(1, 100_000)),
        )
        .define(
            ConfigKey::new(
                TASKS_MAX_PER_WORKER,
                ConfigType::Long,
                Importance::Medium,
                "The most tasks (tasks.max summed over every connector not STOPPED) the \
                 worker runs; a change beyond it is refused (400). Default: what the open-file \
                 limit (raised to the hard limit at start) holds at 16 descriptors a task \
                 after 256 for the rest (240 at 4096), from 16 to 2000. A share-mode task \
                 holds about one descriptor per broker it fetches from and no thread, so a \
                 worker running share connectors only may set it higher.",
            )
            .default(default_tasks_per_worker().to_string())
            .validator(Validator::Between(1, 1_000_000)),
        )
}

/// `tasks.max` as asked, whatever it is (1 when it is not a number: validation says why).
pub fn requested_tasks(config: &ConfigMap) -> u64 {
    config
        .get("tasks.max")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1)
}

impl WorkerLimits {
    pub fn from_worker_config(worker: &ConfigMap) -> Result<WorkerLimits, ConfigError> {
        let parsed = limits_config_def().parse(worker)?;
        Ok(WorkerLimits {
            tasks_per_connector: parsed.long(TASKS_MAX_PER_CONNECTOR)? as u64,
            tasks_per_worker: parsed.long(TASKS_MAX_PER_WORKER)? as u64,
        })
    }

    /// The most tasks a connector gets, whatever its `tasks.max` says: what may be allocated
    /// for one connector's task configurations.
    pub fn clamp_tasks(&self, tasks_max: usize) -> usize {
        tasks_max.min(usize::try_from(self.tasks_per_connector).unwrap_or(usize::MAX))
    }

    /// The tasks `config` counts for against `tasks.max.per.worker`: its `tasks.max`, but never
    /// more than a connector may run, so that a stored configuration beyond the limit (FAILED
    /// at restore) does not block every other connector.
    pub fn counted_tasks(&self, config: &ConfigMap) -> u64 {
        requested_tasks(config).min(self.tasks_per_connector)
    }

    /// What in `config` is beyond the bounds: the name, key and value sizes, `tasks.max`.
    pub fn check_connector(&self, config: &ConfigMap) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let shown = |value: &str| -> String {
            if value.len() > 64 {
                let cut = (0..=64)
                    .rev()
                    .find(|i| value.is_char_boundary(*i))
                    .unwrap_or(0);
                format!("{}... ({} bytes)", &value[..cut], value.len())
            } else {
                value.to_owned()
            }
        };
        if let Some(name) = config.get("name") {
            if name.len() > CONNECTOR_NAME_MAX_BYTES {
                errors.push(ConfigError::InvalidValue {
                    key: "name".into(),
                    value: shown(name),
                    reason: format!(
                        "a connector name is at most {CONNECTOR_NAME_MAX_BYTES} bytes, so that \
                         the group ids, client ids, transactional ids and topic names derived \
                         from it stay valid for Kafka; choose a shorter name"
                    ),
                });
            } else if name.chars().any(char::is_control) {
                errors.push(ConfigError::InvalidValue {
                    key: "name".into(),
                    value: name.escape_debug().to_string(),
                    reason: "a connector name may not hold control characters".into(),
                });
            }
        }
        for (key, value) in config {
            if key.len() > CONFIG_KEY_MAX_BYTES {
                errors.push(ConfigError::InvalidValue {
                    key: shown(key),
                    value: String::new(),
                    reason: format!("a configuration key is at most {CONFIG_KEY_MAX_BYTES} bytes"),
                });
            } else if value.len() > CONFIG_VALUE_MAX_BYTES && key != "name" {
                errors.push(ConfigError::InvalidValue {
                    key: key.clone(),
                    value: shown(value),
                    reason: format!(
                        "a configuration value is at most {CONFIG_VALUE_MAX_BYTES} bytes \
                         (a Kafka string)"
                    ),
                });
            }
        }
        let tasks = requested_tasks(config);
        if tasks > self.tasks_per_connector {
            errors.push(ConfigError::InvalidValue {
                key: "tasks.max".into(),
                value: tasks.to_string(),
                reason: format!(
                    "this worker runs at most {} tasks per connector ({TASKS_MAX_PER_CONNECTOR}); \
                     lower tasks.max, or ask the worker admin to raise the limit",
                    self.tasks_per_connector
                ),
            });
        }
        errors
    }

    /// Refuses `tasks` more tasks for connector `name` when the worker's other connectors
    /// already have `others`.
    pub fn check_worker_tasks(
        &self,
        name: &str,
        others: u64,
        tasks: u64,
    ) -> Result<(), ConfigError> {
        let total = others.saturating_add(tasks);
        if total <= self.tasks_per_worker {
            return Ok(());
        }
        Err(ConfigError::InvalidValue {
            key: "tasks.max".into(),
            value: tasks.to_string(),
            reason: format!(
                "this worker runs at most {} tasks ({TASKS_MAX_PER_WORKER}); its other \
                 connectors have {others}, so connector {name} would take it to {total}. Lower \
                 tasks.max, stop or delete connectors, or ask the worker admin to raise the limit",
                self.tasks_per_worker
            ),
        })
    }
}

/// Distributed mode: refuses `tasks` more tasks for connector `name` when the cluster's other
/// connectors already have `others` and its live workers run at most `worker_caps` tasks each
/// (their `tasks.max.per.worker`): the cluster's capacity is their sum.
pub fn check_cluster_tasks(
    name: &str,
    others: u64,
    tasks: u64,
    worker_caps: &[u64],
) -> Result<(), ConfigError> {
    let capacity = worker_caps.iter().copied().fold(0, u64::saturating_add);
    let total = others.saturating_add(tasks);
    if total <= capacity {
        return Ok(());
    }
    let caps: Vec<String> = worker_caps.iter().map(u64::to_string).collect();
    Err(ConfigError::InvalidValue {
        key: "tasks.max".into(),
        value: tasks.to_string(),
        reason: format!(
            "the cluster runs at most {capacity} tasks ({TASKS_MAX_PER_WORKER} summed over its \
             {} live worker{}: {}); its other connectors have {others}, so connector {name} \
             would take it to {total}. Lower tasks.max, stop or delete connectors, add workers, \
             or ask the worker admin to raise the limit",
            worker_caps.len(),
            if worker_caps.len() == 1 { "" } else { "s" },
            caps.join(" + ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::config_map;

    #[test]
    fn a_huge_task_count_a_long_name_and_a_huge_value_are_refused_naming_the_limit() {
        let limits = WorkerLimits::default();
        let name = "n".repeat(600_000);
        let errors = limits.check_connector(&config_map(&[
            ("name", &name),
            ("tasks.max", "2147483647"),
            ("topics", &"t".repeat(CONFIG_VALUE_MAX_BYTES + 1)),
        ]));
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{text:?}");
        assert!(text[0].contains("at most 128 bytes"), "{}", text[0]);
        assert!(text[0].len() < 1000, "the message does not repeat the name");
        assert!(text
            .iter()
            .any(|t| t.contains("topics") && t.contains("32767")));
        assert!(text
            .iter()
            .any(|t| t.contains("tasks.max") && t.contains(TASKS_MAX_PER_CONNECTOR)));
        assert!(limits
            .check_connector(&config_map(&[
                ("name", &"n".repeat(128)),
                ("tasks.max", "64")
            ]))
            .is_empty());
        assert_eq!(limits.clamp_tasks(2_147_483_647), 64);
        assert_eq!(
            limits.counted_tasks(&config_map(&[("tasks.max", "2147483647")])),
            64,
            "a stored connector beyond the limit counts what it could run"
        );
    }

    #[test]
    fn the_default_worker_cap_follows_the_open_file_limit() {
        let limit = open_files_limit().expect("linux has /proc/self/limits");
        let tasks = default_tasks_per_worker();
        assert!((16..=2000).contains(&tasks), "{tasks}");
        if limit < 32_000 {
            assert!(
                FDS_RESERVED + tasks * FDS_PER_TASK <= limit.max(FDS_RESERVED + 16 * FDS_PER_TASK),
                "{tasks} tasks fit in {limit} descriptors"
            );
        }
    }

    #[test]
    fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
        let hard = std::fs::read_to_string("/proc/self/limits")
            .expect("linux")
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(4).map(str::to_owned))
            .expect("a hard limit");
        let (before, after) =
            raise_open_files_limit().expect("raising to the hard limit is allowed");
        assert!(after >= before);
        let soft = open_files_limit().expect("readable");
        assert_eq!(soft, after);
        if hard != "unlimited" {
            assert_eq!(soft.to_string(), hard, "the soft limit is the hard one now");
        }
    }

    #[test]
    fn the_worker_cap_counts_every_other_connectors_tasks() {
        let limits = WorkerLimits::from_worker_config(&config_map(&[(TASKS_MAX_PER_WORKER, "10")]))
            .expect("valid");
        assert!(limits.check_worker_tasks("a", 6, 4).is_ok());
        let err = limits.check_worker_tasks("a", 7, 4).expect_err("11 > 10");
        assert!(err.to_string().contains(TASKS_MAX_PER_WORKER), "{err}");
        assert!(err.to_string().contains("11"), "{err}");
        assert!(
            WorkerLimits::from_worker_config(&config_map(&[(TASKS_MAX_PER_CONNECTOR, "0")]))
                .is_err()
        );
    }

    #[test]
    fn the_cluster_capacity_is_the_sum_of_its_workers_caps() {
        assert!(check_cluster_tasks("a", 3, 1, &[2, 2]).is_ok());
        let err = check_cluster_tasks("a", 3, 2, &[2, 2])
            .expect_err("5 > 2 + 2")
            .to_string();
        assert!(
            err.contains("at most 4 tasks")
                && err.contains("tasks.max.per.worker summed over its 2 live workers: 2 + 2")
                && err.contains("other connectors have 3")
                && err.contains("take it to 5"),
            "{err}"
        );
    }
}
