//! Hardware RX stamps per interface (docs/probes.md, "NIC hardware stamps"): whether the
//! device can stamp received packets, whether it does now (its `rx_filter`), and its PTP
//! hardware clock's offset to the system clock, read again every interval.
//!
//! A NIC stamps with its own clock (PHC), not the system's: a stamp is only comparable with
//! the kernel's software stamp (CLOCK_REALTIME) through an offset read from that clock.
//! The offset is read with the most precise method the driver has (a cross-timestamp,
//! `PTP_SYS_OFFSET_PRECISE`; else `PTP_SYS_OFFSET_EXTENDED`'s bracketing system reads;
//! else plain `PTP_SYS_OFFSET`), and a device without a PHC, or whose read failed, has no
//! offset: its stamps are never turned into latencies.
//!
//! RX stamping is a device-wide setting that PTP daemons own: it is changed only with
//! `[probes] hw_rx_timestamps = "enable"`, and put back as it was when the daemon stops.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, SystemTime};

use bpf::HwRxStamps;

use crate::api::NicStampRow;

/// How often the interface list is read again (interfaces come and go: veths of pods).
const RESCAN_EVERY: Duration = Duration::from_secs(30);
/// Samples per `PTP_SYS_OFFSET_EXTENDED` / `PTP_SYS_OFFSET` read: the narrowest bracket wins.
const OFFSET_SAMPLES: u32 = 5;
/// A PHC's offset to the system clock at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PhcOffset {
    /// CLOCK_REALTIME − PHC, ns.
    pub(crate) offset_ns: i64,
    /// Half the bracket of system reads around the PHC read, ns.
    pub(crate) uncertainty_ns: u64,
    pub(crate) method: OffsetMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OffsetMethod {
    Precise,
    Extended,
    Plain,
}

impl OffsetMethod {
    fn name(self) -> &'static str {
        match self {
            OffsetMethod::Precise => "precise",
            OffsetMethod::Extended => "extended",
            OffsetMethod::Plain => "plain",
        }
    }
}

/// The offset from bracketing reads `(system before, phc, system after)`, ns: the sample
/// with the narrowest bracket, its midpoint against the PHC.
pub(crate) fn offset_from_brackets(
    samples: &[(i128, i128, i128)],
    method: OffsetMethod,
) -> Option<PhcOffset> {
    let &(before, phc, after) = samples
        .iter()
        .filter(|(b, _, a)| a >= b)
        .min_by_key(|(b, _, a)| a - b)?;
    let mid = before + (after - before) / 2;
    Some(PhcOffset {
        offset_ns: i64::try_from(mid - phc).ok()?,
        uncertainty_ns: u64::try_from((after - before) / 2).ok()?,
        method,
    })
}

fn clock_time_ns(t: &libc::ptp_clock_time) -> i128 {
    i128::from(t.sec) * 1_000_000_000 + i128::from(t.nsec)
}

/// Read the offset of the PHC open at `fd`: a cross-timestamp where the driver has one,
/// else bracketing reads.
fn read_offset(fd: &OwnedFd) -> Result<PhcOffset, String> {
    // SAFETY: zeroed plain-data structs handed to the PTP ioctls, which fill them.
    let mut precise: libc::ptp_sys_offset_precise = unsafe { std::mem::zeroed() };
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::PTP_SYS_OFFSET_PRECISE, &mut precise) } == 0 {
        let offset = clock_time_ns(&precise.sys_realtime) - clock_time_ns(&precise.device);
        return Ok(PhcOffset {
            offset_ns: i64::try_from(offset).map_err(|_| "offset out of range".to_owned())?,
            uncertainty_ns: 0,
            method: OffsetMethod::Precise,
        });
    }
    let mut extended: libc::ptp_sys_offset_extended = unsafe { std::mem::zeroed() };
    extended.n_samples = OFFSET_SAMPLES;
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::PTP_SYS_OFFSET_EXTENDED, &mut extended) } == 0 {
        let n = (extended.n_samples as usize).min(extended.ts.len());
        let samples: Vec<(i128, i128, i128)> = extended.ts[..n]
            .iter()
            .map(|[b, p, a]| (clock_time_ns(b), clock_time_ns(p), clock_time_ns(a)))
            .collect();
        return offset_from_brackets(&samples, OffsetMethod::Extended)
            .ok_or_else(|| "PTP_SYS_OFFSET_EXTENDED gave no usable sample".to_owned());
    }
    let mut plain: libc::ptp_sys_offset = unsafe { std::mem::zeroed() };
    plain.n_samples = OFFSET_SAMPLES;
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::PTP_SYS_OFFSET, &mut plain) } == 0 {
        // System, PHC, system, PHC, ..., system.
        let n = (plain.n_samples as usize).min((plain.ts.len() - 1) / 2);
        let samples: Vec<(i128, i128, i128)> = (0..n)
            .map(|i| {
                (
                    clock_time_ns(&plain.ts[2 * i]),
                    clock_time_ns(&plain.ts[2 * i + 1]),
                    clock_time_ns(&plain.ts[2 * i + 2]),
                )
            })
            .collect();
        return offset_from_brackets(&samples, OffsetMethod::Plain)
            .ok_or_else(|| "PTP_SYS_OFFSET gave no usable sample".to_owned());
    }
    Err(format!(
        "no offset read works: {}",
        std::io::Error::last_os_error()
    ))
}

// linux/ethtool.h and linux/net_tstamp.h, which libc does not carry.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GET_TS_INFO: u32 = 0x41;
const SOF_TIMESTAMPING_RX_HARDWARE: u32 = 1 << 2;
const SOF_TIMESTAMPING_RAW_HARDWARE: u32 = 1 << 6;

#[repr(C)]
#[derive(Default)]
struct EthtoolTsInfo {
    cmd: u32,
    so_timestamping: u32,
    phc_index: i32,
    tx_types: u32,
    tx_reserved: [u32; 3],
    rx_filters: u32,
    rx_reserved: [u32; 3],
}

/// What the driver says it can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TsInfo {
    rx_hardware: bool,
    phc_index: Option<u32>,
    rx_filters: u32,
}

fn ifreq(name: &str, data: *mut libc::c_char) -> Option<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain data; zero is a valid value of every field.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, &b) in req.ifr_name.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    req.ifr_ifru.ifru_data = data;
    Some(req)
}

fn ts_info(sock: &OwnedFd, name: &str) -> Result<TsInfo, std::io::Error> {
    let mut info = EthtoolTsInfo {
        cmd: ETHTOOL_GET_TS_INFO,
        ..Default::default()
    };
    let mut req = ifreq(name, (&mut info as *mut EthtoolTsInfo).cast())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `req` points at `info`, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let hw = SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE;
    Ok(TsInfo {
        rx_hardware: info.so_timestamping & hw == hw,
        phc_index: u32::try_from(info.phc_index).ok(),
        rx_filters: info.rx_filters,
    })
}

/// The device's hardware stamping configuration now (`SIOCGHWTSTAMP`).
fn hwtstamp_config(sock: &OwnedFd, name: &str) -> Result<libc::hwtstamp_config, std::io::Error> {
    // SAFETY: plain data, filled by the ioctl.
    let mut cfg: libc::hwtstamp_config = unsafe { std::mem::zeroed() };
    let mut req = ifreq(name, (&mut cfg as *mut libc::hwtstamp_config).cast())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `req` points at `cfg`, which outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGHWTSTAMP, &mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cfg)
}

fn set_hwtstamp_config(
    sock: &OwnedFd,
    name: &str,
    mut cfg: libc::hwtstamp_config,
) -> Result<libc::hwtstamp_config, std::io::Error> {
    let mut req = ifreq(name, (&mut cfg as *mut libc::hwtstamp_config).cast())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `req` points at `cfg`, which outlives the call; the driver writes back what
    // it set.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSHWTSTAMP, &mut req) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cfg)
}

/// `rx_filter` as `ethtool -T` names it.
pub(crate) fn rx_filter_name(filter: libc::c_int) -> String {
    let name = match u32::try_from(filter).unwrap_or(u32::MAX) {
        libc::HWTSTAMP_FILTER_NONE => "none",
        libc::HWTSTAMP_FILTER_ALL => "all",
        libc::HWTSTAMP_FILTER_SOME => "some",
        libc::HWTSTAMP_FILTER_PTP_V1_L4_EVENT => "ptpv1-l4-event",
        libc::HWTSTAMP_FILTER_PTP_V1_L4_SYNC => "ptpv1-l4-sync",
        libc::HWTSTAMP_FILTER_PTP_V1_L4_DELAY_REQ => "ptpv1-l4-delay-req",
        libc::HWTSTAMP_FILTER_PTP_V2_L4_EVENT => "ptpv2-l4-event",
        libc::HWTSTAMP_FILTER_PTP_V2_L4_SYNC => "ptpv2-l4-sync",
        libc::HWTSTAMP_FILTER_PTP_V2_L4_DELAY_REQ => "ptpv2-l4-delay-req",
        libc::HWTSTAMP_FILTER_PTP_V2_L2_EVENT => "ptpv2-l2-event",
        libc::HWTSTAMP_FILTER_PTP_V2_L2_SYNC => "ptpv2-l2-sync",
        libc::HWTSTAMP_FILTER_PTP_V2_L2_DELAY_REQ => "ptpv2-l2-delay-req",
        libc::HWTSTAMP_FILTER_PTP_V2_EVENT => "ptpv2-event",
        libc::HWTSTAMP_FILTER_PTP_V2_SYNC => "ptpv2-sync",
        libc::HWTSTAMP_FILTER_PTP_V2_DELAY_REQ => "ptpv2-delay-req",
        libc::HWTSTAMP_FILTER_NTP_ALL => "ntp-all",
        _ => return format!("filter {filter}"),
    };
    name.to_owned()
}

/// One interface followed.
struct Nic {
    row: NicStampRow,
    /// Its index, the key under which the probes find its clock (`None`: unreadable).
    ifindex: Option<u32>,
    /// The PHC, open while stamping is on.
    phc: Option<OwnedFd>,
    /// The configuration found, when tailtrap changed it (put back at stop).
    restore: Option<libc::hwtstamp_config>,
}

/// Every interface's hardware RX stamping, followed by the interval loop.
pub(crate) struct NicStamps {
    mode: HwRxStamps,
    sock: Option<OwnedFd>,
    nics: BTreeMap<String, Nic>,
    scanned: Option<SystemTime>,
}

impl NicStamps {
    pub(crate) fn new(mode: HwRxStamps) -> NicStamps {
        // SAFETY: a plain socket for the interface ioctls; checked below.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        let sock = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        NicStamps {
            mode,
            sock,
            nics: BTreeMap::new(),
            scanned: None,
        }
    }

    /// Read the interfaces again when due, and every PHC offset in use; the rows after,
    /// when any of them may have changed (`None`: the last rows stand). The interval loop
    /// copies them into status: on a host with hundreds of veths and no stamping device,
    /// that happens once per rescan, not every interval.
    pub(crate) fn refresh(&mut self, now: SystemTime) -> Option<Vec<NicStampRow>> {
        if self.mode == HwRxStamps::Off {
            return None;
        }
        let due = self
            .scanned
            .is_none_or(|at| now.duration_since(at).unwrap_or_default() >= RESCAN_EVERY);
        let mut changed = due;
        if due {
            self.scan();
            self.scanned = Some(now);
        } else {
            changed |= self.recheck();
        }
        for nic in self.nics.values_mut() {
            if let Some(fd) = &nic.phc {
                changed = true;
                let row = &mut nic.row;
                match read_offset(fd) {
                    Ok(o) => {
                        row.offset_ns = Some(o.offset_ns);
                        row.offset_uncertainty_ns = Some(o.uncertainty_ns);
                        row.offset_method = Some(o.method.name().to_owned());
                        row.offset_read_ns = Some(model::unix_ns(now));
                        row.offset_error = None;
                    }
                    Err(e) => {
                        // A stale offset would turn stamps into nonsense: dropped.
                        row.offset_ns = None;
                        row.offset_uncertainty_ns = None;
                        row.offset_method = None;
                        row.offset_error = Some(e);
                    }
                }
            }
        }
        changed.then(|| self.nics.values().map(|n| n.row.clone()).collect())
    }

    /// Devices with a clock whose RX filter changed since they were read (a PTP daemon
    /// started, or stopped, after tailtrap) are read again: one ioctl per such device per
    /// interval, the only devices that can stamp. Those tailtrap turned on are its own.
    /// Whether any was read again.
    fn recheck(&mut self) -> bool {
        let Some(sock) = &self.sock else {
            return false;
        };
        let changed: Vec<String> = self
            .nics
            .iter()
            .filter(|(_, n)| n.row.phc.is_some() && n.restore.is_none())
            .filter(|(name, n)| {
                let now = hwtstamp_config(sock, name)
                    .ok()
                    .map(|c| rx_filter_name(c.rx_filter));
                now != n.row.rx_filter
            })
            .map(|(name, _)| name.clone())
            .collect();
        let any = !changed.is_empty();
        for name in changed {
            let nic = self.follow(&name);
            tracing::info!(interface = %name, state = %nic.row.state, rx_filter = nic.row.rx_filter.as_deref().unwrap_or("-"), "hardware RX stamping changed on the device");
            self.nics.insert(name, nic);
        }
        any
    }

    fn scan(&mut self) {
        let names = interface_names();
        // `names` is sorted.
        self.nics
            .retain(|name, _| names.binary_search(name).is_ok());
        self.recheck();
        for name in names {
            if self.nics.contains_key(&name) {
                continue;
            }
            let nic = self.follow(&name);
            self.nics.insert(name, nic);
        }
    }

    fn follow(&self, name: &str) -> Nic {
        let mut row = NicStampRow {
            interface: name.to_owned(),
            state: "error".into(),
            summary: String::new(),
            phc: None,
            rx_filter: None,
            enabled_by_tailtrap: false,
            offset_ns: None,
            offset_uncertainty_ns: None,
            offset_method: None,
            offset_read_ns: None,
            offset_error: None,
            timed_by_nic_to_stack: false,
        };
        let none = |row: &mut NicStampRow, state: &str, why: String| {
            row.state = state.to_owned();
            row.summary = format!("no hardware RX stamps on {name}: {why}");
        };
        let Some(sock) = &self.sock else {
            none(
                &mut row,
                "error",
                "no socket for the interface ioctls".into(),
            );
            return Nic {
                row,
                ifindex: None,
                phc: None,
                restore: None,
            };
        };
        let info = match ts_info(sock, name) {
            Ok(i) => i,
            Err(e) => {
                none(
                    &mut row,
                    "unsupported",
                    format!("its driver reports no timestamping ({e})"),
                );
                return Nic {
                    row,
                    ifindex: None,
                    phc: None,
                    restore: None,
                };
            }
        };
        if !info.rx_hardware {
            none(
                &mut row,
                "unsupported",
                "the device does not stamp received packets".into(),
            );
            return Nic {
                row,
                ifindex: None,
                phc: None,
                restore: None,
            };
        }
        let Some(index) = info.phc_index else {
            none(
                &mut row,
                "no-phc",
                "the device has no PTP hardware clock to convert its stamps".into(),
            );
            return Nic {
                row,
                ifindex: None,
                phc: None,
                restore: None,
            };
        };
        let phc_path = format!("/dev/ptp{index}");
        row.phc = Some(phc_path.clone());
        let mut restore = None;
        let mut cfg = match hwtstamp_config(sock, name) {
            Ok(c) => c,
            Err(e) => {
                none(
                    &mut row,
                    "error",
                    format!("its stamping configuration cannot be read ({e})"),
                );
                return Nic {
                    row,
                    ifindex: None,
                    phc: None,
                    restore: None,
                };
            }
        };
        let all = 1u32 << libc::HWTSTAMP_FILTER_ALL;
        if cfg.rx_filter == libc::HWTSTAMP_FILTER_NONE as libc::c_int
            && self.mode == HwRxStamps::Enable
            && info.rx_filters & all != 0
        {
            let wanted = libc::hwtstamp_config {
                rx_filter: libc::HWTSTAMP_FILTER_ALL as libc::c_int,
                ..cfg
            };
            match set_hwtstamp_config(sock, name, wanted) {
                Ok(set) => {
                    restore = Some(cfg);
                    row.enabled_by_tailtrap = true;
                    tracing::info!(interface = name, rx_filter = %rx_filter_name(set.rx_filter), "hardware RX stamping turned on (hw_rx_timestamps = \"enable\")");
                    cfg = set;
                }
                Err(e) => {
                    tracing::warn!(interface = name, error = %e, "hardware RX stamping could not be turned on");
                }
            }
        }
        row.rx_filter = Some(rx_filter_name(cfg.rx_filter));
        if cfg.rx_filter == libc::HWTSTAMP_FILTER_NONE as libc::c_int {
            let hint = if self.mode == HwRxStamps::Enable {
                "the device cannot stamp every packet (no rx_filter all)"
            } else {
                "RX stamping is off (rx_filter none); hw_rx_timestamps = \"enable\" turns it on"
            };
            none(&mut row, "off", hint.into());
            return Nic {
                row,
                ifindex: ifindex_of(name),
                phc: None,
                restore,
            };
        }
        let phc = File::open(&phc_path).map(OwnedFd::from);
        let ifindex = ifindex_of(name);
        match phc {
            Ok(fd) => {
                row.state = "on".into();
                row.summary = format!(
                    "hardware RX stamps on {name} (rx_filter {}, clock {phc_path})",
                    row.rx_filter.as_deref().unwrap_or("?")
                );
                Nic {
                    row,
                    ifindex,
                    phc: Some(fd),
                    restore,
                }
            }
            Err(e) => {
                none(
                    &mut row,
                    "error",
                    format!("its clock {phc_path} cannot be opened ({e})"),
                );
                Nic {
                    row,
                    ifindex,
                    phc: None,
                    restore,
                }
            }
        }
    }

    /// Every device with a PTP clock, whether it stamps, and its offset as read this
    /// interval: what nic-to-stack converts stamps with. The stamps of a device that
    /// stopped stamping, or whose offset read failed, are counted and skipped.
    pub(crate) fn clocks(&self) -> Vec<bpf::NicClock> {
        self.clocks_by_name().into_iter().map(|(_, c)| c).collect()
    }

    /// [`NicStamps::clocks`] with each device's name.
    fn clocks_by_name(&self) -> Vec<(&str, bpf::NicClock)> {
        self.nics
            .values()
            .filter(|n| n.row.phc.is_some())
            .filter_map(|n| {
                let clock = bpf::NicClock {
                    ifindex: n.ifindex?,
                    // The clock is held open exactly while the device stamps.
                    stamping: n.phc.is_some(),
                    offset: n.row.offset_ns.zip(n.row.offset_uncertainty_ns),
                };
                Some((n.row.interface.as_str(), clock))
            })
            .collect()
    }

    /// Mark in `rows` the devices whose clocks the probes took (`timed`: the stage runs and
    /// the kernel accepted them).
    pub(crate) fn mark_timed(&self, rows: &mut [NicStampRow], timed: bool) {
        let names: Vec<&str> = self
            .clocks_by_name()
            .into_iter()
            .filter(|(_, c)| c.stamping && c.offset.is_some())
            .map(|(n, _)| n)
            .collect();
        for row in rows {
            row.timed_by_nic_to_stack = timed && names.contains(&row.interface.as_str());
        }
    }

    /// Put back every stamping configuration tailtrap changed.
    pub(crate) fn restore(&mut self) {
        let Some(sock) = &self.sock else { return };
        for (name, nic) in &mut self.nics {
            if let Some(cfg) = nic.restore.take() {
                match set_hwtstamp_config(sock, name, cfg) {
                    Ok(_) => {
                        tracing::info!(interface = %name, "hardware RX stamping put back as it was")
                    }
                    Err(e) => {
                        tracing::warn!(interface = %name, error = %e, "hardware RX stamping could not be put back")
                    }
                }
            }
        }
    }
}

impl Drop for NicStamps {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Why nic-to-stack cannot measure on this host, or `None` when some device can stamp
/// received packets with a PTP hardware clock to convert them (whether it stamps now or
/// not: that is followed every interval). Asked before the probes load, so that a host
/// without such a device gives the stage no histogram memory.
pub(crate) fn nic_to_stack_unavailable(mode: HwRxStamps) -> Option<String> {
    if mode == HwRxStamps::Off {
        return None; // the loader says why: hw_rx_timestamps = "off"
    }
    let stamps = NicStamps::new(HwRxStamps::Off);
    let sock = stamps.sock.as_ref()?;
    let names = interface_names();
    let capable = names
        .iter()
        .any(|name| ts_info(sock, name).is_ok_and(|i| i.rx_hardware && i.phc_index.is_some()));
    (!capable).then(|| {
        format!(
            "no network device here stamps received packets with a PTP hardware clock \
             (looked at {} interfaces when the probes loaded)",
            names.len()
        )
    })
}

fn ifindex_of(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// This namespace's interfaces, by name.
fn interface_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i128 = 1_000_000_000;

    #[test]
    fn the_narrowest_bracket_gives_the_offset_and_its_uncertainty() {
        // (system before, PHC, system after), as PTP_SYS_OFFSET_EXTENDED returned them from
        // a free-running PHC; the second sample was preempted.
        let base = 1_796_598_265 * SEC;
        let phc = 4_210 * SEC;
        let samples = [
            (base, phc + 1_100, base + 2_400),
            (base + 10_000, phc + 60_000, base + 90_000),
            (base + 100_000, phc + 100_700, base + 101_000),
        ];
        let o = offset_from_brackets(&samples, OffsetMethod::Extended).unwrap();
        assert_eq!(o.uncertainty_ns, 500);
        assert_eq!(i128::from(o.offset_ns), base + 100_500 - (phc + 100_700));
        // A sample whose system clock stepped back in the middle is not used.
        assert_eq!(
            offset_from_brackets(&[(base, phc, base - 1)], OffsetMethod::Plain),
            None
        );
    }

    #[test]
    fn the_loopback_device_is_reported_without_hardware_stamps() {
        // Real ioctls on this kernel: lo stamps in software only.
        let mut nics = NicStamps::new(HwRxStamps::Use);
        let rows = nics.refresh(SystemTime::now()).unwrap_or_default();
        let lo = rows
            .iter()
            .find(|r| r.interface == "lo")
            .expect("lo listed");
        assert_eq!(lo.state, "unsupported", "{lo:?}");
        assert!(
            lo.summary.starts_with("no hardware RX stamps on lo: "),
            "{}",
            lo.summary
        );
        assert_eq!((lo.phc.as_deref(), lo.offset_ns), (None, None));
        assert!(NicStamps::new(HwRxStamps::Off)
            .refresh(SystemTime::now())
            .unwrap_or_default()
            .is_empty());
    }

    #[test]
    fn filters_are_named_as_ethtool_names_them() {
        assert_eq!(rx_filter_name(0), "none");
        assert_eq!(rx_filter_name(1), "all");
        assert_eq!(rx_filter_name(12), "ptpv2-event");
        assert_eq!(rx_filter_name(99), "filter 99");
    }
}
