//! The store: opening (with lock, corruption and restart handling), writes, flushing and
//! counters. Queries, history, retention and checks live in sibling modules as further
//! `impl Store` blocks; sled's files and trees themselves are `engine.rs`'s. The daemon's
//! open, the full flush and the drop also write history, so they are `lifecycle.rs`'s,
//! above it, from the parts here.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use model::config::Validate;
use model::Sample;
use sled::IVec;

use crate::chunk;
use crate::codec::{self, Record};
use crate::config::StoreConfig;
use crate::engine::{
    open_engine, try_open_patiently, write_witness, Engine, OnCorrupt, SledFiles, Verify,
    META_GENERATION, T,
};
use crate::error::{Result, StoreError};
use crate::heap_watch::{HeapProbe, HeapWatch};
use crate::history_buffer::HistoryBuffer;
use crate::keys;
use crate::limits::{MAX_INCIDENT_BYTES, MAX_PWRU_BYTES};
use crate::lock;
use crate::model::{CaptureState, Incident, IncidentState, NewIncident, PwruRecord, PwruState};
use crate::paths::unused_sibling;
use crate::windows::{self, KeyRange};

/// Layout version of the database (trees, keys, record types).
/// 2: samples are stored in chunks (see docs/storage.md); a version-1 database opens and
/// its one-sample records stay readable beside the chunks.
/// 3: samples carry their skb address (chunk version 3); older chunks stay readable.
/// 4: history is stored in chunks of points (version-2 history records); one-point
/// records of earlier schemas stay readable beside them.
/// 5: sample chunks are lz4-compressed (chunk version 4); uncompressed ones stay readable.
/// 6: incidents carry the daemon's cause verdict (incident record version 2); version-1
/// incident records stay readable (no cause) until the incident is next written.
/// 7: samples carry their reader's wait (chunk version 5); version-4 and older chunks stay
/// readable (no reader's wait).
/// 8: samples carry the RX queue they came in on (chunk version 6); version-5 and older
/// chunks stay readable (no RX queue).
/// 9: records may name the send probes (probe indexes 7 and 8, appended); every record
/// written before reads unchanged.
/// 10: records may name nic-to-stack and driver-to-completion (probe indexes 9 and 10,
/// appended); every record written before reads unchanged.
pub const SCHEMA_VERSION: u32 = 10;

/// Most samples in one batch (a sample's index in its batch must fit the low bits of its
/// sequence number).
pub const MAX_SAMPLE_BATCH: usize = 1 << chunk::BATCH_INDEX_BITS;

const META_SCHEMA: &[u8] = b"schema";
const META_NEXT_INCIDENT: &[u8] = b"next_incident";
const META_MOVED_ASIDE: &[u8] = b"moved_aside";
pub(crate) const META_ROTATIONS: &[u8] = b"rotations";

/// How far ahead of the incidents handed out the stored id counter is kept: after a crash,
/// ids skip at most this many.
pub const INCIDENT_ID_RESERVE: u64 = 16;

/// What happened while opening the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpenReport {
    /// The engine reported the database damaged; it was moved here and a fresh one started.
    pub moved_aside: Option<PathBuf>,
    /// Incidents that were open when the previous run stopped, now marked interrupted.
    pub interrupted: Vec<u64>,
    /// What the coarser history levels got back from the finest one after a crash.
    pub history_rebuilt: HistoryRebuild,
}

// Beside the report that holds it (not in `history_rebuild.rs`, the pass itself), so that
// the store does not import the pass.
/// What the pass completing the coarser history levels from the finest one restored at
/// open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HistoryRebuild {
    /// Finest-level points merged into a coarser level (once per level).
    pub points: u64,
    /// Coarser-level streams (service, probe, level) that lacked points.
    pub streams: u64,
    /// Coarser-level streams left as they were because their newest point does not add
    /// up from the finest level's points.
    pub inconsistent: u64,
}

/// Counters of the store since it was opened (and, where noted, over its lifetime).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Writes that failed (any reason).
    pub write_errors: u64,
    /// Of those, failures from a full disk.
    pub disk_full_errors: u64,
    /// Records refused for exceeding their size cap.
    pub oversized_records: u64,
    /// Stored records that failed to decode and were skipped.
    pub undecodable_records: u64,
    /// Damaged databases moved aside at open (over the database's lifetime).
    pub corruption_recoveries: u64,
    /// Rotations into a fresh database (over the database's lifetime).
    pub rotations: u64,
    /// Bytes of live keys and values.
    pub live_bytes: u64,
    /// The engine's files on disk, bytes.
    pub size_on_disk: u64,
    /// The engine failed (a full disk, a file system gone read-only) and writes are refused
    /// until it is reopened: tried every [`RECOVER_EVERY`] once the directory takes a write.
    pub engine_failed: bool,
    /// What made it fail, while it is failed.
    pub engine_failure: Option<String>,
    /// Times the engine was closed and reopened to free its memory (see `cache_bytes`).
    pub engine_reopens: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) write_errors: AtomicU64,
    pub(crate) disk_full: AtomicU64,
    pub(crate) oversized: AtomicU64,
    pub(crate) undecodable: AtomicU64,
    pub(crate) reopens: AtomicU64,
}

/// The tailtrap database: one directory, one process at a time.
///
/// Every method takes `&self`; the store can be shared between threads (`Arc<Store>`).
pub struct Store {
    pub(crate) path: PathBuf,
    pub(crate) cfg: StoreConfig,
    engine: RwLock<Engine>,
    pub(crate) counters: Counters,
    live: [AtomicU64; 6],
    /// The next incident id, once read from the database: numbering an incident then
    /// needs no engine access (none waits on an engine reopen).
    next_incident: Mutex<Option<u64>>,
    /// How far the stored counter reaches: ids below it may be handed out without a write.
    reserved_incidents: AtomicU64,
    /// [`Store::stats`]'s figures that need the engine, as last read.
    engine_stats: EngineStats,
    /// Serialises writes of the stored counter of incident ids, so it only moves forward.
    /// Not `next_incident`: numbering must not wait on a write that waits on the engine.
    stored_next_lock: Mutex<()>,
    /// Serialises flushes, so generations reach the witness file in order.
    flush_lock: Mutex<()>,
    /// Serialises history writes, with the chunks being filled (see `history`).
    pub(crate) history_write: Mutex<HistoryBuffer>,
    /// Bumped whenever history records are removed or the engine is replaced: what the
    /// history buffer knows of the tree is then out of date.
    pub(crate) history_epoch: AtomicU64,
    /// Bytes of records written, removed or read through the engine since it was opened:
    /// about what sled holds in memory (see [`Store::maybe_recycle`]).
    touched: AtomicU64,
    /// The process's heap, when the daemon lets the store read it (see `heap_watch`).
    heap: HeapWatch,
    /// Tree handles in use outside the engine lock (long reads): the engine is not
    /// recycled under them, its files would stay locked.
    outside: AtomicUsize,
    generation: AtomicU64,
    /// An engine I/O error happened: sled 0.34 then fails every later call, so the engine is
    /// reopened once its directory takes writes again (see [`Store::recover`]).
    engine_failed: AtomicBool,
    /// The error that set `engine_failed`, for the status.
    failure: Mutex<Option<String>>,
    /// When [`Store::recover`] last tried.
    last_recovery: Mutex<Option<std::time::Instant>>,
    /// Retention has looked for samples and pwru records of deleted incidents since the
    /// store opened (once per open is enough, see `delete_orphans`).
    pub(crate) orphans_checked: AtomicBool,
    /// A failed engine still shutting down (its files stay locked until it has): signalled
    /// when done.
    retiring: Mutex<Option<mpsc::Receiver<()>>>,
    report: OpenReport,
    pid_file: Option<PathBuf>,
    /// A copy made by [`Store::open_existing_or_copy`], removed when the store is dropped.
    scratch_copy: Option<PathBuf>,
}

/// Why the engine is reopened to free its memory.
#[derive(Clone, Copy)]
enum Recycle {
    /// `cache_bytes` of records went through it.
    Records,
    /// The process's heap grew this many bytes (at least `cache_bytes`) since it opened.
    Heap(u64),
}

impl Store {
    /// The first part of [`Store::open`], up to the history pass (`lifecycle.rs`): the
    /// settings checked, a damaged database moved aside and a fresh one started, incidents
    /// left open by the previous run marked interrupted.
    pub(crate) fn open_repaired(path: impl AsRef<Path>, cfg: StoreConfig) -> Result<Store> {
        if let Some(p) = cfg.validate().into_iter().next() {
            return Err(StoreError::Config {
                key: p.key,
                reason: p.reason,
            });
        }
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)
                .map_err(|e| StoreError::io(format!("creating {}", parent.display()), e))?;
        }
        let (engine, moved_aside) = open_engine(&path, &cfg, OnCorrupt::MoveAside)?;
        let mut store = Store::assemble(path, cfg, engine, true)?;
        if let Some(aside) = &moved_aside {
            store.note_moved_aside(aside)?;
        }
        store.report.moved_aside = moved_aside;
        store.report.interrupted = store.mark_interrupted()?;
        Ok(store)
    }

    /// The last part of [`Store::open`]: what the history pass restored reported, the
    /// repairs made durable, and the pid file written so others can name the lock holder.
    pub(crate) fn finish_open(mut self, history_rebuilt: HistoryRebuild) -> Result<Store> {
        self.report.history_rebuilt = history_rebuilt;
        self.flush_records()?;
        self.pid_file = Some(lock::write_pid_file(&self.path)?);
        Ok(self)
    }

    /// Open an existing database for reading and checking (the CLI when no daemon runs).
    /// Nothing is repaired: a damaged database is an error, open incidents stay open.
    pub fn open_existing(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref().to_path_buf();
        if !path.join("db").is_file() {
            return Err(StoreError::NoDatabase(path));
        }
        let cfg = StoreConfig::default();
        let (engine, _) = open_engine(&path, &cfg, OnCorrupt::Fail)?;
        Store::assemble(path, cfg, engine, false)
    }

    /// [`Store::open_existing`], or, when the database's file system takes no writes, a
    /// copy of it in the temporary directory (sled 0.34 cannot open its files read-only: a
    /// file system the kernel remounted read-only after a disk error, a snapshot mounted
    /// read-only). The copy is removed when the store is dropped; its path is returned so
    /// that the caller can say what it reads.
    pub fn open_existing_or_copy(path: impl AsRef<Path>) -> Result<(Store, Option<PathBuf>)> {
        let path = path.as_ref();
        match Store::open_existing(path) {
            Err(e) if e.is_read_only() => {}
            r => return r.map(|s| (s, None)),
        }
        let copy = unused_sibling(
            &std::env::temp_dir().join(format!("tailtrap-db-{}", std::process::id())),
            "copy",
        );
        if let Err(e) = copy_dir(path, &copy) {
            let _ = fs::remove_dir_all(&copy);
            return Err(StoreError::io(
                format!(
                    "{} is on a file system that takes no writes, and copying it to {} to \
                     read it failed",
                    path.display(),
                    copy.display()
                ),
                e,
            ));
        }
        match Store::open_existing(&copy) {
            Ok(mut store) => {
                store.scratch_copy = Some(copy.clone());
                Ok((store, Some(copy)))
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&copy);
                Err(e)
            }
        }
    }

    fn assemble(path: PathBuf, cfg: StoreConfig, engine: Engine, writable: bool) -> Result<Store> {
        let live = engine.live.map(AtomicU64::new);
        // Opening read every record (the damage check), and sled keeps what it read.
        let touched = AtomicU64::new(engine.live.iter().sum());
        let generation = AtomicU64::new(engine.generation);
        let store = Store {
            path,
            cfg,
            engine: RwLock::new(engine),
            counters: Counters::default(),
            live,
            next_incident: Mutex::new(None),
            reserved_incidents: AtomicU64::new(0),
            engine_stats: EngineStats::default(),
            stored_next_lock: Mutex::new(()),
            flush_lock: Mutex::new(()),
            history_write: Mutex::default(),
            history_epoch: AtomicU64::new(0),
            touched,
            heap: HeapWatch::new(),
            outside: AtomicUsize::new(0),
            generation,
            engine_failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            last_recovery: Mutex::new(None),
            orphans_checked: AtomicBool::new(false),
            retiring: Mutex::new(None),
            report: OpenReport::default(),
            pid_file: None,
            scratch_copy: None,
        };
        store.check_schema(writable)?;
        // A first reading, for a `stats` call that finds the engine busy.
        store.stats();
        if writable {
            let next = store.stored_next_incident()?;
            *store
                .next_incident
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(next);
            // Stored ahead, so that an id handed out and not stored before a crash is not
            // handed out again after it; a clean close stores the exact next id.
            store.reserve_incident_ids(next)?;
        }
        Ok(store)
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The settings in force.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// What happened at open (corruption recovery, interrupted incidents).
    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    /// Make incidents, samples and pwru lines durable, leaving the history chunks being
    /// filled in memory (they are written when complete, at [`Store::flush`] and at close).
    pub fn flush_records(&self) -> Result<()> {
        self.flush_after(|| {})
    }

    /// The flush of [`Store::flush_records`], with `first` run inside it once the engine
    /// takes work (a failed one reopened) and before the engine flushes: [`Store::flush`]
    /// writes the history chunks being filled there.
    pub(crate) fn flush_after(&self, first: impl FnOnce()) -> Result<()> {
        let _serial = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        // A flush seals sled's current log buffer, retiring it on this thread.
        let _release = ReleaseOnDrop;
        if self.engine_failed.load(Ordering::Relaxed) {
            self.reopen_failed()?;
        }
        first();
        let generation = self.generation.load(Ordering::Relaxed) + 1;
        self.meta_put(META_GENERATION, &generation)?;
        let r = self.engine().db.flush().map(|_| ());
        self.counted(r.map_err(StoreError::from))?;
        self.generation.store(generation, Ordering::Relaxed);
        if let Err(e) = write_witness(&self.path, generation) {
            tracing::warn!(error = %e, "could not record the flush generation");
        }
        Ok(())
    }

    /// Whether the live data is over `max_bytes` (until retention trims it). Cheap: the
    /// store keeps the count as it writes and removes.
    pub fn over_budget(&self) -> bool {
        self.live_bytes() > self.cfg.max_bytes
    }

    /// Current counters.
    ///
    /// Never waits for the engine: the daemon's interval loop reads these every interval
    /// (status and metrics), and an engine reopen, flush or rotation holds the engine's
    /// lock for tens of ms, more on a busy disk. The figures read through the engine
    /// (rotations, recoveries, size on disk) are those of the last call that found it free.
    pub fn stats(&self) -> StoreStats {
        let c = &self.counters;
        let cached = &self.engine_stats;
        if let Ok(eng) = self.engine.try_read() {
            let meta = eng.tree(T::Meta);
            let rotations = meta
                .get(META_ROTATIONS)
                .ok()
                .flatten()
                .and_then(|v| self.decode_counted::<u64>(T::Meta, META_ROTATIONS, &v));
            let moved =
                meta.get(META_MOVED_ASIDE).ok().flatten().and_then(|v| {
                    self.decode_counted::<Vec<String>>(T::Meta, META_MOVED_ASIDE, &v)
                });
            cached
                .rotations
                .store(rotations.unwrap_or(0), Ordering::Relaxed);
            cached
                .recoveries
                .store(moved.map_or(0, |m| m.len() as u64), Ordering::Relaxed);
            if let Ok(size) = eng.db.size_on_disk() {
                cached.size_on_disk.store(size, Ordering::Relaxed);
            }
        }
        StoreStats {
            write_errors: c.write_errors.load(Ordering::Relaxed),
            disk_full_errors: c.disk_full.load(Ordering::Relaxed),
            oversized_records: c.oversized.load(Ordering::Relaxed),
            undecodable_records: c.undecodable.load(Ordering::Relaxed),
            corruption_recoveries: cached.recoveries.load(Ordering::Relaxed),
            rotations: cached.rotations.load(Ordering::Relaxed),
            live_bytes: self.live_bytes(),
            size_on_disk: cached.size_on_disk.load(Ordering::Relaxed),
            engine_failed: self.engine_failed.load(Ordering::Relaxed),
            engine_failure: self
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            engine_reopens: c.reopens.load(Ordering::Relaxed),
        }
    }

    /// The engine's files on disk, bytes.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.engine().db.size_on_disk()?)
    }

    // ---- incidents ------------------------------------------------------------------

    /// Open an incident: allocate its id and store it durably.
    pub fn open_incident(&self, new: &NewIncident) -> Result<Incident> {
        let incident = self.open_incident_buffered(new)?;
        self.flush_records()?;
        Ok(incident)
    }

    /// [`Store::open_incident`] without waiting for the disk: readable at once, durable at
    /// the next flush (the engine's own within `flush_every`, or [`Store::flush_records`]).
    /// For a caller that must not wait on an fsync and asks for the flush elsewhere.
    pub fn open_incident_buffered(&self, new: &NewIncident) -> Result<Incident> {
        let incident = self.number_incident(new)?;
        self.put_new_incident(&incident)?;
        Ok(incident)
    }

    /// The id the next incident gets, from the database: the stored counter, or the newest
    /// stored id + 1 if the counter lags (a damaged meta record must not make ids repeat).
    fn stored_next_incident(&self) -> Result<u64> {
        let next = self.meta_get::<u64>(META_NEXT_INCIDENT)?.unwrap_or(1);
        let last = self
            .engine()
            .tree(T::Incidents)
            .last()?
            .and_then(|(k, _)| keys::u64_at(&k, 0))
            .map_or(1, |id| id + 1);
        Ok(next.max(last))
    }

    /// Store `from + INCIDENT_ID_RESERVE` as the next incident id unless the stored one is
    /// that far already.
    fn reserve_incident_ids(&self, from: u64) -> Result<()> {
        let _serial = self
            .stored_next_lock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let want = from.saturating_add(INCIDENT_ID_RESERVE);
        let stored = self.meta_get::<u64>(META_NEXT_INCIDENT)?.unwrap_or(1);
        if stored < want {
            self.meta_put(META_NEXT_INCIDENT, &want)?;
        }
        self.reserved_incidents
            .fetch_max(stored.max(want), Ordering::Relaxed);
        Ok(())
    }

    /// A new open incident with its id, not stored yet: [`Store::put_new_incident`] stores
    /// it. Numbering touches no engine: ids come from memory, below a counter stored ahead
    /// of them (when the store opens, then as incidents are stored), so the daemon's
    /// interval loop numbers an incident at once and hands the write to its storage
    /// thread, ahead of the incident's samples. An id handed out is never handed out
    /// again, even when a crash came before its record was stored; after such a crash
    /// the ids skip up to [`INCIDENT_ID_RESERVE`].
    ///
    /// A failed engine does not stop numbering: the daemon still tracks, and captures
    /// for, an incident whose record cannot be stored yet.
    pub fn number_incident(&self, new: &NewIncident) -> Result<Incident> {
        keys::check_service(&new.service)?;
        let id = {
            let mut next = self.next_incident.lock().unwrap_or_else(|e| e.into_inner());
            let id = match *next {
                Some(id) => id,
                None => self.stored_next_incident()?,
            };
            *next = Some(id + 1);
            id
        };
        if id >= self.reserved_incidents.load(Ordering::Relaxed) {
            // Only when the storage thread stored none of the last ids (its writes failing):
            // reserve here, on the caller's time, rather than risk an id twice.
            if let Err(e) = self.reserve_incident_ids(id + 1) {
                tracing::warn!(incident = id, error = %e, "could not store the incident id counter ahead");
            }
        }
        Ok(Incident {
            id,
            service: new.service.clone(),
            probes: new.probes.clone(),
            opened_ns: new.opened_ns,
            closed_ns: None,
            state: IncidentState::Open,
            evidence_json: new.evidence_json.clone(),
            stages_json: new.stages_json.clone(),
            capture: Default::default(),
            pwru: Default::default(),
            counters: Default::default(),
            cause: None,
        })
    }

    /// Store an incident numbered by [`Store::number_incident`] (its record as it is now),
    /// without waiting for the disk (see [`Store::open_incident_buffered`]).
    pub fn put_new_incident(&self, incident: &Incident) -> Result<()> {
        keys::check_service(&incident.service)?;
        self.writable()?;
        let value = self.encode("incident", incident, MAX_INCIDENT_BYTES)?;
        // Keep the stored counter at least half the reserve ahead of what was stored, so
        // numbering never has to write it.
        if self.reserved_incidents.load(Ordering::Relaxed)
            < incident.id + 1 + INCIDENT_ID_RESERVE / 2
        {
            self.reserve_incident_ids(incident.id + 1)?;
        }
        self.put(T::Incidents, &keys::incident(incident.id), value)
    }

    /// Replace a stored incident's record (status and counter updates). Durable within
    /// `flush_every`.
    pub fn update_incident(&self, incident: &Incident) -> Result<()> {
        keys::check_service(&incident.service)?;
        self.require_incident(incident.id)?;
        let value = self.encode("incident", incident, MAX_INCIDENT_BYTES)?;
        self.put(T::Incidents, &keys::incident(incident.id), value)
    }

    /// Close an incident: store `incident` (with its final status) as closed at `closed_ns`,
    /// durably.
    pub fn close_incident(&self, incident: &mut Incident, closed_ns: u64) -> Result<()> {
        self.close_incident_buffered(incident, closed_ns)?;
        self.flush_records()
    }

    /// [`Store::close_incident`] without waiting for the disk (see
    /// [`Store::open_incident_buffered`]).
    pub fn close_incident_buffered(&self, incident: &mut Incident, closed_ns: u64) -> Result<()> {
        incident.state = IncidentState::Closed;
        incident.closed_ns = Some(closed_ns);
        self.update_incident(incident)
    }

    /// One incident.
    pub fn incident(&self, id: u64) -> Result<Option<Incident>> {
        let raw = self.engine().tree(T::Incidents).get(keys::incident(id))?;
        Ok(raw.and_then(|v| self.decode_counted(T::Incidents, &keys::incident(id), &v)))
    }

    /// [`StoreError::NoSuchIncident`] unless incident `id` is stored: what every call
    /// naming an incident checks first.
    pub(crate) fn require_incident(&self, id: u64) -> Result<()> {
        if !self.incident_exists(id)? {
            return Err(StoreError::NoSuchIncident(id));
        }
        Ok(())
    }

    pub(crate) fn incident_exists(&self, id: u64) -> Result<bool> {
        Ok(self
            .engine()
            .tree(T::Incidents)
            .contains_key(keys::incident(id))?)
    }

    /// Incidents the previous run left open become interrupted.
    fn mark_interrupted(&self) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        for (_, mut inc) in self.scan::<Incident>(T::Incidents, ..)? {
            if inc.state == IncidentState::Open {
                inc.state = IncidentState::Interrupted;
                // Nothing of the previous run is still going on: say so rather than leave
                // "armed" or "running" standing for good.
                if inc.capture.state == CaptureState::Armed {
                    inc.capture.state = CaptureState::Disarmed;
                    inc.capture.message =
                        "disarmed: tailtrap stopped while capture was armed".into();
                }
                if inc.pwru.is_waiting() {
                    inc.pwru.state = PwruState::NotRun;
                    inc.pwru.message = "skipped-busy: tailtrap stopped while this incident \
                                        waited for another incident's pwru session to end"
                        .into();
                } else if inc.pwru.state == PwruState::Running {
                    inc.pwru.state = PwruState::Failed;
                    inc.pwru.message =
                        "tailtrap stopped while pwru ran; the lines stored until then are kept"
                            .into();
                }
                tracing::warn!(
                    incident = inc.id,
                    service = %inc.service,
                    "incident was open when the previous run stopped; marked interrupted"
                );
                let value = self.encode("incident", &inc, MAX_INCIDENT_BYTES)?;
                self.put(T::Incidents, &keys::incident(inc.id), value)?;
                ids.push(inc.id);
            }
        }
        Ok(ids)
    }

    // ---- samples and pwru -----------------------------------------------------------

    /// Store a batch of samples (at most [`MAX_SAMPLE_BATCH`]) atomically. Durable within
    /// `flush_every` (or at [`Store::flush`]). Every sample's incident must exist.
    ///
    /// The batch is stored as chunk records of up to 256 samples of one incident each, in
    /// time order within the batch.
    pub fn put_samples(&self, samples: &[Sample]) -> Result<()> {
        self.writable()?;
        self.room_for_bulk()?;
        if samples.len() > MAX_SAMPLE_BATCH {
            return self.counted(Err(StoreError::TooLarge {
                kind: "sample batch",
                size: samples.len(),
                max: MAX_SAMPLE_BATCH,
            }));
        }
        self.require_incidents(samples.iter().map(|s| s.incident))?;
        let eng = self.engine();
        // One id per batch, the chunk number and index in the low bits: unique, and
        // cheaper than an id per sample or per chunk.
        let batch_id = self.counted(eng.db.generate_id().map_err(StoreError::from))?;
        let chunks = self.counted_encoding(chunk::encode_batch(batch_id, samples))?;
        let mut batch = sled::Batch::default();
        let mut bytes = 0u64;
        for c in chunks {
            bytes += (c.key.len() + c.value.len()) as u64;
            batch.insert(&c.key[..], c.value);
        }
        let r = eng.tree(T::Samples).apply_batch(batch);
        drop(eng);
        self.counted(r.map_err(StoreError::from))?;
        self.live[T::Samples.index()].fetch_add(bytes, Ordering::Relaxed);
        self.touch(bytes);
        self.maybe_recycle();
        Ok(())
    }

    /// Store pwru lines atomically (keyed by incident and `seq`; a repeated `seq`
    /// replaces). Durable within `flush_every`. Every record's incident must exist.
    pub fn put_pwru(&self, records: &[PwruRecord]) -> Result<()> {
        self.writable()?;
        self.room_for_bulk()?;
        self.require_incidents(records.iter().map(|r| r.incident))?;
        let mut batch = sled::Batch::default();
        let mut bytes = 0u64;
        for r in records {
            let value = self.encode("pwru", r, MAX_PWRU_BYTES)?;
            let key = keys::pwru(r.incident, r.seq);
            bytes += (key.len() + value.len()) as u64;
            batch.insert(&key[..], value);
        }
        let r = self.engine().tree(T::Pwru).apply_batch(batch);
        self.counted(r.map_err(StoreError::from))?;
        // A replaced seq makes this an overestimate until the next recount; harmless for a
        // budget check.
        self.live[T::Pwru.index()].fetch_add(bytes, Ordering::Relaxed);
        self.touch(bytes);
        self.maybe_recycle();
        Ok(())
    }

    fn require_incidents(&self, ids: impl Iterator<Item = u64>) -> Result<()> {
        let mut seen: Vec<u64> = Vec::new();
        for id in ids {
            if !seen.contains(&id) {
                self.require_incident(id)?;
                seen.push(id);
            }
        }
        Ok(())
    }

    // ---- internals shared by the other modules --------------------------------------

    pub(crate) fn engine(&self) -> RwLockReadGuard<'_, Engine> {
        // A panic while holding the lock leaves the engine itself intact.
        self.engine.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn engine_mut(&self) -> RwLockWriteGuard<'_, Engine> {
        let guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        // Whatever the holder does to the engine, cached history is no longer trusted.
        self.history_epoch.fetch_add(1, Ordering::SeqCst);
        guard
    }

    /// A handle on tree `t` for a long read outside the engine lock, so the read does not
    /// hold up writers. While any is alive the engine is not recycled: the handle keeps
    /// the old engine, and with it the database's lock, alive.
    pub(crate) fn tree_outside(&self, t: T) -> TreeHandle<'_> {
        let eng = self.engine();
        // Counted under the read lock: a recycle, holding the write lock, sees every handle.
        self.outside.fetch_add(1, Ordering::SeqCst);
        TreeHandle {
            tree: eng.tree(t).clone(),
            outside: &self.outside,
        }
    }

    /// [`windows::for_each_record`] over tree `t` of this store: each window through a tree
    /// handle taken outside the engine lock, windows of `pass_window_bytes`, the engine
    /// reopened between them once `cache_bytes` went through it.
    pub(crate) fn for_each_record_in_windows(
        &self,
        t: T,
        range: KeyRange,
        mut visit: impl FnMut(IVec, IVec) -> Result<()>,
    ) -> Result<()> {
        let mut store = self;
        windows::for_each_record(
            &mut store,
            |s| s.tree_outside(t),
            range,
            self.cfg.pass_window_bytes(),
            |s| {
                s.maybe_recycle();
                Ok(())
            },
            |_, k, v| visit(k, v),
        )
    }

    /// Note `bytes` of records written, removed or read through the engine.
    pub(crate) fn touch(&self, bytes: u64) {
        self.touched.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Reopen the engine once `cache_bytes` of records have gone through it since it was
    /// opened, or the heap grew that much (see [`Store::watch_heap`]), so that its memory
    /// stays about that size.
    ///
    /// sled 0.34 keeps in memory what was written or read until its LRU evicts it, and
    /// that LRU rarely does: it is split into 256 shards by page id, a shard looks at its
    /// accesses only once 64 have queued up, and it always keeps its most recent page
    /// whatever its size (docs/reliability.md, "RSS"). So its memory follows what went
    /// through it, not `cache_capacity`. A dropped engine frees all of it, and a reopened
    /// one starts with pages on disk only (it reads its page table, not the pages).
    ///
    /// A reopen holds the engine's write lock about 20 ms on a small database, 35-50 ms on
    /// 300 MB (up to ~90 ms on a loaded host), whatever the threshold: a larger
    /// `cache_bytes` makes these stalls rarer and RSS swing more. Each reopen also leaves
    /// about 1 MB more on disk, for rotation to reclaim.
    ///
    /// Nothing acknowledged is lost: sled writes out everything as it drops, and the
    /// reopened engine is checked against the flush witness like any other. Called by the
    /// bulk writes and retention themselves, never under the store's own locks; skipped
    /// (left to a later call) while a long read holds a tree handle.
    pub(crate) fn maybe_recycle(&self) {
        release_retired_memory();
        let Some(why) = self.recycle_due() else {
            return;
        };
        if let Err(e) = self.recycle(why) {
            tracing::error!(error = %e, "reopening the storage engine to free its memory failed");
        }
    }

    /// Whether the engine should be reopened to free its memory, and why.
    fn recycle_due(&self) -> Option<Recycle> {
        if self.touched.load(Ordering::Relaxed) >= self.cfg.cache_bytes {
            return Some(Recycle::Records);
        }
        match self.heap.growth() {
            Some(grown) if grown >= self.cfg.cache_bytes => Some(Recycle::Heap(grown)),
            _ => None,
        }
    }

    /// Let the store read the process's heap, so that it also reopens the engine once the
    /// heap grew `cache_bytes` since the engine was opened: sled keeps in memory pages its
    /// segment cleaner read back from disk, which no count of the store's own reads and
    /// writes sees. The daemon passes glibc's count, once started. Growth counts from the
    /// first reading taken after this call; only the first probe set is used.
    pub fn watch_heap(&self, probe: HeapProbe) {
        if !self.heap.set_probe(probe) {
            tracing::debug!("the store already watches the heap; the new probe is ignored");
        }
    }

    fn recycle(&self, why: Recycle) -> Result<()> {
        // The flush lock keeps flushes (and their generation) off a half-swapped engine.
        let _serial = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.engine_failed.load(Ordering::Relaxed) {
            // The next flush reopens it anyway.
            return Ok(());
        }
        let started = std::time::Instant::now();
        // Write out what is buffered while writers can still go on, so that the drop below,
        // under the write lock, has little left to write.
        let flushed = self.engine().db.flush().map(|_| ());
        self.counted(flushed.map_err(StoreError::from))?;
        // Not `engine_mut`: the data stays the same, so the history buffer's knowledge of
        // the tree stays right.
        let flushed_at = started.elapsed();
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        // Another thread may have reopened it meanwhile.
        if guard.stand_in || self.outside.load(Ordering::SeqCst) > 0 || self.recycle_due().is_none()
        {
            return Ok(());
        }
        let locked = std::time::Instant::now();
        let placeholder = Store::temporary_engine()?;
        let old = Store::replace_engine(&mut guard, placeholder);
        // Dropped on a thread of its own, waited for a bounded time: sled can wait forever
        // on a write a full disk made fail (see `reopen_engine`).
        let done = retire(old);
        match done.recv_timeout(RETIRE_WAIT) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                *self.retiring.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
                return self.counted(Err(StoreError::Engine(ENGINE_STUCK.into())));
            }
        }
        let dropped_at = locked.elapsed();
        let engine = match try_open_patiently(&self.path, &self.cfg, Verify::No) {
            Ok(engine) => engine,
            Err(f) => {
                // The stand-in refuses writes and reads; the next flush reopens the files
                // with the full check.
                let e = f.into_error(&self.path);
                self.mark_failed(&e);
                return self.counted(Err(e));
            }
        };
        self.generation
            .fetch_max(engine.generation, Ordering::Relaxed);
        let placeholder = Store::replace_engine(&mut guard, engine);
        let touched = self.touched.swap(0, Ordering::Relaxed);
        self.heap.renewed();
        self.counters.reopens.fetch_add(1, Ordering::Relaxed);
        let held = locked.elapsed();
        drop(guard);
        drop(placeholder);
        // The files' size, to set the reopens against RSS and the log's growth.
        let disk_bytes = self.size_on_disk().unwrap_or(0);
        // Readers and writers wait for `held_ms` (drop and open), not for the flush. At debug:
        // routine (a busy host reopens every minute or so), counted in status and /metrics
        // (`tailtrap_store_engine_reopens_total`).
        let (why, heap_growth) = match why {
            Recycle::Records => ("records", None),
            Recycle::Heap(grown) => ("heap", Some(grown)),
        };
        tracing::debug!(
            why,
            touched,
            heap_growth,
            disk_bytes,
            flush_ms = flushed_at.as_secs_f64() * 1e3,
            drop_ms = dropped_at.as_secs_f64() * 1e3,
            open_ms = (held - dropped_at).as_secs_f64() * 1e3,
            held_ms = held.as_secs_f64() * 1e3,
            "storage engine reopened to free its memory"
        );
        Ok(())
    }

    /// Count a failed write (and whether the disk was full) and pass the result on.
    pub(crate) fn counted<V>(&self, r: Result<V>) -> Result<V> {
        if let Err(e) = &r {
            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            if e.is_disk_full() {
                self.counters.disk_full.fetch_add(1, Ordering::Relaxed);
            }
            if matches!(e, StoreError::Io { .. } | StoreError::Engine(_)) {
                self.mark_failed(e);
            }
        }
        r
    }

    /// Whether the engine has failed and writes are refused until it is reopened (see
    /// [`Store::recover`]).
    pub fn engine_failed(&self) -> bool {
        self.engine_failed.load(Ordering::Relaxed)
    }

    /// Refuse writes while the engine is known to have failed: sled would refuse them too,
    /// and a stand-in engine left by a failed reopen must never take writes that would
    /// silently vanish.
    /// Whether queries can be answered: not while a stand-in engine holds the place of a
    /// failed one that is still shutting down (its data would look gone).
    pub fn readable(&self) -> Result<()> {
        if self.engine().stand_in {
            return Err(StoreError::Engine(ENGINE_STUCK.into()));
        }
        Ok(())
    }

    /// Refuse bulk records (samples, pwru lines, history) when the file system is below the
    /// free-space reserve, before sled meets a full disk.
    pub(crate) fn room_for_bulk(&self) -> Result<()> {
        let reserve = self.cfg.min_free_bytes;
        if reserve == 0 {
            return Ok(());
        }
        // An unreadable file system size is no reason to refuse; sled will report real
        // trouble itself.
        let Some(free) = available_bytes(&self.path) else {
            return Ok(());
        };
        if free >= reserve {
            return Ok(());
        }
        self.counted(Err(StoreError::LowDiskSpace {
            path: self.path.clone(),
            free,
            reserve,
        }))
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.engine_failed.load(Ordering::Relaxed) {
            return self.counted(Err(StoreError::Engine(
                "storage engine unavailable after an I/O failure; it is reopened once the \
                 database directory takes writes again"
                    .into(),
            )));
        }
        Ok(())
    }

    /// Refuse writes until the engine is reopened, because of `e`. The first failure of a
    /// spell is logged as an error saying what goes on and what to do; the later ones are
    /// only counted.
    pub(crate) fn mark_failed(&self, e: &StoreError) {
        let mut failure = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if self.engine_failed.swap(true, Ordering::Relaxed) {
            return;
        }
        *failure = Some(e.to_string());
        tracing::error!(
            path = %self.path.display(),
            error = %e,
            "database writes are failing: new records are dropped (counted in write errors) \
             while the stored ones stay readable and detection goes on; the engine is \
             reopened once the directory takes writes again, tried every 10 s (a file \
             system remounted read-only after an error needs a check and a restart: \
             docs/operations.md, \"Storage faults\")"
        );
    }

    /// Reopen a failed engine if the database directory takes writes again, at most once
    /// every [`RECOVER_EVERY`]; `Ok(true)` when it was reopened. The daemon calls it from
    /// its storage writer, so that a store recovers by itself, not only at the next
    /// incident's flush.
    pub fn recover(&self) -> Result<bool> {
        if !self.engine_failed.load(Ordering::Relaxed) {
            return Ok(false);
        }
        {
            let mut last = self.last_recovery.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < RECOVER_EVERY) {
                return Ok(false);
            }
            *last = Some(std::time::Instant::now());
        }
        let _serial = self.flush_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !self.engine_failed.load(Ordering::Relaxed) {
            return Ok(false);
        }
        self.reopen_failed()?;
        Ok(true)
    }

    /// Reopen the failed engine, once its directory takes a write. On a file system gone
    /// read-only the failed engine is kept: it still answers reads, and a reopen would fail
    /// and leave a stand-in that answers none.
    fn reopen_failed(&self) -> Result<()> {
        let generation = self.generation.load(Ordering::Relaxed);
        if let Err(e) = write_witness(&self.path, generation) {
            return Err(StoreError::io(
                format!(
                    "the database directory {} takes no writes (the engine stays failed)",
                    self.path.display()
                ),
                e,
            ));
        }
        self.reopen_engine()
    }

    /// Replace a failed engine by a freshly opened one on the same files.
    ///
    /// The failed engine must be gone (its lock released) before the files reopen, but
    /// sled 0.34 can wait forever for a log write that a full disk made fail without
    /// recording the failure. It is shut down on a thread of its own, waited for a
    /// bounded time and, if still stuck, left to finish while writes stay refused: the
    /// process keeps running, and a later flush tries again.
    fn reopen_engine(&self) -> Result<()> {
        let mut guard = self.engine_mut();
        let mut retiring = self.retiring.lock().unwrap_or_else(|e| e.into_inner());
        // The first attempt waits; later ones only look, so a stuck engine does not hold
        // the store's lock (and every reader) for long at each flush.
        let mut wait = Duration::ZERO;
        if retiring.is_none() {
            let placeholder = Store::temporary_engine()?;
            *retiring = Some(retire(Store::replace_engine(&mut guard, placeholder)));
            wait = RETIRE_WAIT;
        }
        if let Some(done) = retiring.as_ref() {
            match done.recv_timeout(wait) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => *retiring = None,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::error!(
                        path = %self.path.display(),
                        "the storage engine has not shut down after an I/O failure and still \
                         holds the database; writes stay refused (restart tailtrap if this \
                         persists; records flushed before the failure are safe)"
                    );
                    return self.counted(Err(StoreError::Engine(ENGINE_STUCK.into())));
                }
            }
        }
        drop(retiring);
        let engine = Store::open_engine_at(&self.path, &self.cfg)?;
        self.reset_live(engine.live);
        self.generation
            .fetch_max(engine.generation, Ordering::Relaxed);
        drop(Store::replace_engine(&mut guard, engine));
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.engine_failed.store(false, Ordering::Relaxed);
        tracing::warn!(path = %self.path.display(), "storage engine reopened after an I/O failure");
        Ok(())
    }

    pub(crate) fn encode<V: Record>(
        &self,
        kind: &'static str,
        value: &V,
        max: usize,
    ) -> Result<Vec<u8>> {
        self.counted_encoding(codec::encode(kind, value, max))
    }

    /// Count a failed encoding (and whether the record was over its cap) and pass it on.
    fn counted_encoding<V>(&self, r: Result<V>) -> Result<V> {
        if matches!(r, Err(StoreError::TooLarge { .. })) {
            self.counters.oversized.fetch_add(1, Ordering::Relaxed);
        }
        self.counted(r)
    }

    /// Decode a stored value; a bad one is logged, counted and skipped.
    pub(crate) fn decode_counted<V: Record>(&self, t: T, key: &[u8], value: &[u8]) -> Option<V> {
        self.touch((key.len() + value.len()) as u64);
        self.skip_undecodable(t, key, codec::decode(value))
    }

    /// Decode a sample chunk record; a bad one is logged, counted and skipped.
    pub(crate) fn decode_chunk_counted(&self, key: &[u8], value: &[u8]) -> Option<Vec<Sample>> {
        self.touch((key.len() + value.len()) as u64);
        self.skip_undecodable(T::Samples, key, chunk::decode(value))
    }

    fn skip_undecodable<V>(
        &self,
        t: T,
        key: &[u8],
        decoded: std::result::Result<V, codec::DecodeError>,
    ) -> Option<V> {
        match decoded {
            Ok(v) => Some(v),
            Err(e) => {
                self.counters.undecodable.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(tree = t.name(), key = ?key, error = %e, "skipping undecodable record");
                None
            }
        }
    }

    /// Decoded records of a key range, undecodable ones skipped and counted. The tree
    /// handle is taken out of the lock, so a long scan does not hold up writers.
    pub(crate) fn scan<V: Record>(
        &self,
        t: T,
        range: impl std::ops::RangeBounds<Vec<u8>>,
    ) -> Result<Vec<(sled::IVec, V)>> {
        let tree = self.tree_outside(t);
        let iter = tree.range(range);
        let mut failed: Option<sled::Error> = None;
        let mut out = Vec::new();
        for item in iter {
            match item {
                Ok((k, v)) => {
                    if let Some(d) = self.decode_counted(t, &k, &v) {
                        out.push((k, d));
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }

    /// Insert one value, keeping the live-byte count exact.
    pub(crate) fn put(&self, t: T, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.writable()?;
        let new_len = (key.len() + value.len()) as u64;
        let r = self.engine().tree(t).insert(key, value);
        let old = self.counted(r.map_err(StoreError::from))?;
        self.live_add(t, new_len, old.map(|o| (key.len() + o.len()) as u64));
        Ok(())
    }

    /// Remove one key, keeping the live-byte count exact; returns the bytes freed.
    pub(crate) fn remove(&self, t: T, key: &[u8]) -> Result<u64> {
        self.writable()?;
        let r = self.engine().tree(t).remove(key);
        if t == T::History {
            self.history_epoch.fetch_add(1, Ordering::SeqCst);
        }
        let old = self.counted(r.map_err(StoreError::from))?;
        let freed = old.map_or(0, |o| (key.len() + o.len()) as u64);
        self.live_add(t, 0, Some(freed));
        Ok(freed)
    }

    pub(crate) fn live_add(&self, t: T, added: u64, removed: Option<u64>) {
        self.touch(added + removed.unwrap_or(0));
        let slot = &self.live[t.index()];
        slot.fetch_add(added, Ordering::Relaxed);
        if let Some(r) = removed {
            // Saturating: concurrent estimates must not wrap.
            let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(r))
            });
        }
    }

    /// Live bytes of all trees.
    pub(crate) fn live_bytes(&self) -> u64 {
        self.live.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }

    /// Take the live-byte counts of a freshly opened engine (after rotation).
    pub(crate) fn reset_live(&self, live: [u64; 6]) {
        // Opening read every record, and sled keeps what it read.
        self.touched.store(live.iter().sum(), Ordering::Relaxed);
        self.heap.renewed();
        for (slot, v) in self.live.iter().zip(live) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn meta_get<V: Record>(&self, key: &[u8]) -> Result<Option<V>> {
        let raw = self.engine().tree(T::Meta).get(key)?;
        Ok(raw.and_then(|v| self.decode_counted(T::Meta, key, &v)))
    }

    pub(crate) fn meta_put<V: Record>(&self, key: &[u8], value: &V) -> Result<()> {
        let value = self.encode("meta", value, 64 << 10)?;
        self.put(T::Meta, key, value)
    }

    /// Refuse a database from a newer build; when writing, record this build's version so
    /// an older build refuses the records it could not read.
    fn check_schema(&self, writable: bool) -> Result<()> {
        match self.meta_get::<u32>(META_SCHEMA)? {
            Some(v) if v > SCHEMA_VERSION => Err(StoreError::SchemaTooNew {
                found: v,
                supported: SCHEMA_VERSION,
            }),
            Some(v) if v < SCHEMA_VERSION && writable => {
                tracing::info!(
                    from = v,
                    to = SCHEMA_VERSION,
                    "database schema upgraded: new samples are stored in compressed chunks \
                     with their skb address, reader's wait and RX queue, history in chunks, \
                     incidents with their cause; older records stay as they are and readable"
                );
                self.meta_put(META_SCHEMA, &SCHEMA_VERSION)
            }
            Some(_) => Ok(()),
            None if writable => self.meta_put(META_SCHEMA, &SCHEMA_VERSION),
            None => Ok(()),
        }
    }

    /// The schema version stored in the database.
    pub fn schema_version(&self) -> Result<u32> {
        Ok(self.meta_get(META_SCHEMA)?.unwrap_or(SCHEMA_VERSION))
    }

    fn note_moved_aside(&self, aside: &Path) -> Result<()> {
        let mut list: Vec<String> = self.meta_get(META_MOVED_ASIDE)?.unwrap_or_default();
        list.push(aside.display().to_string());
        self.meta_put(META_MOVED_ASIDE, &list)
    }

    /// Swap in another engine (rotation) while holding the write lock; returns the old one.
    pub(crate) fn replace_engine(
        guard: &mut RwLockWriteGuard<'_, Engine>,
        engine: Engine,
    ) -> Engine {
        std::mem::replace(&mut **guard, engine)
    }

    /// An in-memory engine, deleted when dropped.
    pub(crate) fn temporary_engine() -> Result<Engine> {
        let SledFiles { db, trees } = SledFiles::temporary()?;
        Ok(Engine {
            db,
            trees,
            live: [0; 6],
            generation: 0,
            stand_in: true,
        })
    }

    /// Drop the engine `guard` holds and open its files again without reading them, to
    /// free what sled kept of a long pass (rotation's copy). Not while a tree handle is
    /// out, which keeps the old files locked: then nothing is done and `false` returned.
    pub(crate) fn reopen_held(&self, guard: &mut RwLockWriteGuard<'_, Engine>) -> Result<bool> {
        if guard.stand_in || self.outside.load(Ordering::SeqCst) > 0 {
            return Ok(false);
        }
        let placeholder = Store::temporary_engine()?;
        let old = Store::replace_engine(guard, placeholder);
        let done = retire(old);
        if let Err(mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(RETIRE_WAIT) {
            *self.retiring.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
            return self.counted(Err(StoreError::Engine(ENGINE_STUCK.into())));
        }
        match try_open_patiently(&self.path, &self.cfg, Verify::No) {
            Ok(engine) => {
                drop(Store::replace_engine(guard, engine));
                self.heap.renewed();
                Ok(true)
            }
            Err(f) => {
                let e = f.into_error(&self.path);
                self.mark_failed(&e);
                self.counted(Err(e))
            }
        }
    }

    /// Close `engine` (the files at `path`) and open them again without reading them.
    pub(crate) fn reopen_files(engine: &mut Engine, path: &Path, cfg: &StoreConfig) -> Result<()> {
        let old = std::mem::replace(engine, Store::temporary_engine()?);
        if let Err(mpsc::RecvTimeoutError::Timeout) = retire(old).recv_timeout(RETIRE_WAIT) {
            return Err(StoreError::Engine(ENGINE_STUCK.into()));
        }
        *engine = try_open_patiently(path, cfg, Verify::No).map_err(|f| f.into_error(path))?;
        Ok(())
    }

    pub(crate) fn open_engine_at(path: &Path, cfg: &StoreConfig) -> Result<Engine> {
        open_engine(path, cfg, OnCorrupt::Fail).map(|(e, _)| e)
    }
}

impl Store {
    /// What dropping the store does (`lifecycle.rs`), with `last_writes` run first when the
    /// engine has not failed: the history chunks being filled are written there.
    pub(crate) fn close(&mut self, last_writes: impl FnOnce(&Store)) {
        if self.engine_failed.load(Ordering::Relaxed) {
            // Dropping a failed engine in place could block the shutdown forever (see
            // `reopen_engine`): retire it, waiting a bounded time.
            if let Ok(placeholder) = Store::temporary_engine() {
                let failed = Store::replace_engine(&mut self.engine_mut(), placeholder);
                if retire(failed).recv_timeout(RETIRE_WAIT).is_err() {
                    tracing::error!("the failed storage engine did not shut down; leaving it");
                }
            }
        } else {
            last_writes(self);
            // A clean close leaves the exact next id, not the reserve: ids skip only
            // after a crash.
            let next = *self.next_incident.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(next) = next {
                let stored = self.meta_get::<u64>(META_NEXT_INCIDENT).ok().flatten();
                if stored.is_some_and(|s| s > next) {
                    if let Err(e) = self.meta_put(META_NEXT_INCIDENT, &next) {
                        tracing::error!(error = %e, "the next incident id could not be stored");
                    }
                }
            }
            if let Err(e) = self.engine().db.flush() {
                tracing::error!(error = %e, "final flush of the database failed");
            }
        }
        if let Some(p) = &self.pid_file {
            lock::remove_pid_file(p);
        }
        if let Some(copy) = &self.scratch_copy {
            // The engine goes first: it writes to its files as it closes.
            if let Ok(placeholder) = Store::temporary_engine() {
                drop(Store::replace_engine(&mut self.engine_mut(), placeholder));
            }
            if let Err(e) = fs::remove_dir_all(copy) {
                tracing::warn!(path = %copy.display(), error = %e, "could not remove the database's copy");
            }
        }
    }
}

/// How long to wait for a failed engine to shut down.
const RETIRE_WAIT: Duration = Duration::from_secs(10);

/// How often [`Store::recover`] tries a failed engine again.
pub const RECOVER_EVERY: Duration = Duration::from_secs(10);

const ENGINE_STUCK: &str = "storage engine still shutting down after an I/O failure; writes \
     are refused until it has (restart tailtrap if this persists)";

/// Drop `engine` on a thread of its own; the receiver hears when it is gone.
/// Hand what sled retired on this thread to the shared collector now.
///
/// sled 0.34 frees replaced log buffers (512 KiB each) and node versions through
/// crossbeam-epoch's default collector: each thread keeps what it retired in a bag of its
/// own, handed to the collector only once 64 have piled up. The store's threads write a
/// few times a minute, so such a bag can hold many buffers for a long time, through engine
/// reopens (a soak's figures: docs/reliability.md, "The daemon still grows: sled's log
/// buffers"). Handing the bag on after each write and flush is meant to keep that memory
/// to what is in use.
pub(crate) fn release_retired_memory() {
    crossbeam_epoch::pin().flush();
}

/// Calls [`release_retired_memory`] when dropped, after every return path of a flush.
struct ReleaseOnDrop;

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        release_retired_memory();
    }
}

fn retire(engine: Engine) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("store-retire".into())
        .spawn(move || {
            drop(engine);
            let _ = tx.send(());
        });
    if let Err(e) = spawned {
        // The engine went down with the closure; nothing is waiting on it any more.
        tracing::error!(error = %e, "could not start a thread to shut the engine down");
    }
    rx
}

/// A tree handle for a read outside the engine lock (see [`Store::tree_outside`]).
pub(crate) struct TreeHandle<'a> {
    tree: sled::Tree,
    outside: &'a AtomicUsize,
}

impl std::ops::Deref for TreeHandle<'_> {
    type Target = sled::Tree;

    fn deref(&self) -> &sled::Tree {
        &self.tree
    }
}

impl Drop for TreeHandle<'_> {
    fn drop(&mut self) {
        self.outside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What [`Store::stats`] last read through the engine.
#[derive(Default)]
struct EngineStats {
    rotations: AtomicU64,
    recoveries: AtomicU64,
    size_on_disk: AtomicU64,
}

/// Copy the directory `from` (files and directories, as sled lays them out) to a new `to`,
/// readable by its owner only (the database holds flows and process names; the temporary
/// directory is shared).
fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(0o700).create(to)?;
    let mut pending = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((from, to)) = pending.pop() {
        for entry in fs::read_dir(&from)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let target = to.join(entry.file_name());
            if kind.is_dir() {
                fs::create_dir(&target)?;
                pending.push((entry.path(), target));
            } else if kind.is_file() {
                fs::copy(entry.path(), target)?;
            }
        }
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the file system holding `path`
/// (`f_bavail * f_frsize`); `None` when statvfs fails.
fn available_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and outlives the call; `st` is writable memory of
    // the type statvfs fills.
    if unsafe { libc::statvfs(c_path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    #[allow(clippy::useless_conversion)] // the field types differ between libcs
    let free = u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize));
    Some(free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The daemon's interval loop reads the store's figures every interval: an engine
    /// reopen or rotation holding the lock must not hold it up; the figures it cannot read
    /// meanwhile are the last ones read.
    #[test]
    fn stats_do_not_wait_for_the_engine() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
        let before = store.stats();
        assert!(before.size_on_disk > 0, "{before:?}");
        let held = store.engine.write().unwrap();
        let (tx, rx) = mpsc::channel();
        let reading = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let _ = tx.send(store.stats());
            })
        };
        let read = rx.recv_timeout(Duration::from_secs(10));
        drop(held);
        reading.join().unwrap();
        assert_eq!(read.expect("stats read while the engine was held"), before);
    }

    /// What an engine reopen or rotation does to every other caller (it holds the engine's
    /// write lock for tens of ms): numbering an incident must not wait for it.
    #[test]
    fn numbering_an_incident_does_not_wait_for_the_engine() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
        let new = NewIncident {
            service: "web".into(),
            probes: Vec::new(),
            opened_ns: 1,
            evidence_json: String::new(),
            stages_json: String::new(),
        };
        let held = store.engine.write().unwrap();
        let (tx, rx) = mpsc::channel();
        let numbering = {
            let store = Arc::clone(&store);
            let new = new.clone();
            std::thread::spawn(move || {
                let _ = tx.send(store.number_incident(&new).map(|i| i.id));
            })
        };
        let numbered = rx.recv_timeout(Duration::from_secs(10));
        drop(held);
        numbering.join().unwrap();
        assert_eq!(
            numbered
                .expect("numbered while the engine was held")
                .unwrap(),
            1
        );
        // Storing it does take the engine, after the lock is gone.
        let inc = store.number_incident(&new).unwrap();
        store.put_new_incident(&inc).unwrap();
        assert_eq!(store.incident(2).unwrap().map(|i| i.id), Some(2));
    }
}
