//! In-kernel capture as the daemon uses it: arm a service's hot probes when its incident
//! opens, keep the flight recorder's last samples for the pre-trigger part, hand armed
//! samples to the store, disarm on close or at the time and sample caps.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use bpf::{CaptureControl, CaptureCounters, CaptureError, CaptureLimits, CaptureReader, ProbeSet};
use capture::recorder::{FlightRecorder, IncidentCapture, IncidentLimits, StopReason};
use detector::Detector;
use model::{Probe, Sample};

use super::unix_ns;
use crate::config::{CaptureConfig, Threshold};

/// Capture on one probe set.
pub(super) struct Capture {
    control: CaptureControl,
    reader: CaptureReader,
    /// Flight-recorder records of the last `flight_window`, by service slot.
    flight: FlightRecorder<u32>,
    /// Per-incident caps of armed capture.
    incident_limits: IncidentLimits,
    /// Armed service slots.
    armed: HashMap<u32, Armed>,
}

/// One armed service.
pub(super) struct Armed {
    /// Its incident, the samples handed over so far and the caps.
    pub(super) capture: IncidentCapture,
    /// Its service.
    pub(super) service: String,
    counters_at_arm: CaptureCounters,
}

/// What one drain produced.
pub(super) struct Drained {
    /// Armed samples, `incident` set.
    pub(super) samples: Vec<Sample>,
    /// Slots over their time or sample cap: disarm them (with the reason).
    pub(super) over: Vec<(u32, String)>,
}

impl Capture {
    /// Take over capture on `set` with the configured limits; nothing armed.
    pub(super) fn start(set: &mut ProbeSet, cfg: &CaptureConfig) -> Result<Capture, CaptureError> {
        let limits = CaptureLimits {
            rate_limit: cfg.rate_limit,
            sample_one_in: cfg.sample_one_in,
            flight_rate: cfg.flight_rate,
        };
        let control = CaptureControl::new(set, &limits)?;
        let reader = CaptureReader::start(set)?;
        // The kernel's flight rate limit is for all services together: this many records
        // cover the window (plus one second's burst), so the capacity drops none in it.
        let capacity = u64::from(cfg.flight_rate)
            .saturating_mul(cfg.flight_window.as_secs().saturating_add(1));
        Ok(Capture {
            control,
            reader,
            flight: FlightRecorder::new(
                cfg.flight_window,
                usize::try_from(capacity).unwrap_or(usize::MAX),
            ),
            incident_limits: IncidentLimits {
                max_time: cfg.max_time,
                max_samples: cfg.max_samples,
            },
            armed: HashMap::new(),
        })
    }

    /// Threshold in ns of `probe` for `service`: a baseline quantile (None while the
    /// baseline is cold) or a fixed latency.
    pub(super) fn threshold_ns(
        t: Threshold,
        detector: &Detector,
        service: &str,
        probe: Probe,
    ) -> Option<u64> {
        match t {
            Threshold::Latency(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            Threshold::Quantile(q) => detector
                .baseline_quantile(service, probe, q)
                // The bucket's upper bound: only SKBs clearly above the baseline's quantile.
                .map(|e| e.upper_ns.max(1)),
        }
    }

    /// Set the flight recorder's thresholds of a slot.
    pub(super) fn set_flight(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
        thresholds: &[(Probe, u64)],
    ) -> Result<(), CaptureError> {
        self.control.set_flight_thresholds(set, slot, thresholds)
    }

    /// Take every record read so far: flight records go to the recorder (trimmed to
    /// `window`), armed ones to their incident.
    pub(super) fn drain(&mut self, cfg: &CaptureConfig) -> Drained {
        let mut samples = Vec::new();
        while let Ok(r) = self.reader.records().try_recv() {
            if r.flight {
                self.flight.push(r.service_slot, r.sample);
            } else if let Some(a) = self.armed.get_mut(&r.service_slot) {
                samples.extend(a.capture.accept(r.sample));
            }
        }
        self.flight.expire(unix_ns(SystemTime::now()));
        let now = Instant::now();
        let mut over = Vec::new();
        for (&slot, a) in &self.armed {
            let why = match a.capture.stop_reason(now) {
                None => continue,
                Some(StopReason::MaxSamples) => format!("sample cap {} reached", cfg.max_samples),
                Some(StopReason::MaxTime) => format!(
                    "capture time cap {} reached",
                    humantime::format_duration(cfg.max_time)
                ),
            };
            over.push((slot, why));
        }
        Drained { samples, over }
    }

    /// Arm `slot` for `incident` at `thresholds`; returns the flight recorder's samples of
    /// that slot, taken out of it, marked pre-trigger and given to the incident.
    pub(super) fn arm(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
        incident: u64,
        service: &str,
        thresholds: &[(Probe, u64)],
    ) -> Result<Vec<Sample>, CaptureError> {
        let counters_at_arm = bpf::capture_counters(set)?;
        self.control.arm(set, slot, thresholds)?;
        self.armed.insert(
            slot,
            Armed {
                capture: IncidentCapture::new(incident, Instant::now(), self.incident_limits),
                service: service.to_owned(),
                counters_at_arm,
            },
        );
        Ok(self
            .flight
            .take(&slot, incident, unix_ns(SystemTime::now())))
    }

    /// Disarm `slot`; returns what was armed and the kernel counters' growth meanwhile.
    pub(super) fn disarm(
        &mut self,
        set: &mut ProbeSet,
        slot: u32,
    ) -> Result<Option<(Armed, CaptureCounters)>, CaptureError> {
        let Some(a) = self.armed.remove(&slot) else {
            return Ok(None);
        };
        self.control.disarm(set, slot)?;
        let now = bpf::capture_counters(set)?;
        let before = a.counters_at_arm;
        let delta = CaptureCounters {
            emitted: now.emitted.saturating_sub(before.emitted),
            ring_full: now.ring_full.saturating_sub(before.ring_full),
            rate_limited: now.rate_limited.saturating_sub(before.rate_limited),
            flight_emitted: now.flight_emitted.saturating_sub(before.flight_emitted),
            flight_ring_full: now.flight_ring_full.saturating_sub(before.flight_ring_full),
            flight_rate_limited: now
                .flight_rate_limited
                .saturating_sub(before.flight_rate_limited),
        };
        Ok(Some((a, delta)))
    }

    /// The armed slots.
    pub(super) fn armed(&self) -> impl Iterator<Item = (&u32, &Armed)> {
        self.armed.iter()
    }

    /// The slot armed for `incident`.
    pub(super) fn slot_of(&self, incident: u64) -> Option<u32> {
        self.armed
            .iter()
            .find(|(_, a)| a.capture.incident() == incident)
            .map(|(s, _)| *s)
    }

    /// Records lost between the reader thread and the daemon.
    pub(super) fn overflow(&self) -> u64 {
        self.reader.overflow()
    }

    /// Samples the flight recorder holds now.
    pub(super) fn flight_len(&self) -> usize {
        self.flight.len()
    }
}
