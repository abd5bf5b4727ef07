//! The storage layer's errors. Each names the store's path or the record involved and, where
//! the user has something to do, says what.

use std::path::PathBuf;

/// Errors of the state store.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("cannot open the state store at {path}: {error}. Check that the directory exists and is writable and that no other worker uses it; if the files are damaged, restore {path} from a backup or move it aside to start with empty state")]
    Open { path: PathBuf, error: sled::Error },
    #[error("the state store at {path} was written by a newer Spillway (format version {found}; this build reads up to {supported}). Run a Spillway at least as new as the one that wrote it, or point state.dir at another directory")]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("the state store at {path} is damaged: {detail}. Restore {path} from a backup, or move it aside to start with empty state (every connector would have to be created again)")]
    Damaged { path: PathBuf, detail: String },
    #[error("cannot write to the state store at {path}: {error}")]
    Write { path: PathBuf, error: sled::Error },
    #[error("cannot read the state store at {path}: {error}")]
    Read { path: PathBuf, error: sled::Error },
    #[error("the cluster's state in Kafka (config.storage.topic, status.storage.topic): {0}")]
    Kafka(String),
    #[error(
        "{kind} name '{name}' cannot be stored: it must be non-empty and hold no NUL character"
    )]
    InvalidName { kind: &'static str, name: String },
}
