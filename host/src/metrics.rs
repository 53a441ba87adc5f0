//! Operator metrics (`[metrics] listen`): per task counters, gauges and a
//! commit-latency histogram in one process-wide registry, served in the
//! OpenMetrics text format (which Prometheus scrapes natively) at
//! `http://<listen>/metrics`. docs/metrics.md
//! lists every name.
//!
//! Off unless [`serve`] was called: a task opened before that, or in a
//! process that never calls it, records nothing and its guest calls are
//! not timed. A task keeps its own plain counters on the hot path and
//! publishes them here at each commit, at the end of each replayed batch
//! and at close, so a scrape sees a task at most one commit interval old
//! and recording costs a few atomic adds per commit, not per record.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

type Labels = Vec<(&'static str, String)>;
type Seconds = Counter<f64, AtomicU64>;

/// Every metric family, registered once.
struct Families {
    registry: Registry,
    records: Family<Labels, Counter>,
    writes: Family<Labels, Counter>,
    output_records: Family<Labels, Counter>,
    commits: Family<Labels, Counter>,
    early_commits: Family<Labels, Counter>,
    commit_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    calls: Family<Labels, Counter>,
    call_seconds: Family<Labels, Seconds>,
    changelog_bytes: Family<Labels, Gauge>,
    changelog_segments: Family<Labels, Gauge>,
    cleaner_runs: Family<Labels, Counter>,
    restored_records: Family<Labels, Counter>,
    restore_remaining: Family<Labels, Gauge>,
    guest_memory: Family<Labels, Gauge>,
    input_lag: Family<Labels, Gauge>,
    standby_lag: Family<Labels, Gauge>,
}

/// From 100 µs to about 13 s: a commit is an fsync or two, or a Kafka
/// transaction, and one far past the interval is what an operator looks for.
fn commit_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Families {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("txstore");
        let records = Family::default();
        let writes = Family::default();
        let output_records = Family::default();
        let commits = Family::default();
        let early_commits = Family::default();
        let commit_seconds =
            Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(commit_histogram);
        let calls = Family::default();
        let call_seconds = Family::default();
        let changelog_bytes = Family::default();
        let changelog_segments = Family::default();
        let cleaner_runs = Family::default();
        let restored_records = Family::default();
        let restore_remaining = Family::default();
        let guest_memory = Family::default();
        let input_lag = Family::default();
        let standby_lag = Family::default();
        let r = &mut registry;
        r.register(
            "records_processed",
            "Input records processed",
            records.clone(),
        );
        r.register(
            "writes",
            "Store writes (puts and deletes) made by records",
            writes.clone(),
        );
        r.register(
            "output_records",
            "Output records emitted",
            output_records.clone(),
        );
        r.register(
            "commits",
            "Commits (changelog, then store)",
            commits.clone(),
        );
        r.register(
            "early_commits",
            "Commits made before the interval because the uncommitted bytes reached their limit",
            early_commits.clone(),
        );
        r.register(
            "commit_latency_seconds",
            "Time of one commit: cache flush, changelog commit, store commit",
            commit_seconds.clone(),
        );
        r.register(
            "store_calls",
            "Calls into the store's guest, by function",
            calls.clone(),
        );
        r.register(
            "store_call_seconds",
            "Time spent in calls into the store's guest, by function",
            call_seconds.clone(),
        );
        r.register(
            "changelog_bytes",
            "Bytes in the embedded changelog's segments",
            changelog_bytes.clone(),
        );
        r.register(
            "changelog_segments",
            "Segment files of the embedded changelog",
            changelog_segments.clone(),
        );
        r.register(
            "changelog_cleaner_runs",
            "Changelog cleaning passes taken in",
            cleaner_runs.clone(),
        );
        r.register(
            "restore_records",
            "Changelog records replayed into the store while restoring",
            restored_records.clone(),
        );
        r.register(
            "restore_remaining_offsets",
            "Changelog offsets still to replay before the task serves (0 once restored)",
            restore_remaining.clone(),
        );
        r.register(
            "guest_memory_peak_bytes",
            "The most linear memory the store's guest has held",
            guest_memory.clone(),
        );
        r.register(
            "input_lag_records",
            "Records of the task's input partition not yet consumed (read_committed: to the last stable offset)",
            input_lag.clone(),
        );
        r.register(
            "standby_lag_offsets",
            "Changelog offsets a standby replica had still to apply when it last looked (0: caught up)",
            standby_lag.clone(),
        );
        Families {
            registry,
            records,
            writes,
            output_records,
            commits,
            early_commits,
            commit_seconds,
            calls,
            call_seconds,
            changelog_bytes,
            changelog_segments,
            cleaner_runs,
            restored_records,
            restore_remaining,
            guest_memory,
            input_lag,
            standby_lag,
        }
    }
}

static FAMILIES: OnceLock<Families> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether this process serves metrics (a task then times its guest calls).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The registry in the OpenMetrics text format.
pub fn render() -> String {
    let mut out = String::new();
    let families = FAMILIES.get_or_init(Families::new);
    encode(&mut out, &families.registry).expect("writing to a String cannot fail");
    out
}

/// The HTTP listener; stops when dropped.
pub struct Server {
    addr: SocketAddr,
    http: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Where it listens (the port chosen when `listen` asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Turns metrics on for this process and serves them at `listen`
/// (`host:port`): `GET /metrics` answers with the registry, anything else
/// with 404. Call before opening tasks.
pub fn serve(listen: &str) -> anyhow::Result<Server> {
    let listener = TcpListener::bind(listen).map_err(|e| {
        anyhow::anyhow!("cannot listen for metrics on {listen} ([metrics] listen): {e}")
    })?;
    let addr = listener.local_addr()?;
    let http = tiny_http::Server::from_listener(listener, None)
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
    let http = Arc::new(http);
    FAMILIES.get_or_init(Families::new);
    ENABLED.store(true, Ordering::Relaxed);
    let server = http.clone();
    let thread = std::thread::Builder::new()
        .name("txstore-metrics".into())
        .spawn(move || {
            // `incoming_requests` ends when `unblock` is called (on drop).
            for request in server.incoming_requests() {
                // `/metrics` with any query string; HEAD gets no body.
                let path = request.url().split('?').next().unwrap_or("");
                let scrape = path == "/metrics"
                    && matches!(
                        request.method(),
                        tiny_http::Method::Get | tiny_http::Method::Head
                    );
                let response = if scrape {
                    let header = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                    )
                    .expect("a valid header");
                    tiny_http::Response::from_string(render()).with_header(header)
                } else {
                    tiny_http::Response::from_string("only GET /metrics is served here\n")
                        .with_status_code(404)
                };
                // A scraper that hung up is its own problem.
                let _ = request.respond(response);
            }
        })?;
    Ok(Server {
        addr,
        http,
        thread: Some(thread),
    })
}

/// How far the standby replica of `store` was behind its changelog's
/// committed end when it last looked; `None` drops it (promoted, closed).
pub fn standby_lag(store: &str, lag: Option<u64>) {
    set_store_gauge(|f| &f.standby_lag, store, lag.map(|l| l as i64));
}

/// The input lag of the task whose store is `store` (a Kafka input's
/// partition), as the consumer sees it; `None` drops it (revoked).
pub fn input_lag(store: &str, lag: Option<i64>) {
    set_store_gauge(|f| &f.input_lag, store, lag);
}

/// Sets the gauge of `store` in the family `family` picks, or drops it.
fn set_store_gauge(
    family: fn(&Families) -> &Family<Labels, Gauge>,
    store: &str,
    value: Option<i64>,
) {
    if !enabled() {
        return;
    }
    let family = family(FAMILIES.get_or_init(Families::new));
    let labels: Labels = vec![("store", store.to_string())];
    match value {
        Some(v) => {
            family.get_or_create(&labels).set(v);
        }
        None => {
            family.remove(&labels);
        }
    }
}

/// What a task publishes: its counters since it opened.
#[derive(Clone, Debug, Default)]
pub struct TaskFigures {
    pub records: u64,
    pub writes: u64,
    pub output_records: u64,
    pub commits: u64,
    pub early_commits: u64,
    /// Guest calls by function: (count, time).
    pub calls: Vec<(&'static str, u64, Duration)>,
    pub guest_memory_bytes: u64,
}

/// The size of a task's embedded changelog.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChangelogFigures {
    pub bytes: u64,
    pub segments: u64,
    pub cleaner_runs: u64,
}

/// One task's handles; a no-op when metrics are off.
#[derive(Default)]
pub struct TaskMetrics {
    inner: Option<Inner>,
}

struct Inner {
    labels: Labels,
    records: Counter,
    writes: Counter,
    output_records: Counter,
    commits: Counter,
    early_commits: Counter,
    commit_seconds: Histogram,
    restored_records: Counter,
    restore_remaining: Gauge,
    guest_memory: Gauge,
    /// What was published last: counters move by the difference.
    last: TaskFigures,
    /// Per guest function, made at its first call: its handles and the
    /// totals last published.
    calls: BTreeMap<&'static str, CallHandles>,
    /// Made at the first publish (an embedded changelog only).
    changelog: Option<ChangelogHandles>,
    last_cleaner_runs: u64,
    /// When the changelog's size was last published.
    changelog_at: Option<std::time::Instant>,
}

struct CallHandles {
    calls: Counter,
    seconds: Seconds,
    last: (u64, Duration),
}

struct ChangelogHandles {
    bytes: Gauge,
    segments: Gauge,
    cleaner_runs: Counter,
}

impl TaskMetrics {
    /// The handles of the task whose store is `store` (a Kafka input's
    /// task: `<store>-<partition>`); no-op unless [`serve`] was called.
    pub fn new(store: &str) -> Self {
        if !enabled() {
            return Self::default();
        }
        let f = FAMILIES.get_or_init(Families::new);
        let labels: Labels = vec![("store", store.to_string())];
        let inner = Inner {
            records: f.records.get_or_create(&labels).clone(),
            writes: f.writes.get_or_create(&labels).clone(),
            output_records: f.output_records.get_or_create(&labels).clone(),
            commits: f.commits.get_or_create(&labels).clone(),
            early_commits: f.early_commits.get_or_create(&labels).clone(),
            commit_seconds: f.commit_seconds.get_or_create(&labels).clone(),
            restored_records: f.restored_records.get_or_create(&labels).clone(),
            restore_remaining: f.restore_remaining.get_or_create(&labels).clone(),
            guest_memory: f.guest_memory.get_or_create(&labels).clone(),
            labels,
            last: TaskFigures::default(),
            calls: BTreeMap::new(),
            changelog: None,
            last_cleaner_runs: 0,
            changelog_at: None,
        };
        Self { inner: Some(inner) }
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether to publish the changelog's size now: at most once a
    /// second (it costs a stat per segment) unless `now`.
    pub fn changelog_due(&mut self, now: bool) -> bool {
        let Some(m) = &mut self.inner else {
            return false;
        };
        let due = now
            || m.changelog_at
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if due {
            m.changelog_at = Some(std::time::Instant::now());
        }
        due
    }

    /// One commit took `took`.
    pub fn committed(&self, took: Duration) {
        if let Some(m) = &self.inner {
            m.commit_seconds.observe(took.as_secs_f64());
        }
    }

    /// Restore progress: `records` more replayed, `remaining` offsets to go.
    pub fn restored(&self, records: u64, remaining: u64) {
        if let Some(m) = &self.inner {
            m.restored_records.inc_by(records);
            m.restore_remaining
                .set(remaining.min(i64::MAX as u64) as i64);
        }
    }

    /// Publishes the task's counters (totals since it opened).
    pub fn publish(&mut self, now: &TaskFigures) {
        let Some(m) = &mut self.inner else { return };
        let f = FAMILIES.get().expect("metrics are on");
        let last = &m.last;
        m.records.inc_by(now.records.saturating_sub(last.records));
        m.writes.inc_by(now.writes.saturating_sub(last.writes));
        m.output_records
            .inc_by(now.output_records.saturating_sub(last.output_records));
        m.commits.inc_by(now.commits.saturating_sub(last.commits));
        m.early_commits
            .inc_by(now.early_commits.saturating_sub(last.early_commits));
        m.guest_memory
            .set(now.guest_memory_bytes.min(i64::MAX as u64) as i64);
        for &(func, count, time) in &now.calls {
            let h = m.calls.entry(func).or_insert_with(|| {
                let mut labels = m.labels.clone();
                labels.push(("function", func.to_string()));
                CallHandles {
                    calls: f.calls.get_or_create(&labels).clone(),
                    seconds: f.call_seconds.get_or_create(&labels).clone(),
                    last: (0, Duration::ZERO),
                }
            });
            let (c0, t0) = h.last;
            h.calls.inc_by(count.saturating_sub(c0));
            h.seconds.inc_by(time.saturating_sub(t0).as_secs_f64());
            h.last = (count, time);
        }
        m.last = now.clone();
    }

    /// Publishes the embedded changelog's size.
    pub fn publish_changelog(&mut self, c: ChangelogFigures) {
        let Some(m) = &mut self.inner else { return };
        let h = m.changelog.get_or_insert_with(|| {
            let f = FAMILIES.get().expect("metrics are on");
            ChangelogHandles {
                bytes: f.changelog_bytes.get_or_create(&m.labels).clone(),
                segments: f.changelog_segments.get_or_create(&m.labels).clone(),
                cleaner_runs: f.cleaner_runs.get_or_create(&m.labels).clone(),
            }
        });
        h.bytes.set(c.bytes.min(i64::MAX as u64) as i64);
        h.segments.set(c.segments.min(i64::MAX as u64) as i64);
        h.cleaner_runs
            .inc_by(c.cleaner_runs.saturating_sub(m.last_cleaner_runs));
        m.last_cleaner_runs = c.cleaner_runs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn scrape(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// One value of the text format, by its whole sample name and labels.
    fn value(text: &str, sample: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {sample} in:\n{text}"))
    }

    #[test]
    fn published_counters_move_by_the_difference_and_are_served() {
        let server = serve("127.0.0.1:0").unwrap();
        let mut m = TaskMetrics::new("unit-7");
        assert!(m.is_on());
        let mut figures = TaskFigures {
            records: 10,
            writes: 4,
            commits: 1,
            calls: vec![("put-many", 2, Duration::from_millis(3))],
            ..Default::default()
        };
        m.publish(&figures);
        figures.records = 25;
        figures.calls = vec![("put-many", 5, Duration::from_millis(4))];
        m.publish(&figures);
        m.committed(Duration::from_millis(2));
        m.restored(100, 7);
        m.publish_changelog(ChangelogFigures {
            bytes: 4096,
            segments: 2,
            cleaner_runs: 3,
        });
        m.publish_changelog(ChangelogFigures {
            bytes: 8192,
            segments: 3,
            cleaner_runs: 4,
        });

        let text = scrape(server.addr(), "/metrics");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let l = r#"{store="unit-7"}"#;
        let call = r#"{store="unit-7",function="put-many"}"#;
        for (sample, want) in [
            (format!("txstore_records_processed_total{l}"), 25.0),
            (format!("txstore_writes_total{l}"), 4.0),
            (format!("txstore_commits_total{l}"), 1.0),
            (format!("txstore_store_calls_total{call}"), 5.0),
            (format!("txstore_store_call_seconds_total{call}"), 0.004),
            (format!("txstore_commit_latency_seconds_count{l}"), 1.0),
            (format!("txstore_restore_records_total{l}"), 100.0),
            (format!("txstore_restore_remaining_offsets{l}"), 7.0),
            (format!("txstore_changelog_bytes{l}"), 8192.0),
            (format!("txstore_changelog_cleaner_runs_total{l}"), 4.0),
        ] {
            assert_eq!(value(&text, &sample), want, "{sample}");
        }
        assert!(scrape(server.addr(), "/metrics?name[]=x").starts_with("HTTP/1.1 200"));
        assert!(scrape(server.addr(), "/other").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_busy_address_is_one_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = serve(&addr).err().expect("the port is taken");
        let msg = format!("{err:#}");
        assert!(
            msg.contains(&addr) && msg.contains("[metrics] listen"),
            "{msg}"
        );
    }
}
