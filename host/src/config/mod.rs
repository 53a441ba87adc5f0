//! The TOML configuration: which guest, where its state lives, the task's
//! guarantee and commit policy, the changelog and the sandbox limits.
//! Unknown keys and wrong types are errors that name the file and line.

mod changelog;
mod task;

pub use changelog::{ChangelogConfig, ChangelogKind, CleanMode};
pub use task::{
    Assignment, Guarantee, InputSpec, KafkaInput, OutputSpec, ProcessorSpec, TaskConfig,
};

use crate::runtime::{GuestSource, Limits};
use anyhow::{bail, Result};
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
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The directory relative paths are resolved against (the file's own).
    #[serde(skip)]
    pub base: PathBuf,
    /// Set by [`Config::for_partition`]: this is the config of one
    /// partition's task of a Kafka input, not the job's.
    #[serde(skip)]
    #[doc(hidden)]
    pub partition_task: Option<i32>,
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

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Where compiled guests are cached; defaults to `$XDG_CACHE_HOME/txstore`
    /// or `~/.cache/txstore`.
    pub cache_dir: Option<PathBuf>,
}

/// `[metrics]`: the Prometheus endpoint of `txstore run` (docs/metrics.md).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` to serve `GET /metrics` on (port 0: any free port,
    /// printed at start); off when absent.
    pub listen: Option<String>,
}

/// The `--option key=value` arguments that hand `options` to a child process.
pub fn option_args(options: &[(String, String)]) -> impl Iterator<Item = String> + '_ {
    options
        .iter()
        .flat_map(|(k, v)| ["--option".to_string(), format!("{k}={v}")])
}

impl Config {
    /// Reads and checks the configuration file `path` (relative paths in
    /// it are resolved against its directory). Errors name the file and
    /// line.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("txstore.toml");
    /// std::fs::write(&path, "[store]\nguest = \"buffered\"\nstate_dir = \"state\"\n[task]\ncomit_interval_ms = 5\n")?;
    /// let err = txstore::Config::load(&path).unwrap_err();
    /// assert!(matches!(err, txstore::Error::Config(_)));
    /// assert!(err.to_string().contains("txstore.toml:5"), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<Self, crate::error::Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            crate::error::marked(
                crate::error::Kind::Config,
                format!("cannot read config {}: {e}", path.display()),
            )
        })?;
        // `txstore.toml` has the parent "": relative paths then resolve
        // against ".", which (unlike "") names a directory to fsync.
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Self::parse(&text, &path.display().to_string(), &base)
    }

    /// Parses config text; `origin` names it in errors and `base` is the
    /// directory relative paths are resolved against.
    ///
    /// ```
    /// use txstore::Config;
    ///
    /// let config = Config::parse("[store]\nguest = \"roll-back\"\nstate_dir = \"s\"\n", "inline", "/srv".as_ref())?;
    /// assert_eq!(config.state_dir(), std::path::Path::new("/srv/s"));
    /// # Ok::<(), txstore::Error>(())
    /// ```
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<Self, crate::error::Error> {
        Self::parse_inner(text, origin, base).map_err(|e| {
            crate::error::Error::Config(crate::error::marked(
                crate::error::Kind::Config,
                format!("{e:#}"),
            ))
        })
    }

    fn parse_inner(text: &str, origin: &str, base: &Path) -> Result<Self> {
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
        for warning in deprecated_names(text, origin) {
            tracing::warn!("{warning}");
        }
        config.base = base.to_path_buf();
        config.changelog.check(origin)?;
        config.task.check(&config.changelog, origin)?;
        if config.task.commit_interval_records == 0 {
            bail!("{origin}: task.commit_interval_records must be at least 1");
        }
        crate::storage::check_name(crate::storage::NameKind::Store, &config.store.name)
            .map_err(|e| anyhow::anyhow!("{origin}: store.name: {e}"))?;
        Ok(config)
    }

    /// A config in memory with every default: `guest` (a built-in name or
    /// a component's path) keeping its store in `state_dir`.
    ///
    /// ```
    /// let config = txstore::Config::new("buffered", "state".as_ref());
    /// assert_eq!(config.store.guest, "buffered");
    /// ```
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
            metrics: MetricsConfig::default(),
            base: PathBuf::new(),
            partition_task: None,
        }
    }

    /// A path setting: `~/` is the home directory (as a shell would read
    /// it; a literal `~` directory is never what was meant), a relative
    /// path is the config's directory's.
    fn resolve(&self, p: &Path) -> PathBuf {
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        if let (Ok(rest), Some(home)) = (p.strip_prefix("~"), home) {
            return PathBuf::from(home).join(rest);
        }
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// The state directory, resolved against the config's directory.
    ///
    /// ```
    /// let config = txstore::Config::new("buffered", "/var/lib/app/state".as_ref());
    /// assert_eq!(config.state_dir(), std::path::Path::new("/var/lib/app/state"));
    /// ```
    pub fn state_dir(&self) -> PathBuf {
        self.resolve(&self.store.state_dir)
    }

    #[doc(hidden)]
    /// The Kafka changelog's topic: `changelog.topic`, else `<store.name>-changelog`.
    pub fn kafka_topic(&self) -> String {
        self.changelog
            .topic
            .clone()
            .unwrap_or_else(|| format!("{}-changelog", self.store.name))
    }

    #[doc(hidden)]
    /// Where the changelog is, for messages.
    pub fn changelog_name(&self) -> String {
        match self.changelog.kind {
            ChangelogKind::Embedded => format!("in {}", self.changelog_dir().display()),
            ChangelogKind::Kafka => format!(
                "Kafka topic `{}` partition {}",
                self.kafka_topic(),
                self.changelog.partition
            ),
        }
    }

    #[doc(hidden)]
    pub fn changelog_dir(&self) -> PathBuf {
        match &self.changelog.dir {
            Some(d) => self.resolve(d),
            None => self.state_dir().join("changelog"),
        }
    }

    #[doc(hidden)]
    /// The input file, when the input is one.
    pub fn input(&self) -> Option<PathBuf> {
        match &self.task.input {
            Some(InputSpec::File(p)) => Some(self.resolve(p)),
            _ => None,
        }
    }

    #[doc(hidden)]
    /// The output file, when the output is one.
    pub fn output_file(&self) -> Option<PathBuf> {
        match &self.task.output {
            Some(OutputSpec::File { path }) => Some(self.resolve(path)),
            _ => None,
        }
    }

    #[doc(hidden)]
    /// The Kafka input, when the input is one.
    pub fn kafka_input(&self) -> Option<&KafkaInput> {
        match &self.task.input {
            Some(InputSpec::Kafka(k)) => Some(k),
            _ => None,
        }
    }

    #[doc(hidden)]
    /// The config of the task for input partition `partition` of a Kafka
    /// input: store `<name>-<partition>` in its own directory under the
    /// state directory, changelog partition `partition` of the (shared)
    /// changelog topic, which has `partitions` partitions when created.
    pub fn for_partition(&self, partition: i32, partitions: i32) -> Config {
        let mut c = self.clone();
        let name = format!("{}-{partition}", self.store.name);
        c.changelog.topic = Some(self.kafka_topic());
        c.changelog.partition = partition;
        c.changelog.topic_partitions = Some(self.changelog.topic_partitions.unwrap_or(partitions));
        c.changelog.transactional_id = Some(match &self.changelog.transactional_id {
            Some(prefix) => format!("{prefix}-{partition}"),
            None => format!("txstore-{}-{partition}", self.kafka_topic()),
        });
        c.changelog.group_id = self
            .changelog
            .group_id
            .as_ref()
            .map(|g| format!("{g}-{partition}"));
        c.store.state_dir = self.state_dir().join(&name);
        c.store.name = name;
        c.partition_task = Some(partition);
        // The job's group, named before the store name gains its partition.
        if let Some(InputSpec::Kafka(input)) = &mut c.task.input {
            input
                .group_id
                .get_or_insert_with(|| format!("txstore-{}", self.store.name));
        }
        c
    }

    #[doc(hidden)]
    /// The guest: a built-in name, else a path relative to the config.
    pub fn guest(&self) -> GuestSource {
        match GuestSource::parse(&self.store.guest) {
            GuestSource::Path(p) => GuestSource::Path(self.resolve(&p)),
            builtin => builtin,
        }
    }

    #[doc(hidden)]
    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.runtime
            .cache_dir
            .as_ref()
            .map(|p| self.resolve(p))
            .or_else(default_cache_dir)
    }

    #[doc(hidden)]
    /// Adds `init` options given as `key=value` on a command line.
    pub fn add_init_options(&mut self, options: &[(String, String)]) {
        for (k, v) in options {
            self.store
                .options
                .insert(k.clone(), toml::Value::String(v.clone()));
        }
    }

    #[doc(hidden)]
    /// The `init` options as strings.
    pub fn init_options(&self) -> Vec<(String, String)> {
        as_strings(&self.store.options)
    }

    #[doc(hidden)]
    /// The wasm processor's `init` options as strings.
    pub fn processor_options(&self) -> Vec<(String, String)> {
        as_strings(&self.task.processor_options)
    }

    #[doc(hidden)]
    /// The wasm processor's path, when the processor is one.
    pub fn processor_path(&self) -> Option<PathBuf> {
        match &self.task.processor {
            ProcessorSpec::Wasm(p) => Some(self.resolve(p)),
            _ => None,
        }
    }
}

/// Option values as the WIT's strings (a TOML string unquoted).
fn as_strings(options: &BTreeMap<String, toml::Value>) -> Vec<(String, String)> {
    options
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

/// `$XDG_CACHE_HOME/txstore` or `~/.cache/txstore`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("txstore"))
}

/// Option names that changed, as (section, old, new): the old spelling is
/// still read (a serde alias), with a warning naming the new one.
const RENAMED: &[(&str, &str, &str)] =
    &[("task", "uncommitted_max_bytes", "max_uncommitted_bytes")];

/// One warning line per old option name the config text uses, with its line.
fn deprecated_names(text: &str, origin: &str) -> Vec<String> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new(); // the typed parse reports the syntax error
    };
    let mut warnings = Vec::new();
    for (section, old, new) in RENAMED {
        let used = table
            .get(*section)
            .and_then(|t| t.as_table())
            .is_some_and(|t| t.contains_key(*old));
        if !used {
            continue;
        }
        let at = text
            .lines()
            .position(|l| l.trim_start().starts_with(old))
            .map(|i| format!(":{}", i + 1))
            .unwrap_or_default();
        warnings.push(format!(
            "{origin}{at}: {section}.{old} is deprecated: it is now {section}.{new} (same meaning)"
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `~/` in a path setting is the home directory, never a directory
    /// named `~` next to the config (whose obvious clean-up, `rm -rf ~`,
    /// would delete the home directory).
    #[test]
    fn a_tilde_is_the_home_directory() {
        let home = PathBuf::from(std::env::var_os("HOME").expect("HOME is set"));
        let text = "[store]\nguest = \"buffered\"\nstate_dir = \"~/s\"\n[runtime]\ncache_dir = \"~/.cache/txstore\"\n";
        let c = Config::parse(text, "c.toml", Path::new("/etc/app")).unwrap();
        assert_eq!(c.state_dir(), home.join("s"));
        assert_eq!(c.cache_dir(), Some(home.join(".cache/txstore")));
        let text = "[store]\nguest = \"buffered\"\nstate_dir = \"~s\"\n";
        let c = Config::parse(text, "c.toml", Path::new("/etc/app")).unwrap();
        assert_eq!(c.state_dir(), Path::new("/etc/app/~s"));
    }

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

    /// An old option name still works, says it is old, and cannot be
    /// given beside its new name.
    #[test]
    fn a_renamed_option_is_read_with_a_warning() {
        let text = "[store]\nguest = \"buffered\"\nstate_dir = \"s\"\n[task]\nuncommitted_max_bytes = 4096\n";
        let c = Config::parse(text, "c.toml", Path::new(".")).unwrap();
        assert_eq!(c.task.max_uncommitted_bytes, 4096);
        assert_eq!(
            deprecated_names(text, "c.toml"),
            ["c.toml:5: task.uncommitted_max_bytes is deprecated: it is now task.max_uncommitted_bytes (same meaning)"]
        );
        let new = text.replace("uncommitted_max_bytes", "max_uncommitted_bytes");
        assert!(deprecated_names(&new, "c.toml").is_empty());
        let both = format!("{new}uncommitted_max_bytes = 1\n");
        let err = Config::parse(&both, "c.toml", Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate field"), "{err}");
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

    #[test]
    fn kafka_changelog_settings() {
        let base = "[store]\nname = \"wc\"\nguest = \"g\"\nstate_dir = \"s\"\n[changelog]\n";
        let parse =
            |extra: &str| Config::parse(&format!("{base}{extra}"), "c.toml", Path::new("."));
        let err = |extra: &str| format!("{:#}", parse(extra).unwrap_err());
        assert_eq!(
            err("kind = \"kafka\"\n"),
            "c.toml: changelog.kind = \"kafka\" needs changelog.bootstrap_servers"
        );
        assert_eq!(
            err("topic = \"t\"\n"),
            "c.toml: changelog.topic is only for kind = \"kafka\""
        );
        assert!(err("kind = \"kafak\"\n").starts_with("c.toml:6: unknown variant `kafak`"));
    }

    #[test]
    fn kafka_input_and_output_settings() {
        let base = "[store]\nname = \"wc\"\nguest = \"g\"\nstate_dir = \"s\"\n";
        let kafka = "[changelog]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\n";
        let parse =
            |extra: &str| Config::parse(&format!("{base}{extra}"), "c.toml", Path::new("/etc"));
        let err = |extra: &str| format!("{:#}", parse(extra).unwrap_err());
        let c = parse(&format!(
            "[task]\nthreads = 2\noutput = {{ kind = \"kafka\", topic = \"out\" }}\n\
             input = {{ kind = \"kafka\", topic = \"in\" }}\n{kafka}"
        ))
        .unwrap();
        assert_eq!(c.kafka_input().unwrap().topic, "in");
        assert_eq!(c.kafka_input().unwrap().assignment, Assignment::Cooperative);
        let p3 = c.for_partition(3, 6);
        assert_eq!(p3.store.name, "wc-3");
        assert_eq!(p3.state_dir(), PathBuf::from("/etc/s/wc-3"));
        assert!(
            err("[task]\ninput = { kind = \"kafka\", topic = \"in\" }\n")
                .contains("needs changelog.kind = \"kafka\"")
        );
        assert!(err(&format!("[task]\ninput = {{ kind = \"kafka\", topic = \"in\", assignment = \"static\" }}\n{kafka}"))
            .contains("needs task.input.partitions"));
        assert!(err(&format!(
            "[task]\ninput = {{ kind = \"kafka\", topic = \"in\", partitons = [1] }}\n{kafka}"
        ))
        .contains("unknown field `partitons`"));
        assert!(err("[task]\ninput = { kind = \"kafak\" }\n").contains("task.input.kind must be"));
        assert!(err(&format!(
            "[task]\ninput = {{ kind = \"kafka\", topic = \"in\" }}\noutput = {{ kind = \"file\", path = \"o\" }}\n{kafka}"
        ))
        .contains("is for a file input"));
        let c =
            parse("[task]\ninput = \"in.txt\"\noutput = { kind = \"file\", path = \"o.txt\" }\n")
                .unwrap();
        assert_eq!(c.input(), Some(PathBuf::from("/etc/in.txt")));
        assert_eq!(c.output_file(), Some(PathBuf::from("/etc/o.txt")));
    }

    #[test]
    fn standby_settings_are_checked() {
        let base = "[store]\nname = \"wc\"\nguest = \"g\"\nstate_dir = \"s\"\n";
        let kafka = "[changelog]\nkind = \"kafka\"\nbootstrap_servers = \"b:9092\"\n";
        let parse = |task: &str, input: &str| {
            Config::parse(
                &format!("{base}[task]\n{task}\ninput = {{ kind = \"kafka\", topic = \"in\"{input} }}\n{kafka}"),
                "c.toml",
                Path::new("/etc"),
            )
        };
        let err = |task: &str, input: &str| format!("{:#}", parse(task, input).unwrap_err());
        let c = parse("standby_replicas = 2", "").unwrap();
        assert_eq!(c.task.standby_replicas, 2);
        let c = parse(
            "",
            ", assignment = \"static\", partitions = [0], standby_partitions = [0, 1]",
        )
        .unwrap();
        assert_eq!(c.kafka_input().unwrap().standby_partitions, [0, 1]);
        assert!(parse("", ", standby_partitions = [3]").is_ok());
        assert!(
            err("", ", standby_partitions = [-1]").contains("standby_partitions: -1 is negative")
        );
        assert!(err(
            "standby_replicas = 1",
            ", assignment = \"static\", partitions = [0]"
        )
        .contains("list them in task.input.standby_partitions"));
        assert!(err("standby_replicas = 17", "").contains("at most 16"));
        let file = Config::parse(
            &format!("{base}[task]\nstandby_replicas = 1\ninput = \"in.txt\"\n"),
            "c.toml",
            Path::new("/etc"),
        );
        assert!(format!("{:#}", file.unwrap_err()).contains("is for a Kafka input"));
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
