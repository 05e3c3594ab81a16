//! The storage engine: sled's database and the store's fixed trees, opened with the
//! damage check (every record read once, the flush generation compared with its witness
//! file) and a short wait for a lock this process is still letting go of. The store
//! (`store.rs`) holds one [`Engine`] and swaps it on reopen, recovery and rotation.

use std::fs;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::codec;
use crate::config::StoreConfig;
use crate::error::{Result, StoreError};
use crate::lock;
use crate::paths::{timestamp, unused_sibling};
use crate::windows;

/// The fixed set of trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum T {
    Meta,
    Incidents,
    Samples,
    Pwru,
    History,
    Baselines,
}

impl T {
    pub(crate) const ALL: [T; 6] = [
        T::Meta,
        T::Incidents,
        T::Samples,
        T::Pwru,
        T::History,
        T::Baselines,
    ];

    pub(crate) const fn name(self) -> &'static str {
        match self {
            T::Meta => "meta",
            T::Incidents => "incidents",
            T::Samples => "samples",
            T::Pwru => "pwru",
            T::History => "history",
            T::Baselines => "baselines",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// Meta key of the flush generation, bumped by every flush (see [`WITNESS_FILE`]).
pub(crate) const META_GENERATION: &[u8] = b"flush_generation";

/// File inside the database directory recording the last flush generation sled confirmed.
const WITNESS_FILE: &str = "tailtrap-flushed";

/// The open sled database and its trees.
pub(crate) struct Engine {
    pub(crate) db: sled::Db,
    pub(crate) trees: Vec<sled::Tree>,
    /// Live bytes per tree found when it was opened.
    pub(crate) live: [u64; 6],
    /// Flush generation stored in the database when it was opened.
    pub(crate) generation: u64,
    /// An empty in-memory engine holding the place of the real one (while a failed one
    /// shuts down): reads from it would wrongly look like an empty database.
    pub(crate) stand_in: bool,
}

impl Engine {
    pub(crate) fn tree(&self, t: T) -> &sled::Tree {
        &self.trees[t.index()]
    }
}

/// How the store reacts to an engine that cannot open the database.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnCorrupt {
    MoveAside,
    Fail,
}

/// Whether opening reads every record (to find damage and count live bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    Yes,
    /// Reopening files this process just closed: reading everything would only fill
    /// memory again (the live counts are the store's own).
    No,
}

/// Why sled could not open a database.
pub(crate) enum OpenFailure {
    Locked,
    Damaged(String),
    Other(StoreError),
}

impl OpenFailure {
    /// The store's error for a failure to open the database at `path`.
    pub(crate) fn into_error(self, path: &Path) -> StoreError {
        match self {
            OpenFailure::Other(e) => e,
            OpenFailure::Locked => StoreError::Locked {
                path: path.to_path_buf(),
                holder: lock::holder(path),
            },
            OpenFailure::Damaged(detail) => StoreError::Corrupt {
                path: path.to_path_buf(),
                detail,
            },
        }
    }
}

/// Another open database (of this process or another) holds the files' lock.
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

fn classify(e: sled::Error) -> OpenFailure {
    match e {
        e if is_lock_error(&e) => OpenFailure::Locked,
        sled::Error::Io(io)
            if matches!(
                io.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
            ) =>
        {
            OpenFailure::Damaged(io.to_string())
        }
        sled::Error::Io(cause) if cause.kind() == io::ErrorKind::ReadOnlyFilesystem => {
            OpenFailure::Other(StoreError::Io {
                context: "its file system takes no writes (after a disk error the kernel may \
                          have remounted it read-only: see its log, check the file system, \
                          then start again; docs/operations.md, \"Storage faults\")"
                    .into(),
                cause,
            })
        }
        sled::Error::Io(cause) => OpenFailure::Other(StoreError::Io {
            context: "the storage engine could not open its files".into(),
            cause,
        }),
        sled::Error::Corruption { at, .. } => {
            OpenFailure::Damaged(format!("engine found corruption at {at:?}"))
        }
        other => OpenFailure::Damaged(other.to_string()),
    }
}

/// An open sled database and its trees, before they become an [`Engine`].
pub(crate) struct SledFiles {
    pub(crate) db: sled::Db,
    pub(crate) trees: Vec<sled::Tree>,
}

impl SledFiles {
    fn open(config: &sled::Config) -> sled::Result<SledFiles> {
        let db = config.open()?;
        let trees = T::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<sled::Result<Vec<_>>>()?;
        Ok(SledFiles { db, trees })
    }

    /// An empty in-memory database, deleted when dropped.
    pub(crate) fn temporary() -> sled::Result<SledFiles> {
        SledFiles::open(&sled::Config::new().temporary(true))
    }

    /// Close and open the same files again, dropping what sled held of them. sled's
    /// threads release the files' lock a moment after the drop, so the open is retried
    /// for a while.
    fn reopen(&mut self, config: &sled::Config) -> sled::Result<()> {
        *self = SledFiles::temporary()?;
        let mut waited = Duration::ZERO;
        loop {
            match SledFiles::open(config) {
                Ok(files) => {
                    *self = files;
                    return Ok(());
                }
                Err(e) if is_lock_error(&e) && waited < Duration::from_secs(3) => {
                    std::thread::sleep(Duration::from_millis(20));
                    waited += Duration::from_millis(20);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn try_open(
    path: &Path,
    cfg: &StoreConfig,
    verify: Verify,
) -> std::result::Result<Engine, OpenFailure> {
    let flush_ms = u64::try_from(cfg.flush_every.as_millis()).unwrap_or(1000);
    // The mode is only recorded by sled 0.34 (nothing reads it). `cache_capacity` bounds
    // little of sled's memory (see `Store::maybe_recycle`).
    let config = sled::Config::new()
        .path(path)
        .mode(sled::Mode::HighThroughput)
        .cache_capacity(cfg.cache_bytes)
        .flush_every_ms(Some(flush_ms.max(1)));
    // sled 0.34 can panic on some damaged files instead of returning an error; a panic at
    // open is treated as damage so the daemon recovers rather than crash-looping.
    // Reading every record once (to count live bytes) makes damage anywhere in the files
    // show up now, at open, where it can be handled, rather than in a later query.
    let opened = catch_unwind(AssertUnwindSafe(|| -> sled::Result<Engine> {
        let mut files = SledFiles::open(&config)?;
        let mut live = [0u64; 6];
        if verify == Verify::Yes {
            // In windows, reopening the files between them: read in one go, a large
            // database stayed in memory until the daemon's first engine reopen.
            for (i, slot) in live.iter_mut().enumerate() {
                windows::for_each_record(
                    &mut files,
                    |f| Box::new(f.trees[i].clone()),
                    windows::whole(),
                    cfg.pass_window_bytes(),
                    |f| f.reopen(&config),
                    |_, k, v| {
                        *slot += (k.len() + v.len()) as u64;
                        Ok(())
                    },
                )?;
            }
        }
        let SledFiles { db, trees } = files;
        let generation = match trees[T::Meta.index()].get(META_GENERATION)? {
            Some(v) => codec::decode::<u64>(&v).unwrap_or(0),
            None => 0,
        };
        Ok(Engine {
            db,
            trees,
            live,
            generation,
            stand_in: false,
        })
    }));
    match opened {
        Ok(Ok(engine)) => match read_witness(path) {
            Some(w) if w > engine.generation => Err(OpenFailure::Damaged(format!(
                "records acknowledged as durable are missing (flush generation {w} was \
                 confirmed, the database holds {})",
                engine.generation
            ))),
            _ => Ok(engine),
        },
        Ok(Err(e)) => Err(classify(e)),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "engine panicked".into());
            Err(OpenFailure::Damaged(format!("engine panicked: {msg}")))
        }
    }
}

/// Open, waiting briefly unless another process holds the lock: sled's I/O threads
/// release a dropped database's file a moment after the drop returns, so the holder is
/// either this very process or already gone (nobody listed) by the time we look.
pub(crate) fn try_open_patiently(
    path: &Path,
    cfg: &StoreConfig,
    verify: Verify,
) -> std::result::Result<Engine, OpenFailure> {
    let mut waited = Duration::ZERO;
    loop {
        match try_open(path, cfg, verify) {
            Err(OpenFailure::Locked)
                if waited < Duration::from_secs(3)
                    && lock::holder(path).is_none_or(|h| h.pid == std::process::id()) =>
            {
                std::thread::sleep(Duration::from_millis(20));
                waited += Duration::from_millis(20);
            }
            other => return other,
        }
    }
}

pub(crate) fn open_engine(
    path: &Path,
    cfg: &StoreConfig,
    on_corrupt: OnCorrupt,
) -> Result<(Engine, Option<PathBuf>)> {
    match try_open_patiently(path, cfg, Verify::Yes) {
        Ok(e) => Ok((e, None)),
        Err(OpenFailure::Damaged(detail)) if on_corrupt == OnCorrupt::MoveAside => {
            let aside = unused_sibling(path, &format!("corrupt-{}", timestamp()));
            fs::rename(path, &aside).map_err(|e| {
                StoreError::io(
                    format!("moving damaged database {} aside", path.display()),
                    e,
                )
            })?;
            tracing::error!(
                path = %path.display(),
                moved_to = %aside.display(),
                %detail,
                "DATABASE DAMAGED: moved aside, starting a fresh one; the old data is kept there for inspection"
            );
            // A second failure on a fresh directory is not corruption: report it, do not loop.
            match try_open_patiently(path, cfg, Verify::Yes) {
                Ok(e) => Ok((e, Some(aside))),
                Err(OpenFailure::Damaged(detail)) => Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    detail: format!("fresh database failed to open: {detail}"),
                }),
                Err(f) => Err(f.into_error(path)),
            }
        }
        Err(f) => Err(f.into_error(path)),
    }
}

pub(crate) fn write_witness(db: &Path, generation: u64) -> io::Result<()> {
    let tmp = db.join(format!("{WITNESS_FILE}.tmp"));
    fs::write(&tmp, format!("{generation}\n"))?;
    fs::rename(tmp, db.join(WITNESS_FILE))
}

/// The generation recorded beside the database; `None` when absent or unreadable (a torn
/// write of the file itself must not condemn the database).
fn read_witness(db: &Path) -> Option<u64> {
    fs::read_to_string(db.join(WITNESS_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}
