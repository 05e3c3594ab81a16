//! The records the store keeps (other than [`model::Sample`], shared with capture).

use model::{Flow, Probe, Verdict};
use serde::{Deserialize, Serialize};

/// Where an incident stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IncidentState {
    /// Still going on.
    Open,
    /// Ended normally.
    Closed,
    /// Was open when the daemon stopped without closing it (crash, kill, power loss).
    Interrupted,
}

impl IncidentState {
    /// Lower-case name, as shown and parsed.
    pub const fn name(self) -> &'static str {
        match self {
            IncidentState::Open => "open",
            IncidentState::Closed => "closed",
            IncidentState::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for IncidentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for IncidentState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            IncidentState::Open,
            IncidentState::Closed,
            IncidentState::Interrupted,
        ]
        .into_iter()
        .find(|st| st.name() == s)
        .ok_or_else(|| {
            format!("unknown incident state {s:?} (expected open, closed or interrupted)")
        })
    }
}

/// State of in-kernel capture for an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaptureState {
    /// Capture was not armed (yet).
    #[default]
    NotArmed,
    /// The BPF side is emitting slow-SKB records for this incident.
    Armed,
    /// Capture ran and was disarmed (see the message for why: closed, time or sample cap).
    Disarmed,
    /// Arming failed.
    Failed,
}

/// Capture status and counters of one incident.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CaptureStatus {
    /// Current state.
    pub state: CaptureState,
    /// Records the kernel emitted for this incident.
    pub emitted: u64,
    /// Records lost because the ring buffer was full.
    pub dropped: u64,
    /// Records suppressed by the in-kernel rate limit.
    pub rate_limited: u64,
    /// Samples stored (pre-trigger ones included).
    pub stored: u64,
    /// Pre-trigger samples from the flight recorder stored with the incident.
    pub pre_trigger: u64,
    /// Why it is in this state (e.g. "disarmed: sample cap 20000 reached").
    pub message: String,
}

/// State of the incident's pwru session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PwruState {
    /// No session (disabled, unusable, or in cooldown: see the message).
    #[default]
    NotRun,
    /// The session is running.
    Running,
    /// The session ended and attached to at least one function.
    Done,
    /// The session failed (exit status, nothing attached, ...).
    Failed,
}

/// pwru session status of one incident.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PwruStatus {
    /// Current state.
    pub state: PwruState,
    /// Exit status, when it exited (`None` if killed by a signal or still running).
    pub exit_status: Option<i32>,
    /// Signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Last lines of its stderr.
    pub stderr_tail: String,
    /// When it was started, ns since the epoch.
    pub started_ns: Option<u64>,
    /// When it ended, ns since the epoch.
    pub ended_ns: Option<u64>,
    /// JSON lines stored with the incident.
    pub lines_stored: u64,
    /// Explanation (why not run, why failed).
    pub message: String,
}

impl PwruStatus {
    /// How `message` starts while the incident waits for another incident's session to
    /// end (`state` is then [`PwruState::Running`]: its session is asked for, not over).
    pub const WAITING: &'static str = "waiting: ";

    /// Whether the incident waits for the one session slot rather than running pwru.
    pub fn is_waiting(&self) -> bool {
        self.state == PwruState::Running && self.message.starts_with(Self::WAITING)
    }
}

/// Counters of an incident that are not capture's or pwru's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IncidentCounters {
    /// Detector intervals the incident spanned.
    pub intervals: u64,
    /// Samples or pwru lines that could not be stored (disk full, over the cap, ...).
    pub store_errors: u64,
}

/// One incident: a tail shift on one service, with what was captured about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incident {
    /// Monotonically allocated id.
    pub id: u64,
    /// The service it concerns.
    pub service: String,
    /// The probes whose tail moved.
    pub probes: Vec<Probe>,
    /// When it opened, ns since the epoch.
    pub opened_ns: u64,
    /// When it closed (or when an interrupted one was last known open).
    pub closed_ns: Option<u64>,
    /// Where it stands.
    pub state: IncidentState,
    /// The detector's evidence, as JSON (stored opaquely).
    pub evidence_json: String,
    /// Stage attribution, as JSON (stored opaquely).
    pub stages_json: String,
    /// In-kernel capture status.
    pub capture: CaptureStatus,
    /// pwru session status.
    pub pwru: PwruStatus,
    /// Other counters.
    pub counters: IncidentCounters,
    /// Why the packets waited (None: not decided yet, or written by a build before causes).
    pub cause: Option<IncidentCause>,
}

/// Why the packets waited, as far as the daemon could tell (issue: cause verdicts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentCause {
    /// Machine name of the verdict, kebab-case: "cpu-wait", "throttled", "reader-off-cpu",
    /// "reader-busy", "softirq", "one-cpu", "one-rx-queue", "no-clear-cause" (free text to storage: the agent owns the list).
    pub kind: String,
    /// The operator's sentence with its figures, e.g. "one CPU: cpu 1 has 94 % of slow packets ...".
    pub summary: String,
    /// The figures the verdict was drawn from, as JSON (stored opaquely, like evidence_json).
    pub figures_json: String,
    /// When it was last decided, ns since the epoch.
    pub decided_ns: u64,
}

/// What the caller supplies to open an incident; the store allocates the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewIncident {
    /// The service it concerns.
    pub service: String,
    /// The probes whose tail moved.
    pub probes: Vec<Probe>,
    /// When it opened, ns since the epoch.
    pub opened_ns: u64,
    /// The detector's evidence, as JSON.
    pub evidence_json: String,
    /// Stage attribution, as JSON.
    pub stages_json: String,
}

/// One line of pwru output stored with an incident, with the fields queries need pulled out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PwruRecord {
    /// The incident whose session produced it.
    pub incident: u64,
    /// Line number within the incident's output (0-based); records sort by it.
    pub seq: u64,
    /// When the line was read, ns since the epoch.
    pub received_ns: u64,
    /// pwru's own `time` field when present (its clock: ns since boot by default).
    pub pwru_time_ns: Option<u64>,
    /// Kernel function (pwru's `func`).
    pub func: String,
    /// SKB address (pwru's `skb`).
    pub skb: u64,
    /// The packet's tuple when pwru printed one.
    pub flow: Option<Flow>,
    /// The raw JSON line, verbatim.
    pub raw: String,
}

// With the other stored live types (not in `verdict.rs`, which stores it), so that its
// frozen layout in `layout::incident` does not import the store.
/// A verdict with the operator's note and when it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentVerdict {
    /// The verdict.
    pub verdict: Verdict,
    /// Free text (may be empty).
    pub note: String,
    /// When it was given, ns since the epoch.
    pub marked_ns: u64,
}
