//! Shared helpers: the runtime, the binary, configs in temp directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};
use txstore::Runtime;

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

/// `txstore recover --json` on `config`, parsed.
pub fn recover_json(config: &Path) -> serde_json::Value {
    let json = ok(&txstore(&[
        "recover",
        "--config",
        config.to_str().unwrap(),
        "--json",
    ]));
    serde_json::from_str(&json).unwrap()
}

/// Writes a config for `guest` with its state under `dir`; `extra` is
/// appended (more TOML tables).
pub fn write_config(dir: &Path, guest: &str, extra: &str) -> PathBuf {
    let path = dir.join("txstore.toml");
    let text = format!("[store]\nguest = {guest:?}\nstate_dir = \"state\"\n{extra}");
    std::fs::write(&path, text).unwrap();
    path
}

/// Builds the planted guest with `feature` (none: the correct control)
/// for wasm32-wasip2, outside the host's build, as a guest author would.
pub fn planted(feature: Option<&str>) -> PathBuf {
    build_component("planted", feature)
}

/// Builds the component crate `tests/{name}` (with `feature`) for
/// wasm32-wasip2, outside the host's build; one build at a time.
pub fn build_component(name: &str, feature: Option<&str>) -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _one_build_at_a_time = LOCK.lock().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests")
        .join(name);
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    cmd.args([
        "build",
        "--quiet",
        "--release",
        "--target",
        "wasm32-wasip2",
        "--manifest-path",
    ])
    .arg(root.join("Cargo.toml"))
    .env("CARGO_TARGET_DIR", &target)
    .env_remove("RUSTFLAGS")
    .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "building {name} {feature:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = target.join(format!(
        "wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ));
    let named = target.join(format!("{name}-{}.wasm", feature.unwrap_or("correct")));
    // Copied aside, then renamed over: a test of another thread may be
    // loading the file an earlier build put there, and must see all of it.
    let part = named.with_extension("wasm.part");
    std::fs::copy(built, &part).unwrap();
    std::fs::rename(&part, &named).unwrap();
    named
}

/// What the store holds (key -> value), through `txstore scan`.
pub fn scan(config: &Path) -> BTreeMap<String, String> {
    ok(&txstore(&["scan", "--config", config.to_str().unwrap()]))
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}
