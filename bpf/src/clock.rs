//! User-space side of the clock handling: the clock offsets and RX software timestamping.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// The offsets the BPF programs add to the clocks they can read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offsets {
    /// CLOCK_TAI - CLOCK_REALTIME: how RX stamps (REALTIME) compare with "now" (TAI).
    pub(crate) tai_minus_realtime_ns: i64,
    /// CLOCK_TAI - CLOCK_MONOTONIC: "now" in TAI where the kernel has no TAI helper.
    pub(crate) tai_minus_monotonic_ns: i64,
}

pub(crate) fn offsets() -> io::Result<Offsets> {
    Ok(Offsets {
        tai_minus_realtime_ns: tai_offset_ns()?,
        tai_minus_monotonic_ns: tai_minus_monotonic_ns()?,
    })
}

/// CLOCK_MONOTONIC now, ns (bpf_ktime_get_ns's clock); 1 if it cannot be read, which
/// never happens on Linux and keeps "0 = off" meanings intact.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
        .ok()
        .and_then(|ns| u64::try_from(ns).ok())
        .unwrap_or(1)
        .max(1)
}

fn clock_ns(clock: libc::clockid_t) -> io::Result<i128> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec))
}

/// CLOCK_TAI - CLOCK_MONOTONIC in ns: TAI read between two MONOTONIC reads, against their
/// midpoint, so the error is half the time between them (tens of ns).
fn tai_minus_monotonic_ns() -> io::Result<i64> {
    let before = clock_ns(libc::CLOCK_MONOTONIC)?;
    let tai = clock_ns(libc::CLOCK_TAI)?;
    let after = clock_ns(libc::CLOCK_MONOTONIC)?;
    i64::try_from(tai - (before + after) / 2)
        .map_err(|_| io::Error::other("CLOCK_TAI - CLOCK_MONOTONIC does not fit in 64 bits"))
}

/// CLOCK_TAI - CLOCK_REALTIME in ns, from the kernel's NTP state (exact whole seconds).
fn tai_offset_ns() -> io::Result<i64> {
    // SAFETY: timex is plain data; modes = 0 only reads the state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: tx is a valid, writable timex.
    if unsafe { libc::adjtimex(&mut tx) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i64::from(tx.tai) * 1_000_000_000)
}

/// A socket asking for RX software timestamps. While any such socket is open the kernel
/// stamps every received skb (it flips a static key from a workqueue, so stamps start
/// within ~100 ms); without it, skb->tstamp is 0 on received traffic.
pub(crate) fn rx_timestamping_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let flags: libc::c_int = libc::SOF_TIMESTAMPING_RX_SOFTWARE as libc::c_int;
    // SAFETY: flags outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            (&flags as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}
