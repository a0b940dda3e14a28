//! The one error type of the core. The bindings map each variant to a Python exception
//! (`src/python/errors.rs`), so a caller can tell a corrupt record from a schema mistake.

use std::path::PathBuf;

/// Everything that can go wrong in eagle-io's core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system error on a file, with the file named.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes on disk that do not follow docs/FORMAT.md: bad magic, failed checksum,
    /// out-of-bounds offset, undecodable chunk. `offset` is the byte offset in `path`.
    #[error("{path}: corrupt {what} at byte offset {offset}{}", sample_note(.sample_id))]
    Corrupt {
        path: PathBuf,
        sample_id: Option<u64>,
        offset: u64,
        what: String,
    },
    /// A file written by a format version this build cannot read.
    #[error("{path}: format version {found} is not supported (this eagle-io reads versions up to {supported})")]
    FormatVersion { path: PathBuf, found: u32, supported: u32 },
    /// A sample that does not match the dataset schema (dtype, width, length, contiguity).
    #[error("sample {sample_id}: {message}")]
    Schema { sample_id: u64, message: String },
    /// Datasets or manifests that cannot be combined or opened together.
    #[error("{0}")]
    Incompatible(String),
    /// A lookup of a sample id or position that the dataset does not hold.
    #[error("{0}")]
    NotFound(String),
    /// A caller mistake in arguments or call order (e.g. writing after close).
    #[error("{0}")]
    InvalidArgument(String),
    /// The ring buffer stayed full for longer than the producer's timeout.
    #[error("{0}")]
    Timeout(String),
    /// An object-storage request that failed (after its retries): a missing bucket or object,
    /// refused credentials, a timeout, a truncated object. `url` names the object (its shard or
    /// manifest), `status` the HTTP status of the failed response when there was one.
    #[error("{url}: {message}{}", status_note(.status))]
    Storage {
        url: String,
        status: Option<u16>,
        message: String,
    },
    /// A bug in eagle-io rather than in the caller's input: a worker thread panicked or could
    /// not start, or a thread's channel closed unexpectedly.
    #[error("internal error: {0}")]
    Internal(String),
    /// A wait its caller interrupted (Ctrl-C reaching a producer blocked on a full ring, or a
    /// capture sink's close): the wait returned having changed nothing (`crate::interrupt`).
    #[error("interrupted")]
    Interrupted,
    /// An error that already happened, raised again under `context` (a writer that failed
    /// accepts nothing more): `cause` keeps its own variant, so it reaches Python as its own
    /// class with its fields (a full disk stays a `StorageError` with its errno).
    #[error("{context}: {cause}")]
    Earlier { context: &'static str, cause: Box<Error> },
}

fn sample_note(sample_id: &Option<u64>) -> String {
    match sample_id {
        Some(id) => format!(" (sample id {id})"),
        None => String::new(),
    }
}

fn status_note(status: &Option<u16>) -> String {
    match status {
        Some(s) => format!(" (HTTP status {s})"),
        None => String::new(),
    }
}

/// The core's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// Locks `m`, taking over a lock a panicking thread poisoned (that panic is reported where it happened;
/// the data it guards is never left half-updated by the holders here).
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, turning a panic inside it into [`Error::panicked`] (`what` names the thread or job),
/// so a bug surfaces as `InternalError` instead of unwinding through the caller.
pub fn catch_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(Error::panicked(what, &*payload)))
}

impl Error {
    /// An equal error for another receiver (`std::io::Error` is not `Clone`; its kind, OS
    /// error code and message are kept).
    pub fn duplicate(&self) -> Error {
        match self {
            Error::Io { path, source } => Error::Io {
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            Error::Corrupt {
                path,
                sample_id,
                offset,
                what,
            } => Error::Corrupt {
                path: path.clone(),
                sample_id: *sample_id,
                offset: *offset,
                what: what.clone(),
            },
            Error::FormatVersion { path, found, supported } => Error::FormatVersion {
                path: path.clone(),
                found: *found,
                supported: *supported,
            },
            Error::Schema { sample_id, message } => Error::Schema {
                sample_id: *sample_id,
                message: message.clone(),
            },
            Error::Incompatible(m) => Error::Incompatible(m.clone()),
            Error::NotFound(m) => Error::NotFound(m.clone()),
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::Timeout(m) => Error::Timeout(m.clone()),
            Error::Storage { url, status, message } => Error::Storage {
                url: url.clone(),
                status: *status,
                message: message.clone(),
            },
            Error::Internal(m) => Error::Internal(m.clone()),
            Error::Interrupted => Error::Interrupted,
            Error::Earlier { context, cause } => Error::Earlier {
                context,
                cause: Box::new(cause.duplicate()),
            },
        }
    }

    /// This error raised again under `context`, its variant kept ([`Error::Earlier`]).
    pub fn earlier(&self, context: &'static str) -> Error {
        match self {
            Error::Earlier { cause, .. } => cause.earlier(context),
            _ => Error::Earlier {
                context,
                cause: Box::new(self.duplicate()),
            },
        }
    }

    /// The error itself, under any [`Error::Earlier`] wrapping: what decides its Python class.
    pub fn root(&self) -> &Error {
        match self {
            Error::Earlier { cause, .. } => cause.root(),
            _ => self,
        }
    }

    /// The `Internal` error for a thread (or pool job) that panicked with `payload`: the panic
    /// message is kept (a `&str` or `String` payload, as `panic!` makes).
    pub fn panicked(what: &str, payload: &(dyn std::any::Any + Send)) -> Error {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".into());
        Error::Internal(format!("{what} panicked: {message}"))
    }

    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// A corrupt-bytes error at `offset` in `path`.
    pub fn corrupt(path: impl Into<PathBuf>, sample_id: Option<u64>, offset: u64, what: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.into(),
            sample_id,
            offset,
            what: what.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_error_keeps_its_variant_and_fields() {
        let disk_full = Error::io("/d/.r00000-000002.eio.tmp", std::io::Error::from_raw_os_error(28));
        let again = disk_full.earlier("the writer failed earlier");
        assert!(matches!(again.root(), Error::Io { source, .. } if source.raw_os_error() == Some(28)));
        assert!(again
            .to_string()
            .starts_with("the writer failed earlier: /d/.r00000-000002.eio.tmp: "));
        // Raised again once more: one context, not two.
        let twice = again.earlier("closing");
        assert_eq!(twice.to_string().matches(": /d/").count(), 1);
        assert!(matches!(twice.duplicate(), Error::Earlier { cause, .. } if matches!(*cause, Error::Io { .. })));
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let e = catch_panic::<()>("the shard I/O thread", || panic!("index {} out of range", 7)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "internal error: the shard I/O thread panicked: index 7 out of range"
        );
        let e = catch_panic::<()>("a pool job", || std::panic::panic_any(5u8)).unwrap_err();
        assert!(e.to_string().ends_with("a non-string panic payload"));
        assert_eq!(catch_panic("ok", || Ok(3)).unwrap(), 3);
    }
}
