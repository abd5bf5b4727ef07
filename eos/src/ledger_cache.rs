//! The standing ledger entries, kept in sled so a large ledger does not have to fit in memory.
//! It is a cache: the reader rebuilds it from the ledger topic on every start (the topic is the
//! truth; a cache left from an earlier run may miss later transactions). Each open cache gets a
//! directory of its own under the configured one (a restarted task may overlap its
//! predecessor), removed when it is dropped; directories left by a killed process are removed
//! by the next open.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::ledger::Change;

#[derive(Debug, thiserror::Error)]
#[error("the exactly-once ledger cache at {path} failed: {reason}; check that the directory is writable and not used by another running task")]
pub struct CacheError {
    pub path: PathBuf,
    pub reason: String,
}

/// The sled database behind a reader's cache. Every sled call runs on a blocking thread
/// (`spawn_blocking`): the reader is awaited on the sink's pool thread, which its other tasks
/// share, and a sled call may wait for the disk (a page not cached, a segment written out) or
/// walk the whole tree ([`len`](Self::len)).
pub struct LedgerCache {
    path: PathBuf,
    /// Held so the database lives as long as the cache; dropped on a blocking thread too
    /// (sled flushes and removes the temporary directory when its last handle goes).
    db: Option<sled::Db>,
    entries: sled::Tree,
}

impl LedgerCache {
    /// Opens a new, empty cache in a directory of its own under `base`.
    pub async fn open(base: &Path) -> Result<LedgerCache, CacheError> {
        let base = base.to_owned();
        blocking(base.clone(), move || LedgerCache::open_now(&base)).await?
    }

    fn open_now(base: &Path) -> Result<LedgerCache, CacheError> {
        static INSTANCE: AtomicU64 = AtomicU64::new(0);
        remove_abandoned(base);
        let pid = std::process::id();
        let dir = base.join(format!(
            "{pid}-{}",
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        ));
        let fail = |e: sled::Error| CacheError {
            path: dir.clone(),
            reason: e.to_string(),
        };
        std::fs::create_dir_all(base).map_err(|e| CacheError {
            path: base.to_owned(),
            reason: e.to_string(),
        })?;
        let db = sled::Config::new()
            .path(&dir)
            .temporary(true)
            // Rebuilt on every start, so nothing is worth an fsync.
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(fail)?;
        let entries = db.open_tree("entries").map_err(fail)?;
        entries.clear().map_err(fail)?;
        Ok(LedgerCache {
            path: dir,
            db: Some(db),
            entries,
        })
    }

    /// Runs `work` on the entries on a blocking thread.
    async fn on_entries<T: Send + 'static>(
        &self,
        work: impl FnOnce(&sled::Tree) -> sled::Result<T> + Send + 'static,
    ) -> Result<T, CacheError> {
        let entries = self.entries.clone();
        let path = self.path.clone();
        blocking(self.path.clone(), move || work(&entries))
            .await?
            .map_err(|e| CacheError {
                path,
                reason: e.to_string(),
            })
    }

    pub async fn apply(&self, changes: Vec<Change>) -> Result<(), CacheError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for change in changes {
            match change {
                Change::Put(key, value) => batch.insert(key.as_ref(), value.as_ref()),
                Change::Remove(key) => batch.remove(key.as_ref()),
            }
        }
        self.on_entries(move |entries| entries.apply_batch(batch))
            .await
    }

    /// Whether each of `keys` stands, in one trip to a blocking thread.
    pub async fn contains(&self, keys: Vec<Bytes>) -> Result<Vec<bool>, CacheError> {
        self.on_entries(move |entries| {
            keys.iter()
                .map(|key| entries.contains_key(key.as_ref()))
                .collect()
        })
        .await
    }

    /// The value each of `keys` has, `None` for a key not standing.
    pub async fn get(&self, keys: Vec<Bytes>) -> Result<Vec<Option<Bytes>>, CacheError> {
        self.on_entries(move |entries| {
            keys.iter()
                .map(|key| {
                    entries
                        .get(key.as_ref())
                        .map(|v| v.map(|v| Bytes::copy_from_slice(&v)))
                })
                .collect()
        })
        .await
    }

    /// How many entries stand (sled counts them by walking the tree).
    pub async fn len(&self) -> Result<usize, CacheError> {
        self.on_entries(|entries| Ok(entries.len())).await
    }

    pub async fn is_empty(&self) -> Result<bool, CacheError> {
        self.on_entries(|entries| Ok(entries.is_empty())).await
    }
}

impl Drop for LedgerCache {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || drop(db));
            }
            Err(_) => drop(db),
        }
    }
}

/// Runs `work` on a blocking thread of the current runtime.
async fn blocking<T: Send + 'static>(
    path: PathBuf,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CacheError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CacheError {
            path,
            reason: format!("the cache's blocking thread stopped: {e}"),
        })
}

/// Removes cache directories of processes that are gone (Linux: no `/proc/<pid>`).
fn remove_abandoned(base: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;

    #[tokio::test]
    async fn changes_apply_and_a_reopened_cache_starts_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = LedgerCache::open(dir.path()).await.expect("opens");
        let overlapping = LedgerCache::open(dir.path())
            .await
            .expect("a second task opens its own");
        assert!(overlapping.is_empty().await.expect("read"));
        let a = Bytes::from_static(b"t/0/1");
        let b = Bytes::from_static(b"t/0/2");
        cache
            .apply(vec![
                Change::Put(a.clone(), Bytes::new()),
                Change::Put(b.clone(), Bytes::from_static(b"42")),
            ])
            .await
            .expect("applied");
        cache
            .apply(vec![Change::Remove(a.clone())])
            .await
            .expect("applied");
        assert_eq!(
            cache
                .contains(vec![a.clone(), b.clone()])
                .await
                .expect("read"),
            vec![false, true]
        );
        assert_eq!(
            cache.get(vec![b.clone(), a.clone()]).await.expect("read"),
            vec![Some(Bytes::from_static(b"42")), None]
        );
        assert_eq!(cache.len().await.expect("read"), 1);
        drop(cache);
        drop(overlapping);
        // sled removes a temporary database when its last handle goes (ours on a blocking
        // thread), and its flusher thread may hold one a moment after ours are dropped.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(dir.path()).expect("dir").count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "removed after drop"
        );
        let reopened = LedgerCache::open(dir.path()).await.expect("reopens");
        assert!(
            reopened.is_empty().await.expect("read"),
            "rebuilt from the topic, not trusted from disk"
        );
    }

    /// sled's work runs off the thread that awaits the cache: while a large replay is written
    /// into it and looked up, the sink's pool thread (here a one-thread runtime, as an actix
    /// arbiter is) goes on running its other tasks.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_replay_does_not_hold_up_the_thread_that_awaits_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = LedgerCache::open(dir.path()).await.expect("opens");
        let keys: Vec<Bytes> = (0..20_000)
            .map(|i| Bytes::from(format!("topic/{}/{i}", i % 12)))
            .collect();
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let started = Instant::now();
        cache
            .apply(
                keys.iter()
                    .map(|k| Change::Put(k.clone(), Bytes::new()))
                    .collect(),
            )
            .await
            .expect("applied");
        let found = cache.contains(keys.clone()).await.expect("read");
        let standing = cache.len().await.expect("read");
        let took = started.elapsed();
        let during = ticks.load(Ordering::SeqCst);
        ticker.abort();
        assert!(found.iter().all(|f| *f));
        assert_eq!(standing, keys.len());
        // 5 ms ticks: took/5 if the thread were free all along; blocked by sled, 0 or 1.
        assert!(
            took >= Duration::from_millis(50),
            "the cache's work took only {took:?}: too short to tell"
        );
        assert!(
            during as u128 * 20 >= took.as_millis(),
            "the thread awaiting the cache was held up by sled: {during} ticks in {took:?}"
        );
    }
}
