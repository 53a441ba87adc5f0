//! Compiles every crate under `guests/` to `wasm32-wasip2` and embeds the
//! components, so `cargo build` and `cargo test` on a fresh checkout need no
//! other step (the pattern of wasmtime's test-programs crate).

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap();
    let guests = root.join("guests");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!(
        "cargo:rerun-if-changed={}",
        guests.join("Cargo.toml").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        guests.join("Cargo.lock").display()
    );
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    // Every crate under guests/, the libraries the guests share (the kit)
    // as much as the guests: a change to the kit alone changes them all.
    for entry in std::fs::read_dir(&guests).expect("guests/ directory") {
        let dir = entry.unwrap().path();
        if dir.join("Cargo.toml").exists() {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
    }

    ensure_target();
    let crates = guest_crates(&guests);

    let target_dir = out_dir.join("guests-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--target",
        TARGET,
        "--workspace",
        "--manifest-path",
    ])
    .arg(guests.join("Cargo.toml"))
    .env("CARGO_TARGET_DIR", &target_dir)
    // The outer build's flags are for the host, not for wasm.
    .env_remove("CARGO_ENCODED_RUSTFLAGS")
    .env_remove("RUSTFLAGS")
    .env_remove("CARGO_BUILD_TARGET")
    .env_remove("CARGO_PROFILE_RELEASE_DEBUG")
    .env_remove("CARGO_PROFILE_RELEASE_INCREMENTAL");
    let status = cmd
        .status()
        .expect("could not run cargo to build the guests");
    assert!(
        status.success(),
        "building the guests for {TARGET} failed (see the errors above)"
    );

    let mut code = String::new();
    for (kind, processors) in [("BUILTIN", false), ("PROCESSORS", true)] {
        code.push_str(&format!(
            "/// The built-in {}: (name, component bytes).\npub const {kind}: &[(&str, &[u8])] = &[\n",
            if processors { "example processors" } else { "guests" }
        ));
        for (name, dir) in &crates {
            if is_processor(dir) != processors {
                continue;
            }
            let wasm = target_dir
                .join(TARGET)
                .join("release")
                .join(format!("{}.wasm", name.replace('-', "_")));
            assert!(
                wasm.exists(),
                "guest {name} built but {} is missing",
                wasm.display()
            );
            code.push_str(&format!(
                "    ({name:?}, include_bytes!({:?})),\n",
                wasm.display().to_string()
            ));
        }
        code.push_str("];\n");
    }
    std::fs::write(out_dir.join("guests.rs"), code).unwrap();
}

/// Adds the wasm target with rustup when it is missing (RUSTUP_AUTO_INSTALL=0
/// machines do not add it by themselves), or fails with a one-line fix.
fn ensure_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim().to_string());
    if sysroot.join("lib/rustlib").join(TARGET).exists() {
        return;
    }
    let added = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(added, "the {TARGET} target is missing and `rustup target add {TARGET}` failed: install it, then rebuild");
}

/// A crate of the `processor` world (`[package.metadata.txstore] world =
/// "processor"`) rather than a strategy.
fn is_processor(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml"))
        .unwrap()
        .lines()
        .any(|l| l.replace(' ', "") == "world=\"processor\"")
}

/// (package name, directory) of every guest crate, in name order.
fn guest_crates(guests: &Path) -> Vec<(String, PathBuf)> {
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(guests).expect("guests/ directory") {
        let dir = entry.unwrap().path();
        let manifest = dir.join("Cargo.toml");
        if !manifest.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&manifest).unwrap();
        if !text.contains("cdylib") {
            continue; // a library shared by guests, not a guest
        }
        let name = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("name = ")
                    .map(|v| v.trim_matches('"').to_string())
            })
            .unwrap_or_else(|| panic!("no package name in {}", manifest.display()));
        crates.push((name, dir));
    }
    crates.sort();
    crates
}
