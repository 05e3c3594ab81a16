//! Loading, attaching and reading the probes.

use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use model::config::{KeyProblem, Validate};
use model::{Histogram, Probe};
use serde::Serialize;

use crate::cgroup::{cgroup2_mount_or_default, cgroup_id, CgroupNames};
use crate::config::{HwRxStamps, ProbeConfig, ServiceSpec};
use crate::features::{KernelFeatures, MissingFeature};
use crate::hist_read::HistReader;
use crate::map_read::{decode, ReadError};
use crate::probes::{
    variants, Variant, FIRST_STAMP_PROG, READER_WAIT_PROGS, SEND_DEVICE_PROGS, SK_DATA_READY_PROG,
};
use crate::skel::types;
use crate::skel::{OpenProbesSkel, ProbesSkel, ProbesSkelBuilder};
use crate::snapshot::{Counters, ServiceHist, Snapshot};

// The Rust and BPF sides must agree on the histogram layout and the probe numbering.
const _: () = assert!(
    std::mem::size_of::<types::tt_hist>() == (model::hist::NUM_BUCKETS + 1) * 8,
    "tt_hist must be NUM_BUCKETS counts and a sum"
);
const _: fn(&types::tt_hist) -> &[u64; model::hist::NUM_BUCKETS] = |h| &h.buckets;
const _: () = {
    assert!(types::tt_probe::TT_PROBE_IP_START.0 == Probe::IpStart.id());
    assert!(types::tt_probe::TT_PROBE_TCP_START.0 == Probe::TcpStart.id());
    assert!(types::tt_probe::TT_PROBE_UDP_START.0 == Probe::UdpStart.id());
    assert!(types::tt_probe::TT_PROBE_TCP_SOCKET_ENQUEUED.0 == Probe::TcpSocketEnqueued.id());
    assert!(types::tt_probe::TT_PROBE_UDP_SOCKET_ENQUEUED.0 == Probe::UdpSocketEnqueued.id());
    assert!(types::tt_probe::TT_PROBE_TCP_SOCKET_READ.0 == Probe::TcpSocketRead.id());
    assert!(types::tt_probe::TT_PROBE_UDP_SOCKET_READ.0 == Probe::UdpSocketRead.id());
    assert!(types::tt_probe::TT_PROBE_SEND_TO_QDISC.0 == Probe::SendToQdisc.id());
    assert!(types::tt_probe::TT_PROBE_QDISC_SOJOURN.0 == Probe::QdiscSojourn.id());
    assert!(types::tt_probe::TT_PROBE_NIC_TO_STACK.0 == Probe::NicToStack.id());
    assert!(types::tt_probe::TT_NUM_PROBES.0 as usize == Probe::ALL.len());
};

const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Cgroups whose service is kept where the kernel has no socket storage for it.
const CGROUP_RULE_CACHE_ENTRIES: usize = 4096;

/// One device with a PTP hardware clock, as nic-to-stack converts its hardware RX stamps
/// ([`ProbeSet::set_nic_clocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicClock {
    /// The device.
    pub ifindex: u32,
    /// It stamps received packets now (its `rx_filter` is not none).
    pub stamping: bool,
    /// CLOCK_REALTIME minus the clock and how far that may be off, ns, as read this
    /// interval; `None` when the read failed.
    pub offset: Option<(i64, u64)>,
}

/// How a probe is attached on the running kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum AttachMethod {
    /// fentry/fexit programs on these kernel functions.
    Fentry {
        /// The kernel functions hooked.
        functions: Vec<&'static str>,
    },
    /// A tp_btf program on this tracepoint (the kernel refused fentry/fexit).
    TpBtf {
        /// The tracepoint hooked.
        tracepoint: &'static str,
    },
    /// No method worked on this kernel.
    Unavailable {
        /// Why, per method tried.
        reason: String,
    },
    /// Switched off in the configuration.
    Disabled,
    /// No programs of its own: the named probe's programs take its samples (nic-to-stack,
    /// in ip-start's).
    Within {
        /// The probe whose programs measure it.
        probe: Probe,
    },
}

impl std::fmt::Display for AttachMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachMethod::Fentry { functions } => write!(f, "fentry {}", functions.join(", ")),
            AttachMethod::TpBtf { tracepoint } => write!(f, "tp_btf {tracepoint}"),
            AttachMethod::Unavailable { reason } => write!(f, "unavailable: {reason}"),
            AttachMethod::Disabled => f.write_str("disabled"),
            AttachMethod::Within { probe } => write!(f, "within {probe}'s programs"),
        }
    }
}

/// The attach method chosen for one probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attachment {
    /// The probe.
    pub probe: Probe,
    /// How it is attached, or why not.
    #[serde(flatten)]
    pub method: AttachMethod,
    /// Why the methods preferred to `method` were refused (e.g. fentry on a kernel that
    /// refuses trampolines, or the verifier's complaint); `None` when the first choice
    /// loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// BPF run-time statistics of one loaded program (collected while
/// `kernel.bpf_stats_enabled` is 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgStats {
    /// BPF program name.
    pub program: String,
    /// Where it is attached, as its ELF section names it (`tp_btf/tcp_probe`,
    /// `fentry/tcp_v4_rcv`, ...).
    pub attach_point: String,
    /// Probes the program serves.
    pub probes: Vec<Probe>,
    /// Total run time, ns.
    pub run_time_ns: u64,
    /// Number of runs.
    pub run_cnt: u64,
}

/// Why the probes could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// BPF needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN).
    #[error("loading BPF probes needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): run as root")]
    NotRoot,
    /// The kernel has no BTF; CO-RE and tp_btf/fentry need it.
    #[error(
        "the kernel exposes no BTF ({BTF_VMLINUX} missing): tailtrap needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf,
    /// The configuration breaks the rules of [`ProbeConfig`]'s validation.
    #[error("probe configuration: {}", model::config::joined(.0))]
    Config(Vec<KeyProblem>),
    /// The BPF object lacks something the loader needs (a build problem).
    #[error("the BPF object is unusable: {0}")]
    Object(&'static str),
    /// A configured cgroup could not be resolved.
    #[error("{what}: cgroup {path}: {source}")]
    Cgroup {
        /// Which setting named it.
        what: String,
        /// The path as resolved under the cgroup2 mount.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// libbpf failed while opening, loading or filling maps.
    #[error("{stage}: {source}")]
    Bpf {
        /// What was being done.
        stage: String,
        /// The libbpf error.
        source: libbpf_rs::Error,
    },
    /// Reading the TAI offset or enabling RX timestamping failed.
    #[error("{stage}: {source}")]
    System {
        /// What was being done.
        stage: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A first read of the maps failed.
    #[error("reading the probes' maps: {0}")]
    Read(Box<ReadError>),
    /// Every probe is disabled or unavailable.
    #[error("no probe could be attached:\n{0}")]
    NothingAttached(String),
}

impl LoadError {
    fn config(key: &str, reason: &str) -> LoadError {
        LoadError::Config(vec![KeyProblem::new(key, reason)])
    }
}

/// How service slots get their names.
#[derive(Debug)]
enum SlotNames {
    /// Slot `TT_SERVICE_FIRST + i` is configured service `i`.
    Configured(Vec<String>),
    /// Slots are handed out by BPF per socket cgroup; names come from the cgroup tree.
    Auto(CgroupNames),
}

/// The loaded and attached probes. Dropping it detaches them and ends RX timestamping.
pub struct ProbeSet {
    // Field order is drop order: detach before the object goes away.
    links: Vec<(String, Link)>,
    /// The scheduler hooks of the reader-wait split: attached only while capture is armed.
    reader_wait_links: Vec<Link>,
    /// Whether the reader-wait hooks loaded (task storage in tracing programs), or why not.
    reader_wait: Result<(), String>,
    skel: ProbesSkel<'static>,
    attachments: Vec<Attachment>,
    slot_names: SlotNames,
    /// Auto slots freed at the last snapshot, pushed to the free queue at the next one.
    quarantine: Vec<u32>,
    /// Auto slots freed since load.
    auto_freed: u64,
    /// The histogram map's read buffer and what the last snapshot saw.
    hist_reader: HistReader,
    /// What the kernel lacks and the probes stand in for.
    missing_features: Vec<MissingFeature>,
    /// Where each probe's histogram sits within a service slot's entries.
    hist_columns: HistColumns,
    /// The daemon's network namespace: devices in it are named, others by number.
    own_netns: Option<u32>,
    _rx_timestamping: OwnedFd,
}

impl std::fmt::Debug for ProbeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSet")
            .field("attachments", &self.attachments)
            .finish_non_exhaustive()
    }
}

/// What the loader decided for one probe before the final load.
#[derive(Debug, Clone)]
enum Plan {
    /// This variant, and why the ones preferred to it were refused (`None`: it is the
    /// preferred one).
    Use(Variant, Option<String>),
    Unavailable(String),
    Disabled,
    /// Measured by this probe's programs (which must be in use).
    Within(Probe),
}

impl Plan {
    /// The probe takes samples: it has a histogram column.
    fn measures(&self) -> bool {
        matches!(self, Plan::Use(..) | Plan::Within(_))
    }
}

impl ProbeSet {
    /// Pick an attach method per probe, load and attach. `progress` receives one line per
    /// step for the operator.
    pub fn load(
        config: &ProbeConfig,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ProbeSet, LoadError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(LoadError::NotRoot);
        }
        if !Path::new(BTF_VMLINUX).exists() {
            return Err(LoadError::NoBtf);
        }
        let problems = config.validate();
        if !problems.is_empty() {
            return Err(LoadError::Config(problems));
        }
        let mount = cgroup2_mount_or_default();
        let service_cgroups = resolve_service_cgroups(&config.services, &mount)?;
        let filter_cgroups = config
            .filters
            .cgroups
            .iter()
            .map(|rel| {
                cgroup_id(&mount, rel).map_err(|source| LoadError::Cgroup {
                    what: "cgroup filter".into(),
                    path: mount.join(rel),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        progress("probing kernel features");
        let (features, missing_features) = detect_features(config.kernel_features);
        for m in &missing_features {
            progress(&m.to_string());
        }
        progress("probing attach methods (fentry/fexit, then tp_btf)");
        let plans = plan_attach_methods(config, features);

        progress("loading BPF programs");
        // The skeleton borrows its object storage for its whole life; a ProbeSet lives
        // about as long as the process, so the few bytes of storage are leaked.
        let storage: &'static mut MaybeUninit<OpenObject> =
            Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = ProbesSkelBuilder::default()
            .open(storage)
            .map_err(bpf_err("opening the BPF object"))?;
        let chosen: Vec<&str> = plans
            .values()
            .filter_map(|p| match p {
                Plan::Use(v, _) => Some(v.programs()),
                _ => None,
            })
            .flatten()
            .collect();
        let mut loaded = chosen.clone();
        if features.task_storage {
            loaded.extend(READER_WAIT_PROGS);
        }
        let first_stamps = uses_first_hook_stamps(config, &plans);
        if first_stamps {
            loaded.push(FIRST_STAMP_PROG);
        }
        // The send side's device-layer programs serve both send probes: those the plans
        // did not choose already (qdisc-sojourn's own) load beside them.
        let send_device: Vec<&str> = if uses_send_side(&plans) {
            SEND_DEVICE_PROGS
                .into_iter()
                .filter(|p| !chosen.contains(p))
                .collect()
        } else {
            Vec::new()
        };
        loaded.extend(&send_device);
        set_autoload(&mut open, &loaded)
            .map_err(bpf_err("setting the programs' attach targets"))?;
        configure(
            &mut open,
            config,
            features,
            &plans,
            &service_cgroups,
            &filter_cgroups,
        )?;
        let mut skel = load_final(open)?;
        fill_maps(&skel, config, &service_cgroups, &filter_cgroups)?;
        let offsets = crate::clock::offsets().map_err(|source| LoadError::System {
            stage: "reading the clock offsets (adjtimex, clock_gettime)",
            source,
        })?;
        set_clock_offsets(&mut skel, offsets);
        let rx_timestamping =
            crate::clock::rx_timestamping_socket().map_err(|source| LoadError::System {
                stage: "enabling RX software timestamping",
                source,
            })?;

        progress("attaching probes");
        let (mut links, mut attach_errors) = attach(&skel, &chosen);
        if !send_device.is_empty() {
            // Both send probes take their packets here: without them neither measures.
            let (device, errors) = attach(&skel, &send_device);
            links.extend(device);
            if let Some(why) = errors.values().next() {
                for probe in [
                    Probe::SendToQdisc,
                    Probe::QdiscSojourn,
                    Probe::DriverToCompletion,
                ] {
                    if let Some(Plan::Use(v, _)) = plans.get(&probe) {
                        for prog in v.programs() {
                            attach_errors.insert(prog.to_owned(), why.clone());
                        }
                    }
                }
            }
        }
        if first_stamps {
            // Without it ip-start still measures every packet with a receive stamp.
            let (first, errors) = attach(&skel, &[FIRST_STAMP_PROG]);
            links.extend(first);
            for why in errors.values() {
                progress(&format!(
                    "ip-start: loopback and veth TCP not measured ({why})"
                ));
            }
        }
        let attachments = attachments(&plans, &attach_errors);
        if !attachments.iter().any(|a| {
            matches!(
                a.method,
                AttachMethod::Fentry { .. } | AttachMethod::TpBtf { .. }
            )
        }) {
            let reasons = attachments
                .iter()
                .map(|a| format!("  {}: {}", a.probe, a.method))
                .collect::<Vec<_>>()
                .join("\n");
            return Err(LoadError::NothingAttached(reasons));
        }
        for a in &attachments {
            match &a.refused {
                Some(why) => progress(&format!("{}: {} (refused: {why})", a.probe, a.method)),
                None => progress(&format!("{}: {}", a.probe, a.method)),
            }
        }

        let slot_names = if config.services.is_empty() {
            SlotNames::Auto(CgroupNames::new(mount))
        } else {
            SlotNames::Configured(config.services.iter().map(|s| s.name.clone()).collect())
        };
        let cpus = libbpf_rs::num_possible_cpus().map_err(bpf_err("counting the CPUs"))?;
        let mut hist_reader = HistReader::new(cpus);
        let mut missing_features = missing_features;
        let forced = config.kernel_features == crate::KernelFeatureMode::Baseline;
        if forced {
            hist_reader.read_one_by_one();
        }
        if forced
            || !hist_reader
                .check_batched(&skel.maps.hists)
                .map_err(|e| LoadError::Read(Box::new(e)))?
        {
            let m = crate::features::MissingFeature::batched_map_reads(forced);
            progress(&m.to_string());
            missing_features.push(m);
        }
        let reader_wait = if features.task_storage {
            Ok(())
        } else {
            Err("the kernel lacks task storage in tracing programs (5.11)".into())
        };
        Ok(ProbeSet {
            links,
            reader_wait_links: Vec::new(),
            reader_wait,
            skel,
            attachments,
            slot_names,
            quarantine: Vec::new(),
            auto_freed: 0,
            hist_reader,
            missing_features,
            hist_columns: HistColumns::of(&plans),
            own_netns: crate::device_hists::own_netns(),
            _rx_timestamping: rx_timestamping,
        })
    }

    /// The attach method of every probe, in [`Probe::ALL`] order.
    pub fn attachments(&self) -> &[Attachment] {
        &self.attachments
    }

    /// Hand nic-to-stack every device with a PTP hardware clock: stamps of those stamping
    /// with an offset read are timed, those of the others counted and skipped; devices
    /// left out (no PHC) are ignored. While none stamps, ip-start does not look for
    /// hardware stamps at all. At most `TT_NIC_CLOCKS_MAX` devices, stamping ones first.
    /// Whether the stage runs (a no-op when it does not).
    pub fn set_nic_clocks(&mut self, clocks: &[NicClock]) -> Result<bool, ReadError> {
        if !self.attachments.iter().any(|a| {
            a.probe == Probe::NicToStack && matches!(a.method, AttachMethod::Within { .. })
        }) {
            return Ok(false);
        }
        let max = types::tt_nic_limit::TT_NIC_CLOCKS_MAX.0 as usize;
        let mut clocks = clocks.to_vec();
        clocks.sort_by_key(|c| !c.stamping);
        clocks.truncate(max);
        let map_err = |source| ReadError::Map {
            map: "nic_clocks",
            source,
        };
        let map = &self.skel.maps.nic_clocks;
        let stale: Vec<Vec<u8>> = map
            .keys()
            .filter(|k| {
                let ifindex = k
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map(u32::from_ne_bytes);
                !clocks.iter().any(|c| Some(c.ifindex) == ifindex)
            })
            .collect();
        // Removed first: a stamp is never converted with a clock the daemon dropped.
        for key in stale {
            map.delete(&key).map_err(map_err)?;
        }
        for c in &clocks {
            let (offset_ns, uncertainty_ns) = c.offset.unwrap_or_default();
            let value = types::tt_nic_clock {
                offset_ns,
                uncertainty_ns: uncertainty_ns.max(1),
                usable: u32::from(c.stamping && c.offset.is_some()),
                pad: 0,
            };
            // SAFETY: tt_nic_clock is plain old data (8- and 4-byte integers, no padding).
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&value as *const types::tt_nic_clock).cast::<u8>(),
                    std::mem::size_of::<types::tt_nic_clock>(),
                )
            };
            map.update(&c.ifindex.to_ne_bytes(), bytes, MapFlags::ANY)
                .map_err(map_err)?;
        }
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.nic_clocks_live = clocks.iter().filter(|c| c.stamping).count() as u32;
        }
        Ok(true)
    }

    /// The kernel features the probes stand in for on this kernel (empty on 6.1 and newer).
    pub fn missing_features(&self) -> &[MissingFeature] {
        &self.missing_features
    }

    /// Follow readers' scheduling for the reader-wait split of slow reads (`on`: attach the
    /// scheduler hooks and start a new epoch), or stop (detach: nothing more per context
    /// switch). A refused attach is kept for [`ProbeSet::reader_wait`] and not retried.
    pub(crate) fn follow_readers(&mut self, on: bool) {
        if !on {
            if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
                bss.reader_wait_epoch_ns = 0;
            }
            self.reader_wait_links.clear();
            return;
        }
        if self.reader_wait.is_err() || !self.reader_wait_links.is_empty() {
            return;
        }
        let mut links = Vec::new();
        for prog in self.skel.object().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            if !READER_WAIT_PROGS.contains(&name.as_str()) {
                continue;
            }
            match prog.attach() {
                Ok(link) => links.push(link),
                Err(e) => {
                    self.reader_wait = Err(format!("attaching {name}: {e}"));
                    return;
                }
            }
        }
        let now = crate::clock::monotonic_ns();
        if let Some(bss) = self.skel.maps.bss_data.as_deref_mut() {
            bss.reader_wait_epoch_ns = now;
        }
        self.reader_wait_links = links;
    }

    /// Whether slow reads can carry the reader-wait split on this kernel, or why not.
    pub fn reader_wait(&self) -> Result<(), &str> {
        self.reader_wait
            .as_ref()
            .map(|_| ())
            .map_err(String::as_str)
    }

    /// Whether the scheduler hooks are attached now (capture is armed).
    pub fn following_readers(&self) -> bool {
        !self.reader_wait_links.is_empty()
    }

    /// The skeleton, for in-kernel capture (`crate::capture`).
    pub(crate) fn skel_mut(&mut self) -> &mut ProbesSkel<'static> {
        &mut self.skel
    }

    /// The name of a service slot, as snapshots report it.
    pub fn service_name(&mut self, slot: u32) -> Result<String, ReadError> {
        let auto_slots = match &self.slot_names {
            SlotNames::Auto(_) => read_auto_slots(&self.skel.maps.auto_cgroups)?,
            SlotNames::Configured(_) => HashMap::new(),
        };
        Ok(slot_name(&mut self.slot_names, slot, &auto_slots))
    }

    /// The slot of a service by the name snapshots give it; `None` when no such service has
    /// a slot (yet: auto-grouped services get theirs with their first packet).
    pub fn service_slot(&mut self, service: &str) -> Result<Option<u32>, ReadError> {
        let auto_slots = match &self.slot_names {
            SlotNames::Auto(_) => read_auto_slots(&self.skel.maps.auto_cgroups)?,
            SlotNames::Configured(names) => (0..names.len() as u32)
                .map(|i| (types::tt_service_slot::TT_SERVICE_FIRST.0 + i, 0))
                .collect(),
        };
        let mut slots: Vec<u32> = auto_slots.keys().copied().collect();
        slots.sort_unstable();
        Ok(slots
            .into_iter()
            .find(|&slot| slot_name(&mut self.slot_names, slot, &auto_slots) == service))
    }

    /// A service slot's cumulative histogram at `probe` on each CPU since load, indexed by
    /// CPU; `None` when the probe has no histogram or the slot is beyond the map. The slot
    /// is the one snapshots give the service ([`ServiceHist::slot`]). Callers take the
    /// difference of two reads for a window.
    pub fn per_cpu_hist(
        &mut self,
        slot: u32,
        probe: Probe,
    ) -> Result<Option<Vec<Histogram>>, ReadError> {
        let Some(column) = self.hist_columns.column(probe) else {
            return Ok(None);
        };
        let index = slot
            .saturating_mul(self.hist_columns.stride)
            .saturating_add(column);
        if index >= self.skel.maps.hists.max_entries() {
            return Ok(None);
        }
        let n = model::hist::NUM_BUCKETS;
        let per_cpu = self
            .hist_reader
            .read_per_cpu(&self.skel.maps.hists, index)?;
        let mut hists = Vec::with_capacity(per_cpu.len());
        for sums in per_cpu {
            hists.push(Histogram::from_dense(&sums[..n], sums[n])?);
        }
        Ok(Some(hists))
    }

    /// Re-read CLOCK_TAI - CLOCK_REALTIME (it changes on leap seconds and when NTP/PTP set
    /// it) and CLOCK_TAI - CLOCK_MONOTONIC (the TAI clock's stand-in before 6.1; it changes
    /// when the clock is stepped) and hand them to the BPF programs. Call it every interval.
    pub fn refresh_clock(&mut self) -> Result<(), ReadError> {
        let offsets = crate::clock::offsets().map_err(ReadError::Clock)?;
        set_clock_offsets(&mut self.skel, offsets);
        Ok(())
    }

    /// Cumulative histograms per (service, probe) and the event counters. With
    /// auto-grouping, it also frees the slots of cgroups that are gone (see
    /// [`Snapshot::retired`]).
    pub fn snapshot(&mut self) -> Result<Snapshot, ReadError> {
        self.read_snapshot(false)
    }

    /// [`ProbeSet::snapshot`] with the histograms of only those (service, probe) whose
    /// counts changed since the previous snapshot of either kind (at the first, every one
    /// that has seen samples): the caller keeps the others as they were. The interval loop
    /// reads hundreds of histograms every second, and those of idle services stay put.
    pub fn snapshot_changed(&mut self) -> Result<Snapshot, ReadError> {
        self.read_snapshot(true)
    }

    fn read_snapshot(&mut self, only_changed: bool) -> Result<Snapshot, ReadError> {
        let snapshot = self.read_snapshot_once(only_changed);
        if snapshot.is_err() {
            // The caller got none of what this read saw: the next one reports every
            // histogram again rather than leave it the ones that changed now.
            self.hist_reader.forget();
        }
        snapshot
    }

    fn read_snapshot_once(&mut self, only_changed: bool) -> Result<Snapshot, ReadError> {
        let mut counters = self.counters()?;
        let auto_slots = match &self.slot_names {
            SlotNames::Auto(_) => read_auto_slots(&self.skel.maps.auto_cgroups)?,
            SlotNames::Configured(_) => HashMap::new(),
        };
        let entries = self.entries_in_use(&auto_slots);
        let columns = &self.hist_columns;
        let probes = columns.stride;
        let first = types::tt_service_slot::TT_SERVICE_FIRST.0;
        let auto = matches!(self.slot_names, SlotNames::Auto(_));
        let slot_names = &mut self.slot_names;
        let mut hists = Vec::new();
        self.hist_reader
            .read(&self.skel.maps.hists, entries, |index, sums, changed| {
                let (service, probe) = (index / probes, index % probes);
                if only_changed && !changed {
                    return Ok(true); // the caller has it from before
                }
                let Some(probe) = columns.probe_at(probe) else {
                    return Ok(true);
                };
                if sums.iter().all(|&n| n == 0) {
                    return Ok(true); // never touched
                }
                if auto && service >= first && !auto_slots.contains_key(&service) {
                    // A freed slot in quarantine (stragglers of a cgroup gone), or one
                    // handed out after the names were read: not taken, so a new owner's
                    // counts still come as a change once it has a name.
                    return Ok(false);
                }
                let n = model::hist::NUM_BUCKETS;
                let hist = Histogram::from_dense(&sums[..n], sums[n])?;
                hists.push(ServiceHist {
                    service: slot_name(slot_names, service, &auto_slots),
                    slot: service,
                    probe,
                    hist,
                });
                Ok(true)
            })?;
        hists.sort_by(|a, b| (&a.service, a.probe).cmp(&(&b.service, b.probe)));
        let retired = match self.slot_names {
            SlotNames::Auto(_) => self.free_gone_slots(&auto_slots)?,
            SlotNames::Configured(_) => Vec::new(),
        };
        counters.auto_freed = self.auto_freed;
        let devices =
            crate::device_hists::read(&self.skel.maps.completion_device_hists, self.own_netns)?;
        Ok(Snapshot {
            hists,
            devices,
            counters,
            retired,
        })
    }

    /// Histogram entries that can hold data: those of the slots handed out (`host`,
    /// `other` and the configured services, or the auto slots in use), not the whole map,
    /// which with auto-grouping is sized for the limit.
    fn entries_in_use(&self, auto_slots: &HashMap<u32, u64>) -> u32 {
        let first = types::tt_service_slot::TT_SERVICE_FIRST.0;
        let slots = match &self.slot_names {
            SlotNames::Configured(names) => {
                first.saturating_add(u32::try_from(names.len()).unwrap_or(u32::MAX))
            }
            SlotNames::Auto(_) => auto_slots
                .keys()
                .max()
                .map_or(first, |&s| s.saturating_add(1).max(first)),
        };
        slots
            .saturating_mul(self.hist_columns.stride)
            .min(self.skel.maps.hists.max_entries())
    }

    /// Free the auto slots of cgroups that are gone, in two steps one snapshot apart.
    /// First (the snapshot that read their last histograms): bump the slot's generation, so
    /// sockets that cached it resolve again, and delete its cgroup entry, so nothing new
    /// counts to it. Then, one interval later (packets that had resolved the slot before
    /// have landed by then): zero its histograms and push it to the free queue. Returns
    /// the names of the services retired now.
    fn free_gone_slots(
        &mut self,
        auto_slots: &HashMap<u32, u64>,
    ) -> Result<Vec<String>, ReadError> {
        let first = types::tt_service_slot::TT_SERVICE_FIRST.0;
        let maps = &self.skel.maps;
        let map_err = |map: &'static str| move |source| ReadError::Map { map, source };
        let probes = self.hist_columns.stride;
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err("hists"))?;
        let zero = vec![vec![0u8; std::mem::size_of::<types::tt_hist>()]; cpus];
        // A slot leaves the quarantine only once it is in the queue: after a failed map
        // write it is tried again at the next snapshot (zeroing twice does no harm).
        while let Some(&slot) = self.quarantine.first() {
            for probe in 0..probes {
                let index = slot * probes + probe;
                if index < maps.hists.max_entries() {
                    maps.hists
                        .update_percpu(&index.to_ne_bytes(), &zero, MapFlags::ANY)
                        .map_err(map_err("hists"))?;
                    self.hist_reader.zeroed(index);
                }
            }
            let rel = slot.saturating_sub(first);
            // A queue has no key: update pushes.
            maps.auto_free_slots
                .update(&[], &rel.to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("auto_free_slots"))?;
            self.quarantine.remove(0);
            self.auto_freed += 1;
        }
        let SlotNames::Auto(names) = &mut self.slot_names else {
            return Ok(Vec::new());
        };
        let mut gone: Vec<(u32, u64)> = auto_slots
            .iter()
            .filter(|(slot, id)| **slot >= first && names.gone(**id))
            .map(|(slot, id)| (*slot, *id))
            .collect();
        gone.sort_unstable();
        let live: std::collections::HashSet<String> = auto_slots
            .iter()
            .filter(|(slot, _)| !gone.iter().any(|(s, _)| s == *slot))
            .map(|(_, id)| names.name(*id))
            .collect();
        let mut retired = Vec::new();
        for (slot, id) in gone {
            let rel = (slot - first).to_ne_bytes(); // slot >= first: filtered above
            let gen = maps
                .auto_slot_gen
                .lookup(&rel, MapFlags::ANY)
                .map_err(map_err("auto_slot_gen"))?
                .map(|v| decode::<u32>("auto_slot_gen", &v))
                .transpose()?
                .unwrap_or(0);
            maps.auto_slot_gen
                .update(&rel, &gen.wrapping_add(1).to_ne_bytes(), MapFlags::ANY)
                .map_err(map_err("auto_slot_gen"))?;
            maps.auto_cgroups
                .delete(&id.to_ne_bytes())
                .map_err(map_err("auto_cgroups"))?;
            let name = names.name(id);
            names.forget(id);
            // A cgroup that came back under the same name (a restarted unit) keeps it.
            if !live.contains(&name) {
                retired.push(name);
            }
            self.quarantine.push(slot);
        }
        Ok(retired)
    }

    /// BPF run-time statistics of the attached programs, the reader-wait hooks included
    /// while attached (run_time_ns stays 0 unless `kernel.bpf_stats_enabled` is on).
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        let ids: HashMap<u32, (String, String)> = self
            .skel
            .object()
            .progs()
            .filter(|p| {
                let name = p.name().to_string_lossy();
                self.links.iter().any(|(n, _)| *n == name)
                    || (self.following_readers() && READER_WAIT_PROGS.contains(&name.as_ref()))
            })
            .filter_map(|p| {
                let id = libbpf_rs::Program::id_from_fd(p.as_fd()).ok()?;
                let name = p.name().to_string_lossy().into_owned();
                // Sections name only the kind; the target is set at load from one table.
                let kind = p.section().to_string_lossy();
                let point = match crate::probes::target_of(&name) {
                    Some(target) => format!("{kind}/{target}"),
                    None => kind.into_owned(),
                };
                Some((id, (name, point)))
            })
            .collect();
        let mut stats: Vec<ProgStats> = libbpf_rs::query::ProgInfoIter::default()
            .filter_map(|info| {
                let (program, attach_point) = ids.get(&info.id)?.clone();
                let probes = self
                    .attachments
                    .iter()
                    .filter(|a| serves(&a.method, a.probe, &program))
                    .map(|a| a.probe)
                    .collect();
                Some(ProgStats {
                    program,
                    attach_point,
                    probes,
                    run_time_ns: info.run_time_ns,
                    run_cnt: info.run_cnt,
                })
            })
            .collect();
        stats.sort_by(|a, b| a.program.cmp(&b.program));
        stats
    }

    fn counters(&self) -> Result<Counters, ReadError> {
        let map = &self.skel.maps.counters;
        let read = |c: types::tt_counter| -> Result<u64, ReadError> {
            let per_cpu = map
                .lookup_percpu(&c.0.to_ne_bytes(), MapFlags::ANY)
                .map_err(|source| ReadError::Map {
                    map: "counters",
                    source,
                })?
                .unwrap_or_default();
            per_cpu.iter().try_fold(0u64, |sum, v| {
                let n: u64 = decode("counters", v)?;
                Ok(sum.saturating_add(n))
            })
        };
        Ok(Counters {
            map_full_drops: read(types::tt_counter::TT_COUNTER_MAP_FULL)?,
            zero_tstamp: read(types::tt_counter::TT_COUNTER_ZERO_TSTAMP)?,
            future_tstamp: read(types::tt_counter::TT_COUNTER_FUTURE_TSTAMP)?,
            hol_excluded: read(types::tt_counter::TT_COUNTER_HOL_EXCLUDED)?,
            auto_overflow: read(types::tt_counter::TT_COUNTER_AUTO_OVERFLOW)?,
            auto_freed: 0,
            nic_stamp_no_clock: read(types::tt_counter::TT_COUNTER_NIC_STAMP_NO_CLOCK)?,
            nic_stamp_out_of_bounds: read(types::tt_counter::TT_COUNTER_NIC_STAMP_OUT_OF_BOUNDS)?,
        })
    }
}

/// The name of a service slot in snapshots.
fn slot_name(names: &mut SlotNames, slot: u32, auto_slots: &HashMap<u32, u64>) -> String {
    match slot {
        s if s == types::tt_service_slot::TT_SERVICE_HOST.0 => "host".into(),
        s if s == types::tt_service_slot::TT_SERVICE_OTHER.0 => "other".into(),
        s => {
            let index = s.saturating_sub(types::tt_service_slot::TT_SERVICE_FIRST.0) as usize;
            match names {
                SlotNames::Configured(names) => names
                    .get(index)
                    .cloned()
                    .unwrap_or_else(|| format!("slot:{s}")),
                SlotNames::Auto(cgroups) => match auto_slots.get(&s) {
                    Some(id) => cgroups.name(*id),
                    None => format!("slot:{s}"),
                },
            }
        }
    }
}

/// Whether packets with a delivery time get a stamp at netif_rx: configured, and ip-start,
/// the probe that uses it, is attached.
/// The receive probes: their ids come first, the send probes' after them.
const RECEIVE_PROBES: u32 = Probe::SendToQdisc.id();
const _: () = {
    let mut i = 0;
    while i < Probe::ALL.len() {
        let p = Probe::ALL[i];
        assert!(p.is_own_interval() == (p.id() >= RECEIVE_PROBES));
        i += 1;
    }
};

/// Where each probe's histogram sits among a service slot's entries: the receive probes
/// at their ids, as always (so a receive-only configuration's map keeps its size), then a
/// column for each other probe that measures, in id order. A probe that does not run has
/// no column past the receive ones: the send side and nic-to-stack cost no map memory
/// when off.
#[derive(Debug, Clone)]
struct HistColumns {
    /// The probe of each column, in order; their number is the entries per service slot.
    probes: Vec<Probe>,
    /// Entries per service slot (`probes.len()`).
    stride: u32,
}

impl HistColumns {
    fn of(plans: &BTreeMap<Probe, Plan>) -> HistColumns {
        let probes: Vec<Probe> = Probe::ALL
            .into_iter()
            .filter(|p| p.id() < RECEIVE_PROBES || plans.get(p).is_some_and(Plan::measures))
            .collect();
        let stride = probes.len() as u32;
        HistColumns { probes, stride }
    }

    fn column(&self, probe: Probe) -> Option<u32> {
        let column = self.probes.iter().position(|&p| p == probe)?;
        u32::try_from(column).ok()
    }

    fn probe_at(&self, column: u32) -> Option<Probe> {
        self.probes.get(column as usize).copied()
    }
}

/// A send probe will run: the shared device-layer program loads with it.
fn uses_send_side(plans: &BTreeMap<Probe, Plan>) -> bool {
    [
        Probe::SendToQdisc,
        Probe::QdiscSojourn,
        Probe::DriverToCompletion,
    ]
    .iter()
    .any(|p| matches!(plans.get(p), Some(Plan::Use(..))))
}

fn uses_first_hook_stamps(config: &ProbeConfig, plans: &BTreeMap<Probe, Plan>) -> bool {
    config.first_hook_stamps && matches!(plans.get(&Probe::IpStart), Some(Plan::Use(..)))
}

/// Attach every chosen program; failures are kept per program name.
fn attach(
    skel: &ProbesSkel<'_>,
    chosen: &[&str],
) -> (Vec<(String, Link)>, HashMap<String, String>) {
    let mut links = Vec::new();
    let mut errors = HashMap::new();
    for prog in skel.object().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        if !chosen.contains(&name.as_str()) {
            continue;
        }
        match prog.attach() {
            Ok(link) => links.push((name, link)),
            Err(e) => {
                let reason = format!("attaching {name}: {e}");
                errors.insert(name, reason);
            }
        }
    }
    (links, errors)
}

/// The outcome per probe: the plan, unless attaching one of its programs failed.
/// Why the programs of `variant` did not attach, one reason per failed program.
fn attach_failures(variant: Variant, attach_errors: &HashMap<String, String>) -> Vec<&str> {
    variant
        .programs()
        .iter()
        .filter_map(|p| attach_errors.get(*p).map(String::as_str))
        .collect()
}

fn attachments(
    plans: &BTreeMap<Probe, Plan>,
    attach_errors: &HashMap<String, String>,
) -> Vec<Attachment> {
    plans
        .iter()
        .map(|(&probe, plan)| {
            let method = match plan {
                Plan::Disabled => AttachMethod::Disabled,
                Plan::Unavailable(reason) => AttachMethod::Unavailable {
                    reason: reason.clone(),
                },
                Plan::Within(by) => match plans.get(by) {
                    Some(Plan::Use(v, _)) => {
                        let failed = attach_failures(*v, attach_errors);
                        if failed.is_empty() {
                            AttachMethod::Within { probe: *by }
                        } else {
                            AttachMethod::Unavailable {
                                reason: format!("{by} did not attach: {}", failed.join("; ")),
                            }
                        }
                    }
                    _ => AttachMethod::Unavailable {
                        reason: format!("{by}, whose programs measure it, is not running"),
                    },
                },
                Plan::Use(v, _) => {
                    let failed = attach_failures(*v, attach_errors);
                    if failed.is_empty() {
                        method_of(*v)
                    } else {
                        AttachMethod::Unavailable {
                            reason: failed.join("; "),
                        }
                    }
                }
            };
            let refused = match plan {
                Plan::Use(_, why) => why.clone(),
                _ => None,
            };
            Attachment {
                probe,
                method,
                refused,
            }
        })
        .collect()
}

/// Whether `program` implements `probe` attached with `method`.
fn serves(method: &AttachMethod, probe: Probe, program: &str) -> bool {
    matches!(
        method,
        AttachMethod::Fentry { .. } | AttachMethod::TpBtf { .. }
    ) && variants(probe)
        .iter()
        .any(|v| method_of(*v) == *method && v.programs().contains(&program))
}

fn method_of(v: Variant) -> AttachMethod {
    match v {
        Variant::Fentry(list) => AttachMethod::Fentry {
            functions: list.iter().map(|(_, f)| *f).collect(),
        },
        Variant::TpBtf(_, tracepoint) => AttachMethod::TpBtf { tracepoint },
    }
}

fn bpf_err(stage: &str) -> impl Fn(libbpf_rs::Error) -> LoadError + '_ {
    move |source| LoadError::Bpf {
        stage: stage.to_owned(),
        source,
    }
}

fn resolve_service_cgroups(
    services: &[ServiceSpec],
    mount: &Path,
) -> Result<Vec<Option<u64>>, LoadError> {
    services
        .iter()
        .map(|s| {
            s.cgroup
                .as_ref()
                .map(|rel| {
                    cgroup_id(mount, rel).map_err(|source| LoadError::Cgroup {
                        what: format!("service {:?}", s.name),
                        path: mount.join(rel),
                        source,
                    })
                })
                .transpose()
        })
        .collect()
}

/// libbpf's printer is process-wide: one loader at a time captures it.
static PLANNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// libbpf's messages while trial loads run: failures are expected there, so they are kept
/// for the reasons given to the operator instead of being printed.
static TRIAL_LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn keep_libbpf_message(_level: libbpf_rs::PrintLevel, msg: String) {
    if let Ok(mut log) = TRIAL_LOG.lock() {
        log.extend(msg.lines().map(str::to_owned));
    }
}

/// Routes libbpf's output into [`TRIAL_LOG`] while alive; restores the previous printer.
struct CaptureLibbpf(Option<(libbpf_rs::PrintLevel, libbpf_rs::PrintCallback)>);

impl CaptureLibbpf {
    fn new() -> Self {
        Self(libbpf_rs::set_print(Some((
            libbpf_rs::PrintLevel::Warn,
            keep_libbpf_message,
        ))))
    }

    /// The verifier's complaint from the last failed load: the last line of its log
    /// before the instruction statistics.
    fn take_verifier_complaint(&self) -> Option<String> {
        let mut log = TRIAL_LOG.lock().ok()?;
        let lines = std::mem::take(&mut *log);
        let end = lines
            .iter()
            .rposition(|l| l.contains("-- END PROG LOAD LOG --"))?;
        lines[..end]
            .iter()
            .rev()
            .find(|l| !l.starts_with("processed ") && !l.trim().is_empty())
            .map(|l| l.trim().to_owned())
    }
}

impl Drop for CaptureLibbpf {
    fn drop(&mut self) {
        libbpf_rs::set_print(self.0.take());
        if let Ok(mut log) = TRIAL_LOG.lock() {
            log.clear();
        }
    }
}

/// The kernel's features, found by trial loads of `features.bpf.c` (libbpf's complaints
/// kept for the reasons, not printed).
fn detect_features(mode: crate::KernelFeatureMode) -> (KernelFeatures, Vec<MissingFeature>) {
    let _one_at_a_time = PLANNING.lock().unwrap_or_else(|e| e.into_inner());
    let capture = CaptureLibbpf::new();
    KernelFeatures::detect(mode, &|| capture.take_verifier_complaint())
}

/// Decide each probe's attach method by trial loads: every probe's preferred variant at
/// once first (the common case costs one load), else probe by probe in preference order.
fn plan_attach_methods(config: &ProbeConfig, features: KernelFeatures) -> BTreeMap<Probe, Plan> {
    let _one_at_a_time = PLANNING.lock().unwrap_or_else(|e| e.into_inner());
    let capture = CaptureLibbpf::new();
    let mut plans: BTreeMap<Probe, Plan> = Probe::ALL
        .into_iter()
        .map(|p| (p, Plan::Disabled))
        .collect();
    let blocked_fexit = config.is_enabled(Probe::SendToQdisc) && !fexit_detaches_while_called();
    if blocked_fexit {
        plans.insert(Probe::SendToQdisc, Plan::Unavailable(SLEEPING_FEXIT.into()));
    }
    let enabled: Vec<Probe> = Probe::ALL
        .into_iter()
        .filter(|p| config.is_enabled(*p))
        .filter(|p| !(blocked_fexit && *p == Probe::SendToQdisc))
        // Probes without programs of their own are planned after the ones that host them.
        .filter(|p| p.measured_by() == *p)
        .collect();
    let preferred: Vec<&str> = enabled
        .iter()
        .flat_map(|p| variants(*p)[0].programs())
        .collect();
    if trial_load(&preferred, features).is_ok() {
        for p in enabled {
            plans.insert(p, Plan::Use(variants(p)[0], None));
        }
    } else {
        plan_one_by_one(&mut plans, &enabled, features, &capture);
    }
    plan_hosted(&mut plans, config);
    plans
}

/// The probes measured within another's programs: nic-to-stack, in ip-start's.
fn plan_hosted(plans: &mut BTreeMap<Probe, Plan>, config: &ProbeConfig) {
    let p = Probe::NicToStack;
    let by = p.measured_by();
    let plan = if !config.is_enabled(p) || config.hw_rx_timestamps == HwRxStamps::Off {
        Plan::Disabled
    } else if let Some(why) = &config.nic_to_stack_unavailable {
        Plan::Unavailable(why.clone())
    } else if matches!(plans.get(&by), Some(Plan::Use(..))) {
        Plan::Within(by)
    } else {
        Plan::Unavailable(format!("{by}, whose programs measure it, is not running"))
    };
    plans.insert(p, plan);
}

/// Each probe's variants in preference order, each loaded on its own: the first that
/// loads is used, and the refusals before it are kept as the reasons.
fn plan_one_by_one(
    plans: &mut BTreeMap<Probe, Plan>,
    enabled: &[Probe],
    features: KernelFeatures,
    capture: &CaptureLibbpf,
) {
    for &p in enabled {
        let mut reasons = Vec::new();
        let mut plan = None;
        for v in variants(p) {
            match trial_load(&v.programs(), features) {
                Ok(()) => {
                    let refused = (!reasons.is_empty()).then(|| reasons.join("; "));
                    plan = Some(Plan::Use(*v, refused));
                    break;
                }
                Err(e) => reasons.push(format!(
                    "{}: {}",
                    kind_name(*v),
                    explain(&e, capture.take_verifier_complaint())
                )),
            }
        }
        if variants(p).iter().all(|v| matches!(v, Variant::Fentry(_))) {
            reasons.push("no tracepoint stands in for it".into());
        }
        plans.insert(p, plan.unwrap_or(Plan::Unavailable(reasons.join("; "))));
    }
}

/// Why send-to-qdisc does not attach on kernels before 5.12.
const SLEEPING_FEXIT: &str = "its fexit programs on the send calls (which sleep while a \
     peer is slow) would keep the probes from detaching on kernels before 5.12 (no \
     bpf_tramp_image in the kernel's BTF): a slow peer would hang every reload and stop";

/// Whether detaching an fexit program returns while a task sleeps inside the traced
/// function. Before 5.12 (bpf_tramp_image, "bpf: Fix fexit trampoline") the kernel waited
/// for every such task to leave it: a sender blocked in tcp_sendmsg on a reader that never
/// reads held the detach, and the daemon's stop, for as long (seen on Debian's 5.10 under
/// qemu: the e2e test's daemon never stopped, with RCU stall reports in tcp_sendmsg).
fn fexit_detaches_while_called() -> bool {
    match libbpf_rs::btf::Btf::from_path(BTF_VMLINUX) {
        Ok(btf) => btf
            .type_by_name::<libbpf_rs::btf::types::Struct<'_>>("bpf_tramp_image")
            .is_some(),
        Err(_) => false,
    }
}

fn kind_name(v: Variant) -> &'static str {
    match v {
        Variant::Fentry(_) => "fentry/fexit",
        Variant::TpBtf(..) => "tp_btf",
    }
}

/// An operator-grade reason for a failed trial load.
fn explain(e: &libbpf_rs::Error, verifier: Option<String>) -> String {
    let text = e.to_string();
    // libbpf's errors end in "(os error N)"; the errno tells the cases apart.
    let errno = text
        .rsplit_once("os error ")
        .and_then(|(_, n)| n.trim_end_matches(')').parse::<i32>().ok());
    match errno {
        Some(libc::EPERM) => "refused by the kernel (EPERM: BPF trampolines not allowed)".into(),
        Some(libc::ENOENT) | Some(libc::ESRCH) => "hook not found in the kernel's BTF".into(),
        Some(libc::EACCES) | Some(libc::EINVAL) => match verifier {
            Some(why) => format!("rejected by the BPF verifier: {why}"),
            None => format!("rejected by the BPF verifier ({text})"),
        },
        _ => text,
    }
}

/// The real load; a verifier rejection carries the verifier's complaint.
fn load_final(open: OpenProbesSkel<'static>) -> Result<ProbesSkel<'static>, LoadError> {
    let _one_at_a_time = PLANNING.lock().unwrap_or_else(|e| e.into_inner());
    let capture = CaptureLibbpf::new();
    open.load().map_err(|source| LoadError::Bpf {
        stage: match capture.take_verifier_complaint() {
            Some(why) => format!("loading the BPF programs (verifier: {why})"),
            None => "loading the BPF programs".into(),
        },
        source,
    })
}

/// Load the object with only `programs` (maps at their 1-entry defaults, the kernel's
/// feature flags set); drop it again.
fn trial_load(programs: &[&str], features: KernelFeatures) -> Result<(), libbpf_rs::Error> {
    let mut storage = MaybeUninit::uninit();
    let mut open = ProbesSkelBuilder::default().open(&mut storage)?;
    set_autoload(&mut open, programs)?;
    open.maps
        .reader_waits
        .set_autocreate(features.task_storage)?;
    if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
        set_feature_flags(ro, features);
    }
    open.load().map(drop)
}

/// Which stand-ins the programs use (read-only: the verifier drops the other branch).
fn set_feature_flags(ro: &mut types::rodata, features: KernelFeatures) {
    ro.have_tai_clock = features.tai_clock;
    ro.have_sk_storage = features.sk_storage;
    ro.have_task_storage = features.task_storage;
}

/// Load only `programs`, each attached where the model's table says (the C sections name
/// only the attach kind).
fn set_autoload(open: &mut OpenProbesSkel<'_>, programs: &[&str]) -> Result<(), libbpf_rs::Error> {
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        let on = programs.contains(&name.as_str());
        prog.set_autoload(on);
        // Only for programs that load: libbpf resolves the target in the running kernel's
        // BTF at once, and the unused variants may name what this kernel lacks (6.1 has no
        // sk_data_ready tracepoint).
        if on {
            if let Some(target) = crate::probes::target_of(&name) {
                prog.set_attach_target(0, Some(target.to_owned()))?;
            }
        }
    }
    Ok(())
}

/// Read-only data and map sizes, set between open and load.
fn configure(
    open: &mut OpenProbesSkel<'_>,
    config: &ProbeConfig,
    features: KernelFeatures,
    plans: &BTreeMap<Probe, Plan>,
    service_cgroups: &[Option<u64>],
    filter_cgroups: &[u64],
) -> Result<(), LoadError> {
    let auto = config.services.is_empty();
    let slots = if auto {
        config.auto_service_limit as usize
    } else {
        config.services.len()
    };
    // Indexed by service * stride + column: every probe that runs has its entry.
    let columns = HistColumns::of(plans);
    let stride = columns.stride;
    let probes = stride as usize;
    let entries = match config.hist_map_entries {
        Some(n) => n,
        None => u32::try_from((slots + 2) * probes)
            .map_err(|_| LoadError::config("services", "too many services for one map"))?,
    };
    let port_rules: usize = config.services.iter().map(|s| s.ports.len()).sum();
    let cgroup_rules = service_cgroups.iter().flatten().count();
    let f = &config.filters;
    // Without socket storage the cgroup rules' answer is kept per cgroup (an LRU: a host
    // with more live cgroups than this walks the ancestors again for the evicted ones).
    let rule_cache = if !features.sk_storage && cgroup_rules > 0 {
        CGROUP_RULE_CACHE_ENTRIES
    } else {
        0
    };
    let first_stamps = uses_first_hook_stamps(config, plans);
    let planned = |p: Probe| plans.get(&p).is_some_and(Plan::measures);
    let send_side = uses_send_side(plans);
    let sizes: [(&mut libbpf_rs::OpenMapMut<'_>, usize); 17] = [
        // Their slots (TT_SEND_CALL_SLOTS, TT_QDISC_SLOTS, the index masks) when used.
        (
            &mut open.maps.send_calls,
            if planned(Probe::SendToQdisc) { 8192 } else { 0 },
        ),
        (
            &mut open.maps.queued_packets,
            if send_side { 32768 } else { 0 },
        ),
        (
            &mut open.maps.transmitted_packets,
            if planned(Probe::DriverToCompletion) {
                32768
            } else {
                0
            },
        ),
        (
            &mut open.maps.completion_device_hists,
            if planned(Probe::DriverToCompletion) {
                types::tt_device_limit::TT_COMPLETION_DEVICES_MAX.0 as usize
            } else {
                0
            },
        ),
        // Its slots per CPU (TT_FIRST_STAMP_SLOTS, the index mask) when used.
        (
            &mut open.maps.first_stamps,
            if first_stamps { 1024 } else { 0 },
        ),
        (&mut open.maps.hists, entries as usize),
        (
            &mut open.maps.nic_clocks,
            if planned(Probe::NicToStack) {
                types::tt_nic_limit::TT_NIC_CLOCKS_MAX.0 as usize
            } else {
                0
            },
        ),
        (&mut open.maps.service_cgroups, cgroup_rules),
        // Indexed by port: every port has an entry once any rule exists.
        (
            &mut open.maps.service_ports,
            if port_rules > 0 { 1 << 16 } else { 0 },
        ),
        (&mut open.maps.cgroup_rule_slots, rule_cache),
        (&mut open.maps.auto_cgroups, if auto { slots } else { 0 }),
        (&mut open.maps.auto_free_slots, if auto { slots } else { 0 }),
        (&mut open.maps.auto_slot_gen, if auto { slots } else { 0 }),
        (&mut open.maps.allowed_pids, f.pids.len()),
        (&mut open.maps.allowed_cgroups, filter_cgroups.len()),
        (&mut open.maps.allowed_ifindexes, f.ifindexes.len()),
        (&mut open.maps.allowed_netns, f.netns.len()),
    ];
    for (map, n) in sizes {
        let n = u32::try_from(n.max(1)).map_err(|_| {
            LoadError::config("probes.filters", "a filter or service list is too long")
        })?;
        map.set_max_entries(n)
            .map_err(bpf_err("sizing the BPF maps"))?;
    }
    // A 5.10 kernel refuses the map type: not created, and its users are never reached.
    open.maps
        .reader_waits
        .set_autocreate(features.task_storage)
        .map_err(bpf_err("setting up the reader-wait map"))?;
    let uses_sk_data_ready = |p: Probe| matches!(plans.get(&p), Some(Plan::Use(v, _)) if v.programs().contains(&SK_DATA_READY_PROG));
    let Some(ro) = open.maps.rodata_data.as_deref_mut() else {
        return Err(LoadError::Object("it has no read-only data section"));
    };
    set_feature_flags(ro, features);
    ro.auto_services = auto;
    ro.auto_service_limit = config.auto_service_limit;
    ro.have_cgroup_rules = cgroup_rules > 0;
    ro.have_port_rules = port_rules > 0;
    ro.filter_pids = !f.pids.is_empty();
    ro.filter_cgroups = !filter_cgroups.is_empty();
    ro.filter_ifindexes = !f.ifindexes.is_empty();
    ro.filter_netns = !f.netns.is_empty();
    ro.min_queue_len = f.min_queue_len;
    ro.sample_one_in = f.sample_one_in;
    ro.hol_filter = config.hol_filter;
    ro.ip_start_ports = config.ip_start_ports;
    ro.first_hook_stamps = first_stamps;
    ro.sk_data_ready_tcp = uses_sk_data_ready(Probe::TcpSocketEnqueued);
    ro.sk_data_ready_udp = uses_sk_data_ready(Probe::UdpSocketEnqueued);
    ro.hist_stride = stride;
    for p in Probe::ALL {
        // A probe without a column never records (its programs are not loaded).
        ro.hist_column[p.id() as usize] = columns.column(p).unwrap_or(0);
    }
    ro.nic_to_stack_on = planned(Probe::NicToStack);
    ro.hw_stamp_origin = config.hw_stamp_origin && planned(Probe::NicToStack);
    ro.send_to_qdisc_on = planned(Probe::SendToQdisc);
    ro.qdisc_sojourn_on = planned(Probe::QdiscSojourn);
    ro.driver_to_completion_on = planned(Probe::DriverToCompletion);
    Ok(())
}

fn fill_maps(
    skel: &ProbesSkel<'_>,
    config: &ProbeConfig,
    service_cgroups: &[Option<u64>],
    filter_cgroups: &[u64],
) -> Result<(), LoadError> {
    let maps = &skel.maps;
    let put = |map: &libbpf_rs::MapMut<'_>, key: &[u8], value: &[u8]| {
        map.update(key, value, MapFlags::ANY)
            .map_err(bpf_err("filling the BPF maps"))
    };
    for (i, s) in config.services.iter().enumerate() {
        // validate() bounds the count well below u32.
        let slot = types::tt_service_slot::TT_SERVICE_FIRST.0 + i as u32;
        if let Some(Some(id)) = service_cgroups.get(i) {
            put(
                &maps.service_cgroups,
                &id.to_ne_bytes(),
                &slot.to_ne_bytes(),
            )?;
        }
        for port in &s.ports {
            put(
                &maps.service_ports,
                &u32::from(*port).to_ne_bytes(),
                &slot.to_ne_bytes(),
            )?;
        }
    }
    // Every auto slot starts free: the BPF side pops one per new cgroup.
    if config.services.is_empty() {
        for rel in 0..config.auto_service_limit {
            // A queue has no key: update pushes.
            put(&maps.auto_free_slots, &[], &rel.to_ne_bytes())?;
        }
    }
    let f = &config.filters;
    for pid in &f.pids {
        put(&maps.allowed_pids, &pid.to_ne_bytes(), &[1])?;
    }
    for id in filter_cgroups {
        put(&maps.allowed_cgroups, &id.to_ne_bytes(), &[1])?;
    }
    for ifindex in &f.ifindexes {
        put(&maps.allowed_ifindexes, &ifindex.to_ne_bytes(), &[1])?;
    }
    for inum in &f.netns {
        put(&maps.allowed_netns, &inum.to_ne_bytes(), &[1])?;
    }
    Ok(())
}

fn set_clock_offsets(skel: &mut ProbesSkel<'_>, offsets: crate::clock::Offsets) {
    if let Some(bss) = skel.maps.bss_data.as_deref_mut() {
        // The .bss is mmapped: the programs see the new values at once.
        bss.tai_offset_ns = offsets.tai_minus_realtime_ns;
        bss.tai_minus_mono_ns = offsets.tai_minus_monotonic_ns;
    }
}

/// Auto-grouping slots handed out so far: slot -> cgroup id.
fn read_auto_slots(map: &libbpf_rs::MapMut<'_>) -> Result<HashMap<u32, u64>, ReadError> {
    let mut slots = HashMap::new();
    for key in map.keys() {
        let id: u64 = decode("auto_cgroups", &key)?;
        if let Some(value) = map
            .lookup(&key, MapFlags::ANY)
            .map_err(|source| ReadError::Map {
                map: "auto_cgroups",
                source,
            })?
        {
            let slot: u32 = decode("auto_cgroups", &value)?;
            slots.insert(slot, id);
        }
    }
    Ok(slots)
}
