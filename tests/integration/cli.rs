//! The command line: inspect, put/get/scan round trips, and bad input.

use crate::common::{ok, stderr, txstore, txstore_env, write_config};

#[test]
fn inspect_builtin_prints_world_and_transactional() {
    let out = ok(&txstore(&["inspect", "wipe-on-crash"]));
    assert!(
        out.contains("world:          txstore:store/store@0.1.0"),
        "{out}"
    );
    assert!(out.contains("transactional:  false"), "{out}");
    assert!(out.contains("txstore:store/state-store@0.1.0"), "{out}");
}

/// The first load compiles and writes the cache; the second must not compile.
#[test]
fn second_load_uses_the_compilation_cache() {
    let cache = tempfile::tempdir().unwrap();
    let env = [("XDG_CACHE_HOME", cache.path().to_str().unwrap())];
    let first = ok(&txstore_env(&["inspect", "roll-back"], &env));
    assert!(first.contains("(compiled)"), "{first}");
    let second = ok(&txstore_env(&["inspect", "roll-back"], &env));
    assert!(second.contains("(cached compilation)"), "{second}");
}

#[test]
fn put_get_scan_round_trip_on_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "wipe-on-crash", "");
    let c = config.to_str().unwrap();
    ok(&txstore(&["put", "beta", "2", "--config", c]));
    ok(&txstore(&["put", "alpha", "1", "--config", c]));
    ok(&txstore(&["put", "gamma", "3", "--config", c]));
    ok(&txstore(&["delete", "gamma", "--config", c]));
    assert_eq!(ok(&txstore(&["get", "alpha", "--config", c])), "1\n");
    assert_eq!(
        ok(&txstore(&["scan", "--config", c])),
        "alpha\t1\nbeta\t2\n"
    );
    assert_eq!(
        ok(&txstore(&[
            "scan",
            "--from",
            "b",
            "--config",
            c,
            "--isolation",
            "uncommitted"
        ])),
        "beta\t2\n"
    );
    let json = ok(&txstore(&["scan", "--config", c, "--format", "json"]));
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows[1]["key"], "beta");
    let missing = txstore(&["get", "gamma", "--config", c]);
    assert!(!missing.status.success());
    assert_eq!(stderr(&missing).trim(), "error: key gamma not found");
}

/// A component built against another version of the contract is refused
/// with both versions named.
#[test]
fn other_wit_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wat = r#"(component
        (type $store (instance))
        (import "txstore:store/storage@0.2.0" (instance (type $store)))
        (instance $api)
        (export "txstore:store/state-store@0.2.0" (instance $api)))"#;
    let path = dir.path().join("v2.wasm");
    std::fs::write(&path, wat::parse_str(wat).unwrap()).unwrap();
    let out = txstore(&["inspect", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("built against txstore:store@0.2.0")
            && err.contains("provides txstore:store@0.1.0"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one error line: {err}");
}

#[test]
fn core_module_and_garbage_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, wat::parse_str("(module)").unwrap()).unwrap();
    let err = stderr(&txstore(&["inspect", core.to_str().unwrap()]));
    assert!(
        err.contains("is a core WebAssembly module, not a component"),
        "{err}"
    );
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"hello world").unwrap();
    let err = stderr(&txstore(&["inspect", junk.to_str().unwrap()]));
    assert!(err.contains("is not a WebAssembly file"), "{err}");
    let err = stderr(&txstore(&["inspect", "/no/such/guest.wasm"]));
    assert!(
        err.contains("cannot read guest /no/such/guest.wasm"),
        "{err}"
    );
}

/// A component that exports some other world is refused, naming what it exports.
#[test]
fn other_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wat = r#"(component (instance $i) (export "example:other/api@1.0.0" (instance $i)))"#;
    let path = dir.path().join("other.wasm");
    std::fs::write(&path, wat::parse_str(wat).unwrap()).unwrap();
    let err = stderr(&txstore(&["inspect", path.to_str().unwrap()]));
    assert!(
        err.contains("does not export txstore:store/state-store@0.1.0")
            && err.contains("example:other/api@1.0.0"),
        "{err}"
    );
}

/// A guest that imports an interface the host does not link (here
/// wasi:http, and a WASI release the host does not have) is refused before
/// it runs, with one line naming the import.
#[test]
fn unprovided_import_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for import in [
        "wasi:http/outgoing-handler@0.2.0",
        "wasi:cli/environment@0.3.0",
    ] {
        let wat = format!(
            r#"(component
                (import "{import}" (instance (export "f" (func))))
                (instance $api)
                (export "txstore:store/state-store@0.1.0" (instance $api)))"#
        );
        let path = dir.path().join("imports.wasm");
        std::fs::write(&path, wat::parse_str(&wat).unwrap()).unwrap();
        let out = txstore(&["inspect", path.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
        assert!(
            line.contains(&format!(
                "imports `{import}`, which this host does not provide"
            )),
            "{err}"
        );
    }
}

#[test]
fn config_typo_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "wipe-on-crash",
        "[task]\nguarantee = \"exactly-once\"\ncommit_intervl_ms = 5\n",
    );
    let out = txstore(&["get", "x", "--config", config.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        err.contains("txstore.toml:6: unknown field `commit_intervl_ms`"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = txstore(&[
        "get",
        "x",
        "--config",
        dir.path().join("nope.toml").to_str().unwrap(),
    ]);
    assert!(
        stderr(&out).contains("cannot read config"),
        "{}",
        stderr(&out)
    );
}
