//! The library's error: one enum whose variant says what failed (so a
//! caller can act on it) and whose message says what and where (the whole
//! chain of context, on one line).
//!
//! Inside the crate errors are `anyhow` chains; the public API turns them
//! into an [`Error`] by looking for the typed causes below in the chain.

pub(crate) use crate::cause::{marked, Kind, Marked};
use crate::runtime::CallError;

/// Why an operation of the library failed.
///
/// Every variant carries the full error chain ([`Error::chain`]);
/// `Display` prints it on one line (`what failed: why: root cause`).
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
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let err = txstore::TaskBuilder::new(dir.path()).guest("nope").open().unwrap_err();
    /// assert!(err.chain().chain().count() >= 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// ```
    /// let err = txstore::Error::processor("bad record");
    /// assert!(err.call_error().is_none());
    /// ```
    pub fn call_error(&self) -> Option<&CallError> {
        find(self.chain())
    }

    /// The I/O error at the root of this one, if any.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let err = txstore::Config::load(&dir.path().join("missing.toml")).unwrap_err();
    /// assert!(matches!(err, txstore::Error::Config(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn io_error(&self) -> Option<&std::io::Error> {
        find(self.chain())
    }

    /// Classifies an internal error by the typed causes in its chain: a
    /// guest call first (a trap means the task must be reopened, whatever
    /// else failed with it), then a tagged kind, then I/O.
    pub(crate) fn classify(e: anyhow::Error) -> Self {
        // An `Error` passed through `anyhow` keeps its variant.
        if let Some(v) = e
            .chain()
            .find_map(|c| c.downcast_ref::<Error>())
            .map(Error::variant)
        {
            return v(e);
        }
        if find::<CallError>(&e).is_some() {
            return Error::Guest(e);
        }
        match find::<Marked>(&e).map(|m| m.kind) {
            Some(Kind::Config) => Error::Config(e),
            Some(Kind::InUse) => Error::InUse(e),
            Some(Kind::Fenced) => Error::Fenced(e),
            Some(Kind::Processor) => Error::Processor(e),
            None if find::<std::io::Error>(&e).is_some() => Error::Io(e),
            None => Error::Other(e),
        }
    }
}

/// The first cause of type `T` in `e`: through context layers, causes
/// kept as `source`, and [`Error`]s on the way (whose `source` is empty,
/// since their message already holds the chain).
pub(crate) fn find<T: std::error::Error + Send + Sync + 'static>(e: &anyhow::Error) -> Option<&T> {
    e.downcast_ref::<T>().or_else(|| {
        e.chain().find_map(|c| {
            c.downcast_ref::<T>().or_else(|| {
                c.downcast_ref::<Error>()
                    .and_then(|inner| find::<T>(inner.chain()))
            })
        })
    })
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

/// No `source`: the message already holds the whole chain (one line, as
/// an operator should see it); [`Error::chain`] has the causes.
impl std::error::Error for Error {}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The variant follows the typed cause, through context layers and
    /// through an `Error` that went into `anyhow` and came back.
    #[test]
    fn variants_follow_the_typed_cause() {
        let dir = tempfile::tempdir().unwrap();
        let _held = crate::file::lock_dir(dir.path(), "state directory").unwrap();
        let err = Error::from(crate::file::lock_dir(dir.path(), "state directory").unwrap_err());
        assert!(matches!(err, Error::InUse(_)), "{err}");
        let back = Error::from(anyhow::Error::from(err).context("outer"));
        assert!(matches!(back, Error::InUse(_)), "{back}");
        assert!(back.to_string().starts_with("outer: "), "{back}");
        assert!(
            back.to_string()
                .contains("is in use by another txstore process"),
            "{back}"
        );

        let trap = CallError::Trap {
            guest: "g".into(),
            func: "commit",
            reason: "guest trapped".into(),
        };
        let guest = Error::from(anyhow::Error::from(trap).context("committing"));
        assert!(
            matches!(guest, Error::Guest(_)) && guest.call_error().is_some_and(CallError::is_trap)
        );

        let io =
            Error::from(anyhow::Error::from(std::io::Error::other("disk gone")).context("writing"));
        assert!(
            matches!(io, Error::Io(_)) && io.io_error().is_some(),
            "{io}"
        );
        assert!(matches!(
            Error::from(anyhow::anyhow!("refused")),
            Error::Other(_)
        ));
    }
}
