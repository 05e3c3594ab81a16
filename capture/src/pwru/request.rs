//! The typed inputs of one pwru session and the argv built from them.
//!
//! Every value that reaches pwru's command line is rendered here from a validated Rust
//! value (ports are `u16`, addresses `IpAddr`, function names checked identifiers), so no
//! text from configuration, the kernel or the network is ever pasted into the argv.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use model::{Flow, Probe, Transport};
use serde::{Deserialize, Serialize};

/// Why a session request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No local port was given: a session without one would trace the whole host.
    #[error("a pwru session needs at least one local port")]
    NoPorts,
    /// Port 0 cannot be a service port.
    #[error("port 0 is not a valid service port")]
    ZeroPort,
    /// More ports or addresses than a bounded filter allows.
    #[error("too many {what}: {got} (at most {max})")]
    TooMany {
        /// What was counted (`local ports`, `remote addresses`, `filter functions`).
        what: &'static str,
        /// How many were given.
        got: usize,
        /// The limit.
        max: usize,
    },
    /// An unspecified address (0.0.0.0 or ::) names no peer.
    #[error("remote address {0} is unspecified and names no peer")]
    UnspecifiedAddr(IpAddr),
    /// A kernel function name that is not a plain identifier.
    #[error("filter function {0:?} is not a kernel symbol name ([A-Za-z_][A-Za-z0-9_.]*, at most 128 characters)")]
    BadFunction(String),
    /// The list of filter functions is empty.
    #[error("the filter function list is empty")]
    NoFunctions,
    /// An `inode:` netns filter whose number is not a 32-bit inode.
    #[error("netns {0:?} is not inode:<number>")]
    BadNetnsInode(String),
    /// A network namespace path pwru could not be given safely.
    #[error("netns path {0:?} must be absolute, UTF-8 and without `..`")]
    BadNetnsPath(PathBuf),
    /// A limit outside its allowed range.
    #[error("{what} {got} is out of range ({range})")]
    LimitOutOfRange {
        /// Which limit (`deadline`, `kill grace`, `output limit`).
        what: &'static str,
        /// The value given, as text.
        got: String,
        /// The allowed range, as text.
        range: &'static str,
    },
}

/// Transport protocol of the service a session is scoped to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The pcap-filter primitive (matches IPv4 and IPv6).
    pub const fn pcap_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// Most local ports one filter carries (a service listens on a handful at most).
const MAX_PORTS: usize = 16;
/// Most remote addresses: the top talkers among the incident's samples, not every peer.
pub(crate) const MAX_ADDRS: usize = 16;
/// Most service addresses in a filter; with more, any destination address is taken.
const MAX_LOCAL_ADDRS: usize = 4;

/// `items` without repeats (the first of each kept, in order), refused as
/// [`RequestError::TooMany`] `what` when more than `max` are left: a request's lists are
/// bounded so pwru's filter and argv stay small.
fn distinct<T: PartialEq>(
    items: impl IntoIterator<Item = T>,
    what: &'static str,
    max: usize,
) -> Result<Vec<T>, RequestError> {
    let mut out: Vec<T> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    if out.len() > max {
        return Err(RequestError::TooMany {
            what,
            got: out.len(),
            max,
        });
    }
    Ok(out)
}

/// The pcap filter of a session: packets *to* the service (its protocol and local
/// port(s), optionally its local addresses), optionally narrowed to those *from* the top
/// remote addresses. Inbound (the slow packets are the ones the service receives), or for a
/// send-side incident outbound ([`PcapFilter::outbound`]). Built only from typed values (and therefore
/// serialisable for the record, but not deserialisable around [`PcapFilter::new`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PcapFilter {
    protocol: Protocol,
    local_ports: Vec<u16>,
    remote_addrs: Vec<IpAddr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    local_addrs: Vec<IpAddr>,
    /// Packets *from* the service instead (a send-side incident's slow packets leave it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    outbound: bool,
}

impl PcapFilter {
    /// A filter for `protocol` traffic on any of `local_ports` and, when `remote_addrs` is
    /// not empty, only to or from those peers. Duplicates are dropped, order is kept (the
    /// caller lists the dominant flows first). IPv4-mapped IPv6 peers become IPv4, which is
    /// how a dual-stack socket's IPv4 traffic looks on the wire.
    pub fn new(
        protocol: Protocol,
        local_ports: &[u16],
        remote_addrs: &[IpAddr],
    ) -> Result<Self, RequestError> {
        if local_ports.is_empty() {
            return Err(RequestError::NoPorts);
        }
        if local_ports.contains(&0) {
            return Err(RequestError::ZeroPort);
        }
        let ports = distinct(local_ports.iter().copied(), "local ports", MAX_PORTS)?;
        if let Some(&a) = remote_addrs.iter().find(|a| a.is_unspecified()) {
            return Err(RequestError::UnspecifiedAddr(a));
        }
        let addrs = distinct(
            remote_addrs.iter().map(|a| a.to_canonical()),
            "remote addresses",
            MAX_ADDRS,
        )?;
        Ok(PcapFilter {
            protocol,
            local_ports: ports,
            remote_addrs: addrs,
            local_addrs: Vec::new(),
            outbound: false,
        })
    }

    /// A filter for the dominant flows among an incident's samples: `protocol` traffic on
    /// `local_ports`, narrowed to the `max_peers` remote addresses that sent the most
    /// samples to those ports (ties go to the lower address, so the choice is stable).
    /// Flows of other protocols or ports are ignored; with none left, the filter is the
    /// ports alone.
    pub fn from_flows<'a>(
        protocol: Protocol,
        local_ports: &[u16],
        flows: impl IntoIterator<Item = &'a Flow>,
        max_peers: usize,
    ) -> Result<Self, RequestError> {
        let transport = match protocol {
            Protocol::Tcp => Transport::Tcp,
            Protocol::Udp => Transport::Udp,
        };
        let mut counts: HashMap<IpAddr, u64> = HashMap::new();
        let mut local: Vec<IpAddr> = Vec::new();
        for f in flows {
            if f.transport == transport && local_ports.contains(&f.dport) && !f.src.is_unspecified()
            {
                *counts.entry(f.src.to_canonical()).or_default() += 1;
                let dst = f.dst.to_canonical();
                if !dst.is_unspecified() && !local.contains(&dst) {
                    local.push(dst);
                }
            }
        }
        let mut peers: Vec<(IpAddr, u64)> = counts.into_iter().collect();
        peers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let top: Vec<IpAddr> = peers
            .into_iter()
            .take(max_peers.min(MAX_ADDRS))
            .map(|(a, _)| a)
            .collect();
        let mut filter = PcapFilter::new(protocol, local_ports, &top)?;
        if local.len() <= MAX_LOCAL_ADDRS {
            local.sort();
            filter.local_addrs = local;
        }
        Ok(filter)
    }

    /// The same flows in the other direction: packets the service sends (`src port`,
    /// `src host` local, `dst host` the peers), for a send-side incident.
    pub fn outbound(mut self) -> Self {
        self.outbound = true;
        self
    }

    /// Whether the filter matches what the service sends rather than what it receives.
    pub fn is_outbound(&self) -> bool {
        self.outbound
    }

    /// The service's own addresses seen in the samples (empty: any).
    pub fn local_addrs(&self) -> &[IpAddr] {
        &self.local_addrs
    }

    /// The protocol.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The local ports, deduplicated.
    pub fn local_ports(&self) -> &[u16] {
        &self.local_ports
    }

    /// The remote addresses, deduplicated and canonical.
    pub fn remote_addrs(&self) -> &[IpAddr] {
        &self.remote_addrs
    }

    /// The pcap-filter expression, e.g.
    /// `tcp and dst port 9000 and dst host 10.0.0.1 and (src host 10.0.0.5 or src host ::1)`:
    /// inbound only, so the service's own replies and ACKs (and their drops when a
    /// connection closes) stay out of the trace.
    pub fn expression(&self) -> String {
        let (local, remote) = if self.outbound {
            ("src", "dst")
        } else {
            ("dst", "src")
        };
        let mut s = String::from(self.protocol.pcap_name());
        s.push_str(" and ");
        push_alternatives(&mut s, &format!("{local} port"), &self.local_ports);
        if !self.local_addrs.is_empty() {
            s.push_str(" and ");
            push_alternatives(&mut s, &format!("{local} host"), &self.local_addrs);
        }
        if !self.remote_addrs.is_empty() {
            s.push_str(" and ");
            push_alternatives(&mut s, &format!("{remote} host"), &self.remote_addrs);
        }
        s
    }
}

/// `kw a` for one value, `(kw a or kw b)` for several.
fn push_alternatives<T: std::fmt::Display>(s: &mut String, kw: &str, values: &[T]) {
    let grouped = values.len() > 1;
    if grouped {
        s.push('(');
    }
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        // Writing to a String cannot fail.
        let _ = write!(s, "{kw} {v}");
    }
    if grouped {
        s.push(')');
    }
}

/// Which network namespace pwru filters on (`--filter-netns`), in the two forms pwru
/// 1.0.12 accepts: `inode:<inode>` or a namespace file path such as `/proc/<pid>/ns/net`.
/// Written and parsed (also in configuration) in that same form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NetnsFilter(Netns);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Netns {
    Inode(u32),
    Path(PathBuf),
}

impl NetnsFilter {
    /// The namespace with this inode number (as in `ls -L -i /proc/<pid>/ns/net`).
    pub fn inode(inode: u32) -> Self {
        NetnsFilter(Netns::Inode(inode))
    }

    /// The namespace of process `pid`.
    pub fn of_pid(pid: u32) -> Self {
        NetnsFilter(Netns::Path(PathBuf::from(format!("/proc/{pid}/ns/net"))))
    }

    /// A namespace file (`/run/netns/<name>`, ...); must be absolute, UTF-8 and free of `..`.
    pub fn path(path: impl Into<PathBuf>) -> Result<Self, RequestError> {
        let path = path.into();
        let ok = path.is_absolute()
            && path.to_str().is_some()
            && !path.components().any(|c| c == Component::ParentDir);
        if ok {
            Ok(NetnsFilter(Netns::Path(path)))
        } else {
            Err(RequestError::BadNetnsPath(path))
        }
    }

    fn arg(&self) -> OsString {
        match &self.0 {
            Netns::Inode(ino) => format!("inode:{ino}").into(),
            Netns::Path(p) => p.clone().into_os_string(),
        }
    }
}

impl std::str::FromStr for NetnsFilter {
    type Err = RequestError;
    fn from_str(s: &str) -> Result<Self, RequestError> {
        match s.strip_prefix("inode:") {
            Some(n) => n
                .parse()
                .map(NetnsFilter::inode)
                .map_err(|_| RequestError::BadNetnsInode(s.to_owned())),
            None => NetnsFilter::path(s),
        }
    }
}

impl TryFrom<String> for NetnsFilter {
    type Error = RequestError;
    fn try_from(s: String) -> Result<Self, RequestError> {
        s.parse()
    }
}

impl From<NetnsFilter> for String {
    fn from(n: NetnsFilter) -> String {
        n.arg().to_string_lossy().into_owned()
    }
}

/// The kernel functions pwru attaches to (`--filter-func`), kept as a list of checked
/// symbol names and rendered as one anchored RE2 alternation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct FilterFuncs(Vec<String>);

/// Most functions in one session: pwru's cost grows with each attached function.
const MAX_FUNCS: usize = 64;

/// Where SKBs are dropped: `kfree_skb_reason` up to 6.11, `sk_skb_reason_drop` from 6.12.
/// The daemon keeps only the one the running kernel really traces.
const DROP_POINTS: [&str; 2] = ["kfree_skb_reason", "sk_skb_reason_drop"];

impl FilterFuncs {
    /// Checked function names (duplicates dropped, order kept).
    pub fn new<I, S>(names: I) -> Result<Self, RequestError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names = names
            .into_iter()
            .map(|n| {
                let n = n.as_ref();
                if is_symbol_name(n) {
                    Ok(n.to_owned())
                } else {
                    Err(RequestError::BadFunction(n.to_owned()))
                }
            })
            .collect::<Result<Vec<String>, _>>()?;
        let out = distinct(names, "filter functions", MAX_FUNCS)?;
        if out.is_empty() {
            return Err(RequestError::NoFunctions);
        }
        Ok(FilterFuncs(out))
    }

    /// The functions pwru follows for `probes`: for each, its stage's functions (the probe
    /// table's [`model::KernelHooks::pwru_functions`]) and those of every stage before it
    /// on the path (a slow read is followed from the IP receive on), then the drop points. Candidates for the kernel check, not verified.
    pub fn for_probes(probes: &[Probe]) -> Self {
        let mut names: Vec<&str> = Vec::new();
        for &hot in probes {
            let mut path = vec![hot];
            while let Some(prev) = path.last().and_then(|p| p.previous()) {
                path.push(prev);
            }
            for stage in path.into_iter().rev() {
                names.extend(stage.hooks().pwru_functions);
            }
        }
        names.extend(DROP_POINTS);
        let mut out: Vec<String> = Vec::new();
        for n in names {
            if !out.iter().any(|o| o == n) {
                out.push(n.to_owned());
            }
        }
        FilterFuncs(out)
    }

    /// Keep only the names `keep` accepts (the daemon's kernel check); `None` when none is
    /// left.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> Option<Self> {
        let v: Vec<String> = self.0.iter().filter(|n| keep(n)).cloned().collect();
        (!v.is_empty()).then_some(FilterFuncs(v))
    }

    /// The names.
    pub fn names(&self) -> &[String] {
        &self.0
    }

    /// The anchored regular expression pwru matches whole symbol names against,
    /// e.g. `^(tcp_v4_rcv|tcp_queue_rcv)$`. Dots (in names like `foo.isra.0`) are escaped.
    pub fn regex(&self) -> String {
        let mut s = String::from("^(");
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                s.push('|');
            }
            s.push_str(&n.replace('.', "\\."));
        }
        s.push_str(")$");
        s
    }
}

impl Default for FilterFuncs {
    /// Every probed function and the drop points.
    fn default() -> Self {
        FilterFuncs::for_probes(&Probe::ALL)
    }
}

impl TryFrom<Vec<String>> for FilterFuncs {
    type Error = RequestError;
    fn try_from(v: Vec<String>) -> Result<Self, RequestError> {
        FilterFuncs::new(v)
    }
}

impl From<FilterFuncs> for Vec<String> {
    fn from(f: FilterFuncs) -> Vec<String> {
        f.0
    }
}

/// A kernel symbol as it appears in kallsyms: an identifier, possibly with compiler
/// suffixes after dots (`.isra.0`, `.cold`).
fn is_symbol_name(s: &str) -> bool {
    let mut chars = s.chars();
    let first_ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_');
    first_ok && s.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// How long a session may run and how much it may print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawLimits", into = "RawLimits")]
pub struct SessionLimits {
    attach_timeout: Duration,
    deadline: Duration,
    kill_grace: Duration,
    output_limit_lines: u64,
}

/// The serde form of [`SessionLimits`] (human durations), checked on the way in.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLimits {
    #[serde(with = "humantime_serde")]
    attach_timeout: Duration,
    #[serde(with = "humantime_serde")]
    deadline: Duration,
    #[serde(with = "humantime_serde")]
    kill_grace: Duration,
    output_limit_lines: u64,
}

impl Default for RawLimits {
    fn default() -> Self {
        let d = SessionLimits::default();
        RawLimits {
            attach_timeout: d.attach_timeout,
            deadline: d.deadline,
            kill_grace: d.kill_grace,
            output_limit_lines: d.output_limit_lines,
        }
    }
}

impl TryFrom<RawLimits> for SessionLimits {
    type Error = RequestError;
    fn try_from(r: RawLimits) -> Result<Self, RequestError> {
        SessionLimits::new(r.deadline, r.kill_grace, r.output_limit_lines)?
            .with_attach_timeout(r.attach_timeout)
    }
}

impl From<SessionLimits> for RawLimits {
    fn from(l: SessionLimits) -> Self {
        RawLimits {
            attach_timeout: l.attach_timeout,
            deadline: l.deadline,
            kill_grace: l.kill_grace,
            output_limit_lines: l.output_limit_lines,
        }
    }
}

impl Default for SessionLimits {
    /// 60 s to attach, then 30 s of tracing, 5 s between SIGTERM and SIGKILL, 5000 lines.
    fn default() -> Self {
        SessionLimits {
            attach_timeout: Duration::from_secs(60),
            deadline: Duration::from_secs(30),
            kill_grace: Duration::from_secs(5),
            output_limit_lines: 5000,
        }
    }
}

/// 100 ms..=10 min. Separate checks so configuration can name the offending key.
pub(crate) fn check_deadline(d: Duration) -> Result<Duration, RequestError> {
    check_duration(d, "deadline", Duration::from_secs(600), "100ms..=10min")
}

/// 100 ms..=10 min (pwru under emulation takes over a minute to attach).
pub(crate) fn check_attach_timeout(d: Duration) -> Result<Duration, RequestError> {
    check_duration(
        d,
        "attach timeout",
        Duration::from_secs(600),
        "100ms..=10min",
    )
}

/// 100 ms..=60 s.
pub(crate) fn check_kill_grace(d: Duration) -> Result<Duration, RequestError> {
    check_duration(d, "kill grace", Duration::from_secs(60), "100ms..=60s")
}

fn check_duration(
    d: Duration,
    what: &'static str,
    max: Duration,
    range: &'static str,
) -> Result<Duration, RequestError> {
    if (Duration::from_millis(100)..=max).contains(&d) {
        Ok(d)
    } else {
        Err(RequestError::LimitOutOfRange {
            what,
            got: humantime::format_duration(d).to_string(),
            range,
        })
    }
}

/// 1..=1 000 000 lines.
pub(crate) fn check_output_limit(n: u64) -> Result<u64, RequestError> {
    if (1..=1_000_000).contains(&n) {
        Ok(n)
    } else {
        Err(RequestError::LimitOutOfRange {
            what: "output limit",
            got: n.to_string(),
            range: "1..=1000000 lines",
        })
    }
}

impl SessionLimits {
    /// Checked limits: deadline 100 ms..=10 min, kill grace 100 ms..=60 s,
    /// output limit 1..=1 000 000 lines.
    pub fn new(
        deadline: Duration,
        kill_grace: Duration,
        output_limit_lines: u64,
    ) -> Result<Self, RequestError> {
        Ok(SessionLimits {
            attach_timeout: SessionLimits::default().attach_timeout,
            deadline: check_deadline(deadline)?,
            kill_grace: check_kill_grace(kill_grace)?,
            output_limit_lines: check_output_limit(output_limit_lines)?,
        })
    }

    /// Limits whose values went through the `check_*` functions one by one.
    pub(crate) fn from_checked(deadline: Duration, kill_grace: Duration, lines: u64) -> Self {
        SessionLimits {
            attach_timeout: SessionLimits::default().attach_timeout,
            deadline,
            kill_grace,
            output_limit_lines: lines,
        }
    }

    /// These limits with another attach timeout (100 ms..=10 min).
    pub fn with_attach_timeout(self, d: Duration) -> Result<Self, RequestError> {
        Ok(self.with_attach_timeout_checked(check_attach_timeout(d)?))
    }

    pub(crate) fn with_attach_timeout_checked(mut self, d: Duration) -> Self {
        self.attach_timeout = d;
        self
    }

    /// How long pwru may take to attach (create its ready file), counted from the start;
    /// past it the session ends as not ready.
    pub fn attach_timeout(&self) -> Duration {
        self.attach_timeout
    }

    /// How long pwru traces: SIGTERM is sent this long after it became ready.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// How long after SIGTERM SIGKILL follows.
    pub fn kill_grace(&self) -> Duration {
        self.kill_grace
    }

    /// `--output-limit-lines`: pwru exits by itself after this many events.
    pub fn output_limit_lines(&self) -> u64 {
        self.output_limit_lines
    }
}

/// Everything one pwru session needs, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionRequest {
    service: String,
    filter: PcapFilter,
    netns: Option<NetnsFilter>,
    funcs: FilterFuncs,
    limits: SessionLimits,
}

impl SessionRequest {
    /// A session for `service` (the cooldown key; never passed to pwru) with `filter`,
    /// the default functions and limits and no netns filter.
    pub fn new(service: impl Into<String>, filter: PcapFilter) -> Self {
        SessionRequest {
            service: service.into(),
            filter,
            netns: None,
            funcs: FilterFuncs::default(),
            limits: SessionLimits::default(),
        }
    }

    /// Restrict to a network namespace (services living outside the host namespace).
    pub fn with_netns(mut self, netns: NetnsFilter) -> Self {
        self.netns = Some(netns);
        self
    }

    /// Attach to these functions instead of the defaults.
    pub fn with_filter_funcs(mut self, funcs: FilterFuncs) -> Self {
        self.funcs = funcs;
        self
    }

    /// Use these limits instead of the defaults.
    pub fn with_limits(mut self, limits: SessionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The service name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The pcap filter.
    pub fn filter(&self) -> &PcapFilter {
        &self.filter
    }

    /// The kernel functions.
    pub fn filter_funcs(&self) -> &FilterFuncs {
        &self.funcs
    }

    /// The limits.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// pwru's arguments (without the program name). JSON events on stdout, one per line,
    /// with boot-time timestamps and callers so they can be lined up with the samples;
    /// the ready file tells when the probes are attached; the pcap filter goes last as a
    /// single argument (pwru reads the expression from its positional arguments).
    pub fn argv(&self, ready_file: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--output-json".into(),
            "--output-limit-lines".into(),
            self.limits.output_limit_lines.to_string().into(),
            "--ready-file".into(),
            ready_file.as_os_str().to_owned(),
            "--filter-func".into(),
            self.funcs.regex().into(),
        ];
        if let Some(ns) = &self.netns {
            a.push("--filter-netns".into());
            a.push(ns.arg());
        }
        a.extend(
            [
                "--timestamp",
                "current",
                "--output-meta",
                "--output-tuple",
                "--output-caller",
                // Once a packet matched the filter, follow its skb by address: past the
                // IP layer (queueing, the read, the free) the headers pwru's filter reads
                // may no longer be where it looks.
                "--filter-track-skb",
            ]
            .map(OsString::from),
        );
        a.push(self.filter.expression().into());
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn filter_expression_single_and_grouped() {
        let f = PcapFilter::new(Protocol::Tcp, &[9000], &[]).unwrap();
        assert_eq!(f.expression(), "tcp and dst port 9000");
        let f = PcapFilter::new(
            Protocol::Udp,
            &[53, 5353, 53],
            &[ip("10.0.0.5"), ip("2001:db8::1"), ip("::ffff:10.0.0.5")],
        )
        .unwrap();
        assert_eq!(
            f.expression(),
            "udp and (dst port 53 or dst port 5353) and (src host 10.0.0.5 or src host 2001:db8::1)"
        );
        let f = PcapFilter::new(Protocol::Tcp, &[443], &[ip("::ffff:192.0.2.7")]).unwrap();
        assert_eq!(
            f.expression(),
            "tcp and dst port 443 and src host 192.0.2.7"
        );
    }

    #[test]
    fn an_outbound_filter_matches_what_the_service_sends_to_its_peers() {
        let flows = [flow(Transport::Tcp, "10.0.0.5", 9000)];
        let f = PcapFilter::from_flows(Protocol::Tcp, &[9000], &flows, 4)
            .unwrap()
            .outbound();
        assert_eq!(
            f.expression(),
            "tcp and src port 9000 and src host 10.0.0.1 and dst host 10.0.0.5"
        );
    }

    fn flow(t: Transport, src: &str, dport: u16) -> Flow {
        Flow {
            transport: t,
            src: ip(src),
            sport: 40000,
            dst: ip("10.0.0.1"),
            dport,
        }
    }

    #[test]
    fn filter_from_dominant_flows() {
        let mut flows = Vec::new();
        for (src, n) in [
            ("10.0.0.9", 2),
            ("10.0.0.5", 5),
            ("::ffff:10.0.0.7", 3),
            ("10.0.0.8", 3),
        ] {
            flows.extend(std::iter::repeat_n(flow(Transport::Tcp, src, 9000), n));
        }
        // Other ports and protocols do not count, however many.
        flows.extend(std::iter::repeat_n(
            flow(Transport::Udp, "10.9.9.9", 9000),
            50,
        ));
        flows.extend(std::iter::repeat_n(
            flow(Transport::Tcp, "10.9.9.8", 22),
            50,
        ));
        let f = PcapFilter::from_flows(Protocol::Tcp, &[9000], &flows, 3).unwrap();
        // 10.0.0.7 and 10.0.0.8 tie at 3: the lower address first.
        assert_eq!(
            f.expression(),
            "tcp and dst port 9000 and dst host 10.0.0.1 and \
             (src host 10.0.0.5 or src host 10.0.0.7 or src host 10.0.0.8)"
        );
        let f = PcapFilter::from_flows(Protocol::Udp, &[53], &flows, 3).unwrap();
        assert_eq!(f.expression(), "udp and dst port 53");
        let many: Vec<Flow> = (1..=40u8)
            .map(|i| flow(Transport::Tcp, &format!("10.1.0.{i}"), 9000))
            .collect();
        let f = PcapFilter::from_flows(Protocol::Tcp, &[9000], &many, 100).unwrap();
        assert_eq!(f.remote_addrs().len(), MAX_ADDRS);
    }

    #[test]
    fn filter_rejects_bad_values() {
        assert_eq!(
            PcapFilter::new(Protocol::Tcp, &[], &[]),
            Err(RequestError::NoPorts)
        );
        assert_eq!(
            PcapFilter::new(Protocol::Tcp, &[80, 0], &[]),
            Err(RequestError::ZeroPort)
        );
        assert_eq!(
            PcapFilter::new(Protocol::Tcp, &[80], &[IpAddr::V6(Ipv6Addr::UNSPECIFIED)]),
            Err(RequestError::UnspecifiedAddr(IpAddr::V6(
                Ipv6Addr::UNSPECIFIED
            )))
        );
        let ports: Vec<u16> = (1..=17).collect();
        assert!(matches!(
            PcapFilter::new(Protocol::Tcp, &ports, &[]),
            Err(RequestError::TooMany { got: 17, .. })
        ));
        let addrs: Vec<IpAddr> = (1..=17u8)
            .map(|i| IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)))
            .collect();
        assert!(matches!(
            PcapFilter::new(Protocol::Tcp, &[80], &addrs),
            Err(RequestError::TooMany { got: 17, .. })
        ));
    }

    #[test]
    fn filter_funcs_validate_and_render() {
        let f = FilterFuncs::new(["tcp_v4_rcv", "foo.isra.0", "tcp_v4_rcv"]).unwrap();
        assert_eq!(f.regex(), r"^(tcp_v4_rcv|foo\.isra\.0)$");
        for bad in ["", "a b", "x|y", ".*", "1abc", "f)$|(.*", "-x"] {
            assert!(
                matches!(FilterFuncs::new([bad]), Err(RequestError::BadFunction(_))),
                "{bad:?} accepted"
            );
        }
        assert_eq!(
            FilterFuncs::new(Vec::<String>::new()),
            Err(RequestError::NoFunctions)
        );
        let long = "a".repeat(129);
        assert!(FilterFuncs::new([long]).is_err());
        let json: Result<FilterFuncs, _> = serde_json::from_str(r#"["ok", "not ok"]"#);
        assert!(json.is_err());
    }

    #[test]
    fn default_funcs_cover_probes_and_drops() {
        assert_eq!(
            FilterFuncs::default().regex(),
            "^(ip_rcv_core|ip_local_deliver|ip6_rcv_core|ip6_input|tcp_v4_rcv|tcp_v6_rcv|\
             tcp_rcv_established|udp_rcv|udp_unicast_rcv_skb|udp_queue_rcv_one_skb|udpv6_rcv|\
             tcp_data_queue|tcp_queue_rcv|__udp_enqueue_schedule_skb|tcp_eat_recv_skb|\
             skb_attempt_defer_free|__kfree_skb|consume_skb|skb_consume_udp|\
             __consume_stateless_skb|__tcp_transmit_skb|__ip_queue_xmit|ip_output|\
             ip_finish_output2|ip6_output|ip6_finish_output2|__dev_queue_xmit|\
             sch_direct_xmit|dev_hard_start_xmit|napi_gro_receive|netif_receive_skb|\
             __netif_receive_skb|netif_rx|napi_consume_skb|kfree_skb_reason|\
             sk_skb_reason_drop)$"
        );
        let f = FilterFuncs::for_probes(&[Probe::UdpSocketRead, Probe::UdpSocketRead]);
        // The whole UDP path up to the read, once, then the drop points.
        assert_eq!(
            f.names(),
            [
                "ip_rcv_core",
                "ip_local_deliver",
                "ip6_rcv_core",
                "ip6_input",
                "udp_rcv",
                "udp_unicast_rcv_skb",
                "udp_queue_rcv_one_skb",
                "udpv6_rcv",
                "__udp_enqueue_schedule_skb",
                "skb_consume_udp",
                "__consume_stateless_skb",
                "consume_skb",
                "kfree_skb_reason",
                "sk_skb_reason_drop"
            ]
        );
        let kept = f.retain(|n| n.starts_with("udp")).unwrap();
        assert_eq!(kept.names().len(), 4);
        assert!(f.retain(|_| false).is_none());
    }

    #[test]
    fn netns_forms() {
        assert_eq!(NetnsFilter::inode(4026531840).arg(), "inode:4026531840");
        assert_eq!(NetnsFilter::of_pid(42).arg(), "/proc/42/ns/net");
        assert!(NetnsFilter::path("/run/netns/blue").is_ok());
        for bad in ["run/netns/x", "/proc/../etc/passwd", ""] {
            assert!(NetnsFilter::path(bad).is_err(), "{bad:?} accepted");
        }
        let n: NetnsFilter = serde_json::from_str(r#""inode:4026532000""#).unwrap();
        assert_eq!(n, NetnsFilter::inode(4026532000));
        assert_eq!(serde_json::to_string(&n).unwrap(), r#""inode:4026532000""#);
        let n: NetnsFilter = "/run/netns/blue".parse().unwrap();
        assert_eq!(n.arg(), "/run/netns/blue");
        for bad in [
            "inode:",
            "inode:-1",
            "inode:4294967296",
            "blue",
            "--filter-func=x",
        ] {
            assert!(bad.parse::<NetnsFilter>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn limits_bounds_and_serde() {
        let s = Duration::from_secs;
        assert!(SessionLimits::new(s(0), s(5), 10).is_err());
        assert!(SessionLimits::new(s(601), s(5), 10).is_err());
        assert!(SessionLimits::new(s(30), s(61), 10).is_err());
        assert!(SessionLimits::new(s(30), s(5), 0).is_err());
        let l: SessionLimits =
            serde_json::from_str(r#"{"deadline":"10s","output_limit_lines":200}"#).unwrap();
        assert_eq!(l, SessionLimits::new(s(10), s(5), 200).unwrap());
        let e = serde_json::from_str::<SessionLimits>(r#"{"deadline":"0s"}"#).unwrap_err();
        assert!(e.to_string().contains("deadline 0s is out of range"), "{e}");
        assert!(serde_json::from_str::<SessionLimits>(r#"{"deadlne":"1s"}"#).is_err());
    }

    /// pwru's argv as it must be, spelled out here rather than built like
    /// [`SessionRequest::argv`], so the test pins it.
    fn pinned_argv(
        limit: &str,
        ready: &str,
        funcs: &str,
        netns: Option<&str>,
        filter: &str,
    ) -> Vec<OsString> {
        let mut a = vec![
            "--output-json",
            "--output-limit-lines",
            limit,
            "--ready-file",
            ready,
            "--filter-func",
            funcs,
        ];
        if let Some(ns) = netns {
            a.extend(["--filter-netns", ns]);
        }
        a.extend([
            "--timestamp",
            "current",
            "--output-meta",
            "--output-tuple",
            "--output-caller",
            "--filter-track-skb",
            filter,
        ]);
        a.into_iter().map(OsString::from).collect()
    }

    #[test]
    fn argv_exact() {
        let filter = PcapFilter::new(Protocol::Tcp, &[9000], &[ip("10.1.2.3")]).unwrap();
        let req = SessionRequest::new("web", filter)
            .with_netns(NetnsFilter::inode(4026532000))
            .with_filter_funcs(FilterFuncs::new(["tcp_v4_rcv", "tcp_queue_rcv"]).unwrap())
            .with_limits(
                SessionLimits::new(Duration::from_secs(30), Duration::from_secs(5), 200).unwrap(),
            );
        let argv = req.argv(Path::new("/run/tailtrap/pwru-1.ready"));
        let expected = pinned_argv(
            "200",
            "/run/tailtrap/pwru-1.ready",
            "^(tcp_v4_rcv|tcp_queue_rcv)$",
            Some("inode:4026532000"),
            "tcp and dst port 9000 and src host 10.1.2.3",
        );
        assert_eq!(argv, expected);
    }

    #[test]
    fn argv_without_netns_and_defaults() {
        let filter = PcapFilter::new(Protocol::Udp, &[9001], &[]).unwrap();
        let argv = SessionRequest::new("dns", filter).argv(Path::new("/r"));
        let expected = pinned_argv(
            "5000",
            "/r",
            &FilterFuncs::default().regex(),
            None,
            "udp and dst port 9001",
        );
        assert_eq!(argv, expected);
    }
}
