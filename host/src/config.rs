//! The TOML configuration: which guest, where its state lives, the task's
//! guarantee and commit policy, the changelog and the sandbox limits.
//! Unknown keys and wrong types are errors that name the file and line.

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

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize, clap::ValueEnum,
)]
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

/// `task.processor`: a built-in name or a processor component's path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProcessorSpec {
    /// `key<TAB>value` puts, `key` alone deletes.
    #[default]
    Kv,
    /// Counts words (runs of ASCII letters and digits, lowercased).
    WordCount,
    /// A component of the `processor` world (a path ending in `.wasm`,
    /// relative to the config file).
    Wasm(PathBuf),
}

impl<'de> Deserialize<'de> for ProcessorSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "kv" => Ok(ProcessorSpec::Kv),
            "word-count" => Ok(ProcessorSpec::WordCount),
            path if path.ends_with(".wasm") => Ok(ProcessorSpec::Wasm(PathBuf::from(path))),
            other => Err(serde::de::Error::custom(format!(
                "unknown processor `{other}`: a built-in (`kv`, `word-count`) or a processor component's path \
                 ending in `.wasm`"
            ))),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskConfig {
    pub guarantee: Guarantee,
    pub processor: ProcessorSpec,
    /// Passed to a wasm processor's `init` as strings.
    pub processor_options: BTreeMap<String, toml::Value>,
    /// What `txstore run` consumes: a file path (overridden by `--input`),
    /// or `{ kind = "kafka", topic = "..." }`.
    pub input: Option<InputSpec>,
    /// Where the processor's output records go (none when unset).
    pub output: Option<OutputSpec>,
    /// Worker threads for the tasks of a Kafka input (one task per
    /// assigned partition).
    pub threads: usize,
    /// Commit after this many input records...
    pub commit_interval_records: u64,
    /// ...or after this much time, whichever comes first.
    pub commit_interval_ms: u64,
    /// Commit early when the guest holds more uncommitted bytes than this
    /// (Kafka's `statestore.uncommitted.max.bytes`). Once spelled
    /// `uncommitted_max_bytes`, still accepted with a warning.
    #[serde(alias = "uncommitted_max_bytes")]
    pub max_uncommitted_bytes: u64,
    /// After a guest trap or limit breach, `txstore run` discards the
    /// instance and restarts from recovery up to this many times; 0 stops
    /// with the error.
    pub restarts_on_guest_failure: u32,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            guarantee: Guarantee::ExactlyOnce,
            processor: ProcessorSpec::Kv,
            processor_options: BTreeMap::new(),
            input: None,
            output: None,
            threads: 1,
            commit_interval_records: 10_000,
            commit_interval_ms: 100,
            max_uncommitted_bytes: 64 << 20,
            restarts_on_guest_failure: 0,
        }
    }
}

/// `task.input`: a file path, or a table with `kind`.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSpec {
    /// One record per newline-terminated line.
    File(PathBuf),
    /// The partitions of a Kafka topic, shared by the processes of a group.
    Kafka(KafkaInput),
}

/// `task.input = { kind = "kafka", ... }`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaInput {
    /// Always "kafka" (the tag the table was told apart by).
    #[serde(default, rename = "kind")]
    _kind: String,
    pub topic: String,
    /// Defaults to `changelog.bootstrap_servers`.
    pub bootstrap_servers: Option<String>,
    /// The consumer group the processes share; defaults to
    /// `txstore-<store.name>`. Each task commits its input position to it
    /// (the input partition's offset) inside the changelog transaction, so
    /// Kafka's own tools show the group's lag; a task resumes from the
    /// position its changelog transaction committed.
    pub group_id: Option<String>,
    /// How partitions are spread over the group's processes.
    #[serde(default)]
    pub assignment: Assignment,
    /// `assignment = "static"`: the partitions this process owns.
    #[serde(default)]
    pub partitions: Vec<i32>,
    /// A process that misses heartbeats this long loses its partitions.
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u64,
    /// Further librdkafka settings for the input consumer, passed as is.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

fn default_session_timeout_ms() -> u64 {
    10_000
}

/// How a Kafka input's partitions reach the processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// Consumer group, `cooperative-sticky`: a rebalance moves only the
    /// partitions that change owner.
    #[default]
    Cooperative,
    /// Consumer group, `range` (eager): every rebalance revokes everything.
    Eager,
    /// No group: `partitions` names what this process owns.
    Static,
}

/// `task.output`: a table with `kind`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum OutputSpec {
    /// A topic written in the changelog's Kafka transaction: a
    /// `read_committed` reader sees each update once.
    Kafka { topic: String },
    /// A file whose committed length is in `<path>.committed`.
    File { path: PathBuf },
}

impl<'de> Deserialize<'de> for InputSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(d)? {
            toml::Value::String(path) => Ok(InputSpec::File(path.into())),
            toml::Value::Table(t) => match t.get("kind").and_then(|k| k.as_str()) {
                Some("kafka") => KafkaInput::deserialize(toml::Value::Table(t))
                    .map(InputSpec::Kafka)
                    .map_err(|e| D::Error::custom(format!("task.input: {}", e.message()))),
                Some("file") => match (t.get("path").and_then(|p| p.as_str()), t.len()) {
                    (Some(path), 2) => Ok(InputSpec::File(path.into())),
                    _ => Err(D::Error::custom(
                        "task.input of kind \"file\" takes exactly one more key: path",
                    )),
                },
                _ => Err(D::Error::custom(
                    "task.input.kind must be \"file\" or \"kafka\"",
                )),
            },
            _ => Err(D::Error::custom(
                "task.input must be a file path or a table with kind = \"file\" or \"kafka\"",
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangelogKind {
    /// Segment files under the state directory: one machine.
    #[default]
    Embedded,
    /// A partition of a Kafka topic, written by a transactional producer.
    Kafka,
}

/// How the embedded changelog cleans itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanMode {
    /// On a thread beside the task, installed at a later commit.
    #[default]
    Background,
    /// Inside the commit that finds it due (deterministic: crash tests).
    Inline,
    /// Never: the changelog keeps all history.
    Off,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChangelogConfig {
    pub kind: ChangelogKind,
    /// Embedded: defaults to `<state_dir>/changelog`.
    pub dir: Option<PathBuf>,
    /// Embedded: a segment is rolled at the first commit past this size.
    pub segment_bytes: u64,
    /// Embedded: how sealed segments are cleaned (latest record per key).
    pub clean: CleanMode,
    /// Embedded: the most a clean's key index may hold; past it a clean
    /// covers fewer segments.
    pub clean_memory_bytes: usize,
    /// Kafka: `host:port[,host:port...]`.
    pub bootstrap_servers: Option<String>,
    /// Kafka: the changelog topic; defaults to `<store.name>-changelog`.
    pub topic: Option<String>,
    /// Kafka: this store's partition of the topic (one store per input partition).
    pub partition: i32,
    /// Kafka: defaults to `txstore-<topic>-<partition>`. Two instances with
    /// the same id fence each other: the older one stops.
    pub transactional_id: Option<String>,
    /// Kafka, file input: the consumer group the input position is
    /// committed to, in the same transaction; defaults to the transactional
    /// id. (A Kafka input's positions go to `task.input.group_id`.)
    pub group_id: Option<String>,
    /// Kafka: create the topic (compacted) when it does not exist.
    pub create_topic: bool,
    /// Kafka: partitions and replication of a created topic.
    pub topic_partitions: Option<i32>,
    pub replication_factor: i32,
    /// Kafka: `min.insync.replicas` of a created topic (the broker's
    /// default when unset): with `acks=all`, a commit needs this many
    /// replicas to have it.
    pub min_insync_replicas: Option<i32>,
    /// Kafka: `min.compaction.lag.ms` of a created topic. A replay of
    /// transactions younger than this is proven record by record; older
    /// ones may have been compacted, so gaps there are accepted.
    pub min_compaction_lag_ms: i64,
    /// Kafka: the most any broker operation may take.
    pub timeout_ms: u64,
    /// Kafka: further librdkafka settings (security, tuning), passed as is.
    pub properties: BTreeMap<String, String>,
}

impl Default for ChangelogConfig {
    fn default() -> Self {
        Self {
            kind: ChangelogKind::Embedded,
            dir: None,
            segment_bytes: 64 << 20,
            clean: CleanMode::Background,
            clean_memory_bytes: 256 << 20,
            bootstrap_servers: None,
            topic: None,
            partition: 0,
            transactional_id: None,
            group_id: None,
            create_topic: true,
            topic_partitions: None,
            replication_factor: 1,
            min_insync_replicas: None,
            min_compaction_lag_ms: 3_600_000,
            timeout_ms: 30_000,
            properties: BTreeMap::new(),
        }
    }
}

impl ChangelogConfig {
    /// Settings of one kind given for the other are mistakes worth naming.
    fn check(&self, origin: &str) -> Result<()> {
        let kafka_keys = [
            ("bootstrap_servers", self.bootstrap_servers.is_some()),
            ("topic", self.topic.is_some()),
            ("transactional_id", self.transactional_id.is_some()),
            ("group_id", self.group_id.is_some()),
            ("properties", !self.properties.is_empty()),
        ];
        match self.kind {
            ChangelogKind::Embedded => {
                if let Some((key, _)) = kafka_keys.iter().find(|(_, set)| *set) {
                    bail!("{origin}: changelog.{key} is only for kind = \"kafka\"");
                }
            }
            ChangelogKind::Kafka => {
                if self.bootstrap_servers.is_none() {
                    bail!("{origin}: changelog.kind = \"kafka\" needs changelog.bootstrap_servers");
                }
                if self.dir.is_some() {
                    bail!("{origin}: changelog.dir is only for kind = \"embedded\"");
                }
                if self.partition < 0 {
                    bail!("{origin}: changelog.partition must not be negative");
                }
                if self.timeout_ms == 0 {
                    bail!("{origin}: changelog.timeout_ms must be at least 1");
                }
            }
        }
        Ok(())
    }
}

impl TaskConfig {
    fn check(&self, changelog: &ChangelogConfig, origin: &str) -> Result<()> {
        if !(1..=MAX_THREADS).contains(&self.threads) {
            bail!("{origin}: task.threads must be between 1 and {MAX_THREADS}");
        }
        if !self.processor_options.is_empty() && !matches!(self.processor, ProcessorSpec::Wasm(_)) {
            bail!("{origin}: task.processor_options are for a processor component (task.processor = \"PATH.wasm\")");
        }
        let kafka_changelog = changelog.kind == ChangelogKind::Kafka;
        if let Some(InputSpec::Kafka(k)) = &self.input {
            // A partition's state must follow it to whichever process
            // takes it over: only a Kafka changelog does.
            if !kafka_changelog {
                bail!("{origin}: task.input of kind \"kafka\" needs changelog.kind = \"kafka\"");
            }
            if k.topic.is_empty() {
                bail!("{origin}: task.input.topic must not be empty");
            }
            if k.session_timeout_ms == 0 {
                bail!("{origin}: task.input.session_timeout_ms must be at least 1");
            }
            match k.assignment {
                Assignment::Static if k.partitions.is_empty() => {
                    bail!("{origin}: task.input.assignment = \"static\" needs task.input.partitions")
                }
                Assignment::Static => {
                    if let Some(p) = k.partitions.iter().find(|p| **p < 0) {
                        bail!("{origin}: task.input.partitions: {p} is negative");
                    }
                }
                _ if !k.partitions.is_empty() => bail!(
                    "{origin}: task.input.partitions is only for assignment = \"static\" (a group assigns them)"
                ),
                _ => {}
            }
        }
        if let (Some(OutputSpec::File { .. }), Some(InputSpec::Kafka(_))) =
            (&self.output, &self.input)
        {
            bail!(
                "{origin}: task.output of kind \"file\" is for a file input; a Kafka input's tasks write to a topic \
                 (kind = \"kafka\")"
            );
        }
        if let Some(OutputSpec::Kafka { topic }) = &self.output {
            if !kafka_changelog {
                bail!(
                    "{origin}: task.output of kind \"kafka\" is written in the changelog's transaction: it needs \
                     changelog.kind = \"kafka\""
                );
            }
            if topic.is_empty() {
                bail!("{origin}: task.output.topic must not be empty");
            }
        }
        Ok(())
    }
}

/// The most worker threads a process runs tasks on.
pub const MAX_THREADS: usize = 256;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Where compiled guests are cached; defaults to `$XDG_CACHE_HOME/txstore`
    /// or `~/.cache/txstore`.
    pub cache_dir: Option<PathBuf>,
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
