//! driver-to-completion per device: the kernel's per-CPU hash keyed by (ifindex, network
//! namespace), summed over CPUs and named. The per-service histograms say whose packets
//! waited; these say on which NIC's transmit queue, whichever service sent.

use std::ffi::CStr;
use std::os::unix::fs::MetadataExt;

use libbpf_rs::{MapCore, MapFlags};
use model::hist::NUM_BUCKETS;
use model::Histogram;
use serde::Serialize;

use crate::hist_read::WORDS;
use crate::map_read::{decode, ReadError};
use crate::skel::types;

const MAP: &str = "completion_device_hists";

/// One device's driver-to-completion histogram, cumulative since the probes were loaded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceHist {
    /// The interface's name in the daemon's network namespace, or `ifindex N in netns M`
    /// for a device in another one (a virtual function moved into a container).
    pub device: String,
    /// Its ifindex, in its namespace.
    pub ifindex: u32,
    /// Its network namespace's inode number.
    pub netns: u32,
    /// Cumulative since load.
    pub hist: Histogram,
}

/// The daemon's own network namespace (the inode number the kernel's `ns.inum` holds).
pub(crate) fn own_netns() -> Option<u32> {
    let meta = std::fs::metadata("/proc/self/ns/net").ok()?;
    u32::try_from(meta.ino()).ok()
}

fn interface_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires; it writes a
    // NUL-terminated name there or returns NULL.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Every device's histogram, sorted by name. Devices of the daemon's namespace that are
/// gone are reported this once and then deleted from the map, which makes room for new
/// ones (the map holds `TT_COMPLETION_DEVICES_MAX`).
pub(crate) fn read(
    map: &libbpf_rs::MapMut<'_>,
    own_netns: Option<u32>,
) -> Result<Vec<DeviceHist>, ReadError> {
    let map_err = |source| ReadError::Map { map: MAP, source };
    let mut out = Vec::new();
    let mut gone = Vec::new();
    for key_bytes in map.keys() {
        let key: types::tt_device_key = decode(MAP, &key_bytes)?;
        let Some(per_cpu) = map
            .lookup_percpu(&key_bytes, MapFlags::ANY)
            .map_err(map_err)?
        else {
            continue; // deleted since the key was listed
        };
        let mut sums = [0u64; WORDS];
        for value in &per_cpu {
            if value.len() < WORDS * 8 {
                return Err(ReadError::Size {
                    map: MAP,
                    got: value.len(),
                    expected: WORDS * 8,
                });
            }
            for (sum, word) in sums.iter_mut().zip(value.chunks_exact(8)) {
                let mut w = [0u8; 8];
                w.copy_from_slice(word);
                *sum = sum.saturating_add(u64::from_ne_bytes(w));
            }
        }
        let hist = Histogram::from_dense(&sums[..NUM_BUCKETS], sums[NUM_BUCKETS])?;
        let device = if Some(key.netns) == own_netns {
            match interface_name(key.ifindex) {
                Some(name) => name,
                None => {
                    gone.push(key_bytes);
                    format!("ifindex {} (gone)", key.ifindex)
                }
            }
        } else {
            format!("ifindex {} in netns {}", key.ifindex, key.netns)
        };
        out.push(DeviceHist {
            device,
            ifindex: key.ifindex,
            netns: key.netns,
            hist,
        });
    }
    for key in gone {
        map.delete(&key).map_err(map_err)?;
    }
    out.sort_by(|a, b| (&a.device, a.netns, a.ifindex).cmp(&(&b.device, b.netns, b.ifindex)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_named_and_an_unused_ifindex_is_not() {
        assert_eq!(interface_name(1).as_deref(), Some("lo"));
        assert_eq!(interface_name(u32::MAX), None);
    }

    #[test]
    fn a_key_of_the_wrong_size_is_named_as_such() {
        let err = decode::<types::tt_device_key>(MAP, &[0u8; 4])
            .unwrap_err()
            .to_string();
        assert!(err.contains(MAP) && err.contains("4 bytes"), "{err}");
        let key = decode::<types::tt_device_key>(MAP, &[2, 0, 0, 0, 7, 0, 0, 0])
            .map_err(|e| e.to_string());
        let key = key.as_ref().map(|k| (k.ifindex, k.netns));
        assert_eq!(
            key,
            Ok((
                u32::from_ne_bytes([2, 0, 0, 0]),
                u32::from_ne_bytes([7, 0, 0, 0])
            ))
        );
    }
}
