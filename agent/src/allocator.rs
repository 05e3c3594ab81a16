//! glibc malloc behaviour for the long-running daemon, and its heap figures.
//!
//! glibc keeps freed memory inside its heaps: only a free stretch at the top of an arena
//! goes back to the kernel, past a trim threshold it raises on its own up to 64 MiB. The
//! daemon frees a lot in bursts (an incident's samples and pwru output encoded and handed to
//! sled, the BTF parse of the first pwru session), and those holes stayed resident: in a
//! soak, one `malloc_trim` gave back 5.6 of 39.4 MiB of anonymous memory, and RSS ran about
//! 5 MiB lower with this thread (docs/reliability.md, "RSS"). `malloc_trim(0)` returns
//! every whole free page of every arena; it took 0.1 to 0.3 ms in the soak (1.6 ms at most).
//!
//! Every few seconds the thread also reads glibc's own counts of what is allocated, so the
//! status can tell memory in use from allocator slack without the interval loop ever
//! taking an arena lock, and the store can reopen its engine when the heap grew (see
//! [`heap_reading`]).
//!
//! glibc's per-thread caches (tcache) are turned off for the daemon. Each thread keeps up
//! to 7 freed blocks of every size up to 1 KiB for itself; to the arena they stay in use,
//! so they neither coalesce with their neighbours nor let `malloc_trim` return their
//! pages. sled frees and reallocates such blocks from several threads all the time: in
//! `storage/examples/sled_rss` (240 simulated minutes of the soak's writes) the process
//! ran 1.2–1.5 MiB lower on average without them at every `cache_bytes` tried, and
//! after the store was dropped 2.8 MiB of anonymous memory stayed resident instead of
//! 5.8. The daemon benchmark showed no CPU cost: its allocations are few and mostly off
//! the interval loop (docs/reliability.md, "Per-thread caches"). glibc reads the setting
//! only from `GLIBC_TUNABLES` when a process starts, so `tailtrap run` started without
//! it executes itself once more with it set; an operator's own
//! `glibc.malloc.tcache_count` is left as given.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::{Duration, Instant};

/// How often free pages go back to the kernel and glibc's counts are read. The store's
/// engine gains about 1 MiB in 2 to 4 minutes under the soak's load, so a reading this
/// old lets it overshoot its budget by a few percent at most; one reading takes each
/// arena's lock for microseconds. Trimming as often keeps RSS on the live heap: with a
/// trim every 30 s, what the engine and the writers freed stayed resident for up to
/// half a minute, and that share grew with the database (docs/reliability.md, "Trimming
/// every 5 s").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const READ_EVERY: Duration = Duration::from_secs(5);

/// Above this size an allocation gets pages of its own from the kernel, which go back
/// whole when it is freed. It is glibc's starting value; setting it also stops glibc
/// from raising it, up to 32 MiB, each time such a block is freed. Left dynamic, after
/// the first freed sled buffer or sample batch the same sizes were carved from the heap
/// and left holes there: in `storage/examples/sled_rss` at the soak's write rate
/// (`--minutes 120 --rate 200`, two runs each) RSS grew 7.6 → 19.5 MiB from minute 10
/// to 120 without this setting and 7.6 → 13.1 MiB with it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// glibc's counts as last read (bytes); `u64::MAX` until the first reading.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static ARENA_IN_USE: AtomicU64 = AtomicU64::new(u64::MAX);
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static MAPPED_IN_USE: AtomicU64 = AtomicU64::new(u64::MAX);
/// When `ARENA_IN_USE` was read.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static READ_AT: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// What the allocator holds for the daemon, as last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeapFigures {
    /// Bytes allocated from glibc's arenas (the main heap and the threads' arenas).
    pub arena_in_use: u64,
    /// Bytes of blocks mapped on their own (allocations over the mmap threshold). Counted
    /// whole though pages never written are not resident (sled allocates large zeroed
    /// tables it mostly never touches).
    pub mapped_in_use: u64,
}

/// The heap figures as last read (at start, then every few seconds); `None`
/// before the trimming thread started and where the allocator is not glibc's.
pub(crate) fn heap_figures() -> Option<HeapFigures> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let arena_in_use = ARENA_IN_USE.load(Ordering::Relaxed);
        let mapped_in_use = MAPPED_IN_USE.load(Ordering::Relaxed);
        if arena_in_use != u64::MAX && mapped_in_use != u64::MAX {
            return Some(HeapFigures {
                arena_in_use,
                mapped_in_use,
            });
        }
    }
    None
}

/// The bytes glibc's arenas hold allocated, as last read by the trimming thread, and
/// when: what the store watches to reopen its engine (`storage::Store::watch_heap`).
/// `None` before the first reading and where the allocator is not glibc's.
pub(crate) fn heap_reading() -> Option<storage::HeapReading> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let taken = (*READ_AT.lock().unwrap_or_else(|e| e.into_inner()))?;
        let allocated = ARENA_IN_USE.load(Ordering::Relaxed);
        if allocated != u64::MAX {
            return Some(storage::HeapReading { allocated, taken });
        }
    }
    None
}

/// glibc's tunable for the per-thread caches.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TCACHE_TUNABLE: &str = "glibc.malloc.tcache_count";
/// Set only in the daemon's second execution: the `GLIBC_TUNABLES` it was first started
/// with (empty: none), restored at once so that its children (pwru) get the environment
/// the operator gave.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const GIVEN_TUNABLES: &str = "TAILTRAP_GIVEN_GLIBC_TUNABLES";
/// Set only in the daemon's second execution: the process name (`/proc/self/comm`) it was
/// first started with. Executed through `/proc/self/exe`, the kernel names the process
/// `exe`, and `ps`, `top`, `pgrep tailtrap` and `killall tailtrap` would no longer find it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const GIVEN_NAME: &str = "TAILTRAP_GIVEN_NAME";

/// How the daemon came to run with or without glibc's per-thread caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ThreadCaches {
    /// Turned off by the daemon (the way it is meant to run).
    TurnedOff,
    /// The operator's `GLIBC_TUNABLES` sets `glibc.malloc.tcache_count`: left as given.
    Given(String),
    /// Could not be turned off (why); the daemon runs with them.
    Left(String),
    /// Not glibc's allocator: nothing to turn off.
    #[cfg_attr(all(target_os = "linux", target_env = "gnu"), allow(dead_code))]
    NotGlibc,
}

/// Start the daemon with glibc's per-thread caches off: unless the operator's
/// `GLIBC_TUNABLES` already sets them, execute this program again (same pid, name,
/// arguments and environment) with the tunable added. Returns only when no new execution is needed
/// or it failed. Call first thing in `main`, before any thread starts or anything is
/// logged (the first execution's lines would be printed twice).
pub(crate) fn turn_off_thread_caches() -> ThreadCaches {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if let Some(given) = std::env::var_os(GIVEN_TUNABLES) {
            if let Some(name) = std::env::var_os(GIVEN_NAME) {
                restore_name(&name);
            }
            // SAFETY: no other thread runs yet, so nothing reads the environment meanwhile.
            unsafe {
                std::env::remove_var(GIVEN_NAME);
                std::env::remove_var(GIVEN_TUNABLES);
                if given.is_empty() {
                    std::env::remove_var("GLIBC_TUNABLES");
                } else {
                    std::env::set_var("GLIBC_TUNABLES", &given);
                }
            }
            return ThreadCaches::TurnedOff;
        }
        let given = match std::env::var("GLIBC_TUNABLES") {
            Ok(given) => given,
            Err(std::env::VarError::NotPresent) => String::new(),
            // Not text: left alone rather than rewritten.
            Err(std::env::VarError::NotUnicode(_)) => {
                return ThreadCaches::Left("GLIBC_TUNABLES is not UTF-8".into())
            }
        };
        if let Some(own) = given
            .split(':')
            .find(|t| t.split('=').next() == Some(TCACHE_TUNABLE))
        {
            return ThreadCaches::Given(own.to_owned());
        }
        let tunables = if given.is_empty() {
            format!("{TCACHE_TUNABLE}=0")
        } else {
            format!("{given}:{TCACHE_TUNABLE}=0")
        };
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_else(|| "tailtrap".into());
        // /proc/self/exe: this very binary, even if a package upgrade replaced the file
        // at its path since it started.
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(argv0)
            .args(args)
            .env("GLIBC_TUNABLES", tunables)
            .env(GIVEN_TUNABLES, &given)
            .env(GIVEN_NAME, own_name())
            .exec();
        ThreadCaches::Left(format!(
            "executing itself with {TCACHE_TUNABLE}=0 failed: {err}"
        ))
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    ThreadCaches::NotGlibc
}

/// This process's name as the kernel shows it (`/proc/self/comm`), empty if unreadable.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn own_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|n| n.trim_end_matches('\n').to_owned())
        .unwrap_or_default()
}

/// Give this process back the name of its first execution (see [`GIVEN_NAME`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn restore_name(name: &std::ffi::OsStr) {
    use std::os::unix::ffi::OsStrExt;
    // The kernel keeps 15 bytes and a NUL; a longer or empty name is not ours to give.
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() > 15 {
        return;
    }
    let Ok(name) = std::ffi::CString::new(bytes) else {
        return;
    };
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `name`
    // is, and only renames the calling thread (the main thread: the process's name).
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}

/// Say at start-up whether the per-thread caches are off, checked by their effect.
pub(crate) fn report_thread_caches(how: &ThreadCaches) {
    let in_use = thread_caches_in_use();
    THREAD_CACHES_OFF.get_or_init(|| in_use.map(|on| !on));
    match (how, in_use) {
        (ThreadCaches::TurnedOff, Some(false)) => {
            tracing::debug!("glibc's per-thread caches off")
        }
        (ThreadCaches::Given(t), _) => tracing::info!(
            tunable = %t,
            in_use = ?in_use,
            "glibc's per-thread caches as GLIBC_TUNABLES sets them; RSS may run higher"
        ),
        (ThreadCaches::Left(why), _) => {
            tracing::warn!(why = %why, "glibc's per-thread caches left on; RSS may run higher")
        }
        (ThreadCaches::NotGlibc, _) => tracing::debug!("not glibc's allocator"),
        (ThreadCaches::TurnedOff, in_use) => tracing::warn!(
            in_use = ?in_use,
            "glibc's per-thread caches were asked off but are not seen off; RSS may run higher"
        ),
    }
}

static THREAD_CACHES_OFF: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();

/// Whether the per-thread caches were seen off at start-up; `None` when not checked or
/// not known.
pub(crate) fn thread_caches_off() -> Option<bool> {
    THREAD_CACHES_OFF.get().copied().flatten()
}

/// Whether glibc's per-thread caches are in use, by their one visible effect: two
/// neighbouring 512-byte blocks freed one after the other coalesce into one 1 KiB block
/// only without them (with them both wait in the thread's cache, still in use to the
/// arena), and a 1 KiB request then gets the first block's address. `None` when no two
/// neighbouring blocks could be had, or not on glibc.
pub(crate) fn thread_caches_in_use() -> Option<bool> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // 504 bytes make a 512-byte chunk with its header, 1016 a 1024-byte one: above the
        // fast bins (128 bytes), within the per-thread caches' sizes.
        const SMALL: usize = 504;
        const CHUNK: usize = 512;
        const MERGED: usize = 1016;
        let mut held = Vec::new();
        let mut answer = None;
        // SAFETY: plain malloc/free pairs of blocks this function owns; every block is
        // freed once, and none is read or written.
        unsafe {
            // Each pair that is not neighbours is held, which drains the per-thread cache
            // (up to 7 blocks of a size by default, more if the operator says so) and the
            // free lists of that size: 4 tries were too few once the start-up freed more
            // 512-byte blocks (the answer was then absent from status).
            for _ in 0..32 {
                let a = libc::malloc(SMALL);
                let b = libc::malloc(SMALL);
                let guard = libc::malloc(32);
                if a.is_null() || b.is_null() || guard.is_null() {
                    held.extend([a, b, guard]);
                    break;
                }
                if (b as usize).wrapping_sub(a as usize) != CHUNK {
                    // Not neighbours (a came from a free block elsewhere): keep them, so
                    // the next pair comes from further on.
                    held.extend([a, b, guard]);
                    continue;
                }
                libc::free(a);
                libc::free(b);
                let c = libc::malloc(MERGED);
                answer = Some(c != a);
                held.extend([c, guard]);
                break;
            }
            for p in held {
                libc::free(p);
            }
        }
        answer
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Fix glibc's mmap threshold (see [`MMAP_THRESHOLD`]); before any thread starts.
pub(crate) fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tunable of the allocator; it is called before the
    // daemon starts any thread.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } != 1 {
        tracing::warn!("cannot fix glibc's mmap threshold; RSS may grow");
    }
}

/// How many arenas the daemon's threads share: the main heap and one more. glibc gives
/// each thread that allocates an arena of its own (up to 8 per CPU), and each arena keeps
/// its own free space, which `malloc_trim` cannot return while a block in use pins its
/// page. In two 2 h soaks side by side the daemon had 15 thread arenas and 2.6 MiB of
/// anonymous memory above what it held allocated, against 1.8 MiB with two arenas
/// (docs/reliability.md, "Arenas"). The daemon allocates little, mostly off the
/// interval loop, so the threads rarely wait on a shared arena's lock.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENAS: libc::c_int = 2;

/// Limit glibc's arenas (see [`ARENAS`]) unless the operator set the limit
/// (`MALLOC_ARENA_MAX` or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`); before any
/// thread starts.
pub(crate) fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || tunables
                .to_string_lossy()
                .contains("glibc.malloc.arena_max")
        {
            tracing::debug!("glibc's arena limit left as the environment sets it");
            return;
        }
        // SAFETY: mallopt only changes a tunable of the allocator; it is called before the
        // daemon starts any thread, so no arena beyond the limit exists yet.
        if unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) } != 1 {
            tracing::warn!("cannot limit glibc's arenas; RSS may run higher");
        }
    }
}

/// Start the thread that trims the heap. Failing to start it only loses the trimming.
pub(crate) fn start_trimming() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Err(e) = std::thread::Builder::new()
        .name("tailtrap-trim".into())
        .spawn(trim_loop)
    {
        tracing::warn!(error = %e, "cannot start the heap trimming thread; RSS may grow");
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_loop() {
    publish_heap_figures();
    loop {
        std::thread::sleep(READ_EVERY);
        let began = Instant::now();
        // SAFETY: malloc_trim only returns free pages to the kernel; it takes each
        // arena's lock itself and touches no memory that is in use.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::trace!(
            released = released != 0,
            took_us = began.elapsed().as_micros() as u64,
            "heap trimmed"
        );
        publish_heap_figures();
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn publish_heap_figures() {
    // SAFETY: mallinfo2 only reads the allocator's counters, under each arena's lock.
    let info = unsafe { libc::mallinfo2() };
    let taken = Instant::now();
    ARENA_IN_USE.store(info.uordblks as u64, Ordering::Relaxed);
    MAPPED_IN_USE.store(info.hblkhd as u64, Ordering::Relaxed);
    *READ_AT.lock().unwrap_or_else(|e| e.into_inner()) = Some(taken);
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The probe sees the per-thread caches this test process runs with: on, unless
    /// `GLIBC_TUNABLES` turns them off (tests/tests/allocator.rs checks the daemon's).
    #[test]
    fn the_thread_cache_probe_sees_them_on_by_default() {
        let set =
            std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.tcache_count="));
        if !set {
            assert_eq!(thread_caches_in_use(), Some(true));
        }
    }

    /// The figures follow what is allocated: a block far over the mmap threshold shows in
    /// the mapped count, and goes when freed. 256 MiB, zeroed so never resident, dwarfs
    /// what the tests running beside this one allocate and free meanwhile.
    #[test]
    fn heap_figures_follow_allocations() {
        const BLOCK: u64 = 256 << 20;
        publish_heap_figures();
        assert!(heap_figures().is_some_and(|h| h.arena_in_use > 0));
        let block = vec![0u8; BLOCK as usize];
        publish_heap_figures();
        let during = heap_figures().expect("published");
        assert!(
            during.mapped_in_use >= BLOCK,
            "a 256 MiB block is mapped on its own: {during:?}"
        );
        drop(std::hint::black_box(block));
        publish_heap_figures();
        let after = heap_figures().expect("published");
        assert!(
            after.mapped_in_use + BLOCK / 2 <= during.mapped_in_use,
            "freed: {during:?} -> {after:?}"
        );
    }

    /// What the store watches is the arena count just read, stamped with when it was read.
    #[test]
    fn the_heap_reading_is_the_last_one_published() {
        let before = Instant::now();
        publish_heap_figures();
        let reading = heap_reading().expect("published");
        assert!(reading.taken >= before && reading.taken <= Instant::now());
        assert!(reading.allocated > 0);
    }
}
