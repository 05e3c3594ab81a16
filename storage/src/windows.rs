//! Passes over a whole tree (or a large range of it) in windows, so that sled never holds
//! more than about one window of what the pass read.
//!
//! sled 0.34 keeps every node a read pulls in until its engine is dropped, whatever its
//! `cache_capacity`: one pass over a database kept about its live size in memory (`tailtrap
//! db check`, and the daemon's start until its first engine reopen). So a long pass stops
//! after each window, lets go of its tree handle, lets the caller reopen the engine, and
//! resumes after the last key it saw. A window is `storage.cache_bytes`, at least 4 MiB
//! (`StoreConfig::pass_window_bytes`): each reopen costs tens of ms, so a pass in windows
//! takes a little longer for a peak memory that no longer follows the database (the
//! figures: docs/reliability.md, "Long passes: bounded by windows").

use std::ops::{Bound, Deref};

use sled::IVec;

/// A key range to pass over.
pub(crate) type KeyRange = (Bound<IVec>, Bound<IVec>);

/// Every key of a tree.
pub(crate) fn whole() -> KeyRange {
    (Bound::Unbounded, Bound::Unbounded)
}

/// Every key starting with `prefix`.
pub(crate) fn prefixed(prefix: &[u8]) -> KeyRange {
    let end =
        crate::keys::prefix_end(prefix).map_or(Bound::Unbounded, |e| Bound::Excluded(e.into()));
    (Bound::Included(prefix.into()), end)
}

/// Visit the records of `range` in key order. `tree` gives the tree's current handle.
/// After each `window` bytes read the handle is dropped and `between` runs (to reopen the
/// engine); the pass then resumes after the last key visited, so records `visit` removed
/// are not met again and none is met twice.
pub(crate) fn for_each_record<S, H, E>(
    state: &mut S,
    tree: impl Fn(&S) -> H,
    range: KeyRange,
    window: u64,
    mut between: impl FnMut(&mut S) -> Result<(), E>,
    mut visit: impl FnMut(&mut S, IVec, IVec) -> Result<(), E>,
) -> Result<(), E>
where
    H: Deref<Target = sled::Tree>,
    E: From<sled::Error>,
{
    let (mut from, to) = range;
    loop {
        let handle = tree(state);
        let mut read = 0u64;
        let mut last = None;
        for item in handle.range((from.clone(), to.clone())) {
            let (k, v) = item?;
            read += (k.len() + v.len()) as u64;
            last = Some(k.clone());
            visit(state, k, v)?;
            if read >= window {
                break;
            }
        }
        drop(handle);
        match last {
            Some(k) if read >= window => {
                from = Bound::Excluded(k);
                between(state)?;
            }
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_with(n: u32, value_len: usize) -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let t = db.open_tree("t").unwrap();
        for i in 0..n {
            t.insert(i.to_be_bytes(), vec![7u8; value_len]).unwrap();
        }
        t
    }

    #[test]
    fn every_record_once_in_order_across_windows() {
        let tree = tree_with(1000, 100);
        let mut seen: Vec<u32> = Vec::new();
        let mut windows = 0;
        for_each_record::<_, _, sled::Error>(
            &mut seen,
            |_| Box::new(tree.clone()),
            whole(),
            1000,
            |_| {
                windows += 1;
                Ok(())
            },
            |seen, k, _| {
                seen.push(u32::from_be_bytes(k.as_ref().try_into().unwrap()));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        // 104 bytes a record, 1000 bytes a window: a break after every 10th record.
        assert_eq!(windows, 100);
    }

    #[test]
    fn removing_what_was_visited_resumes_after_it() {
        let tree = tree_with(300, 50);
        let mut removed = 0;
        for_each_record::<_, _, sled::Error>(
            &mut removed,
            |_| Box::new(tree.clone()),
            prefixed(&[0, 0, 0]),
            500,
            |_| Ok(()),
            |removed, k, _| {
                tree.remove(k)?;
                *removed += 1;
                Ok(())
            },
        )
        .unwrap();
        // Keys 0..=255 share the prefix [0, 0, 0]; 256..300 do not and stay.
        assert_eq!(removed, 256);
        assert_eq!(tree.len(), 44);
    }

    #[test]
    fn a_failing_visit_stops_the_pass() {
        let tree = tree_with(10, 1);
        let mut n = 0;
        let r = for_each_record::<_, _, sled::Error>(
            &mut n,
            |_| Box::new(tree.clone()),
            whole(),
            u64::MAX,
            |_| Ok(()),
            |n, _, _| {
                *n += 1;
                if *n == 3 {
                    return Err(sled::Error::Unsupported("stop".into()));
                }
                Ok(())
            },
        );
        assert!(r.is_err());
        assert_eq!(n, 3);
    }
}
