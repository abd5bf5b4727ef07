//! The launcher's Python environment: a venv under `tools/.venv` holding the pinned
//! `confluent-kafka` wheel, created on first use so that no one has to set it up by hand.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel that ships librdkafka's mock cluster and the reference `ShareConsumer`.
pub const CONFLUENT_KAFKA_PIN: &str = "confluent-kafka==2.16.1";

/// `tools/` of the workspace; `SPILLWAY_TOOLS_DIR` overrides it (for an installed binary).
pub fn tools_dir() -> PathBuf {
    match std::env::var_os("SPILLWAY_TOOLS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("tools"),
    }
}

/// Returns the venv's python, creating the venv first if needed. Safe to call from many test
/// processes at once: creation happens under an exclusive file lock, and a venv counts as ready
/// only once its marker file exists.
pub fn venv_python() -> Result<PathBuf, String> {
    let tools = tools_dir();
    let venv = tools.join(".venv");
    let python = venv.join("bin").join("python");
    let marker = venv.join(".spillway-ready");
    if marker.exists() {
        return Ok(python);
    }
    let lock_path = tools.join(".venv.lock");
    let lock = File::create(&lock_path)
        .map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
    if marker.exists() {
        return Ok(python);
    }
    let host_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    run(
        Command::new(&host_python)
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        &format!("{host_python} -m venv {}", venv.display()),
    )?;
    run(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            CONFLUENT_KAFKA_PIN,
        ]),
        &format!("pip install {CONFLUENT_KAFKA_PIN}"),
    )?;
    fs::write(&marker, CONFLUENT_KAFKA_PIN)
        .map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    Ok(python)
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("`{what}` could not start: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{what}` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
