//! The TOML configuration: which guest, where its state lives, the task's
//! guarantee and commit policy, the changelog and the sandbox limits.
//! Unknown keys and wrong types are errors that name the file and line.

use crate::runtime::{GuestSource, Limits};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub store: StoreConfig,
    #[serde(default)]
    pub task: TaskConfig,
    #[serde(default)]
    pub changelog: ChangelogConfig,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// The directory relative paths are resolved against (the file's own).
    #[serde(skip)]
    pub base: PathBuf,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// The store's name (its namespace in storage).
    #[serde(default = "default_store_name")]
    pub name: String,
    /// A built-in guest name (`txstore inspect` lists them) or a `.wasm` path.
    pub guest: String,
    /// Where the store's data, changelog and checkpoint live.
    pub state_dir: PathBuf,
    #[serde(default)]
    pub backend: BackendKind,
    /// Passed to the guest's `init` as strings.
    #[serde(default)]
    pub options: BTreeMap<String, toml::Value>,
}

fn default_store_name() -> String {
    "store".into()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    #[default]
    Rocksdb,
    Memory,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

impl std::fmt::Display for Guarantee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Guarantee::ExactlyOnce => "exactly-once",
            Guarantee::AtLeastOnce => "at-least-once",
        })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessorKind {
    /// `key<TAB>value` puts, `key` alone deletes.
    #[default]
    Kv,
    /// Counts words (runs of ASCII letters and digits, lowercased).
    WordCount,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    pub guarantee: Guarantee,
    pub processor: ProcessorKind,
    /// The input file for `txstore run` (overridden by `--input`).
    pub input: Option<PathBuf>,
    /// Commit after this many input records...
    pub commit_interval_records: u64,
    /// ...or after this much time, whichever comes first.
    pub commit_interval_ms: u64,
    /// Commit early when the guest holds more uncommitted bytes than this
    /// (Kafka's `statestore.uncommitted.max.bytes`).
    pub uncommitted_max_bytes: u64,
    /// After a guest trap or limit breach, `txstore run` discards the
    /// instance and restarts from recovery up to this many times; 0 stops
    /// with the error.
    pub restarts_on_guest_failure: u32,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            guarantee: Guarantee::ExactlyOnce,
            processor: ProcessorKind::Kv,
            input: None,
            commit_interval_records: 10_000,
            commit_interval_ms: 100,
            uncommitted_max_bytes: 64 << 20,
            restarts_on_guest_failure: 0,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChangelogConfig {
    /// Only `embedded` so far: segment files in `dir`.
    pub kind: String,
    /// Defaults to `<state_dir>/changelog`.
    pub dir: Option<PathBuf>,
    /// A segment is rolled at the first commit past this size.
    pub segment_bytes: u64,
}

impl Default for ChangelogConfig {
    fn default() -> Self {
        Self {
            kind: "embedded".into(),
            dir: None,
            segment_bytes: 64 << 20,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Where compiled guests are cached; defaults to `$XDG_CACHE_HOME/txstore`
    /// or `~/.cache/txstore`.
    pub cache_dir: Option<PathBuf>,
}

impl Config {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), &base)
    }

    /// Parses config text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<Self> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(span) => {
                    // Bytes, not str slicing: a span may not fall on a char boundary.
                    let before = &text.as_bytes()[..span.start.min(text.len())];
                    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
                    anyhow::anyhow!("{origin}:{line}: {msg}")
                }
                None => anyhow::anyhow!("{origin}: {msg}"),
            }
        })?;
        config.base = base.to_path_buf();
        if config.changelog.kind != "embedded" {
            bail!(
                "{origin}: changelog.kind `{}` is not supported (only `embedded`)",
                config.changelog.kind
            );
        }
        if config.task.commit_interval_records == 0 {
            bail!("{origin}: task.commit_interval_records must be at least 1");
        }
        crate::storage::check_name(crate::storage::NameKind::Store, &config.store.name)
            .map_err(|e| anyhow::anyhow!("{origin}: store.name: {e}"))?;
        Ok(config)
    }

    /// A config in memory, for tests and the library API.
    pub fn new(guest: &str, state_dir: &Path) -> Self {
        Self {
            store: StoreConfig {
                name: default_store_name(),
                guest: guest.into(),
                state_dir: state_dir.into(),
                backend: BackendKind::Rocksdb,
                options: BTreeMap::new(),
            },
            task: TaskConfig::default(),
            changelog: ChangelogConfig::default(),
            limits: Limits::default(),
            runtime: RuntimeConfig::default(),
            base: PathBuf::new(),
        }
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.resolve(&self.store.state_dir)
    }

    pub fn changelog_dir(&self) -> PathBuf {
        match &self.changelog.dir {
            Some(d) => self.resolve(d),
            None => self.state_dir().join("changelog"),
        }
    }

    pub fn input(&self) -> Option<PathBuf> {
        self.task.input.as_ref().map(|p| self.resolve(p))
    }

    /// The guest: a built-in name, else a path relative to the config.
    pub fn guest(&self) -> GuestSource {
        match GuestSource::parse(&self.store.guest) {
            GuestSource::Path(p) => GuestSource::Path(self.resolve(&p)),
            builtin => builtin,
        }
    }

    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.runtime
            .cache_dir
            .as_ref()
            .map(|p| self.resolve(p))
            .or_else(default_cache_dir)
    }

    /// The `init` options as strings.
    pub fn init_options(&self) -> Vec<(String, String)> {
        self.store
            .options
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect()
    }
}

/// `$XDG_CACHE_HOME/txstore` or `~/.cache/txstore`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("txstore"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_name_the_line() {
        let text = "[store]\nguest = \"wipe-on-crash\"\nstate_dir = \"s\"\n\n[task]\ncomit_interval_ms = 5\n";
        let err = Config::parse(text, "c.toml", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("c.toml:6: unknown field `comit_interval_ms`"),
            "{err}"
        );
        let text = "[store]\nguest = \"wipe-on-crash\"\nstate_dir = 5\n";
        let err = Config::parse(text, "c.toml", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml:3: "), "{err}");
    }

    #[test]
    fn defaults_and_options() {
        let text =
            "[store]\nguest = \"g\"\nstate_dir = \"s\"\noptions = { limit = 64, mode = \"x\" }\n";
        let c = Config::parse(text, "c.toml", Path::new("/etc/tx")).unwrap();
        assert_eq!(c.state_dir(), PathBuf::from("/etc/tx/s"));
        assert_eq!(c.changelog_dir(), PathBuf::from("/etc/tx/s/changelog"));
        assert_eq!(c.task.guarantee, Guarantee::ExactlyOnce);
        assert_eq!(
            c.init_options(),
            vec![("limit".into(), "64".into()), ("mode".into(), "x".into())]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any text: a config or one error line with a line number, never a panic.
        #[test]
        fn fuzz_parse_never_panics(text in "(\\PC|\n|\\[|\\]|=|\"){0,200}") {
            if let Err(e) = Config::parse(&text, "f.toml", Path::new(".")) {
                let msg = format!("{e:#}");
                proptest::prop_assert!(msg.starts_with("f.toml"), "{}", msg);
            }
        }

        /// Real keys with random values: same.
        #[test]
        fn fuzz_parse_known_keys(value in "[a-z0-9\"{}=., ]{0,20}", key in proptest::sample::select(vec!["guest", "state_dir", "backend", "name", "options"])) {
            let text = format!("[store]\n{key} = {value}\n[task]\ncommit_interval_ms = {value}\n");
            let _ = Config::parse(&text, "f.toml", Path::new("."));
        }
    }
}
