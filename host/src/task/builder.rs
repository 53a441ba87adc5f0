//! [`TaskBuilder`]: a task from code rather than a config file.

use super::{Processor, RecoveryReport, Task};
use crate::config::{Config, Guarantee, OutputSpec};
use crate::error::Error;
use crate::runtime::{Limits, Runtime};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Builds a [`Task`]: which strategy guest keeps the store, where, the
/// processor, the guarantee and the commit policy. Unset, it is what a
/// config file with only `[store] guest` and `state_dir` gives: guest
/// `roll-forward`, the `kv` processor, exactly-once, an embedded changelog
/// in the state directory, a commit every 10,000 records or 100 ms.
///
/// ```
/// use std::time::Duration;
/// use txstore::{Guarantee, Isolation, TaskBuilder, WordCount};
///
/// let dir = tempfile::tempdir()?;
/// let (mut task, report) = TaskBuilder::new(dir.path().join("state"))
///     .guest("buffered")
///     .guarantee(Guarantee::ExactlyOnce)
///     .processor(WordCount)
///     .commit_every(1_000, Duration::from_millis(500))
///     .open()?;
/// assert_eq!(report.action, "clean");
/// task.process_line(b"a rose is a rose", 17)?;
/// task.commit()?;
/// assert_eq!(task.get(b"rose", Isolation::ReadCommitted)?.as_deref(), Some(&b"2"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TaskBuilder {
    config: Config,
    processor: Option<Box<dyn Processor>>,
}

impl TaskBuilder {
    /// A task whose store, changelog and checkpoint live in `state_dir`
    /// (created if missing).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (task, _) = txstore::TaskBuilder::new(dir.path()).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(state_dir: impl AsRef<Path>) -> Self {
        Self {
            config: Config::new("roll-forward", state_dir.as_ref()),
            processor: None,
        }
    }

    /// Starts from a configuration (the `txstore.toml` form, see
    /// [`Config::load`]); the builder's other calls override it.
    ///
    /// ```
    /// use txstore::{Config, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let config = Config::parse("[store]\nguest = \"roll-back\"\nstate_dir = \"s\"\n", "inline", dir.path())?;
    /// let (task, report) = TaskBuilder::from_config(config).open()?;
    /// assert_eq!(report.guest, "roll-back");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_config(config: Config) -> Self {
        Self {
            config,
            processor: None,
        }
    }

    /// The strategy guest: a built-in name (`roll-forward`, `roll-back`,
    /// `buffered`, `wipe-on-crash`) or a component's path.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (_, report) = txstore::TaskBuilder::new(dir.path()).guest("wipe-on-crash").open()?;
    /// assert!(!report.transactional);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn guest(mut self, guest: impl Into<String>) -> Self {
        self.config.store.guest = guest.into();
        self
    }

    /// An option for the guest's `init` (the `[store.options]` table).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let err = txstore::TaskBuilder::new(dir.path()).option("no-such-option", "1").open().unwrap_err();
    /// assert!(err.to_string().contains("no-such-option"), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config
            .store
            .options
            .insert(key.into(), toml::Value::String(value.into()));
        self
    }

    /// The store's name (its namespace in storage; default `store`).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (task, _) = txstore::TaskBuilder::new(dir.path()).name("sessions").open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.store.name = name.into();
        self
    }

    /// The processor that turns input records into writes and output.
    ///
    /// ```
    /// use txstore::{Context, Error, Input, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let upper = |input: Input<'_>, ctx: &mut Context<'_>| -> Result<(), Error> {
    ///     let line = input.value().unwrap_or_default();
    ///     ctx.put(line, &line.to_ascii_uppercase());
    ///     Ok(())
    /// };
    /// let (mut task, _) = TaskBuilder::new(dir.path()).processor(upper).open()?;
    /// task.process_line(b"abc", 4)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn processor(mut self, processor: impl Processor + 'static) -> Self {
        self.processor = Some(Box::new(processor));
        self
    }

    /// A processor component (the `processor` world of wit/), given its
    /// `init` options.
    ///
    /// ```no_run
    /// let (task, _) = txstore::TaskBuilder::new("state")
    ///     .wasm_processor("stats.wasm", [("prefix", "s/")])
    ///     .open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wasm_processor<K: Into<String>, V: Into<String>>(
        mut self,
        path: impl Into<PathBuf>,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.processor = None;
        self.config.task.processor = crate::config::ProcessorSpec::Wasm(path.into());
        self.config.task.processor_options = options
            .into_iter()
            .map(|(k, v)| (k.into(), toml::Value::String(v.into())))
            .collect();
        self
    }

    /// Exactly-once (the default) or at-least-once.
    ///
    /// ```
    /// use txstore::{Guarantee, TaskBuilder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (_, report) = TaskBuilder::new(dir.path()).guarantee(Guarantee::AtLeastOnce).open()?;
    /// assert_eq!(report.guarantee, Guarantee::AtLeastOnce);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn guarantee(mut self, guarantee: Guarantee) -> Self {
        self.config.task.guarantee = guarantee;
        self
    }

    /// Commit after `records` records or `interval`, whichever comes
    /// first (checked after each record; [`Task::commit_if_due`] checks
    /// the time while the input is idle).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = txstore::TaskBuilder::new(dir.path())
    ///     .commit_every(2, Duration::from_secs(3600))
    ///     .open()?;
    /// task.process_line(b"a\t1", 4)?;
    /// task.process_line(b"b\t2", 8)?;
    /// assert_eq!(task.stats().commits, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn commit_every(mut self, records: u64, interval: Duration) -> Self {
        self.config.task.commit_interval_records = records.max(1);
        self.config.task.commit_interval_ms = interval.as_millis().min(u64::MAX as u128) as u64;
        self
    }

    /// Commits only when the caller calls [`Task::commit`] (or
    /// [`Task::close`]), and early when the guest holds more uncommitted
    /// bytes than its limit.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (mut task, _) = txstore::TaskBuilder::new(dir.path()).manual_commits().open()?;
    /// for i in 0..100u64 {
    ///     task.process_line(format!("k{i}\t{i}").as_bytes(), i + 1)?;
    /// }
    /// assert_eq!(task.stats().commits, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn manual_commits(mut self) -> Self {
        self.config.task.commit_interval_records = u64::MAX;
        self.config.task.commit_interval_ms = u64::MAX;
        self
    }

    /// Output records go to `path`, exactly once (see the README's
    /// "Output"): lines `key<TAB>value`, the committed length in
    /// `<path>.committed`.
    ///
    /// ```
    /// use txstore::{TaskBuilder, WordCount};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let out = dir.path().join("counts.tsv");
    /// let (mut task, _) = TaskBuilder::new(dir.path().join("s"))
    ///     .processor(WordCount)
    ///     .output_file(&out)
    ///     .open()?;
    /// task.process_line(b"hi hi", 6)?;
    /// task.close()?;
    /// assert_eq!(std::fs::read_to_string(&out)?, "hi\t2\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn output_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.task.output = Some(OutputSpec::File { path: path.into() });
        self
    }

    /// The guest's sandbox limits (memory, time per call).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let limits = txstore::Limits { memory_mib: 64, ..Default::default() };
    /// let (task, _) = txstore::TaskBuilder::new(dir.path()).limits(limits).open()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// The configuration the builder holds so far.
    ///
    /// ```
    /// let b = txstore::TaskBuilder::new("state").guest("buffered");
    /// assert_eq!(b.config().store.guest, "buffered");
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Opens the task in a runtime of its own (a wasmtime engine; compiled
    /// guests are cached on disk, so this is cheap after the first time).
    /// See [`TaskBuilder::open_in`] to share one runtime between tasks.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let (task, report) = txstore::TaskBuilder::new(dir.path()).open()?;
    /// assert_eq!(report.replayed_records, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(self) -> Result<(Task, RecoveryReport), Error> {
        let runtime = Runtime::new(self.config.cache_dir()).map_err(Error::from)?;
        self.open_in(&runtime)
    }

    /// Opens the task in `runtime` (one per process is enough: tasks on
    /// several threads share it).
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let runtime = txstore::Runtime::new(None)?;
    /// let (a, _) = txstore::TaskBuilder::new(dir.path().join("a")).open_in(&runtime)?;
    /// let (b, _) = txstore::TaskBuilder::new(dir.path().join("b")).open_in(&runtime)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_in(self, runtime: &Runtime) -> Result<(Task, RecoveryReport), Error> {
        Task::open_with(&self.config, runtime, self.processor)
    }
}

/// A closure is a processor.
impl<F> Processor for F
where
    F: FnMut(super::Input<'_>, &mut super::Context<'_>) -> Result<(), Error> + Send,
{
    fn process(
        &mut self,
        input: super::Input<'_>,
        ctx: &mut super::Context<'_>,
    ) -> Result<(), Error> {
        self(input, ctx)
    }
}
