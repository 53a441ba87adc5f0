//! The typed causes an internal error can carry, so that the public
//! `Error` (`error.rs`, floors up, where every layer's causes meet) can
//! say what failed: a [`Kind`] tag put on an `anyhow` error where the
//! failure is found (a held lock, a bad setting, a fenced writer).

/// What an internal error is, when its message alone would not tell a
/// caller (see the public `Error`'s variants).
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
