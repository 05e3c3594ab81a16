//! The kernel side of the interval loop: what the loop reads and sets in the BPF maps,
//! behind a trait so the loop also runs on recorded data (tests, without root or BPF).

use bpf::{
    CaptureControl, CaptureCounters, CaptureError, CaptureLimits, CaptureReader, CaptureRecord,
    ProbeSet, ProgStats, ReadError, Snapshot,
};
use model::{Histogram, Probe};

/// The probes and their capture, as the interval loop uses them.
pub(super) trait Kernel {
    /// Refresh the clock the probes compare timestamps with, then read the counters and
    /// the cumulative histograms, or only those that changed since the previous read (the
    /// loop keeps the rest from before).
    fn snapshot(&mut self) -> Result<Snapshot, ReadError>;
    /// A service slot's cumulative histogram at `probe` on each CPU, by CPU (None: the
    /// probe has no histogram or the slot is out of the map).
    fn per_cpu_hist(
        &mut self,
        slot: u32,
        probe: Probe,
    ) -> Result<Option<Vec<Histogram>>, ReadError>;
    /// Run-time statistics of the BPF programs.
    fn prog_stats(&self) -> Vec<ProgStats>;
    /// Take over capture: apply `limits`, clear every threshold, start reading records.
    fn start_capture(&mut self, limits: &CaptureLimits) -> Result<(), CaptureError>;
    /// Arm a service slot at these thresholds (ns).
    fn arm(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError>;
    /// Disarm a service slot (the flight recorder carries on).
    fn disarm(&mut self, slot: u32) -> Result<(), CaptureError>;
    /// Set a slot's flight-recorder thresholds (ns).
    fn set_flight(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError>;
    /// The kernel's capture counters since load.
    fn capture_counters(&mut self) -> Result<CaptureCounters, CaptureError>;
    /// Append every capture record read since the last call to `out`.
    fn take_records(&mut self, out: &mut Vec<CaptureRecord>);
    /// Records lost between the ring-buffer reader and the loop.
    fn capture_overflow(&self) -> u64;
    /// The reader-wait split of slow reads: whether its scheduler hooks are attached now
    /// (only while capture is armed), or why the kernel cannot give it.
    fn reader_wait(&self) -> Result<bool, String>;
    /// Hand nic-to-stack the clocks of the devices stamping now; whether the stage runs.
    fn set_nic_clocks(&mut self, clocks: &[bpf::NicClock]) -> Result<bool, ReadError>;
}

/// The real thing: a loaded probe set and, once started, its capture.
pub(super) struct BpfKernel {
    probes: ProbeSet,
    capture: Option<(CaptureControl, CaptureReader)>,
}

impl BpfKernel {
    pub(super) fn new(probes: ProbeSet) -> BpfKernel {
        BpfKernel {
            probes,
            capture: None,
        }
    }

    fn control(&mut self) -> Result<(&mut ProbeSet, &mut CaptureControl), CaptureError> {
        match &mut self.capture {
            Some((control, _)) => Ok((&mut self.probes, control)),
            None => Err(CaptureError::NotStarted),
        }
    }
}

impl Kernel for BpfKernel {
    fn snapshot(&mut self) -> Result<Snapshot, ReadError> {
        self.probes.refresh_clock()?;
        self.probes.snapshot_changed()
    }

    fn per_cpu_hist(
        &mut self,
        slot: u32,
        probe: Probe,
    ) -> Result<Option<Vec<Histogram>>, ReadError> {
        self.probes.per_cpu_hist(slot, probe)
    }

    fn prog_stats(&self) -> Vec<ProgStats> {
        self.probes.prog_stats()
    }

    fn start_capture(&mut self, limits: &CaptureLimits) -> Result<(), CaptureError> {
        let control = CaptureControl::new(&mut self.probes, limits)?;
        let reader = CaptureReader::start(&mut self.probes)?;
        self.capture = Some((control, reader));
        Ok(())
    }

    fn arm(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError> {
        let (set, control) = self.control()?;
        control.arm(set, slot, thresholds)
    }

    fn disarm(&mut self, slot: u32) -> Result<(), CaptureError> {
        let (set, control) = self.control()?;
        control.disarm(set, slot)
    }

    fn set_flight(&mut self, slot: u32, thresholds: &[(Probe, u64)]) -> Result<(), CaptureError> {
        let (set, control) = self.control()?;
        control.set_flight_thresholds(set, slot, thresholds)
    }

    fn capture_counters(&mut self) -> Result<CaptureCounters, CaptureError> {
        bpf::capture_counters(&mut self.probes)
    }

    fn reader_wait(&self) -> Result<bool, String> {
        self.probes
            .reader_wait()
            .map(|()| self.probes.following_readers())
            .map_err(str::to_owned)
    }

    fn set_nic_clocks(&mut self, clocks: &[bpf::NicClock]) -> Result<bool, ReadError> {
        self.probes.set_nic_clocks(clocks)
    }

    fn take_records(&mut self, out: &mut Vec<CaptureRecord>) {
        if let Some((_, reader)) = &self.capture {
            out.extend(reader.records().try_iter());
        }
    }

    fn capture_overflow(&self) -> u64 {
        self.capture.as_ref().map_or(0, |(_, r)| r.overflow())
    }
}
