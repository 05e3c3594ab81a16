//! What happens to captured samples in user space: the flight recorder (the last seconds of
//! low-rate slow samples, kept in memory so an incident can store the start of the anomaly)
//! and the per-incident limits of armed capture.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use model::{Sample, SampleFlags};

/// The last `window` of flight-recorder samples, all services together, in arrival order;
/// `K` names the service (its name, or the daemon's service slot).
#[derive(Debug)]
pub struct FlightRecorder<K> {
    window_ns: u64,
    capacity: usize,
    samples: VecDeque<(K, Sample)>,
}

impl<K: PartialEq> FlightRecorder<K> {
    /// Keep samples for `window`, at most `capacity` of them (the oldest go first). With the
    /// kernel's flight rate limit `r`/s, `capacity = r x window` never drops in-window samples.
    pub fn new(window: Duration, capacity: usize) -> FlightRecorder<K> {
        FlightRecorder {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            capacity,
            samples: VecDeque::with_capacity(capacity.min(4096)),
        }
    }

    /// Add a sample of `service`; samples older than the window before it are dropped.
    pub fn push(&mut self, service: K, sample: Sample) {
        if self.capacity == 0 {
            return;
        }
        let now_ns = sample.time_ns;
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back((service, sample));
        self.expire(now_ns);
    }

    /// Drop samples taken before `now_ns - window` (ns since the Unix epoch).
    pub fn expire(&mut self, now_ns: u64) {
        let cutoff = now_ns.saturating_sub(self.window_ns);
        while self
            .samples
            .front()
            .is_some_and(|(_, s)| s.time_ns < cutoff)
        {
            self.samples.pop_front();
        }
    }

    /// The window's samples of `service`, removed from the recorder, assigned to `incident`
    /// and marked pre-trigger; oldest first. `now_ns` bounds the window.
    pub fn take(&mut self, service: &K, incident: u64, now_ns: u64) -> Vec<Sample> {
        self.expire(now_ns);
        let mut taken = Vec::new();
        self.samples.retain(|(svc, s)| {
            if svc != service {
                return true;
            }
            let mut s = s.clone();
            s.incident = incident;
            s.flags.insert(SampleFlags::PRE_TRIGGER);
            taken.push(s);
            false
        });
        taken
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// Per-incident bounds of armed capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncidentLimits {
    /// Disarm after this long even if the incident is still open.
    pub max_time: Duration,
    /// Disarm after this many samples.
    pub max_samples: u64,
}

impl Default for IncidentLimits {
    fn default() -> Self {
        IncidentLimits {
            max_time: Duration::from_secs(120),
            max_samples: 20_000,
        }
    }
}

/// Why armed capture for an incident must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The maximum capture time passed.
    MaxTime,
    /// The maximum number of samples was reached.
    MaxSamples,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::MaxTime => "maximum capture time reached",
            StopReason::MaxSamples => "maximum samples per incident reached",
        })
    }
}

/// Armed capture of one incident: assigns samples to it and says when to disarm.
#[derive(Debug, Clone)]
pub struct IncidentCapture {
    incident: u64,
    armed_at: Instant,
    limits: IncidentLimits,
    samples: u64,
}

impl IncidentCapture {
    /// Capture for `incident`, armed at `armed_at`.
    pub fn new(incident: u64, armed_at: Instant, limits: IncidentLimits) -> IncidentCapture {
        IncidentCapture {
            incident,
            armed_at,
            limits,
            samples: 0,
        }
    }

    /// The incident.
    pub fn incident(&self) -> u64 {
        self.incident
    }

    /// Samples accepted so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Take an armed-capture sample for the incident; `None` once the sample limit is
    /// reached (records still in flight when capture is disarmed).
    pub fn accept(&mut self, mut sample: Sample) -> Option<Sample> {
        if self.samples >= self.limits.max_samples {
            return None;
        }
        self.samples += 1;
        sample.incident = self.incident;
        Some(sample)
    }

    /// Whether capture must stop at `now`, and why.
    pub fn stop_reason(&self, now: Instant) -> Option<StopReason> {
        if self.samples >= self.limits.max_samples {
            Some(StopReason::MaxSamples)
        } else if now.saturating_duration_since(self.armed_at) >= self.limits.max_time {
            Some(StopReason::MaxTime)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn sample(time_ns: u64, dport: u16) -> Sample {
        let mut s = model::fixtures::sample(0, 10, time_ns);
        s.flow.dport = dport;
        s
    }

    #[test]
    fn flight_recorder_keeps_only_the_last_window_of_the_service() {
        let mut fr = FlightRecorder::new(Duration::from_secs(120), 10_000);
        // One sample per second for 300 s, alternating two services.
        for t in 0..300u64 {
            let svc = if t % 2 == 0 { "web" } else { "db" };
            fr.push(svc, sample(1_000 * S + t * S, 80));
        }
        let now = 1_000 * S + 299 * S;
        let taken = fr.take(&"web", 42, now);
        // Even seconds in [179, 299]: 180..=298.
        assert_eq!(taken.len(), 60);
        assert!(taken.iter().all(|s| s.time_ns >= now - 120 * S));
        assert_eq!(taken.first().map(|s| s.time_ns), Some(1_180 * S));
        assert!(taken
            .iter()
            .all(|s| s.incident == 42 && s.flags.contains(SampleFlags::PRE_TRIGGER)));
        // The other service's samples stay; the taken ones are gone.
        assert_eq!(fr.len(), 61);
        assert!(fr.take(&"web", 43, now).is_empty());
    }

    #[test]
    fn flight_recorder_capacity_drops_the_oldest() {
        let mut fr = FlightRecorder::new(Duration::from_secs(120), 3);
        for t in 0..5u64 {
            fr.push("web", sample(t * S, 80));
        }
        let times: Vec<u64> = fr
            .take(&"web", 1, 5 * S)
            .iter()
            .map(|s| s.time_ns)
            .collect();
        assert_eq!(times, vec![2 * S, 3 * S, 4 * S]);
        assert!(fr.is_empty());
    }

    #[test]
    fn incident_capture_stops_at_max_samples_then_refuses_more() {
        let armed = Instant::now();
        let limits = IncidentLimits {
            max_time: Duration::from_secs(120),
            max_samples: 3,
        };
        let mut c = IncidentCapture::new(9, armed, limits);
        let accepted: Vec<Sample> = (0..5).filter_map(|i| c.accept(sample(i, 80))).collect();
        assert_eq!(accepted.len(), 3);
        assert!(accepted.iter().all(|s| s.incident == 9));
        assert_eq!(c.samples(), 3);
        assert_eq!(c.stop_reason(armed), Some(StopReason::MaxSamples));
    }

    #[test]
    fn incident_capture_stops_at_max_time() {
        let armed = Instant::now();
        let c = IncidentCapture::new(1, armed, IncidentLimits::default());
        assert_eq!(c.stop_reason(armed + Duration::from_secs(119)), None);
        assert_eq!(
            c.stop_reason(armed + Duration::from_secs(120)),
            Some(StopReason::MaxTime)
        );
    }
}
