//! Paths a connector's configuration names (keys declared with [`Reach::FilePath`]), and the
//! confinement of a tenant's paths to its directory.
//!
//! Without confinement (authentication off, or the `default` tenant) a path is taken as
//! written, as Kafka Connect's FileStreamSink does. A confined connector carries its
//! directory in [`FILES_ROOT`]; its paths must then be relative (or absolute inside that
//! directory), without `..`, and may not leave the directory through a symbolic link.
//!
//! [`Reach::FilePath`]: spillway_core::config::Reach::FilePath

use std::path::{Component, Path, PathBuf};

use spillway_core::{ConfigError, ConfigMap};

use crate::runtime_keys::FILES_ROOT;

/// The directory `config`'s paths are confined to, when they are.
pub fn confinement(config: &ConfigMap) -> Option<PathBuf> {
    config
        .get(FILES_ROOT)
        .filter(|r| !r.trim().is_empty())
        .map(PathBuf::from)
}

/// Where the path `value` of `key` points: as written when `config` is not confined, else
/// inside its directory. Refuses, naming the key, a confined path that is absolute outside the
/// directory, holds `..`, or leads out of it through a symbolic link.
pub fn resolve(config: &ConfigMap, key: &str, value: &str) -> Result<PathBuf, ConfigError> {
    match confinement(config) {
        None => Ok(PathBuf::from(value)),
        Some(root) => confine(&root, key, value),
    }
}

/// `value` inside `root` (see [`resolve`]).
pub fn confine(root: &Path, key: &str, value: &str) -> Result<PathBuf, ConfigError> {
    let refuse = |reason: String| ConfigError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let path = Path::new(value);
    let relative = if path.is_absolute() {
        path.strip_prefix(root).map_err(|_| {
            refuse(format!(
                "a tenant's paths are relative to its directory {}; use a relative path such as 'out.txt'",
                root.display()
            ))
        })?
    } else {
        path
    };
    let mut clean = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse(
                "'..' is not allowed in a tenant's paths: they stay inside the tenant's directory"
                    .into(),
            )),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse("not a relative path".into()))
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(refuse(
            "names the tenant's directory itself; name a file or directory inside it".into(),
        ));
    }
    let joined = root.join(&clean);
    // The deepest part of the path that exists decides where it leads: a symbolic link in it
    // (or the whole path being one) must still end inside the directory.
    let real_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mut existing = Some(joined.as_path());
    while let Some(candidate) = existing {
        if candidate == root {
            break;
        }
        if candidate.symlink_metadata().is_ok() {
            let real = candidate.canonicalize().map_err(|e| {
                refuse(format!(
                    "cannot tell where {} leads ({e}); a symbolic link out of the tenant's directory is not allowed",
                    candidate.display()
                ))
            })?;
            if !real.starts_with(&real_root) {
                return Err(refuse(format!(
                    "{} leads out of the tenant's directory (to {}) through a symbolic link",
                    candidate.display(),
                    real.display()
                )));
            }
            break;
        }
        existing = candidate.parent();
    }
    Ok(joined)
}

/// Creates the confinement directory and the parents of `path` inside it, so that a confined
/// connector can write where its configuration says (it cannot create directories otherwise).
pub fn prepare(config: &ConfigMap, path: &Path) -> std::io::Result<()> {
    if let (Some(_), Some(parent)) = (confinement(config), path.parent()) {
        std::fs::create_dir_all(parent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(root: &Path, value: &str) -> String {
        confine(root, "file", value).expect_err(value).to_string()
    }

    #[test]
    fn confined_paths_stay_inside_the_tenants_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("acme");
        assert_eq!(
            confine(&root, "file", "out/a.txt").expect("relative"),
            root.join("out/a.txt")
        );
        assert_eq!(
            confine(&root, "file", &root.join("b.txt").display().to_string()).expect("inside"),
            root.join("b.txt")
        );
        assert!(refused(&root, "/etc/passwd").contains("relative"));
        assert!(refused(&root, "../globex/out.txt").contains("'..'"));
        assert!(refused(&root, "a/../../x").contains("'..'"));
        assert!(refused(&root, ".").contains("directory itself"));
        let message = refused(&root, &dir.path().join("globex/x").display().to_string());
        assert!(message.contains("file"), "names the key: {message}");
    }

    #[test]
    fn a_symbolic_link_out_of_the_directory_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("acme");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).expect("root");
        std::fs::create_dir_all(&outside).expect("outside");
        std::os::unix::fs::symlink(&outside, root.join("escape")).expect("link");
        std::os::unix::fs::symlink(outside.join("f"), root.join("file-link")).expect("link");
        std::os::unix::fs::symlink(root.join("inner"), root.join("inside")).expect("link");
        assert!(refused(&root, "escape/x.txt").contains("symbolic link"));
        assert!(refused(&root, "file-link").contains("symbolic link"));
        std::fs::create_dir_all(root.join("inner")).expect("inner");
        assert!(confine(&root, "file", "inside/x.txt").is_ok());
    }

    #[test]
    fn without_confinement_a_path_is_taken_as_written() {
        let config = ConfigMap::new();
        assert_eq!(
            resolve(&config, "file", "/tmp/x").expect("as written"),
            PathBuf::from("/tmp/x")
        );
        let confined: ConfigMap = [(FILES_ROOT.to_owned(), "/srv/t/acme".to_owned())].into();
        assert!(resolve(&confined, "file", "/tmp/x").is_err());
    }
}
