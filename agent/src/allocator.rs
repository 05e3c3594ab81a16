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
//! After each trim the thread also reads glibc's own counts of what is allocated, so the
//! status can tell memory in use from allocator slack without the interval loop ever
//! taking an arena lock.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(all(target_os = "linux", target_env = "gnu"))]
use std::time::{Duration, Instant};

/// How often free pages go back to the kernel: often enough that RSS follows the live
/// heap from minute to minute, rare enough that the cost does not matter.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Above this size an allocation gets pages of its own from the kernel, which go back
/// whole when it is freed. It is glibc's starting value; setting it also stops glibc
/// from raising it, up to 32 MiB, each time such a block is freed. Left dynamic, after
/// the first freed sled buffer or sample batch the same sizes were carved from the heap
/// and left holes there: in `storage/examples/sled_rss` at the soak's write rate
/// (`--minutes 120 --rate 200`, two runs each) RSS grew 7.6 → 19.5 MiB from minute 10
/// to 120 without this setting and 7.6 → 13.1 MiB with it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// glibc's counts at the last trim (bytes); `u64::MAX` until the first.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static ARENA_IN_USE: AtomicU64 = AtomicU64::new(u64::MAX);
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static MAPPED_IN_USE: AtomicU64 = AtomicU64::new(u64::MAX);

/// What the allocator holds for the daemon, as of the last trim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeapFigures {
    /// Bytes allocated from glibc's arenas (the main heap and the threads' arenas).
    pub arena_in_use: u64,
    /// Bytes of blocks mapped on their own (allocations over the mmap threshold). Counted
    /// whole though pages never written are not resident (sled allocates large zeroed
    /// tables it mostly never touches).
    pub mapped_in_use: u64,
}

/// The heap figures of the last trim; `None` before the first (30 s after start) and
/// where the allocator is not glibc's.
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

/// Fix glibc's mmap threshold (see [`MMAP_THRESHOLD`]); before any thread starts.
pub(crate) fn fix_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tunable of the allocator; it is called before the
    // daemon starts any thread.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) } != 1 {
        tracing::warn!("cannot fix glibc's mmap threshold; RSS may grow");
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
    loop {
        std::thread::sleep(TRIM_EVERY);
        let started = Instant::now();
        // SAFETY: malloc_trim only returns free pages to the kernel; it takes each
        // arena's lock itself and touches no memory that is in use.
        let released = unsafe { libc::malloc_trim(0) };
        let trimmed = started.elapsed();
        publish_heap_figures();
        tracing::trace!(
            released = released != 0,
            took_us = trimmed.as_micros() as u64,
            "heap trimmed"
        );
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn publish_heap_figures() {
    // SAFETY: mallinfo2 only reads the allocator's counters, under each arena's lock.
    let info = unsafe { libc::mallinfo2() };
    ARENA_IN_USE.store(info.uordblks as u64, Ordering::Relaxed);
    MAPPED_IN_USE.store(info.hblkhd as u64, Ordering::Relaxed);
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

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
}
