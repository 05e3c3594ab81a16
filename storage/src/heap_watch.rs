//! The engine's memory that the store cannot count: sled's segment cleaner reads pages back
//! from disk to rewrite them elsewhere, and keeps them in memory until the engine is
//! closed. Under heaptrack in the soak those pages were most of what the heap gained
//! between engine reopens, and none of it went through the store's own reads and writes
//! (docs/reliability.md, "The segment cleaner's pages"). So the
//! store can also watch the process's heap, read by whoever knows the allocator (the
//! daemon), and reopen the engine once the heap grew `cache_bytes` above its lowest reading
//! since the engine was opened.

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// One reading of the bytes the process's allocator holds allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapReading {
    /// Bytes allocated (not merely mapped).
    pub allocated: u64,
    /// When it was read: readings older than the engine's last reopen say nothing of it.
    pub taken: Instant,
}

/// Reads the process's heap for `Store::watch_heap`; `None` when no reading is available
/// yet. Called on write paths: it must be cheap (a stored reading, not a fresh walk of the
/// allocator).
pub type HeapProbe = Box<dyn Fn() -> Option<HeapReading> + Send + Sync>;

pub(crate) struct HeapWatch {
    probe: OnceLock<HeapProbe>,
    since: Mutex<SinceRenewed>,
}

struct SinceRenewed {
    /// When the engine was last opened or reopened.
    at: Instant,
    /// The lowest reading taken since.
    floor: Option<u64>,
}

impl HeapWatch {
    pub(crate) fn new() -> HeapWatch {
        HeapWatch {
            probe: OnceLock::new(),
            since: Mutex::new(SinceRenewed {
                at: Instant::now(),
                floor: None,
            }),
        }
    }

    /// Set the probe; `false` if one was set already (it stays). Growth is counted from
    /// the first reading taken after this.
    pub(crate) fn set_probe(&self, probe: HeapProbe) -> bool {
        let set = self.probe.set(probe).is_ok();
        if set {
            self.renewed();
        }
        set
    }

    /// Bytes the heap holds above its lowest reading since the engine was renewed; `None`
    /// without a probe or a reading taken since.
    pub(crate) fn growth(&self) -> Option<u64> {
        let reading = (self.probe.get()?)()?;
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        if reading.taken < since.at {
            return None;
        }
        let floor = since.floor.get_or_insert(reading.allocated);
        *floor = (*floor).min(reading.allocated);
        Some(reading.allocated - *floor)
    }

    /// The engine was just opened again (or the watch began): growth counts from here.
    pub(crate) fn renewed(&self) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        since.at = Instant::now();
        since.floor = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    fn watch_of(heap: &Arc<AtomicU64>) -> HeapWatch {
        let watch = HeapWatch::new();
        let heap = heap.clone();
        assert!(watch.set_probe(Box::new(move || {
            Some(HeapReading {
                allocated: heap.load(Ordering::Relaxed),
                taken: Instant::now(),
            })
        })));
        watch
    }

    #[test]
    fn growth_is_measured_from_the_lowest_reading_since_the_engine_was_renewed() {
        let heap = Arc::new(AtomicU64::new(3_000));
        let watch = watch_of(&heap);
        assert_eq!(watch.growth(), Some(0));
        heap.store(2_000, Ordering::Relaxed);
        assert_eq!(watch.growth(), Some(0), "a lower reading is the new floor");
        heap.store(2_700, Ordering::Relaxed);
        assert_eq!(watch.growth(), Some(700));
        watch.renewed();
        heap.store(2_900, Ordering::Relaxed);
        assert_eq!(
            watch.growth(),
            Some(0),
            "a renewed engine starts a new floor"
        );
        heap.store(3_100, Ordering::Relaxed);
        assert_eq!(watch.growth(), Some(200));
    }

    #[test]
    fn readings_taken_before_the_watch_began_or_the_engine_was_renewed_are_ignored() {
        let watch = HeapWatch::new();
        let taken = Arc::new(std::sync::Mutex::new(Instant::now()));
        let t = taken.clone();
        assert!(watch.set_probe(Box::new(move || {
            Some(HeapReading {
                allocated: 5_000,
                taken: *t.lock().unwrap(),
            })
        })));
        assert_eq!(watch.growth(), None, "read before the watch began");
        *taken.lock().unwrap() = Instant::now();
        assert_eq!(watch.growth(), Some(0));
        watch.renewed();
        assert_eq!(
            watch.growth(),
            None,
            "read while the old engine still held its memory"
        );
        assert!(!watch.set_probe(Box::new(|| None)), "the first probe stays");
    }

    #[test]
    fn without_a_probe_or_a_reading_nothing_is_known() {
        let watch = HeapWatch::new();
        assert_eq!(watch.growth(), None);
        assert!(watch.set_probe(Box::new(|| None)));
        assert_eq!(watch.growth(), None);
    }
}
