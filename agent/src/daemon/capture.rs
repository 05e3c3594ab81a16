//! In-kernel capture as the daemon uses it: arm a service's hot probes when its incident
//! opens, keep the flight recorder's last samples for the pre-trigger part, hand armed
//! samples over, disarm on close or at the time and sample caps, and keep the flight
//! recorder's thresholds following the baselines.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bpf::{CaptureCounters, CaptureError, CaptureLimits};
use capture::recorder::{FlightRecorder, IncidentCapture, IncidentLimits, StopReason};
use capture::{CaptureConfig, Threshold};
use detector::Detector;
use model::Probe;
use model::Sample;

use super::kernel::Kernel;
use crate::api::{CaptureCounts, CaptureReport};
use model::fmt_ns;
use model::unix_ns;

/// How many intervals between two updates of the flight recorder's thresholds from the
/// baselines (each is a map write per service and probe).
const FLIGHT_UPDATE_EVERY: u64 = 10;

/// Why in-kernel capture is not available on the current probes.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum Unavailable {
    /// `[capture] enabled = false`.
    #[error("in-kernel capture is off ([capture] enabled = false)")]
    Disabled,
    /// Setting it up failed.
    #[error("in-kernel capture unavailable: {0}")]
    Failed(Arc<CaptureError>),
}

/// Why an incident's capture was not armed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ArmError {
    /// Capture is not available at all.
    #[error(transparent)]
    Unavailable(Unavailable),
    /// The probes do not know the service.
    #[error("service {0:?} has no slot in the probes")]
    NoSlot(String),
    /// No hot probe has a threshold yet (baselines still cold).
    #[error("no threshold: the hot probes' baselines give no {0}")]
    NoThreshold(Threshold),
    /// The kernel refused.
    #[error("arming failed: {0}")]
    Kernel(CaptureError),
}

/// An incident's capture, just armed.
pub(super) struct Armed {
    /// The flight recorder's samples of the service, pre-trigger, given to the incident.
    pub(super) pre_trigger: Vec<Sample>,
    /// The thresholds armed, ns.
    pub(super) thresholds: Vec<(Probe, u64)>,
}

impl Armed {
    /// `tcp-socket-read ≥ 1.20ms, ...`.
    pub(super) fn thresholds_text(&self) -> String {
        self.thresholds
            .iter()
            .map(|(p, ns)| format!("{p} ≥ {}", fmt_ns(*ns as f64)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An incident's capture, just disarmed.
pub(super) struct Disarmed {
    /// Its service.
    pub(super) service: String,
    /// Samples handed over while armed.
    pub(super) samples: u64,
    /// The kernel counters' growth while armed.
    pub(super) counters: CaptureCounters,
}

/// What one drain produced.
pub(super) struct Drained {
    /// Armed samples, `incident` set.
    pub(super) samples: Vec<Sample>,
    /// Incidents over their time or sample cap: disarm them (with the reason).
    pub(super) over: Vec<(u64, String)>,
}

/// Capture on one probe set: available or why not, the armed slots and the flight recorder.
pub(super) struct CaptureController {
    state: State,
    cfg: CaptureConfig,
    /// Keys whose flight-recorder threshold is set.
    flight_set: HashSet<(String, Probe)>,
    /// Keys whose flight-recorder threshold the kernel refused at the last try: said once
    /// when that begins and once when it is set again, not at every interval's retry.
    flight_failing: HashSet<(String, Probe)>,
}

enum State {
    Active(Active),
    Unavailable(Unavailable),
}

struct Active {
    /// Flight-recorder records of the last `flight_window`, by service slot.
    flight: FlightRecorder<u32>,
    incident_limits: IncidentLimits,
    /// Armed service slots.
    armed: HashMap<u32, ArmedSlot>,
}

struct ArmedSlot {
    capture: IncidentCapture,
    service: String,
    counters_at_arm: CaptureCounters,
    /// The thresholds armed so far, ns, in the order they were armed.
    thresholds: Vec<(Probe, u64)>,
}

impl CaptureController {
    /// Take over capture on `kernel` with `cfg`, nothing armed; when that is impossible, the
    /// controller says why wherever capture is asked for.
    pub(super) fn start(kernel: &mut impl Kernel, cfg: &CaptureConfig) -> CaptureController {
        let state = if !cfg.enabled {
            State::Unavailable(Unavailable::Disabled)
        } else {
            let limits = CaptureLimits {
                rate_limit: cfg.rate_limit,
                sample_one_in: cfg.sample_one_in,
                flight_rate: cfg.flight_rate,
            };
            match kernel.start_capture(&limits) {
                Ok(()) => State::Active(Active::new(cfg)),
                Err(e) => {
                    tracing::warn!(error = %e, "in-kernel capture unavailable");
                    State::Unavailable(Unavailable::Failed(Arc::new(e)))
                }
            }
        };
        CaptureController {
            state,
            cfg: cfg.clone(),
            flight_set: HashSet::new(),
            flight_failing: HashSet::new(),
        }
    }

    /// Arm the incident's hot probes at the configured threshold in the service's `slot`
    /// (`None`: it has none, as a host-wide incident); the flight recorder's samples of
    /// the service become the incident's pre-trigger samples.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn arm(
        &mut self,
        kernel: &mut impl Kernel,
        detector: &Detector,
        incident: u64,
        inc: &detector::Incident,
        slot: Option<u32>,
        now: Instant,
        wall: SystemTime,
    ) -> Result<Armed, ArmError> {
        let active = match &mut self.state {
            State::Active(a) => a,
            State::Unavailable(why) => return Err(ArmError::Unavailable(why.clone())),
        };
        let slot = slot.ok_or_else(|| ArmError::NoSlot(inc.service.clone()))?;
        let thresholds: Vec<(Probe, u64)> = inc
            .probes
            .iter()
            .filter_map(|&p| {
                threshold_ns(self.cfg.threshold, detector, &inc.service, p).map(|ns| (p, ns))
            })
            .collect();
        if thresholds.is_empty() {
            return Err(ArmError::NoThreshold(self.cfg.threshold));
        }
        let counters_at_arm = kernel.capture_counters().map_err(ArmError::Kernel)?;
        kernel.arm(slot, &thresholds).map_err(ArmError::Kernel)?;
        active.armed.insert(
            slot,
            ArmedSlot {
                capture: IncidentCapture::new(incident, now, active.incident_limits),
                service: inc.service.clone(),
                counters_at_arm,
                thresholds: thresholds.clone(),
            },
        );
        let pre_trigger = active.flight.take(&slot, incident, unix_ns(wall));
        Ok(Armed {
            pre_trigger,
            thresholds,
        })
    }

    /// Incident `incident` gained hot probes: arm them too, so that its samples cover
    /// the stage the detector attributes now (an incident that opened at the read can turn
    /// out to be the softirq's). Returns every threshold armed when any was added.
    pub(super) fn widen(
        &mut self,
        kernel: &mut impl Kernel,
        detector: &Detector,
        incident: u64,
        inc: &detector::Incident,
    ) -> Result<Option<Armed>, ArmError> {
        let State::Active(active) = &mut self.state else {
            return Ok(None);
        };
        let Some((&slot, armed)) = active
            .armed
            .iter_mut()
            .find(|(_, a)| a.capture.incident() == incident)
        else {
            return Ok(None);
        };
        let added: Vec<(Probe, u64)> = inc
            .probes
            .iter()
            .filter(|&&p| armed.thresholds.iter().all(|&(q, _)| q != p))
            .filter_map(|&p| {
                threshold_ns(self.cfg.threshold, detector, &inc.service, p).map(|ns| (p, ns))
            })
            .collect();
        if added.is_empty() {
            return Ok(None);
        }
        kernel.arm(slot, &added).map_err(ArmError::Kernel)?;
        armed.thresholds.extend(added);
        Ok(Some(Armed {
            pre_trigger: Vec::new(),
            thresholds: armed.thresholds.clone(),
        }))
    }

    /// Disarm the slot armed for `incident`, if one is.
    pub(super) fn disarm(
        &mut self,
        kernel: &mut impl Kernel,
        incident: u64,
    ) -> Result<Option<Disarmed>, CaptureError> {
        let State::Active(active) = &mut self.state else {
            return Ok(None);
        };
        let Some(slot) = active
            .armed
            .iter()
            .find(|(_, a)| a.capture.incident() == incident)
            .map(|(s, _)| *s)
        else {
            return Ok(None);
        };
        let Some(a) = active.armed.remove(&slot) else {
            return Ok(None);
        };
        kernel.disarm(slot)?;
        let now = kernel.capture_counters()?;
        let before = a.counters_at_arm;
        Ok(Some(Disarmed {
            service: a.service,
            samples: a.capture.samples(),
            counters: CaptureCounters {
                emitted: now.emitted.saturating_sub(before.emitted),
                ring_full: now.ring_full.saturating_sub(before.ring_full),
                rate_limited: now.rate_limited.saturating_sub(before.rate_limited),
                flight_emitted: now.flight_emitted.saturating_sub(before.flight_emitted),
                flight_ring_full: now.flight_ring_full.saturating_sub(before.flight_ring_full),
                flight_rate_limited: now
                    .flight_rate_limited
                    .saturating_sub(before.flight_rate_limited),
            },
        }))
    }

    /// The incidents capture is armed for.
    pub(super) fn armed_incidents(&self) -> Vec<u64> {
        match &self.state {
            State::Active(a) => a.armed.values().map(|a| a.capture.incident()).collect(),
            State::Unavailable(_) => Vec::new(),
        }
    }

    /// Take every record read so far: flight records go to the recorder (trimmed to its
    /// window), armed ones to their incident; and which incidents reached a cap.
    pub(super) fn drain(
        &mut self,
        kernel: &mut impl Kernel,
        now: Instant,
        wall: SystemTime,
    ) -> Drained {
        let State::Active(active) = &mut self.state else {
            return Drained {
                samples: Vec::new(),
                over: Vec::new(),
            };
        };
        let mut records = Vec::new();
        kernel.take_records(&mut records);
        let mut samples = Vec::new();
        for r in records {
            if r.flight {
                active.flight.push(r.service_slot, r.sample);
            } else if let Some(a) = active.armed.get_mut(&r.service_slot) {
                samples.extend(a.capture.accept(r.sample));
            }
        }
        active.flight.expire(unix_ns(wall));
        let mut over = Vec::new();
        for a in active.armed.values() {
            let why = match a.capture.stop_reason(now) {
                None => continue,
                Some(StopReason::MaxSamples) => {
                    format!("sample cap {} reached", self.cfg.max_samples)
                }
                Some(StopReason::MaxTime) => format!(
                    "capture time cap {} reached",
                    humantime::format_duration(self.cfg.max_time)
                ),
            };
            over.push((a.capture.incident(), why));
        }
        Drained { samples, over }
    }

    /// The flight recorder follows each service's baseline at every probe seen this
    /// interval (service, its slot, probe): a key gets its threshold as soon as its baseline
    /// is warm, and all are refreshed every [`FLIGHT_UPDATE_EVERY`] intervals.
    pub(super) fn update_flight<'a>(
        &mut self,
        kernel: &mut impl Kernel,
        detector: &Detector,
        seen: impl IntoIterator<Item = (&'a str, u32, Probe)>,
        interval: u64,
    ) {
        if !matches!(self.state, State::Active(_)) {
            return;
        }
        let refresh = interval % FLIGHT_UPDATE_EVERY == 0;
        for (service, slot, probe) in seen {
            let key = (service.to_owned(), probe);
            if !refresh && self.flight_set.contains(&key) {
                continue;
            }
            let Some(ns) = threshold_ns(self.cfg.flight_threshold, detector, service, probe) else {
                continue;
            };
            match kernel.set_flight(slot, &[(probe, ns)]) {
                Ok(()) => {
                    if self.flight_failing.remove(&key) {
                        tracing::info!(%service, %probe, "flight recorder threshold set again");
                    }
                    self.flight_set.insert(key);
                }
                Err(e) if self.flight_failing.insert(key) => tracing::warn!(
                    %service,
                    %probe,
                    error = %e,
                    "flight recorder threshold not set (tried again each interval, said again \
                     when set)"
                ),
                Err(e) => {
                    tracing::debug!(%service, %probe, error = %e, "flight recorder threshold not set")
                }
            }
        }
    }

    /// Services whose cgroup is gone (auto-grouping), with their slots: a slot goes to
    /// another cgroup soon, so switch its flight thresholds off; the next owner gets
    /// thresholds from its own baseline.
    pub(super) fn forget_services(&mut self, kernel: &mut impl Kernel, services: &[(String, u32)]) {
        for (service, slot) in services {
            let slot = *slot;
            let off: Vec<(Probe, u64)> = self
                .flight_set
                .iter()
                .filter(|(s, _)| s == service)
                .map(|(_, p)| (*p, 0))
                .collect();
            self.flight_set.retain(|(s, _)| s != service);
            self.flight_failing.retain(|(s, _)| s != service);
            if matches!(self.state, State::Active(_)) && !off.is_empty() {
                if let Err(e) = kernel.set_flight(slot, &off) {
                    tracing::warn!(%service, error = %e, "flight recorder threshold not cleared");
                }
            }
        }
    }

    /// The capture part of the status report.
    pub(super) fn report(&self, kernel: &mut impl Kernel) -> CaptureReport {
        let active = match &self.state {
            State::Active(a) => a,
            State::Unavailable(why) => {
                return CaptureReport {
                    available: false,
                    state: why.to_string(),
                    armed: Vec::new(),
                    flight_samples: 0,
                    counters: Default::default(),
                    reader_wait: String::new(),
                }
            }
        };
        // A failed read shows zeros for one interval: the kernel's counters are cumulative,
        // the next read has them all again.
        let k = kernel.capture_counters().unwrap_or_default();
        let overflow = kernel.capture_overflow();
        let armed: Vec<String> = active
            .armed
            .values()
            .map(|a| {
                format!(
                    "{} (incident {}, {} samples)",
                    a.service,
                    a.capture.incident(),
                    a.capture.samples()
                )
            })
            .collect();
        CaptureReport {
            available: true,
            state: format!(
                "{}; flight recorder holds {} samples; {} records lost in user space",
                if armed.is_empty() {
                    "disarmed".to_owned()
                } else {
                    format!("armed for {}", armed.join(", "))
                },
                active.flight.len(),
                overflow
            ),
            armed: active.armed.values().map(|a| a.service.clone()).collect(),
            flight_samples: active.flight.len() as u64,
            counters: CaptureCounts {
                kernel: k,
                user_space_lost: overflow,
            },
            reader_wait: match kernel.reader_wait() {
                Ok(true) => {
                    "following the readers of slow packets (scheduler hooks attached)".to_owned()
                }
                Ok(false) => {
                    "ready (scheduler hooks attached only while capture is armed)".to_owned()
                }
                Err(why) => format!("unavailable: {why}"),
            },
        }
    }
}

impl Active {
    fn new(cfg: &CaptureConfig) -> Active {
        // The kernel's flight rate limit is for all services together: this many records
        // cover the window (plus one second's burst), so the capacity drops none in it.
        let capacity = u64::from(cfg.flight_rate)
            .saturating_mul(cfg.flight_window.as_secs().saturating_add(1));
        Active {
            flight: FlightRecorder::new(
                cfg.flight_window,
                usize::try_from(capacity).unwrap_or(usize::MAX),
            ),
            incident_limits: IncidentLimits {
                max_time: cfg.max_time,
                max_samples: cfg.max_samples,
            },
            armed: HashMap::new(),
        }
    }
}

/// Threshold in ns of `probe` for `service`: a baseline quantile (None while the baseline
/// is cold) or a fixed latency.
fn threshold_ns(t: Threshold, detector: &Detector, service: &str, probe: Probe) -> Option<u64> {
    match t {
        Threshold::Latency(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        Threshold::Quantile(q) => detector
            .baseline_quantile(service, probe, q)
            // The bucket's upper bound: only SKBs clearly above the baseline's quantile.
            .map(|e| e.upper_ns.max(1)),
    }
}
