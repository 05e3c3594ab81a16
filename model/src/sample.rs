//! One slow SKB caught by in-kernel capture: the record the ring buffer delivers (after
//! decoding) and the unit storage keeps per incident.
//!
//! Plain data on purpose: the capture side fills it from the kernel record, storage encodes
//! it with postcard, the CLI prints it as JSON. Times are nanoseconds since the Unix epoch
//! (CLOCK_REALTIME), latencies are nanoseconds.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Probe;

/// One slow SKB.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// When the probe fired, ns since the Unix epoch.
    pub time_ns: u64,
    /// The incident this sample was captured for.
    pub incident: u64,
    /// Where on the receive path it was measured.
    pub probe: Probe,
    /// `now - skb->tstamp` at the probe, ns.
    pub latency_ns: u64,
    /// Address family, transport protocol and ports of the packet.
    pub flow: Flow,
    /// cgroup v2 id of the socket owner (0 when unknown, e.g. before socket lookup).
    pub cgroup_id: u64,
    /// Process in whose context the probe ran, when there is one (reads, not softirq).
    pub pid: Option<u32>,
    /// That process's command name (empty when there is no process context).
    pub comm: Comm,
    /// CPU the probe ran on.
    pub cpu: u32,
    /// Receiving interface index (0 when unknown).
    pub ifindex: u32,
    /// Network namespace inode number.
    pub netns_ino: u32,
    /// `skb->len`, bytes.
    pub skb_len: u32,
    /// The socket's receive queue at the probe, when a socket is known.
    pub socket_queue: Option<SocketQueue>,
    /// TCP sequence number of the segment (TCP only).
    pub tcp_seq: Option<u32>,
    /// Marks such as pre-trigger and head-of-line suspect.
    pub flags: SampleFlags,
    /// The skb's address, the key pwru prints (`None` where the probe has no skb). Hex
    /// in JSON: 64-bit integers lose digits in many JSON readers.
    #[serde(with = "skb_addr")]
    pub skb: Option<u64>,
    /// How the reading thread spent the packet's wait, from the scheduler's tracepoints:
    /// socket-read samples of armed capture only, on kernels with task storage (5.11+),
    /// and only once the thread was followed for the whole wait.
    pub reader_wait: Option<ReaderWait>,
    /// The RX queue of `ifindex` the packet came in on, as the receiving driver recorded it
    /// in the skb (`skb_record_rx_queue`); `None` where none was recorded (loopback, most
    /// virtual devices), where the probe has no skb, and in samples stored before it was
    /// recorded.
    pub rx_queue: Option<u16>,
}

/// Where the reading thread was between the packet's arrival and its read. What is
/// neither is time on a CPU (running elsewhere in the program, or reading).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderWait {
    /// Runnable but waiting for a CPU (run-queue delay), ns.
    pub runq_ns: u64,
    /// Off CPU: sleeping or blocked, ns.
    pub off_cpu_ns: u64,
    /// The task that held the reader's CPU just before the reader got it back after its
    /// last run-queue wait in the span (`None` when it never waited for a CPU).
    pub cpu_holder: Option<CpuHolder>,
}

impl ReaderWait {
    /// The rest of `latency_ns`: on a CPU.
    pub fn on_cpu_ns(&self, latency_ns: u64) -> u64 {
        latency_ns.saturating_sub(self.runq_ns.saturating_add(self.off_cpu_ns))
    }
}

/// A task on a CPU: the thread group's id and the thread's command name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuHolder {
    /// Thread group id (0: the CPU's idle task).
    pub pid: u32,
    /// The thread's command name.
    pub comm: Comm,
}

/// `Option<u64>` as `"0x…"` in human-readable formats (JSON), as itself in binary ones
/// (postcard, the stored form).
mod skb_addr {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(a) if s.is_human_readable() => s.serialize_some(&format!("{a:#x}")),
            Some(a) => s.serialize_some(a),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        if !d.is_human_readable() {
            return Option::<u64>::deserialize(d);
        }
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => {
                let hex = text.strip_prefix("0x").unwrap_or(&text);
                u64::from_str_radix(hex, 16)
                    .map(Some)
                    .map_err(|e| D::Error::custom(format!("skb address {text:?}: {e}")))
            }
        }
    }
}

/// Transport protocol of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// IPPROTO_TCP.
    Tcp,
    /// IPPROTO_UDP.
    Udp,
    /// Any other IP protocol number (seen at ip-start only).
    Other(u8),
}

impl Transport {
    /// From an IP protocol number.
    pub const fn from_ip_proto(proto: u8) -> Transport {
        match proto {
            6 => Transport::Tcp,
            17 => Transport::Udp,
            p => Transport::Other(p),
        }
    }

    /// The IP protocol number.
    pub const fn ip_proto(self) -> u8 {
        match self {
            Transport::Tcp => 6,
            Transport::Udp => 17,
            Transport::Other(p) => p,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp => f.write_str("tcp"),
            Transport::Udp => f.write_str("udp"),
            Transport::Other(p) => write!(f, "ip-proto-{p}"),
        }
    }
}

/// A packet's 5-tuple as received: `src` is the remote peer, `dst` the local socket.
/// The address family is that of the addresses (both are the same family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Flow {
    /// Transport protocol.
    pub transport: Transport,
    /// Source address (the sender).
    pub src: IpAddr,
    /// Source port (0 when the protocol has none).
    pub sport: u16,
    /// Destination address (this host).
    pub dst: IpAddr,
    /// Destination port (0 when the protocol has none).
    pub dport: u16,
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Bracket IPv6 so the port separator stays unambiguous.
        fn ep(f: &mut fmt::Formatter<'_>, a: &IpAddr, p: u16) -> fmt::Result {
            match a {
                IpAddr::V4(a) => write!(f, "{a}:{p}"),
                IpAddr::V6(a) => write!(f, "[{a}]:{p}"),
            }
        }
        write!(f, "{} ", self.transport)?;
        ep(f, &self.src, self.sport)?;
        f.write_str(" -> ")?;
        ep(f, &self.dst, self.dport)
    }
}

/// Depth of a socket's receive queue when the probe fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketQueue {
    /// Bytes waiting to be read (TCP: `rcv_nxt - copied_seq`; UDP: queued datagram bytes).
    pub bytes: u32,
    /// SKBs on `sk_receive_queue`.
    pub skbs: u32,
    /// `sk_rmem_alloc`: receive memory charged to the socket, bytes.
    pub rmem_alloc: u32,
    /// `sk_rcvbuf`: the socket's receive buffer limit, bytes.
    pub rcvbuf: u32,
}

/// Longest command name the kernel keeps (`TASK_COMM_LEN` minus the NUL).
pub const COMM_MAX: usize = 15;

/// A process command name as the kernel reports it (`task->comm`): at most [`COMM_MAX`]
/// bytes of text, held inline. Inline because a sample is made for every captured SKB (up to
/// the rate limit, 2 000 a second) on the ring-buffer thread and freed on another: a heap
/// string per sample left the allocator's per-thread caches holding memory across threads.
#[derive(Clone, Copy, Default)]
pub struct Comm {
    len: u8,
    /// Valid UTF-8 in `..len`, zeros after it.
    bytes: [u8; COMM_MAX],
}

/// A command name longer than [`COMM_MAX`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("command name {0:?} is longer than {COMM_MAX} bytes")]
pub struct CommTooLong(pub String);

impl Comm {
    /// From the kernel's fixed buffer: up to the first NUL; invalid UTF-8 is replaced, so
    /// whatever the kernel hands over can be shown.
    pub fn from_kernel(raw: &[u8]) -> Comm {
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        // Borrowed (no allocation) when the bytes are valid UTF-8, as they nearly always are.
        let text = String::from_utf8_lossy(&raw[..end.min(COMM_MAX)]);
        // A replacement character can make the text longer than the bytes it replaced.
        let mut cut = text.len().min(COMM_MAX);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        Comm::from_short(&text[..cut])
    }

    /// `text`, known to be at most [`COMM_MAX`] bytes.
    fn from_short(text: &str) -> Comm {
        let mut comm = Comm::default();
        comm.bytes[..text.len()].copy_from_slice(text.as_bytes());
        comm.len = text.len() as u8;
        comm
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        // Only ever filled from a `&str` cut at a character boundary.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// True when there was no process context.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl TryFrom<String> for Comm {
    type Error = CommTooLong;
    fn try_from(s: String) -> Result<Comm, CommTooLong> {
        Comm::try_from(s.as_str()).map_err(|_| CommTooLong(s))
    }
}

impl TryFrom<&str> for Comm {
    type Error = CommTooLong;
    fn try_from(s: &str) -> Result<Comm, CommTooLong> {
        if s.len() > COMM_MAX {
            return Err(CommTooLong(s.to_owned()));
        }
        Ok(Comm::from_short(s))
    }
}

impl PartialEq for Comm {
    fn eq(&self, other: &Comm) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Comm {}

impl std::hash::Hash for Comm {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialOrd for Comm {
    fn partial_cmp(&self, other: &Comm) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Comm {
    fn cmp(&self, other: &Comm) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Comm {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Comm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Comm, D::Error> {
        // A visitor sees the text in the reader's buffer, so reading a stored sample
        // allocates nothing for its name either.
        struct CommText;
        impl serde::de::Visitor<'_> for CommText {
            type Value = Comm;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a command name of at most {COMM_MAX} bytes")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Comm, E> {
                Comm::try_from(v).map_err(E::custom)
            }
        }
        d.deserialize_str(CommText)
    }
}

/// Marks on a sample, as a bitset. Humans and JSON see the names (`["pre-trigger"]`);
/// compact binary encodings see the bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SampleFlags(u32);

impl SampleFlags {
    /// Kept by the flight recorder before the incident opened.
    pub const PRE_TRIGGER: SampleFlags = SampleFlags(1 << 0);
    /// The SKB waited behind an earlier one on the same socket (head-of-line blocking suspect).
    pub const HOL_SUSPECT: SampleFlags = SampleFlags(1 << 1);
    /// The kernel sampled this record 1-in-N: it stands for N slow SKBs.
    pub const SUBSAMPLED: SampleFlags = SampleFlags(1 << 2);
    /// Processed by the CPU's ksoftirqd thread (receive softirq deferred), not at interrupt
    /// exit (samples of the probes that run outside a process's context).
    pub const KSOFTIRQD: SampleFlags = SampleFlags(1 << 3);

    /// Every named flag with its name.
    const NAMED: [(SampleFlags, &'static str); 4] = [
        (SampleFlags::PRE_TRIGGER, "pre-trigger"),
        (SampleFlags::HOL_SUSPECT, "hol-suspect"),
        (SampleFlags::SUBSAMPLED, "subsampled"),
        (SampleFlags::KSOFTIRQD, "ksoftirqd"),
    ];

    /// No flag set.
    pub const fn empty() -> SampleFlags {
        SampleFlags(0)
    }

    /// From raw bits (the kernel record's flag word); unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> SampleFlags {
        SampleFlags(bits & Self::all_bits())
    }

    const fn all_bits() -> u32 {
        let mut bits = 0;
        let mut i = 0;
        while i < Self::NAMED.len() {
            bits |= Self::NAMED[i].0 .0;
            i += 1;
        }
        bits
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True when every flag in `other` is set.
    pub const fn contains(self, other: SampleFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Set the flags in `other`.
    pub fn insert(&mut self, other: SampleFlags) {
        self.0 |= other.0;
    }

    /// Names of the flags set, in bit order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED
            .into_iter()
            .filter(move |(f, _)| self.contains(*f))
            .map(|(_, n)| n)
    }

    /// The flag with this name.
    pub fn from_name(name: &str) -> Option<SampleFlags> {
        Self::NAMED
            .into_iter()
            .find(|(_, n)| *n == name)
            .map(|(f, _)| f)
    }
}

impl std::ops::BitOr for SampleFlags {
    type Output = SampleFlags;
    fn bitor(self, rhs: SampleFlags) -> SampleFlags {
        SampleFlags(self.0 | rhs.0)
    }
}

impl Serialize for SampleFlags {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.collect_seq(self.names())
        } else {
            s.serialize_u32(self.0)
        }
    }
}

impl<'de> Deserialize<'de> for SampleFlags {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SampleFlags, D::Error> {
        if d.is_human_readable() {
            let names = Vec::<String>::deserialize(d)?;
            let mut flags = SampleFlags::empty();
            for n in &names {
                let f = SampleFlags::from_name(n).ok_or_else(|| {
                    serde::de::Error::custom(format!("unknown sample flag {n:?}"))
                })?;
                flags.insert(f);
            }
            Ok(flags)
        } else {
            // Bits written by a newer version are dropped rather than rejected: the rest of
            // the sample is still good evidence.
            Ok(SampleFlags::from_bits_truncate(u32::deserialize(d)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn sample() -> Sample {
        let mut s = crate::fixtures::sample(7, 1, 1_700_000_000_123_456_789);
        s.comm = Comm::from_kernel(b"nginx\0\0\0\0\0\0\0\0\0\0\0");
        s.flags = SampleFlags::PRE_TRIGGER | SampleFlags::HOL_SUSPECT;
        s
    }

    #[test]
    fn json_shows_flag_names_and_round_trips() {
        let s = sample();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["flags"],
            serde_json::json!(["pre-trigger", "hol-suspect"])
        );
        assert_eq!(json["comm"], "nginx");
        assert_eq!(json["probe"], "tcp-socket-read");
        let back: Sample = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn unknown_flag_name_is_rejected() {
        let r: Result<SampleFlags, _> = serde_json::from_str(r#"["pre-trigger","bogus"]"#);
        assert!(r.unwrap_err().to_string().contains("bogus"));
    }

    #[test]
    fn comm_from_kernel_stops_at_nul_and_caps_length() {
        assert_eq!(Comm::from_kernel(b"sshd\0garbage").as_str(), "sshd");
        assert_eq!(Comm::from_kernel(&[b'x'; 16]).as_str().len(), COMM_MAX);
        let bad = Comm::from_kernel(&[0xff; 16]);
        assert!(bad.as_str().len() <= COMM_MAX && !bad.is_empty());
        assert!(Comm::try_from("a".repeat(16)).is_err());
        let r: Result<Comm, _> = serde_json::from_str(&format!("\"{}\"", "b".repeat(16)));
        assert!(r.is_err());
    }

    #[test]
    fn comm_is_stored_as_the_string_it_used_to_be() {
        // Stored samples were written when the name was a `String`; the bytes must not move.
        for name in ["", "nginx", "123456789012345", "résumé"] {
            let comm = Comm::try_from(name).unwrap();
            let stored = postcard::to_allocvec(&name.to_owned()).unwrap();
            assert_eq!(postcard::to_allocvec(&comm).unwrap(), stored, "{name}");
            let back: Comm = postcard::from_bytes(&stored).unwrap();
            assert_eq!(back.as_str(), name);
        }
        let too_long = postcard::to_allocvec(&"x".repeat(16)).unwrap();
        assert!(postcard::from_bytes::<Comm>(&too_long).is_err());
        // Equal names are equal whatever was built how; order is the text's.
        assert_eq!(
            Comm::from_kernel(b"web\0\0zzz"),
            Comm::try_from("web").unwrap()
        );
        assert!(Comm::try_from("b").unwrap() > Comm::try_from("ab").unwrap());
    }

    #[test]
    fn flags_bits_and_names() {
        let f = SampleFlags::from_bits_truncate(0xffff_ffff);
        assert!(f.contains(SampleFlags::PRE_TRIGGER | SampleFlags::SUBSAMPLED));
        assert_eq!(f.bits(), 0b1111);
        assert_eq!(f.names().count(), 4);
        assert!(!SampleFlags::empty().contains(SampleFlags::HOL_SUSPECT));
    }

    #[test]
    fn flow_display() {
        let f = Flow {
            transport: Transport::from_ip_proto(17),
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
            sport: 5353,
            dst: IpAddr::V6(Ipv6Addr::LOCALHOST),
            dport: 53,
        };
        assert_eq!(f.to_string(), "udp 10.0.0.5:5353 -> [::1]:53");
        assert_eq!(Transport::from_ip_proto(1).to_string(), "ip-proto-1");
        assert_eq!(Transport::Other(1).ip_proto(), 1);
    }
}
