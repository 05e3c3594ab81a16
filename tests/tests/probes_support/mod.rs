//! Shared by the probe tests (`probes_*.rs`): loading the probes the way the agent does,
//! checking the attach method the environment expects, and reading snapshots.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bpf::{AttachMethod, ProbeConfig, ProbeSet, ServiceSpec, Snapshot};
use model::{Histogram, Probe};
use tailtrap_tests::{expected_attach, Cgroup, ClientOpts, Netns, Proto, ServerOpts};

/// RX timestamping is switched on from a kernel workqueue after the socket asks for it.
const TIMESTAMPING_SETTLE: Duration = Duration::from_millis(300);

/// Loads the probes, checks the attach methods against `TAILTRAP_EXPECT_ATTACH`, and waits
/// until received packets carry timestamps.
pub fn load(config: &ProbeConfig) -> ProbeSet {
    let set = ProbeSet::load(config, &mut |_| {}).expect("loading the probes");
    check_expected_attach(&set);
    std::thread::sleep(TIMESTAMPING_SETTLE);
    set
}

/// With `TAILTRAP_EXPECT_ATTACH=fentry` (stock kernels under qemu) every enabled probe
/// with kernel functions must use fentry/fexit; with `tp_btf`, every attached probe must
/// use tp_btf.
pub fn check_expected_attach(set: &ProbeSet) {
    let Some(expected) = expected_attach() else {
        return;
    };
    for a in set.attachments() {
        // A probe no kernel function marks (qdisc-sojourn) is tp_btf on every kernel.
        let expected = if a.probe.hooks().functions.is_empty() {
            "tp_btf"
        } else {
            expected.as_str()
        };
        match (&a.method, expected) {
            // send-to-qdisc refuses kernels before 5.12 whatever they allow (docs/probes.md).
            (AttachMethod::Unavailable { reason }, _) if reason.contains("kernels before 5.12") => {
            }
            // nic-to-stack has no programs of its own: ip-start's measure it.
            (AttachMethod::Disabled | AttachMethod::Within { .. }, _)
            | (AttachMethod::Fentry { .. }, "fentry")
            | (AttachMethod::TpBtf { .. }, "tp_btf")
            | (AttachMethod::Unavailable { .. }, "tp_btf") => {}
            (method, _) => panic!(
                "{}: attached as {method}, but TAILTRAP_EXPECT_ATTACH={expected}",
                a.probe
            ),
        }
    }
}

/// Probes attached with some method.
pub fn attached(set: &ProbeSet) -> Vec<Probe> {
    set.attachments()
        .iter()
        .filter(|a| {
            matches!(
                a.method,
                AttachMethod::Fentry { .. } | AttachMethod::TpBtf { .. }
            )
        })
        .map(|a| a.probe)
        .collect()
}

/// The histogram of `service` at `probe`, empty when it has none.
pub fn hist(snapshot: &Snapshot, service: &str, probe: Probe) -> Histogram {
    snapshot
        .hists
        .iter()
        .find(|h| h.service == service && h.probe == probe)
        .map(|h| h.hist.clone())
        .unwrap_or_default()
}

/// All services' histograms at `probe`, merged.
pub fn all_services(snapshot: &Snapshot, probe: Probe) -> Histogram {
    let mut total = Histogram::new();
    for h in snapshot.hists.iter().filter(|h| h.probe == probe) {
        total.merge(&h.hist);
    }
    total
}

/// A configured service.
pub fn service(name: &str, cgroup: Option<&Cgroup>, ports: &[u16]) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        cgroup: cgroup.map(|c| PathBuf::from(c.rel_path())),
        ports: ports.to_vec(),
    }
}

/// Server options.
pub fn server<'a>(
    bind: SocketAddr,
    netns: Option<&'a Netns>,
    cgroup: Option<&'a Cgroup>,
    read_delay: Duration,
) -> ServerOpts<'a> {
    ServerOpts {
        bind,
        netns,
        cgroup,
        read_delay,
    }
}

/// A client sending `messages` 200-byte messages back to back (each after the last echo).
pub fn client(
    target: SocketAddr,
    netns: Option<&Netns>,
    proto: Proto,
    messages: u32,
) -> ClientOpts<'_> {
    ClientOpts {
        netns,
        size: 200,
        ..ClientOpts::new(target, proto, messages)
    }
}

/// ns in a quantile estimate, for messages.
pub fn q(h: &Histogram, q: f64) -> model::hist::QuantileEstimate {
    h.quantile(q).expect("histogram has samples")
}
