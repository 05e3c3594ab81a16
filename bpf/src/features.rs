//! What the running kernel offers the probes beyond the 5.10 baseline, found by loading one
//! small program per feature (`src/bpf/features.bpf.c`; loaded, never attached), and the
//! stand-in the probes use where a feature is missing. Every missing feature is reported
//! with what its stand-in costs, never silently.

use std::mem::MaybeUninit;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use serde::Serialize;

use crate::config::KernelFeatureMode;
use crate::skel_features::FeaturesSkelBuilder;

/// The reason given for every stand-in when the configuration asks for them.
const BASELINE: &str = "[probes] kernel_features = \"baseline\"";

/// The kernel features the probes use where they load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelFeatures {
    /// `bpf_ktime_get_tai_ns` (6.1).
    pub(crate) tai_clock: bool,
    /// Socket storage from tracing programs (5.11).
    pub(crate) sk_storage: bool,
    /// Task storage from tracing programs (5.11): the reader-wait split of slow reads.
    pub(crate) task_storage: bool,
}

/// A feature the running kernel lacks, the stand-in used instead and what that costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MissingFeature {
    /// The feature.
    pub feature: &'static str,
    /// The first mainline kernel that has it.
    pub since: &'static str,
    /// What the probes do instead.
    pub stand_in: &'static str,
    /// What the stand-in costs in accuracy or CPU.
    pub cost: &'static str,
    /// Why it counts as missing (the verifier's complaint, or the configuration).
    pub why: String,
}

impl KernelFeatures {
    /// Finds out by loading each feature's program (`Baseline`: takes every stand-in).
    /// `verifier` gives the verifier's complaint about the last refused load, for the
    /// reason shown to the operator.
    pub(crate) fn detect(
        mode: KernelFeatureMode,
        verifier: &dyn Fn() -> Option<String>,
    ) -> (KernelFeatures, Vec<MissingFeature>) {
        if mode == KernelFeatureMode::Baseline {
            let features = KernelFeatures {
                tai_clock: false,
                sk_storage: false,
                task_storage: false,
            };
            return (features, features.missing_with(|_| BASELINE.into()));
        }
        let mut reasons = std::collections::HashMap::new();
        let mut check = |program: &'static str| match load_only(program) {
            Ok(()) => true,
            Err(e) => {
                let why = match verifier() {
                    Some(complaint) => format!("rejected by the BPF verifier: {complaint}"),
                    None => e,
                };
                reasons.insert(program, why);
                false
            }
        };
        let features = KernelFeatures {
            tai_clock: check("feature_tai_clock"),
            sk_storage: check("feature_sk_storage"),
            task_storage: check("feature_task_storage"),
        };
        let missing = features.missing_with(|program| {
            reasons
                .get(program)
                .cloned()
                .unwrap_or_else(|| "refused by the kernel".into())
        });
        (features, missing)
    }

    fn missing_with(&self, why: impl Fn(&'static str) -> String) -> Vec<MissingFeature> {
        let mut missing = Vec::new();
        if !self.tai_clock {
            missing.push(MissingFeature {
                feature: "bpf_ktime_get_tai_ns",
                since: "6.1",
                stand_in: "CLOCK_MONOTONIC plus the CLOCK_TAI offset, re-read every interval",
                cost: "after a clock step (settimeofday, a leap second) latencies are off by \
                       the step until the next interval; no extra CPU",
                why: why("feature_tai_clock"),
            });
        }
        if !self.sk_storage {
            missing.push(MissingFeature {
                feature: "socket storage in tracing programs",
                since: "5.11",
                stand_in: "a packet's service is looked up by its socket's cgroup in a hash \
                           map, not cached on the socket",
                cost: "one hash lookup per packet of services matched by cgroup (and of \
                       auto-grouped services); beyond auto_service_limit the overflow \
                       counter counts packets, not sockets",
                why: why("feature_sk_storage"),
            });
        }
        if !self.task_storage {
            missing.push(MissingFeature {
                feature: "task storage in tracing programs",
                since: "5.11",
                stand_in: "slow-read samples carry no reader-wait split (run queue, off CPU, \
                           CPU holder); cause verdicts use the readers' /proc schedstat \
                           per interval",
                cost: "verdicts see each reader's whole interval, not each slow packet's \
                       wait; no extra CPU",
                why: why("feature_task_storage"),
            });
        }
        missing
    }
}

impl std::fmt::Display for MissingFeature {
    /// One line for logs and notes: what is missing, since when, the stand-in, its cost.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel lacks {} (since {}): {}; cost: {}",
            self.feature, self.since, self.stand_in, self.cost
        )
    }
}

impl MissingFeature {
    /// The kernel has no batched lookup for per-CPU arrays (5.10), or `forced` by
    /// `kernel_features = "baseline"`.
    pub(crate) fn batched_map_reads(forced: bool) -> MissingFeature {
        MissingFeature {
            feature: "batched lookups of per-CPU array maps",
            since: "after 5.10",
            stand_in: "the histogram map is read one entry per system call",
            cost: "one system call per service and probe every interval instead of one \
                   per batch (7 x (services + 2)): daemon CPU only, not per packet",
            why: if forced {
                BASELINE.into()
            } else {
                "BPF_MAP_LOOKUP_BATCH on the histogram map: not supported".into()
            },
        }
    }
}

/// Load (and drop) the features object with only `program`.
fn load_only(program: &str) -> Result<(), String> {
    let mut storage = MaybeUninit::uninit();
    let mut open = FeaturesSkelBuilder::default()
        .open(&mut storage)
        .map_err(|e| format!("opening the feature probes: {e}"))?;
    for mut prog in open.open_object_mut().progs_mut() {
        let on = prog.name().to_string_lossy() == program;
        prog.set_autoload(on);
    }
    // A map type the kernel lacks fails the whole load: create it only where it is probed.
    open.maps
        .feature_task_storage_map
        .set_autocreate(program == "feature_task_storage")
        .map_err(|e| format!("setting up the feature probes: {e}"))?;
    open.load().map(drop).map_err(|e| e.to_string())
}
