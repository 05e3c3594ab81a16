use std::io;

/// What went wrong while setting up or running a test fixture.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An external command (`ip`, `tc`, ...) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status as text.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A system call or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the file or object.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The traffic helper did not behave as its protocol says.
    #[error("tailtrap-traffic: {0}")]
    Traffic(String),
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 file system is mounted (see /proc/self/mountinfo)")]
    NoCgroup2,
    /// The running kernel lacks a feature the fixture needs (e.g. the netem qdisc).
    #[error("the running kernel does not support {0}")]
    Unsupported(&'static str),
    /// A CPU fixture (pinning, quota cgroup) could not be set up.
    #[error("{0}")]
    Setup(String),
    /// Every veth subnet of 10.200.0.0/16 is taken.
    #[error("no free veth pair slot: all 16384 /30 subnets of 10.200.0.0/16 are in use")]
    NoFreeSlot,
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
