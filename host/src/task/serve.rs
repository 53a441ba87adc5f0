//! Live queries: while `txstore run` processes, `get` and `scan` are
//! answered by the running task itself, over a Unix socket (no network
//! exposure).
//!
//! The socket is an abstract one (Linux): its name is derived from the
//! canonical state directory alone, so a client finds it whatever its
//! environment (`TMPDIR`, `XDG_RUNTIME_DIR`, systemd's private /tmp, a long
//! path) and nothing is left on disk. Abstract sockets have no file
//! permissions, so both ends check the other's uid (`SO_PEERCRED`): the
//! task answers only its own user and root, and a client talks only to a
//! task run by the state directory's owner (another user who takes the name
//! first gets no query answered, and can only turn live queries off).
//!
//! The task answers between input records, so every answer is one
//! consistent view of the store:
//! - read-committed: exactly the state of the task's last commit (what a
//!   crash now would recover to);
//! - read-uncommitted: that plus every record processed since, never part
//!   of a record.
//!
//! A scan is answered a page at a time ([`MAX_PAGE_ENTRIES`] entries,
//! [`MAX_PAGE_BYTES`] bytes at most); the client asks again from where a
//! page ended, so a scan of more than a page is a sequence of consistent
//! views, not one.
//!
//! What a client can cost the writer: clients are read and written on
//! threads of their own ([`MAX_CLIENTS`] at once; more are turned away),
//! so a slow or idle client costs the task nothing. The task only computes
//! answers: at most [`QUERIES_PER_POLL`] per poll, each at most one page.
//! A client has [`REQUEST_TIMEOUT`] in all to send its request and
//! [`DELIVERY_TIMEOUT`] in all to take its answer.

use super::Task;
use crate::runtime::{CallError, Isolation, WitError};
use anyhow::{Context, Result};
use base64::Engine as _;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a client may take, in all, to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest request line (a key can be long, but not this long).
pub const MAX_REQUEST: usize = 4 << 20;
/// How long a client waits for the task's answer (the task answers
/// between records, so only a stuck commit makes it wait).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long, in all, a client may take to read its answer.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most queries the task answers in one poll.
pub const QUERIES_PER_POLL: usize = 4;
/// The most entries in one answer to a scan.
pub const MAX_PAGE_ENTRIES: usize = 4096;
/// The most key and value bytes in one answer to a scan (a page ends at
/// the first entry that reaches it).
pub const MAX_PAGE_BYTES: usize = 4 << 20;
/// The most clients served at once; more are told the task is busy.
pub const MAX_CLIENTS: usize = 32;
/// Queries waiting for the task; more are told the task is busy.
const QUEUED: usize = 64;
/// How often the accepting thread looks for new clients and for its end.
const ACCEPT_EVERY: Duration = Duration::from_millis(10);
/// How an answer to a client turned away begins; the client asks again.
const BUSY: &str = "the task is busy";
/// How long a client keeps asking a busy task.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(10);

/// A query, one JSON line. Keys are standard base64.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Get {
        key: String,
        committed: bool,
    },
    Scan {
        from: Option<String>,
        to: Option<String>,
        limit: Option<usize>,
        committed: bool,
    },
}

/// The task's answer, one JSON line. Bytes are standard base64.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Answer {
    Value(Option<String>),
    /// One page of a scan; `more`: the range goes on after its last key.
    Entries {
        entries: Vec<(String, String)>,
        more: bool,
    },
    Error(String),
}

fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode(text: &str) -> Result<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .context("bad base64 in a live query")
}

fn isolation(committed: bool) -> Isolation {
    if committed {
        Isolation::ReadCommitted
    } else {
        Isolation::ReadUncommitted
    }
}

impl Request {
    pub fn get(key: &[u8], isolation: Isolation) -> Self {
        Request::Get {
            key: encode(key),
            committed: isolation == Isolation::ReadCommitted,
        }
    }

    pub fn scan(
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: Option<usize>,
        isolation: Isolation,
    ) -> Self {
        Request::Scan {
            from: from.map(encode),
            to: to.map(encode),
            limit,
            committed: isolation == Isolation::ReadCommitted,
        }
    }
}

impl Answer {
    /// The value of a `get` answer.
    pub fn into_value(self) -> Result<Option<Vec<u8>>> {
        match self {
            Answer::Value(v) => v.as_deref().map(decode).transpose(),
            Answer::Error(e) => anyhow::bail!("the running task refused the query: {e}"),
            Answer::Entries { .. } => {
                anyhow::bail!("the running task answered a get with entries")
            }
        }
    }

    /// The entries of a `scan` answer's page, and whether more follow.
    pub fn into_page(self) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool)> {
        match self {
            Answer::Entries { entries, more } => Ok((
                entries
                    .iter()
                    .map(|(k, v)| Ok((decode(k)?, decode(v)?)))
                    .collect::<Result<_>>()?,
                more,
            )),
            Answer::Error(e) => anyhow::bail!("the running task refused the query: {e}"),
            Answer::Value(_) => anyhow::bail!("the running task answered a scan with a value"),
        }
    }
}

/// The abstract socket name of the task running on `state_dir`; `None`
/// when the directory does not exist (so no task runs on it).
pub fn socket_name(state_dir: &Path) -> Option<Vec<u8>> {
    use sha2::Digest as _;
    let canonical = state_dir.canonicalize().ok()?;
    let hash = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("txstore/live/{hex}").into_bytes())
}

/// The uid of the process at the other end of `stream`.
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given,
    // and the descriptor is open for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(cred.uid)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// One query waiting for the task, with where its answer goes.
struct Pending {
    request: Request,
    reply: SyncSender<Answer>,
}

/// The running task's end of the socket: a thread accepts clients and
/// hands their queries to [`QueryServer::poll`].
pub struct QueryServer {
    queries: Receiver<Pending>,
    stop: Arc<AtomicBool>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl QueryServer {
    /// Listens on the socket of `state_dir`. The caller holds the state
    /// directory's lock, so no other task serves it.
    pub fn bind(state_dir: &Path) -> Result<Self> {
        let name = socket_name(state_dir)
            .with_context(|| format!("no state directory {}", state_dir.display()))?;
        let addr = SocketAddr::from_abstract_name(&name)?;
        let listener = UnixListener::bind_addr(&addr).with_context(|| {
            format!(
                "cannot listen on the live-query socket of {} (another user's process holds its name?)",
                state_dir.display()
            )
        })?;
        listener.set_nonblocking(true)?;
        let (tx, queries) = mpsc::sync_channel(QUEUED);
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("txstore-queries".into())
                .spawn(move || accept(listener, tx, &stop))
                .context("cannot start the live-query thread")?
        };
        Ok(QueryServer {
            queries,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// Answers the queries waiting, at most [`QUERIES_PER_POLL`], without
    /// blocking. A client's mistake is answered to the client; only a
    /// failure of the store itself is returned (the task stops on it).
    pub fn poll(&self, task: &mut Task) -> Result<()> {
        for _ in 0..QUERIES_PER_POLL {
            let pending = match self.queries.try_recv() {
                Ok(p) => p,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(()),
            };
            let answer = match answer(task, pending.request) {
                Ok(a) => a,
                Err(AnswerError::Client(e)) => Answer::Error(format!("{e:#}")),
                Err(AnswerError::Task(e)) => {
                    let _ = pending
                        .reply
                        .try_send(Answer::Error(format!("the task failed: {e:#}")));
                    return Err(e);
                }
            };
            // The client's thread waits with room for one answer.
            let _ = pending.reply.try_send(answer);
        }
        Ok(())
    }
}

impl Drop for QueryServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// The accepting thread: each client on a thread of its own, at most
/// [`MAX_CLIENTS`] at once. Errors never end it (a full descriptor table
/// passes); only the server's drop does.
fn accept(listener: UnixListener, queries: SyncSender<Pending>, stop: &AtomicBool) {
    let clients = Arc::new(AtomicUsize::new(0));
    let own = euid();
    while !stop.load(Ordering::Relaxed) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(ACCEPT_EVERY);
                continue;
            }
            Err(e) => {
                tracing::warn!("live queries: accept failed: {e} (retrying)");
                std::thread::sleep(ACCEPT_EVERY * 10);
                continue;
            }
        };
        match peer_uid(&stream) {
            Ok(uid) if uid == own || uid == 0 => {}
            Ok(uid) => {
                tracing::warn!("live queries: refused a client of uid {uid}");
                continue;
            }
            Err(e) => {
                tracing::warn!("live queries: cannot tell a client's uid: {e}");
                continue;
            }
        }
        if clients.load(Ordering::Relaxed) >= MAX_CLIENTS {
            busy(&stream, "too many clients at once");
            continue;
        }
        clients.fetch_add(1, Ordering::Relaxed);
        let (queries, clients) = (queries.clone(), clients.clone());
        let spawned = std::thread::Builder::new()
            .name("txstore-query".into())
            .spawn(move || {
                if let Err(e) = serve_client(&stream, &queries) {
                    tracing::debug!("live query: {e:#}");
                }
                clients.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            tracing::warn!("live queries: cannot start a client thread: {e}");
        }
    }
}

/// Tells a client it was turned away, without waiting for it. What it
/// sent already is read first: a socket closed with unread data resets
/// the connection, and the client would not see the answer.
fn busy(stream: &UnixStream, why: &str) {
    let answer = Answer::Error(format!("{BUSY}: {why}"));
    if let Ok(mut line) = serde_json::to_vec(&answer) {
        line.push(b'\n');
        let _ = stream.set_nonblocking(true);
        let mut sink = [0u8; 8192];
        while matches!((&*stream).read(&mut sink), Ok(n) if n > 0) {}
        let _ = (&*stream).write(&line);
    }
}

/// One client: its request, the task's answer, delivered.
fn serve_client(stream: &UnixStream, queries: &SyncSender<Pending>) -> Result<()> {
    let request = read_request(stream, Instant::now() + REQUEST_TIMEOUT)?;
    let (reply, answer) = mpsc::sync_channel(1);
    let answer = match queries.try_send(Pending { request, reply }) {
        Ok(()) => match answer.recv_timeout(ANSWER_TIMEOUT) {
            Ok(a) => a,
            // The run ended or is stuck: the client says so itself.
            Err(_) => return Ok(()),
        },
        Err(TrySendError::Full(_)) => Answer::Error(format!("{BUSY}: too many queries waiting")),
        Err(TrySendError::Disconnected(_)) => return Ok(()),
    };
    write_line(stream, &answer, Instant::now() + DELIVERY_TIMEOUT)
}

enum AnswerError {
    /// The request was wrong: the client is told.
    Client(anyhow::Error),
    /// The store failed: the task stops.
    Task(anyhow::Error),
}

/// A guest's answer to a read: refusing the arguments is the client's
/// business; anything else (a trap, a storage failure, corrupt data) is
/// the task's.
fn read_failed(e: CallError) -> AnswerError {
    match &e {
        CallError::Guest {
            err: WitError::InvalidArgument(_) | WitError::AccessDenied(_),
            ..
        } => AnswerError::Client(e.into()),
        _ => AnswerError::Task(e.into()),
    }
}

fn answer(task: &mut Task, request: Request) -> Result<Answer, AnswerError> {
    let client = AnswerError::Client;
    Ok(match request {
        Request::Get { key, committed } => {
            let key = decode(&key).map_err(client)?;
            // The task's write cache holds the newest uncommitted writes.
            if let Some(cached) = task.cache.latest(&key).filter(|_| !committed) {
                return Ok(Answer::Value(cached.map(encode)));
            }
            let value = task
                .store()
                .get(&key, isolation(committed))
                .map_err(read_failed)?;
            Answer::Value(value.as_deref().map(encode))
        }
        Request::Scan {
            from,
            to,
            limit,
            committed,
        } => {
            let from = from.as_deref().map(decode).transpose().map_err(client)?;
            let to = to.as_deref().map(decode).transpose().map_err(client)?;
            if let (Some(f), Some(t)) = (&from, &to) {
                if f > t {
                    return Err(client(anyhow::anyhow!(
                        "the range's start is after its end"
                    )));
                }
            }
            let want = limit.unwrap_or(usize::MAX).min(MAX_PAGE_ENTRIES);
            if !committed {
                // A scan pages through the guest: the cached writes go
                // there first.
                task.flush_cache().map_err(AnswerError::Task)?;
            }
            let (entries, full) = page(
                task,
                from.as_deref(),
                to.as_deref(),
                isolation(committed),
                want,
            )
            .map_err(read_failed)?;
            let more = full && limit.is_none_or(|l| l > entries.len());
            Answer::Entries {
                entries: entries
                    .iter()
                    .map(|(k, v)| (encode(k), encode(v)))
                    .collect(),
                more,
            }
        }
    })
}

/// Up to `want` entries of [from, to), stopping at [`MAX_PAGE_BYTES`];
/// and whether the page stopped before the range's end could be seen.
#[allow(clippy::type_complexity)]
fn page(
    task: &mut Task,
    from: Option<&[u8]>,
    to: Option<&[u8]>,
    isolation: Isolation,
    want: usize,
) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, bool), CallError> {
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut full = false;
    task.store()
        .range_pages(from, to, isolation, want, |page| {
            for (k, v) in page.iter() {
                if full {
                    return;
                }
                bytes += k.len() + v.len();
                out.push((k.to_vec(), v.to_vec()));
                full = bytes >= MAX_PAGE_BYTES;
            }
        })?;
    let full = full || out.len() == want;
    Ok((out, full))
}

/// Reads one request line, all of it before `deadline`.
fn read_request(stream: &UnixStream, deadline: Instant) -> Result<Request> {
    stream.set_nonblocking(false)?;
    let mut line = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(
            !left.is_zero(),
            "a request not sent within {REQUEST_TIMEOUT:?}"
        );
        stream.set_read_timeout(Some(left))?;
        let n = match (&*stream).read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        anyhow::ensure!(n > 0, "the client left before its request ended");
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            break;
        }
        anyhow::ensure!(
            line.len() <= MAX_REQUEST,
            "a request of more than {MAX_REQUEST} bytes"
        );
    }
    serde_json::from_slice(&line).context("not a live query")
}

/// Writes `value` as one JSON line, all of it before `deadline`.
fn write_line(stream: &UnixStream, value: &impl serde::Serialize, deadline: Instant) -> Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    let mut written = 0;
    while written < line.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        anyhow::ensure!(
            !left.is_zero(),
            "the client did not take its answer in time"
        );
        stream.set_write_timeout(Some(left))?;
        match (&*stream).write(&line[written..]) {
            Ok(0) => anyhow::bail!("the client left"),
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The owner of `state_dir`: the only uid whose task may answer for it.
fn owner(state_dir: &Path) -> Result<u32> {
    use std::os::unix::fs::MetadataExt as _;
    Ok(std::fs::metadata(state_dir)
        .with_context(|| format!("cannot read {}", state_dir.display()))?
        .uid())
}

/// Whether a task answers live queries on `state_dir` now.
pub fn is_served(state_dir: &Path) -> bool {
    socket_name(state_dir)
        .and_then(|name| SocketAddr::from_abstract_name(name).ok())
        .is_some_and(|addr| UnixStream::connect_addr(&addr).is_ok())
}

/// Asks the task running on `state_dir`. `Ok(None)` when no task serves
/// it (nobody listening, or a run that ended before it answered): the
/// caller then opens the store itself. A busy task is asked again, for
/// [`BUSY_RETRY_FOR`] at most.
pub fn ask(state_dir: &Path, request: &Request) -> Result<Option<Answer>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let answer = ask_once(state_dir, request)?;
        let busy = match &answer {
            Some(Answer::Error(e)) => e.starts_with(BUSY),
            // Turned away before an answer (a reset), by a task still running.
            None => is_served(state_dir),
            Some(_) => false,
        };
        if !busy || started.elapsed() >= BUSY_RETRY_FOR {
            return Ok(answer);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

fn ask_once(state_dir: &Path, request: &Request) -> Result<Option<Answer>> {
    let Some(name) = socket_name(state_dir) else {
        return Ok(None);
    };
    let addr = SocketAddr::from_abstract_name(&name)?;
    let stream = match UnixStream::connect_addr(&addr) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot connect to the live-query socket of {}",
                    state_dir.display()
                )
            })
        }
    };
    let (server, owner) = (peer_uid(&stream)?, owner(state_dir)?);
    anyhow::ensure!(
        server == owner || server == 0,
        "the live-query socket of {} is held by a process of uid {server}, not of the state directory's owner \
         (uid {owner}): not asked",
        state_dir.display()
    );
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    if let Err(e) = (&stream).write_all(&line) {
        // A run that ended after the connect: nobody will answer.
        if matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ) {
            return Ok(None);
        }
        return Err(e).with_context(|| {
            format!("cannot send a query to the task on {}", state_dir.display())
        });
    }
    let mut answer = Vec::new();
    match (&stream).read_to_end(&mut answer) {
        Ok(_) if answer.ends_with(b"\n") => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            anyhow::bail!(
                "the task running on {} did not answer within {} s",
                state_dir.display(),
                ANSWER_TIMEOUT.as_secs()
            )
        }
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot read the answer of the task on {}",
                    state_dir.display()
                )
            })
        }
    }
    Ok(Some(
        serde_json::from_slice(&answer).context("a live query's answer is not JSON")?,
    ))
}

/// A scan of the task running on `state_dir`, page by page: `each` gets
/// every page in key order. `Ok(false)` when no task serves it.
pub fn ask_scan(
    state_dir: &Path,
    from: Option<&[u8]>,
    to: Option<&[u8]>,
    limit: Option<usize>,
    isolation: Isolation,
    mut each: impl FnMut(Vec<(Vec<u8>, Vec<u8>)>) -> Result<()>,
) -> Result<bool> {
    let mut next = from.map(<[u8]>::to_vec);
    let mut left = limit;
    loop {
        let request = Request::scan(next.as_deref(), to, left, isolation);
        let Some(answer) = ask(state_dir, &request)? else {
            // Gone between pages: only a first page may fall back.
            anyhow::ensure!(
                next.as_deref() == from,
                "the task running on {} stopped during the scan",
                state_dir.display()
            );
            return Ok(false);
        };
        let (entries, more) = answer.into_page()?;
        if let Some(l) = &mut left {
            *l -= entries.len().min(*l);
        }
        // The next page starts just after this page's last key.
        next = entries.last().map(|(k, _)| {
            let mut k = k.clone();
            k.push(0);
            k
        });
        each(entries)?;
        if !more || next.is_none() || left == Some(0) {
            return Ok(true);
        }
    }
}
