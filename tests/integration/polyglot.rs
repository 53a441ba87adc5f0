//! Guests written in other languages, built by their own scripts with their
//! own tools (componentize-py for Python, jco/componentize-js for
//! JavaScript), then held to the same checks as the built-in guests: the
//! conformance suite and the word-count crash sweep; the Python processor
//! to the processors' crash sweep. The two guests as they were when WIT
//! 0.1.0 was current (`tests/compat`) are built against `wit/0.1.0` and
//! must still pass the suite: the host links both versions.
//!
//! A missing tool skips the tests with one `SKIPPED` line on stderr; with
//! `TXSTORE_REQUIRE_POLYGLOT=1` (CI) it fails them instead.

use crate::common::{ok, txstore};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Exit code of a build script whose tool is not installed.
const SKIPPED: i32 = 3;

/// Builds `examples/{example}` with its `build.sh` into this test run's
/// temporary directory and compiles it once (so the tests that use it do
/// not race to compile the same large component). `None` after saying why
/// when the tool is missing.
fn build(example: &str, wasm: &str) -> Result<PathBuf, String> {
    build_from(example, wasm, None)
}

/// As `build`, with the sources of `tests/compat/{compat}` built against
/// `wit/0.1.0` by the example's own `build.sh`.
fn build_from(example: &str, wasm: &str, compat: Option<&str>) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(compat.unwrap_or(example));
    let mut build = Command::new("bash");
    build
        .arg(root.join("examples").join(example).join("build.sh"))
        .arg(&out_dir);
    if let Some(compat) = compat {
        build
            .arg(root.join("tests/compat").join(compat))
            .arg(root.join("wit/0.1.0"));
    }
    let out = build.output().expect("run bash");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() == Some(SKIPPED) {
        if std::env::var_os("TXSTORE_REQUIRE_POLYGLOT").is_some_and(|v| v == "1") {
            panic!("TXSTORE_REQUIRE_POLYGLOT=1 but examples/{example} was not built: {said}");
        }
        return Err(said.trim().to_string());
    }
    assert!(
        out.status.success(),
        "examples/{example}/build.sh failed: {said}"
    );
    let path = out_dir.join(wasm);
    let inspected = ok(&txstore(&["inspect", path.to_str().unwrap()]));
    if compat.is_some() {
        assert!(
            inspected.contains("txstore:store/state-store@0.1.0"),
            "tests/compat/{compat:?} was not built for 0.1.0: {inspected}"
        );
    }
    Ok(path)
}

/// The built guest, or `None` after telling the test's skip reason.
fn built(b: &'static Result<PathBuf, String>, test: &str) -> Option<&'static Path> {
    match b {
        Ok(path) => Some(path),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

fn python_guest(test: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built(
        BUILT.get_or_init(|| build("python-guest", "python_guest.wasm")),
        test,
    )
}

fn python_processor(test: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built(
        BUILT.get_or_init(|| build("python-processor", "python_processor.wasm")),
        test,
    )
}

fn js_guest(test: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built(
        BUILT.get_or_init(|| build("js-guest", "js_guest.wasm")),
        test,
    )
}

fn python_guest_0_1_0(test: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built(
        BUILT.get_or_init(|| {
            build_from(
                "python-guest",
                "python_guest.wasm",
                Some("python-guest-0.1.0"),
            )
        }),
        test,
    )
}

fn js_guest_0_1_0(test: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    built(
        BUILT.get_or_init(|| build_from("js-guest", "js_guest.wasm", Some("js-guest-0.1.0"))),
        test,
    )
}

/// The suite's crash exploration in the process-crash modes (the power mode
/// and the I/O error pass exercise the host's files and storage, which the
/// built-in guests' runs cover). Bounded hard by default: these guests run
/// interpreted (8 minutes for the JavaScript one at 12 points per step);
/// `TXSTORE_LONG_TESTS=1` runs the suite's default settings.
fn conformance(guest: &Path) {
    let mut args = vec![
        "conformance",
        guest.to_str().unwrap(),
        "--modes",
        "lossy,+flush",
        "--no-io-errors",
    ];
    if std::env::var_os("TXSTORE_LONG_TESTS").is_none_or(|v| v != "1") {
        args.extend(["--ops", "80", "--seeds", "0", "--max-points", "4"]);
    }
    let out = txstore(&args);
    let text = ok(&out);
    assert!(text.contains(": PASS ("), "{text}");
    eprintln!("{}", text.trim());
}

#[test]
fn python_guest_passes_conformance() {
    if let Some(guest) = python_guest("python_guest_passes_conformance") {
        conformance(guest);
    }
}

#[test]
fn python_guest_word_count_is_exact_after_every_crash() {
    if let Some(guest) = python_guest("python_guest_word_count_is_exact_after_every_crash") {
        crate::strategies::sweep(guest.to_str().unwrap());
    }
}

#[test]
fn js_guest_passes_conformance() {
    if let Some(guest) = js_guest("js_guest_passes_conformance") {
        conformance(guest);
    }
}

#[test]
fn js_guest_word_count_is_exact_after_every_crash() {
    if let Some(guest) = js_guest("js_guest_word_count_is_exact_after_every_crash") {
        crate::strategies::sweep(guest.to_str().unwrap());
    }
}

/// Built for 0.1.0 before the packed types existed, and unchanged since:
/// the host's 0.1.0 linker must serve it as it did.
#[test]
fn python_guest_built_for_0_1_0_passes_conformance() {
    if let Some(guest) = python_guest_0_1_0("python_guest_built_for_0_1_0_passes_conformance") {
        conformance(guest);
    }
}

#[test]
fn js_guest_built_for_0_1_0_passes_conformance() {
    if let Some(guest) = js_guest_0_1_0("js_guest_built_for_0_1_0_passes_conformance") {
        conformance(guest);
    }
}

/// The Python processor (running statistics, like the Rust example) held
/// to the Rust one's sweep: every strategy, every crash and power-loss
/// scenario, exact store and output.
#[test]
fn python_processor_is_exact_after_every_crash_and_power_loss() {
    if let Some(p) = python_processor("python_processor_is_exact_after_every_crash_and_power_loss")
    {
        let crashes = crate::processors::sweep(p);
        eprintln!("python-processor: {crashes} crashes, exact after each");
    }
}
