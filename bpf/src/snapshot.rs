//! What [`crate::ProbeSet::snapshot`] returns.

use model::{Histogram, Probe};
use serde::Serialize;

/// Cumulative histograms since load, and the kernel-side event counters.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// One cumulative histogram per (service, probe) that has seen samples, sorted by
    /// service name, then probe ([`crate::ProbeSet::snapshot_changed`]: only those whose
    /// counts changed since the previous snapshot).
    pub hists: Vec<ServiceHist>,
    /// driver-to-completion per device, cumulative, every device that has seen a
    /// completion (empty when the probe does not run).
    pub devices: Vec<crate::DeviceHist>,
    /// Event counters, cumulative since load.
    pub counters: Counters,
    /// Auto-grouped services whose cgroup is gone: this snapshot holds their last
    /// histograms and their slots are being freed, so forget them after this interval.
    pub retired: Vec<String>,
}

/// A service's histogram at one probe.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceHist {
    /// Configured service name, cgroup path (auto-grouping), `host` or `other`.
    pub service: String,
    /// Its slot in the probes' maps, what capture is armed and set by
    /// ([`crate::CaptureControl`]). An auto-grouped service's slot goes to another cgroup
    /// only after the service is retired ([`Snapshot::retired`]).
    pub slot: u32,
    /// The probe.
    pub probe: Probe,
    /// Cumulative since load.
    pub hist: Histogram,
}

/// Kernel-side event counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Samples dropped because the histogram map was full.
    pub map_full_drops: u64,
    /// skbs without a timestamp (arrived before RX timestamping was on).
    pub zero_tstamp: u64,
    /// Timestamps in the future of their clock: skipped.
    pub future_tstamp: u64,
    /// tcp-socket-read samples skipped as head-of-line blocked.
    pub hol_excluded: u64,
    /// Samples counted toward `other` because the auto-service limit was reached.
    pub auto_overflow: u64,
    /// Auto-service slots freed (their cgroup was gone) and reusable since load.
    pub auto_freed: u64,
    /// nic-to-stack: hardware stamps from a device whose clock offset the daemon did not
    /// hold (not stamping at its last look, or the offset read failed), skipped.
    pub nic_stamp_no_clock: u64,
    /// nic-to-stack: converted stamps too far after the software stamp or over 10 s
    /// before it (a clock stepped since its offset was read), skipped.
    pub nic_stamp_out_of_bounds: u64,
}
