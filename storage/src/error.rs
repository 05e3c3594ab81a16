//! The store's one error type.

use std::io;
use std::path::PathBuf;

/// The process holding the database lock, as far as it could be found out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LockHolder {
    /// Its process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), when readable.
    pub comm: Option<String>,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.comm {
            Some(c) => write!(f, "process {} ({c})", self.pid),
            None => write!(f, "process {}", self.pid),
        }
    }
}

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process (normally the running daemon) has the database open.
    #[error(
        "database {} is locked by {}, normally the running daemon: query through the daemon \
         (e.g. `tailtrap incidents`) instead of opening the database directly",
        path.display(),
        holder.as_ref().map_or_else(|| "another process".to_string(), |h| h.to_string())
    )]
    Locked {
        /// The database directory.
        path: PathBuf,
        /// Who holds the lock, if it could be found.
        holder: Option<LockHolder>,
    },
    /// No database exists at the path (and this operation does not create one).
    #[error("no database at {}", .0.display())]
    NoDatabase(PathBuf),
    /// The engine found the database damaged while opening it.
    #[error("database {} is corrupt: {detail}", path.display())]
    Corrupt {
        /// The database directory.
        path: PathBuf,
        /// What the engine reported.
        detail: String,
    },
    /// The database was written by a newer tailtrap with a layout this one does not know.
    #[error(
        "database schema version {found} is newer than the supported {supported}; upgrade tailtrap"
    )]
    SchemaTooNew {
        /// Version found in the database.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// A file system error (disk full shows up here, see [`StoreError::is_disk_full`]).
    // The cause is part of the message and not a `source`: error chains print it once.
    #[error("{context}: {cause}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        cause: io::Error,
    },
    /// Any other engine failure.
    #[error("storage engine: {0}")]
    Engine(String),
    /// The file system holding the database is below the free-space reserve
    /// (`min_free_bytes`); bulk records are refused until space comes back.
    #[error(
        "{path}: {free} bytes free, below the {reserve}-byte reserve (storage.min_free_bytes): \
         samples, pwru lines and history are not stored until space is freed"
    )]
    LowDiskSpace {
        /// The database directory.
        path: PathBuf,
        /// Bytes available to tailtrap.
        free: u64,
        /// The reserve in force.
        reserve: u64,
    },
    /// A record is bigger than the cap for its kind; it was not stored.
    #[error("{kind} record of {size} bytes exceeds the {max}-byte cap")]
    TooLarge {
        /// Which kind of record.
        kind: &'static str,
        /// Its encoded size.
        size: usize,
        /// The cap.
        max: usize,
    },
    /// A service name that cannot be stored.
    #[error("service name {name:?}: {reason}")]
    BadServiceName {
        /// The name given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The incident does not exist.
    #[error("no incident {0}")]
    NoSuchIncident(u64),
    /// A record could not be encoded (a bug: every stored type is encodable).
    #[error("encoding a {kind} record: {source}")]
    Encode {
        /// Which kind of record.
        kind: &'static str,
        /// The encoder's error.
        source: postcard::Error,
    },
    /// A configuration value is out of range.
    #[error("storage setting `{key}`: {reason}")]
    Config {
        /// The setting's name, as in the configuration file.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// True when the error comes from a full disk (or quota): the caller should count it and
    /// carry on; nothing already stored is affected.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Io { cause, .. } => is_enospc(cause),
            StoreError::LowDiskSpace { .. } => true,
            StoreError::Engine(msg) => msg.contains("No space left") || msg.contains("quota"),
            _ => false,
        }
    }

    /// True when the file system holding the database takes no writes.
    pub fn is_read_only(&self) -> bool {
        matches!(self, StoreError::Io { cause, .. } if cause.kind() == io::ErrorKind::ReadOnlyFilesystem)
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> StoreError {
        StoreError::Io {
            context: context.into(),
            cause: source,
        }
    }
}

fn is_enospc(e: &io::Error) -> bool {
    // sled re-wraps I/O errors and may lose the raw OS code, keeping the kind or the text.
    e.raw_os_error() == Some(28)
        || e.raw_os_error() == Some(122)
        || e.kind() == io::ErrorKind::StorageFull
        || e.to_string().contains("No space left")
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> StoreError {
        match e {
            sled::Error::Io(cause) => StoreError::Io {
                context: "storage engine I/O".into(),
                cause,
            },
            other => StoreError::Engine(other.to_string()),
        }
    }
}

/// Shorthand for the store's results.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
