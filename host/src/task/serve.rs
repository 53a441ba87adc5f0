//! Live queries: while `txstore run` processes, `get` and `scan` are
//! answered by the running task itself, over a Unix socket (no network
//! exposure). The socket is not in the state directory, which holds only
//! data (crash tests and operators copy it; a socket cannot be copied): it
//! is `RUNTIME/txstore-UID/HASH.sock`, where RUNTIME is `$XDG_RUNTIME_DIR`
//! or the temp directory, the directory is the user's own (mode 0700,
//! checked), and HASH names the canonical state directory.
//!
//! The task answers between input records, so every answer is one
//! consistent view of the store:
//! - read-committed: exactly the state of the task's last commit (what a
//!   crash now would recover to);
//! - read-uncommitted: that plus every record processed since, never part
//!   of a record.
//!
//! The writer pauses while it answers. A client has [`REQUEST_TIMEOUT`] to
//! send a request of at most [`MAX_REQUEST`] bytes and [`DELIVERY_TIMEOUT`]
//! to take its answer, and one pause answers at most [`QUERIES_PER_POLL`]
//! queries, so a stalled or hostile client cannot stall the task for long.

use super::Task;
use crate::runtime::Isolation;
use anyhow::{Context, Result};
use base64::Engine as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a client may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest request line (a key can be long, but not this long).
pub const MAX_REQUEST: u64 = 4 << 20;
/// How long a client waits for the task's answer (the task answers
/// between records, so only a stuck commit makes it wait).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the task waits for a client to take its answer.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most queries answered in one pause of the writer: a flood of
/// clients slows the task, it does not stop it.
pub const QUERIES_PER_POLL: usize = 16;

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
    Entries(Vec<(String, String)>),
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
            Answer::Entries(_) => anyhow::bail!("the running task answered a get with entries"),
        }
    }

    /// The entries of a `scan` answer.
    pub fn into_entries(self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        match self {
            Answer::Entries(e) => e
                .iter()
                .map(|(k, v)| Ok((decode(k)?, decode(v)?)))
                .collect(),
            Answer::Error(e) => anyhow::bail!("the running task refused the query: {e}"),
            Answer::Value(_) => anyhow::bail!("the running task answered a scan with a value"),
        }
    }
}

/// The directory of this user's sockets, created owner-only; refused if
/// another user owns it or others may write in it.
fn socket_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = base.join(format!("txstore-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("cannot create {}", dir.display()))
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?;
    anyhow::ensure!(
        meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0,
        "{} is not a directory of this user's alone (owner {}, mode {:o})",
        dir.display(),
        meta.uid(),
        meta.mode() & 0o7777
    );
    Ok(dir)
}

/// The socket of the task running on `state_dir`; `None` when the
/// directory does not exist (so no task runs on it).
pub fn socket_path(state_dir: &Path) -> Result<Option<PathBuf>> {
    use sha2::Digest as _;
    let Ok(canonical) = state_dir.canonicalize() else {
        return Ok(None);
    };
    let hash = sha2::Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let name: String = hash[..12].iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(socket_dir()?.join(format!("{name}.sock"))))
}

/// The running task's end of the socket.
pub struct QueryServer {
    listener: UnixListener,
    path: PathBuf,
}

impl QueryServer {
    /// Listens on the socket of `state_dir`. The caller holds the state
    /// directory's lock, so a socket left there is a dead run's.
    pub fn bind(state_dir: &Path) -> Result<Self> {
        let path = socket_path(state_dir)?
            .with_context(|| format!("no state directory {}", state_dir.display()))?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", path.display()))
            }
            _ => {}
        }
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let server = QueryServer { listener, path };
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&server.path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot restrict {}", server.path.display()))?;
        server.listener.set_nonblocking(true)?;
        Ok(server)
    }

    /// Answers every query waiting, without blocking when none is. A
    /// client's mistake or disconnect is logged; a guest failure is the
    /// task's and returned.
    pub fn poll(&self, task: &mut Task) -> Result<()> {
        for _ in 0..QUERIES_PER_POLL {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot accept on {}", self.path.display()))
                }
            };
            let request = match read_request(&stream) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("live query ignored: {e:#}");
                    continue;
                }
            };
            let answer = match answer(task, request) {
                Ok(a) => a,
                Err(AnswerError::Client(e)) => Answer::Error(format!("{e:#}")),
                Err(AnswerError::Task(e)) => return Err(e),
            };
            if let Err(e) = write_line(&stream, &answer) {
                tracing::warn!("live query's answer not delivered: {e:#}");
            }
        }
        Ok(())
    }
}

impl Drop for QueryServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

enum AnswerError {
    /// The request was wrong: the client is told.
    Client(anyhow::Error),
    /// The guest failed: the task stops.
    Task(anyhow::Error),
}

fn answer(task: &mut Task, request: Request) -> Result<Answer, AnswerError> {
    let client = AnswerError::Client;
    let failed = |e: crate::runtime::CallError| AnswerError::Task(e.into());
    Ok(match request {
        Request::Get { key, committed } => {
            let key = decode(&key).map_err(client)?;
            let value = task
                .store()
                .get(&key, isolation(committed))
                .map_err(failed)?;
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
            let entries = task
                .store()
                .range_up_to(
                    from.as_deref(),
                    to.as_deref(),
                    isolation(committed),
                    limit.unwrap_or(usize::MAX),
                )
                .map_err(failed)?;
            Answer::Entries(
                entries
                    .iter()
                    .map(|(k, v)| (encode(k), encode(v)))
                    .collect(),
            )
        }
    })
}

fn read_request(stream: &UnixStream) -> Result<Request> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(DELIVERY_TIMEOUT))?;
    let mut line = Vec::new();
    BufReader::new(stream.take(MAX_REQUEST)).read_until(b'\n', &mut line)?;
    anyhow::ensure!(
        line.ends_with(b"\n"),
        "a request of {} bytes without its newline (at most {MAX_REQUEST} bytes, within {:?})",
        line.len(),
        REQUEST_TIMEOUT
    );
    serde_json::from_slice(&line).context("not a live query")
}

fn write_line(mut stream: &UnixStream, value: &impl serde::Serialize) -> Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    Ok(())
}

/// Asks the task running on `state_dir`. `Ok(None)` when no task serves
/// it (no socket, nobody listening, or a run that ended before it
/// answered): the caller then opens the store itself.
pub fn ask(state_dir: &Path, request: &Request) -> Result<Option<Answer>> {
    // A socket directory that cannot be used (the run said so when it
    // started) must not stop a query of a store that is not running.
    let path = match socket_path(state_dir) {
        Ok(Some(path)) => path,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::debug!("no live query: {e:#}");
            return Ok(None);
        }
    };
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e).with_context(|| format!("cannot connect to {}", path.display())),
    };
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    if let Err(e) = write_line(&stream, request) {
        // A run that ended after the connect: nobody will answer.
        let gone = e.downcast_ref::<std::io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            )
        });
        if gone {
            return Ok(None);
        }
        return Err(e).with_context(|| format!("cannot send a query to {}", path.display()));
    }
    let mut line = Vec::new();
    match BufReader::new(&stream).read_until(b'\n', &mut line) {
        Ok(_) if line.ends_with(b"\n") => {}
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
            return Err(e)
                .with_context(|| format!("cannot read the answer from {}", path.display()))
        }
    }
    Ok(Some(
        serde_json::from_slice(&line).context("a live query's answer is not JSON")?,
    ))
}
