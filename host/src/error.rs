//! The library's error: one enum whose variant says what failed (so a
//! caller can act on it) and whose message says what and where (the whole
//! chain of context, on one line).
//!
//! Inside the crate errors are `anyhow` chains; the public API turns them
//! into an [`Error`] by looking for the typed causes below in the chain.

use crate::runtime::CallError;

/// Why an operation of the library failed.
///
/// Every variant carries the full error chain; `Display` prints it on one
/// line (`what failed: why: root cause`).
///
/// ```
/// use txstore::{Error, TaskBuilder};
///
/// let dir = tempfile::tempdir()?;
/// let err = TaskBuilder::new(dir.path()).guest("no-such-guest").open().unwrap_err();
/// assert!(matches!(err, Error::Config(_)), "{err}");
/// assert!(err.to_string().contains("no-such-guest"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid, or names a guest, processor or file
    /// that cannot be used. Nothing was changed.
    Config(anyhow::Error),
    /// The state directory (or changelog directory) is held by another
    /// process. Nothing was changed.
    InUse(anyhow::Error),
    /// Another process with the same transactional identity took over the
    /// changelog (a zombie was fenced). This task must stop; its
    /// uncommitted work is discarded, nothing committed is lost.
    Fenced(anyhow::Error),
    /// The strategy guest failed: a trap, a time or memory limit, or an
    /// error it returned. After a trap the task must be dropped and opened
    /// again (recovery makes the store consistent).
    Guest(anyhow::Error),
    /// The processor refused or failed on a record; nothing of that record
    /// was applied.
    Processor(anyhow::Error),
    /// An I/O error of the host's storage or files (disk full, failed
    /// fsync). The task must be dropped; a new open recovers what was
    /// durable.
    Io(anyhow::Error),
    /// Anything else: a refused operation (another store's changelog,
    /// another input file, a corrupt file), named in the message.
    Other(anyhow::Error),
}

impl Error {
    /// The error chain, whatever the variant.
    pub fn chain(&self) -> &anyhow::Error {
        match self {
            Error::Config(e)
            | Error::InUse(e)
            | Error::Fenced(e)
            | Error::Guest(e)
            | Error::Processor(e)
            | Error::Io(e)
            | Error::Other(e) => e,
        }
    }

    /// The guest call that failed, when a guest call is the cause.
    pub fn call_error(&self) -> Option<&CallError> {
        let e = self.chain();
        e.downcast_ref()
            .or_else(|| e.chain().find_map(|c| c.downcast_ref()))
    }

    /// Classifies an internal error by the typed causes in its chain: a
    /// guest call first (a trap means the task must be reopened, whatever
    /// else failed with it), then a tagged kind, then I/O.
    pub(crate) fn classify(e: anyhow::Error) -> Self {
        // `downcast_ref` sees through context layers; `chain` through
        // errors that keep their cause as `source`.
        let find = |e: &anyhow::Error| -> (bool, Option<Kind>, bool) {
            let call = e.downcast_ref::<CallError>().is_some()
                || e.chain().any(|c| c.downcast_ref::<CallError>().is_some());
            let kind = e
                .downcast_ref::<Marked>()
                .or_else(|| e.chain().find_map(|c| c.downcast_ref::<Marked>()))
                .map(|m| m.kind);
            let io = e.downcast_ref::<std::io::Error>().is_some()
                || e.chain()
                    .any(|c| c.downcast_ref::<std::io::Error>().is_some());
            (call, kind, io)
        };
        // An `Error` passed through `anyhow` keeps its variant.
        let inner = e
            .downcast_ref::<Error>()
            .or_else(|| e.chain().find_map(|c| c.downcast_ref::<Error>()))
            .map(Error::variant);
        if let Some(v) = inner {
            return v(e);
        }
        match find(&e) {
            (true, _, _) => Error::Guest(e),
            (_, Some(Kind::Config), _) => Error::Config(e),
            (_, Some(Kind::InUse), _) => Error::InUse(e),
            (_, Some(Kind::Fenced), _) => Error::Fenced(e),
            (_, Some(Kind::Processor), _) => Error::Processor(e),
            (_, None, true) => Error::Io(e),
            (_, None, false) => Error::Other(e),
        }
    }
}

impl Error {
    /// This error's variant, as a constructor.
    fn variant(&self) -> fn(anyhow::Error) -> Error {
        match self {
            Error::Config(_) => Error::Config,
            Error::InUse(_) => Error::InUse,
            Error::Fenced(_) => Error::Fenced,
            Error::Guest(_) => Error::Guest,
            Error::Processor(_) => Error::Processor,
            Error::Io(_) => Error::Io,
            Error::Other(_) => Error::Other,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.chain())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.chain().source()
    }
}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Error::classify(e)
    }
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        Error::Guest(e.into())
    }
}

/// What an internal error is, when its message alone would not tell a
/// caller (see [`Error`]'s variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Config,
    InUse,
    Fenced,
    Processor,
}

/// An internal error tagged with its [`Kind`].
#[derive(Debug)]
pub(crate) struct Marked {
    pub kind: Kind,
    pub message: String,
}

impl std::fmt::Display for Marked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Marked {}

/// An `anyhow` error of `kind` saying `message`.
pub(crate) fn marked(kind: Kind, message: impl Into<String>) -> anyhow::Error {
    Marked {
        kind,
        message: message.into(),
    }
    .into()
}
