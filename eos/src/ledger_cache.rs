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

pub struct LedgerCache {
    path: PathBuf,
    _db: sled::Db,
    entries: sled::Tree,
}

impl LedgerCache {
    /// Opens a new, empty cache in a directory of its own under `base`.
    pub fn open(base: &Path) -> Result<LedgerCache, CacheError> {
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
            _db: db,
            entries,
        })
    }

    fn fail(&self, e: sled::Error) -> CacheError {
        CacheError {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    pub fn apply(&self, changes: Vec<Change>) -> Result<(), CacheError> {
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
        self.entries.apply_batch(batch).map_err(|e| self.fail(e))
    }

    pub fn contains(&self, key: &Bytes) -> Result<bool, CacheError> {
        self.entries
            .contains_key(key.as_ref())
            .map_err(|e| self.fail(e))
    }

    /// The value a standing key has.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, CacheError> {
        self.entries
            .get(key)
            .map(|v| v.map(|v| Bytes::copy_from_slice(&v)))
            .map_err(|e| self.fail(e))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
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
    use super::*;

    #[test]
    fn changes_apply_and_a_reopened_cache_starts_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = LedgerCache::open(dir.path()).expect("opens");
        let overlapping = LedgerCache::open(dir.path()).expect("a second task opens its own");
        assert!(overlapping.is_empty());
        let a = Bytes::from_static(b"t/0/1");
        let b = Bytes::from_static(b"t/0/2");
        cache
            .apply(vec![
                Change::Put(a.clone(), Bytes::new()),
                Change::Put(b.clone(), Bytes::from_static(b"42")),
            ])
            .expect("applied");
        cache
            .apply(vec![Change::Remove(a.clone())])
            .expect("applied");
        assert!(!cache.contains(&a).expect("read"));
        assert!(cache.contains(&b).expect("read"));
        assert_eq!(cache.get(&b).expect("read").as_deref(), Some(&b"42"[..]));
        assert_eq!(cache.get(&a).expect("read"), None);
        drop(cache);
        drop(overlapping);
        // sled removes a temporary database when its last handle goes, and its flusher thread
        // may hold one a moment after ours are dropped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_dir(dir.path()).expect("dir").count() > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("dir").count(),
            0,
            "removed after drop"
        );
        let reopened = LedgerCache::open(dir.path()).expect("reopens");
        assert!(
            reopened.is_empty(),
            "rebuilt from the topic, not trusted from disk"
        );
    }
}
