//! Shared helpers: the runtime, the binary, configs in temp directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use txstore::runtime::Runtime;

/// One runtime for the test process, caching compiled guests in a
/// directory of its own so tests never touch the user's cache.
pub fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| Runtime::new(Some(cache_dir())).expect("runtime"))
}

pub fn cache_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap())
        .path()
        .to_path_buf()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_txstore")
}

/// Runs `txstore args...` with the test cache; returns the output.
pub fn txstore(args: &[&str]) -> Output {
    txstore_env(args, &[])
}

pub fn txstore_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env("XDG_CACHE_HOME", cache_dir())
        .env_remove("TXSTORE_CRASH_AT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run txstore")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Asserts success, showing stderr otherwise.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "txstore failed: {}\n{}",
        o.status,
        stderr(o)
    );
    stdout(o)
}

/// Writes a config for `guest` with its state under `dir`; `extra` is
/// appended (more TOML tables).
pub fn write_config(dir: &Path, guest: &str, extra: &str) -> PathBuf {
    let path = dir.join("txstore.toml");
    let text = format!("[store]\nguest = {guest:?}\nstate_dir = \"state\"\n{extra}");
    std::fs::write(&path, text).unwrap();
    path
}
