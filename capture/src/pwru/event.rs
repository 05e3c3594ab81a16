//! One line of pwru's `--output-json` output, kept raw and parsed.
//!
//! Format facts (pwru 1.0.12): one JSON object per event; zero-valued fields are omitted
//! (`cpu` on CPU 0, `netns`, `len`, ...); `skb` is a hex string; `process` is
//! `<last 16 chars of exe, "~"-prefixed when cut>:<pid>`; `iface` is `name:ifindex` or `"0"`;
//! drop events carry the reason in the function name: `kfree_skb_reason(SKB_DROP_REASON_…)`.
//! Unknown fields are ignored so newer pwru versions still parse; the raw line is kept anyway.

use std::net::IpAddr;
use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A stdout line of a session: the text as pwru printed it, and its parsed fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PwruLine {
    /// 0-based position in the session's output.
    pub seq: u64,
    /// When tailtrap read the line.
    #[serde(with = "humantime_serde")]
    pub received: SystemTime,
    /// The line without its newline, exactly as printed.
    pub raw: String,
    /// The parsed event, when the line parsed.
    pub event: Option<PwruEvent>,
    /// Why it did not parse, when it did not.
    pub error: Option<String>,
}

impl PwruLine {
    /// Parse `raw` (one line, newline stripped) into a line record.
    pub fn new(seq: u64, received: SystemTime, raw: String) -> Self {
        let (event, error) = match PwruEvent::parse(&raw) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e.to_string())),
        };
        PwruLine {
            seq,
            received,
            raw,
            event,
            error,
        }
    }
}

/// Why a line is not a pwru event.
#[derive(Debug, thiserror::Error)]
pub enum ParseLineError {
    /// Not JSON, or a field of the wrong type.
    #[error("not a pwru JSON event: {0}")]
    Json(#[from] serde_json::Error),
    /// A field with the right type but an unexpected form.
    #[error("bad {field} {value:?} in pwru event")]
    Field {
        /// The field name.
        field: &'static str,
        /// Its value.
        value: String,
    },
}

/// The fields of one pwru event tailtrap uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PwruEvent {
    /// `--timestamp current`: ns since boot (CLOCK_MONOTONIC), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// The kernel function the SKB passed (drop reason split off).
    pub func: String,
    /// For drop points, the `SKB_DROP_REASON_*` pwru printed after the function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_reason: Option<String>,
    /// The calling function (`--output-caller`), when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The SKB's kernel address: the key that follows one packet through the functions.
    #[serde(serialize_with = "ser_hex", deserialize_with = "de_hex")]
    pub skb: u64,
    /// CPU the event fired on.
    pub cpu: u32,
    /// The process current when the event fired (often unrelated in softirq context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessRef>,
    /// Network namespace inode (0 when pwru printed none).
    pub netns: u32,
    /// The SKB's device, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iface: Option<Iface>,
    /// `skb->len` (0 when pwru printed none).
    pub len: u32,
    /// `skb->mark` (0 when pwru printed none).
    #[serde(default)]
    pub mark: u32,
    /// The device's MTU (0 when pwru printed none).
    #[serde(default)]
    pub mtu: u32,
    /// `skb->protocol`, the EtherType in host order (0x0800 IPv4, 0x86dd IPv6).
    #[serde(default)]
    pub l3_proto: u16,
    /// The L4 tuple, when pwru printed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuple: Option<Tuple>,
}

/// A process as pwru names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRef {
    /// Executable name (its last 16 characters, `~`-prefixed when cut).
    pub name: String,
    /// Process id.
    pub pid: u32,
}

/// A network device as pwru names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    /// Device name (empty when pwru could not resolve it).
    pub name: String,
    /// Interface index.
    pub ifindex: u32,
}

/// L4 tuple of the SKB at the event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuple {
    /// Source address.
    pub saddr: IpAddr,
    /// Destination address.
    pub daddr: IpAddr,
    /// Source port.
    #[serde(default)]
    pub sport: u16,
    /// Destination port.
    #[serde(default)]
    pub dport: u16,
    /// IP protocol number (6 TCP, 17 UDP).
    #[serde(default)]
    pub proto: u8,
    /// TCP flags as pwru names them (`--output-tcp-flags`), when printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<String>,
}

/// The wire form, as pwru writes it.
#[derive(Deserialize)]
struct RawEvent {
    skb: String,
    #[serde(default)]
    cpu: u32,
    process: Option<String>,
    func: String,
    caller_func: Option<String>,
    time: Option<u64>,
    #[serde(default)]
    netns: u32,
    iface: Option<String>,
    #[serde(default)]
    len: u32,
    #[serde(default)]
    mark: u32,
    #[serde(default)]
    mtu: u32,
    #[serde(default)]
    proto: u16,
    tuple: Option<Tuple>,
}

impl PwruEvent {
    /// Parse one JSON line.
    pub fn parse(line: &str) -> Result<Self, ParseLineError> {
        let raw: RawEvent = serde_json::from_str(line)?;
        let skb = parse_hex(&raw.skb).ok_or_else(|| ParseLineError::Field {
            field: "skb",
            value: raw.skb.clone(),
        })?;
        let (func, drop_reason) =
            split_drop_reason(&raw.func).ok_or_else(|| ParseLineError::Field {
                field: "func",
                value: raw.func.clone(),
            })?;
        let process = match raw.process {
            None => None,
            Some(p) => Some(parse_process(&p).ok_or(ParseLineError::Field {
                field: "process",
                value: p,
            })?),
        };
        let iface = match raw.iface {
            None => None,
            Some(i) => parse_iface(&i).ok_or(ParseLineError::Field {
                field: "iface",
                value: i,
            })?,
        };
        Ok(PwruEvent {
            time_ns: raw.time,
            func,
            drop_reason,
            caller: raw.caller_func,
            skb,
            cpu: raw.cpu,
            process,
            netns: raw.netns,
            iface,
            len: raw.len,
            mark: raw.mark,
            mtu: raw.mtu,
            l3_proto: raw.proto,
            tuple: raw.tuple,
        })
    }
}

fn parse_hex(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x")?;
    u64::from_str_radix(digits, 16).ok()
}

fn ser_hex<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

fn de_hex<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    parse_hex(&s).ok_or_else(|| serde::de::Error::custom(format!("bad hex address {s:?}")))
}

/// `kfree_skb_reason(SKB_DROP_REASON_X)` -> (`kfree_skb_reason`, `SKB_DROP_REASON_X`).
fn split_drop_reason(func: &str) -> Option<(String, Option<String>)> {
    match func.split_once('(') {
        None if !func.is_empty() => Some((func.to_owned(), None)),
        None => None,
        Some((name, rest)) => {
            let reason = rest.strip_suffix(')')?;
            (!name.is_empty()).then(|| (name.to_owned(), Some(reason.to_owned())))
        }
    }
}

/// `~/python3.11:247` -> name `~/python3.11`, pid 247.
fn parse_process(s: &str) -> Option<ProcessRef> {
    let (name, pid) = s.rsplit_once(':')?;
    Some(ProcessRef {
        name: name.to_owned(),
        pid: pid.parse().ok()?,
    })
}

/// `lo:1` -> Some(lo, 1); `0` (no device) -> None.
fn parse_iface(s: &str) -> Option<Option<Iface>> {
    if s == "0" {
        return Some(None);
    }
    let (name, idx) = s.rsplit_once(':')?;
    Some(Some(Iface {
        name: name.to_owned(),
        ifindex: idx.parse().ok()?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meta_line() {
        let line = r#"{"skb":"0xffff888004b338e8","cpu":1,"process":"~/python3.11:467","func":"ip_local_deliver","caller_func":"__netif_receive_skb_one_core","time":65717813665,"netns":4026531840,"iface":"lo:1","proto":2048,"mtu":65536,"len":60,"cb":[0,0,0,0,0],"tuple":{"saddr":"127.0.0.1","daddr":"127.0.0.1","sport":56178,"dport":9000,"proto":6}}"#;
        let e = PwruEvent::parse(line).unwrap();
        assert_eq!(e.skb, 0xffff888004b338e8);
        assert_eq!(e.time_ns, Some(65717813665));
        assert_eq!(e.func, "ip_local_deliver");
        assert_eq!(e.caller.as_deref(), Some("__netif_receive_skb_one_core"));
        assert_eq!(e.cpu, 1);
        assert_eq!(
            e.process,
            Some(ProcessRef {
                name: "~/python3.11".into(),
                pid: 467
            })
        );
        assert_eq!(
            e.iface,
            Some(Iface {
                name: "lo".into(),
                ifindex: 1
            })
        );
        let t = e.tuple.as_ref().unwrap();
        assert_eq!((t.sport, t.dport, t.proto), (56178, 9000, 6));
        // The serialised form round-trips and shows the address in hex.
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""skb":"0xffff888004b338e8""#), "{json}");
        assert_eq!(serde_json::from_str::<PwruEvent>(&json).unwrap(), e);
    }

    #[test]
    fn parses_drop_and_omitted_fields() {
        let line = r#"{"skb":"0xffff888004b028e8","process":"~/python3.11:245","func":"sk_skb_reason_drop(SKB_DROP_REASON_QUEUE_PURGE)","iface":"0","proto":2048,"cb":[0,0,0,0,0]}"#;
        let e = PwruEvent::parse(line).unwrap();
        assert_eq!(e.func, "sk_skb_reason_drop");
        assert_eq!(
            e.drop_reason.as_deref(),
            Some("SKB_DROP_REASON_QUEUE_PURGE")
        );
        assert_eq!((e.cpu, e.netns, e.len), (0, 0, 0));
        assert_eq!(e.iface, None);
        assert_eq!(e.tuple, None);
        assert_eq!(e.time_ns, None);
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "",
            "not json",
            r#"{"func":"x"}"#,
            r#"{"skb":"ffff","func":"x"}"#,
            r#"{"skb":"0x1","func":""}"#,
            r#"{"skb":"0x1","func":"kfree_skb_reason(X"}"#,
            r#"{"skb":"0x1","func":"x","process":"nopid"}"#,
            r#"{"skb":"0x1","func":"x","iface":"eth0"}"#,
            r#"{"skb":"0x1","func":"x","tuple":{"saddr":"1.2.3","daddr":"1.2.3.4"}}"#,
        ] {
            assert!(PwruEvent::parse(bad).is_err(), "{bad:?} parsed");
        }
        let l = PwruLine::new(3, SystemTime::UNIX_EPOCH, "garbage".into());
        assert!(l.event.is_none());
        assert!(l
            .error
            .as_deref()
            .unwrap_or("")
            .starts_with("not a pwru JSON event"));
    }
}
