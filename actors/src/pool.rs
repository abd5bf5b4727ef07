//! The worker's task threads: a fixed pool of actix arbiters that every task's actors run on,
//! so a task costs a few futures, not a thread (and the thread's runtime, its epoll and wake-up
//! descriptors). A task goes to the thread running the fewest tasks and stays there for its run.
//!
//! Sharing threads means a task must never block its thread: every call that may wait (a
//! Kafka client's poll, seek, commit or close, the state store, a plugin's I/O) runs as a
//! future or on tokio's blocking threads. A task is killed by dropping its actors' futures
//! ([`TaskScope::kill`]), which is what stopping its own thread did before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::dev::channel::{channel, AddressReceiver};
use actix::prelude::*;
use futures::future::{AbortHandle, Abortable};
use spillway_core::config::{ConfigDef, ConfigKey, ConfigType, Importance, Validator};
use spillway_core::{ConfigError, ConfigMap};
use tracing::{Instrument, Span};

/// Worker key: how many threads run the tasks' actors.
pub const TASK_THREADS: &str = "task.threads";
/// The most threads `task.threads` may ask for.
pub const TASK_THREADS_MAX: i64 = 1024;

/// The default `task.threads`: one per core (what the machine can run at once; tasks wait on
/// Kafka and their targets, not on CPU), at least 2 so that one busy task cannot hold up all.
pub fn default_task_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2)
}

/// The worker key of the pool.
pub fn pool_config_def() -> ConfigDef {
    ConfigDef::new().define(
        ConfigKey::new(
            TASK_THREADS,
            ConfigType::Int,
            Importance::Medium,
            "How many threads run the tasks of every connector on this worker: tasks share \
             them (each task goes to the thread with the fewest). Default: the number of cores, \
             at least 2.",
        )
        .default(default_task_threads().to_string())
        .validator(Validator::Between(1, TASK_THREADS_MAX)),
    )
}

/// `task.threads` from the worker's configuration.
pub fn task_threads(worker: &ConfigMap) -> Result<usize, ConfigError> {
    let parsed = pool_config_def().parse(worker)?;
    Ok(parsed.int(TASK_THREADS)? as usize)
}

struct PoolThread {
    arbiter: ArbiterHandle,
    /// Tasks running on it.
    tasks: Arc<AtomicUsize>,
}

/// The threads tasks run on. Cheap to clone; the threads end with the actix system that
/// made them (the worker's).
#[derive(Clone)]
pub struct TaskPool {
    threads: Arc<Vec<PoolThread>>,
}

impl std::fmt::Debug for TaskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskPool")
            .field("threads", &self.threads.len())
            .field("tasks", &self.tasks_per_thread())
            .finish()
    }
}

impl TaskPool {
    /// Starts `threads` arbiters. Must be called on a thread running an actix system; they
    /// stop when it does.
    pub fn start(threads: usize) -> TaskPool {
        let threads = (0..threads.max(1))
            .map(|_| PoolThread {
                arbiter: Arbiter::new().handle(),
                tasks: Arc::default(),
            })
            .collect();
        TaskPool {
            threads: Arc::new(threads),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// How many tasks each thread runs now.
    pub fn tasks_per_thread(&self) -> Vec<usize> {
        self.threads
            .iter()
            .map(|t| t.tasks.load(Ordering::Relaxed))
            .collect()
    }

    /// A place on the thread with the fewest tasks, held until the lease is dropped.
    pub fn lease(&self) -> ThreadLease {
        let thread = self
            .threads
            .iter()
            .min_by_key(|t| t.tasks.load(Ordering::Relaxed))
            .expect("a pool has at least one thread");
        thread.tasks.fetch_add(1, Ordering::Relaxed);
        ThreadLease {
            arbiter: thread.arbiter.clone(),
            tasks: Arc::clone(&thread.tasks),
        }
    }
}

/// A task's place on a pool thread.
pub struct ThreadLease {
    arbiter: ArbiterHandle,
    tasks: Arc<AtomicUsize>,
}

impl ThreadLease {
    pub fn arbiter(&self) -> &ArbiterHandle {
        &self.arbiter
    }
}

impl Drop for ThreadLease {
    fn drop(&mut self) {
        self.tasks.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The actors of one task run: started on the task's pool thread, each in the task's log
/// span, and all dropped at once by [`kill`](Self::kill).
#[derive(Clone, Default)]
pub struct TaskScope {
    inner: Arc<ScopeInner>,
}

#[derive(Default)]
struct ScopeInner {
    handles: Mutex<Vec<AbortHandle>>,
    killed: AtomicBool,
}

impl TaskScope {
    /// Drops every actor of the task on its thread's next turn, as a crash would: nothing
    /// more is handled or sent. Actors started after this are dropped at once.
    pub fn kill(&self) {
        self.inner.killed.store(true, Ordering::SeqCst);
        let handles =
            std::mem::take(&mut *self.inner.handles.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            handle.abort();
        }
    }

    pub fn is_killed(&self) -> bool {
        self.inner.killed.load(Ordering::SeqCst)
    }

    /// A mailbox for an actor [`run`](Self::run) starts later, and its address now.
    pub fn mailbox<A>() -> (Addr<A>, AddressReceiver<A>)
    where
        A: Actor<Context = Context<A>>,
    {
        let (tx, rx) = channel(16);
        (Addr::new(tx), rx)
    }

    /// Starts `actor` on the current (pool) thread, in `span`, under this scope.
    pub fn start<A>(&self, actor: A, span: &Span) -> Addr<A>
    where
        A: Actor<Context = Context<A>>,
    {
        let (addr, rx) = Self::mailbox();
        self.run(Context::with_receiver(rx), actor, span);
        addr
    }

    /// Runs `actor` in `ctx` on the current (pool) thread, in `span`, under this scope.
    pub fn run<A>(&self, ctx: Context<A>, actor: A, span: &Span)
    where
        A: Actor<Context = Context<A>>,
    {
        let (handle, registration) = AbortHandle::new_pair();
        {
            let mut handles = self.inner.handles.lock().unwrap_or_else(|e| e.into_inner());
            if self.is_killed() {
                return;
            }
            handles.push(handle);
        }
        let future = Abortable::new(
            ctx.into_future(actor).instrument(span.clone()),
            registration,
        );
        actix::spawn(async move {
            let _ = future.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_go_to_the_thread_with_the_fewest_and_leave_it_when_done() {
        let system = System::new();
        system.block_on(async {
            let pool = TaskPool::start(3);
            let a = pool.lease();
            let b = pool.lease();
            let c = pool.lease();
            assert_eq!(pool.tasks_per_thread(), vec![1, 1, 1]);
            drop(b);
            assert_eq!(pool.tasks_per_thread(), vec![1, 0, 1]);
            let d = pool.lease();
            assert_eq!(
                pool.tasks_per_thread(),
                vec![1, 1, 1],
                "the free place is taken first"
            );
            drop((a, c, d));
            assert_eq!(pool.tasks_per_thread(), vec![0, 0, 0]);
        });
    }

    #[test]
    fn the_default_thread_count_is_the_core_count_and_at_least_two() {
        let threads = task_threads(&ConfigMap::new()).expect("default");
        assert!(threads >= 2);
        assert_eq!(threads, default_task_threads());
        assert_eq!(
            task_threads(&spillway_core::config::config_map(&[(TASK_THREADS, "7")])).expect("7"),
            7
        );
        let err = task_threads(&spillway_core::config::config_map(&[(TASK_THREADS, "0")]))
            .expect_err("0 threads");
        assert!(err.to_string().contains(TASK_THREADS), "{err}");
    }
}
