//! Bounds that keep one connector from hurting the others on a worker: how many tasks a
//! connector and the whole worker may run, how long a connector name and a configuration value
//! may be. Checked on validate and create (400 naming the limit) and again when a connector
//! starts, so a stored configuration beyond them (written by an older version) becomes a FAILED
//! connector instead of taking the worker down.

use spillway_core::config::{
    resolve_group_protocol, ConfigDef, ConfigKey, ConfigType, Importance, Validator,
};
use spillway_core::{ConfigError, ConfigMap};

/// Worker key: the most tasks one connector may run (`tasks.max` above it is refused).
pub const TASKS_MAX_PER_CONNECTOR: &str = "tasks.max.per.connector";
/// Worker key: the most tasks all the worker's connectors may run together.
pub const TASKS_MAX_PER_WORKER: &str = "tasks.max.per.worker";
pub const DEFAULT_TASKS_PER_CONNECTOR: u64 = 64;
/// The default of `tasks.max.per.worker`: the task count the worker is built for (issue 19).
/// What the process's limits hold is checked besides, task by task at its weight.
pub const DEFAULT_TASKS_PER_WORKER: u64 = 2000;
/// Descriptors kept for everything but tasks: the REST server and its clients, the state
/// store, logs, the dead letter queue producers.
pub const FDS_RESERVED: u64 = 256;
/// Threads kept for everything but tasks: the runtime, the task pool, REST, blocking calls,
/// the worker's own Kafka clients.
pub const THREADS_RESERVED: u64 = 256;

/// What one idle task holds of the worker's process limits, measured with
/// `cargo run -p spillway-bench --bin idle_tasks -- --tasks N [--mode classic]`
/// (docs/tenants.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskWeight {
    pub fds: u64,
    pub threads: u64,
}

/// A share-mode task: measured 1.02 descriptors and 0.000 threads per task at 2,000 tasks
/// (members of a connector share a connection per broker; tasks run on the worker's pool).
/// Weighted 1 descriptor, no thread: 2,000 share tasks fit the kernel's default 4,096
/// descriptors after [`FDS_RESERVED`].
pub const SHARE_TASK_WEIGHT: TaskWeight = TaskWeight { fds: 1, threads: 0 };
/// A classic-mode task (a librdkafka consumer of its own): measured 9.0 descriptors and 5.5
/// threads per task; weighted 10 and 6, rounded up.
pub const CLASSIC_TASK_WEIGHT: TaskWeight = TaskWeight {
    fds: 10,
    threads: 6,
};

/// A task's weight: by the group protocol it runs with (`connector` over the `worker`'s
/// default); classic's, the heavier, when the protocol cannot be read (validation says why).
pub fn task_weight(connector: &ConfigMap, worker: &ConfigMap) -> TaskWeight {
    match resolve_group_protocol(connector, worker) {
        Ok(resolved) if resolved.protocol.is_share() => SHARE_TASK_WEIGHT,
        _ => CLASSIC_TASK_WEIGHT,
    }
}

/// What tasks cost together: how many, and the descriptors and threads they weigh.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCost {
    pub tasks: u64,
    pub fds: u64,
    pub threads: u64,
}

impl TaskCost {
    /// `tasks` tasks of `weight`.
    pub fn of(tasks: u64, weight: TaskWeight) -> TaskCost {
        TaskCost {
            tasks,
            fds: tasks.saturating_mul(weight.fds),
            threads: tasks.saturating_mul(weight.threads),
        }
    }

    pub fn plus(self, other: TaskCost) -> TaskCost {
        TaskCost {
            tasks: self.tasks.saturating_add(other.tasks),
            fds: self.fds.saturating_add(other.fds),
            threads: self.threads.saturating_add(other.threads),
        }
    }
}

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

/// The threads this process may have: the smaller of its `RLIMIT_NPROC` soft limit (which
/// counts every thread of the user) and the kernel's `threads-max`; `None` when neither can be
/// read.
fn threads_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let nproc = limits
        .lines()
        .find(|l| l.starts_with("Max processes"))
        .and_then(|l| {
            match l
                .trim_start_matches("Max processes")
                .split_whitespace()
                .next()?
            {
                "unlimited" => Some(u64::MAX),
                n => n.parse().ok(),
            }
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/threads-max")
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok());
    match (nproc, kernel) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
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
    /// The process's soft open-file limit when the limits were read (after the worker raised
    /// it to the hard limit); 1024 when it cannot be read.
    pub open_files: u64,
    /// The threads the process may have ([`threads_limit`]); 4096 when it cannot be read.
    pub threads: u64,
}

impl Default for WorkerLimits {
    fn default() -> Self {
        WorkerLimits {
            tasks_per_connector: DEFAULT_TASKS_PER_CONNECTOR,
            tasks_per_worker: DEFAULT_TASKS_PER_WORKER,
            open_files: open_files_limit().unwrap_or(1024),
            threads: threads_limit().unwrap_or(4096),
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
                 worker runs; a change beyond it is refused (400). Besides, the tasks must fit \
                 the process's open-file and thread limits at their weights: a share-mode \
                 task 1 descriptor and no thread, a classic one 10 descriptors and 6 threads \
                 (measured by bench idle_tasks), after 256 of each for the rest.",
            )
            .default(DEFAULT_TASKS_PER_WORKER.to_string())
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
            ..WorkerLimits::default()
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

    /// What `config`'s tasks cost against `tasks.max.per.worker` and the process's limits:
    /// [`WorkerLimits::counted_tasks`] at the weight of its mode ([`task_weight`]; `worker`
    /// gives the default group protocol).
    pub fn cost(&self, config: &ConfigMap, worker: &ConfigMap) -> TaskCost {
        TaskCost::of(self.counted_tasks(config), task_weight(config, worker))
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

    /// Refuses connector `name`'s tasks (`this`) when, with the worker's other connectors'
    /// (`others`), they would be more than `tasks.max.per.worker`, or weigh more descriptors or
    /// threads than the process's limits leave after what is reserved for the rest. The error
    /// names the limit, the weights and the figures.
    pub fn check_worker_tasks(
        &self,
        name: &str,
        others: TaskCost,
        this: TaskCost,
    ) -> Result<(), ConfigError> {
        let total = others.plus(this);
        let refuse = |reason: String| ConfigError::InvalidValue {
            key: "tasks.max".into(),
            value: this.tasks.to_string(),
            reason,
        };
        let fix = "Lower tasks.max, stop or delete connectors, or ask the worker admin";
        if total.tasks > self.tasks_per_worker {
            return Err(refuse(format!(
                "this worker runs at most {} tasks ({TASKS_MAX_PER_WORKER}); its other \
                 connectors have {}, so connector {name} would take it to {}. {fix} to raise \
                 the limit",
                self.tasks_per_worker, others.tasks, total.tasks
            )));
        }
        let weights = format!(
            "a classic-mode task weighs {} descriptors and {} threads, a share-mode task {} \
             descriptor and {} threads (measured: bench idle_tasks)",
            CLASSIC_TASK_WEIGHT.fds,
            CLASSIC_TASK_WEIGHT.threads,
            SHARE_TASK_WEIGHT.fds,
            SHARE_TASK_WEIGHT.threads
        );
        let fds = self.open_files.saturating_sub(FDS_RESERVED);
        if total.fds > fds {
            return Err(refuse(format!(
                "the worker's tasks would hold {} file descriptors (connector {name}'s {} tasks \
                 {}, the other connectors' {} tasks {}), more than the {fds} its open-file \
                 limit ({}, ulimit -n) leaves after {FDS_RESERVED} for the rest; {weights}. \
                 {fix} to raise the open-file limit; share mode \
                 (consumer.override.group.protocol=share) costs far less",
                total.fds, this.tasks, this.fds, others.tasks, others.fds, self.open_files
            )));
        }
        let threads = self.threads.saturating_sub(THREADS_RESERVED);
        if total.threads > threads {
            return Err(refuse(format!(
                "the worker's tasks would run {} threads (connector {name}'s {} tasks {}, the \
                 other connectors' {} tasks {}), more than the {threads} its thread limit ({}, \
                 the smaller of ulimit -u and kernel.threads-max) leaves after \
                 {THREADS_RESERVED} for the rest; {weights}. {fix} to raise the thread \
                 limit; share mode (consumer.override.group.protocol=share) runs no thread \
                 per task",
                total.threads, this.tasks, this.threads, others.tasks, others.threads, self.threads
            )));
        }
        Ok(())
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
    fn the_limits_read_the_process_limits() {
        let limits = WorkerLimits::default();
        assert_eq!(limits.tasks_per_worker, DEFAULT_TASKS_PER_WORKER);
        assert_eq!(Some(limits.open_files), open_files_limit());
        assert!(limits.threads > THREADS_RESERVED, "{limits:?}");
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

    /// A worker at the kernel's default limits: 4,096 descriptors, and threads to spare.
    fn at_kernel_defaults(tasks_per_worker: &str) -> WorkerLimits {
        WorkerLimits {
            open_files: 4096,
            threads: 100_000,
            ..WorkerLimits::from_worker_config(&config_map(&[(
                TASKS_MAX_PER_WORKER,
                tasks_per_worker,
            )]))
            .expect("valid")
        }
    }

    #[test]
    fn the_worker_cap_counts_every_other_connectors_tasks() {
        let limits = at_kernel_defaults("10");
        let share = |n| TaskCost::of(n, SHARE_TASK_WEIGHT);
        assert!(limits.check_worker_tasks("a", share(6), share(4)).is_ok());
        let err = limits
            .check_worker_tasks("a", share(7), share(4))
            .expect_err("11 > 10");
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

    #[test]
    fn tasks_weigh_what_their_mode_costs() {
        let worker = ConfigMap::new();
        let share = config_map(&[("consumer.override.group.protocol", "share")]);
        assert_eq!(task_weight(&share, &worker), SHARE_TASK_WEIGHT);
        assert_eq!(task_weight(&ConfigMap::new(), &worker), CLASSIC_TASK_WEIGHT);
        let share_worker = config_map(&[("consumer.group.protocol", "share")]);
        assert_eq!(
            task_weight(&ConfigMap::new(), &share_worker),
            SHARE_TASK_WEIGHT,
            "the worker's default protocol"
        );
        assert_eq!(
            task_weight(
                &config_map(&[("consumer.override.group.protocol", "x")]),
                &worker
            ),
            CLASSIC_TASK_WEIGHT,
            "unreadable: the worst case"
        );
        let limits = WorkerLimits::default();
        let mut sixty_four = share.clone();
        sixty_four.insert("tasks.max".into(), "64".into());
        assert_eq!(
            limits.cost(&sixty_four, &worker),
            TaskCost {
                tasks: 64,
                fds: 64,
                threads: 0
            }
        );
    }

    /// Issue 19: a worker with 2,000 tasks stays within its limits. At the kernel's default
    /// 4,096 descriptors, 2,000 share-mode tasks fit; classic tasks stop where the descriptors
    /// run out (384 of them), and the refusal names the limit, the weights and the figures.
    #[test]
    fn two_thousand_share_tasks_fit_and_classic_ones_stop_at_the_descriptor_limit() {
        let limits = at_kernel_defaults(&DEFAULT_TASKS_PER_WORKER.to_string());
        let share = |n| TaskCost::of(n, SHARE_TASK_WEIGHT);
        let classic = |n| TaskCost::of(n, CLASSIC_TASK_WEIGHT);
        assert!(limits
            .check_worker_tasks("s", share(1936), share(64))
            .is_ok());
        assert!(limits
            .check_worker_tasks("s", share(1937), share(64))
            .is_err());
        // (4096 - 256) / 10 = 384 classic tasks.
        assert!(limits
            .check_worker_tasks("c", classic(320), classic(64))
            .is_ok());
        let err = limits
            .check_worker_tasks("c", classic(321), classic(64))
            .expect_err("3850 > 3840 descriptors")
            .to_string();
        for part in [
            "tasks.max",
            "3850 file descriptors",
            "3840",
            "open-file limit (4096",
            "10 descriptors and 6 threads",
            "1 descriptor",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        // Mixed: classic tasks leave less room for share ones.
        assert!(limits
            .check_worker_tasks("s", classic(300), share(840))
            .is_ok());
        assert!(limits
            .check_worker_tasks("s", classic(300), share(841))
            .is_err());
        // Threads bind where descriptors are plentiful.
        let few_threads = WorkerLimits {
            open_files: 1_048_576,
            threads: 1256,
            ..limits
        };
        let err = few_threads
            .check_worker_tasks("c", classic(128), classic(64))
            .expect_err("1152 > 1000 threads")
            .to_string();
        assert!(
            err.contains("1152 threads") && err.contains("thread limit (1256"),
            "{err}"
        );
        assert!(few_threads
            .check_worker_tasks("s", classic(128), share(64))
            .is_ok());
    }
}
