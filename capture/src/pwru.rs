//! Bounded pwru sessions scoped to an incident.
//!
//! [pwru](https://github.com/cilium/pwru) traces an SKB through every kernel function it
//! passes. tailtrap runs it at most once at a time, for a short while, filtered to the flows
//! of one incident, and keeps what it printed with that incident:
//!
//! - [`Prerequisites::check`] finds the binary, its version and the kernel features pwru
//!   needs, and says in one line whether sessions can run.
//! - [`SessionRequest`] holds the typed, validated inputs of one session and turns them
//!   into pwru's argv; nothing from outside is pasted into a shell or a string.
//!   [`SessionRequest::for_incident`] builds the one an incident asks for.
//! - [`SessionManager::run`] supervises the process (readiness, deadline, SIGTERM, SIGKILL,
//!   reaping), streams each stdout line as a [`PwruLine`] and returns a [`SessionStatus`].
//! - [`PwruConfig`] is the `[pwru]` configuration table, checked when loaded.

mod busy;
mod config;
mod event;
mod incident;
mod prereq;
mod request;
mod session;
mod stderr;
#[cfg(test)]
mod stderr_fuzz;
mod timeline;

pub use config::{PwruConfig, DEFAULTS_TOML};
pub use event::{Iface, ParseLineError, ProcessRef, PwruEvent, PwruLine, Tuple};
pub use incident::{IncidentRequestError, IncidentScope};
pub use prereq::{KprobeMulti, PrereqStatus, Prerequisites, TracefsState};
pub use request::{
    FilterFuncs, NetnsFilter, PcapFilter, Protocol, RequestError, SessionLimits, SessionRequest,
};
pub use session::{ManagerConfig, Reservation, SessionManager, SessionState, SessionStatus};
pub use stderr::AttachReport;
pub use timeline::{
    clock_offset, wall_minus_mono_ns, ClockOffset, Passes, SampleKey, Step, Timeline, TracePoint,
};
