//! Helpers for tailtrap's tests that need a real kernel: network namespaces, veth pairs with
//! IPv4 and IPv6 addresses, cgroups, and TCP/UDP traffic from a separate helper process
//! (`tailtrap-traffic`) that can be placed in a namespace and a cgroup before it opens its
//! socket.
//!
//! Everything here needs root, `ip` and `tc` (iproute2). Every object undoes itself on drop.
//! Traffic only ever goes to addresses inside namespaces these helpers created, or loopback.
//!
//! For end-to-end tests, [`Daemon`] runs the real `tailtrap run` with a test configuration
//! (logging to a file in a [`ScratchDir`]) and [`cli`] / [`cli_json`] run the CLI against it.
//! For metrics tests, [`Prometheus`] runs a real Prometheus server scraping the daemon and
//! [`http_get`] scrapes by hand. For the Helm chart and the container image, [`helm_template`],
//! [`k8s_validate`] and [`image_archive`].
//!
//! The test binaries of this crate run on the host kernel (`cargo test`) and, through
//! `tests/vm/run-vm-tests.sh`, on stock kernels under qemu; [`vm_kernel`] and
//! [`expected_attach`] tell a test where it runs, and [`require_vm`] guards the tests that
//! must run only there. Tests needing root are `#[ignore]`d (docs/testing.md has the tiers).
#![deny(missing_docs)]

mod bins;
mod cgroup;
mod cmd;
mod cpu;
mod daemon;
mod daemon_config;
mod error;
mod k8s;
mod netns;
mod otelcol;
mod proc_status;
mod prometheus;
mod traffic;
mod veth;

pub use bins::{
    expected_attach, fake_pwru, guest_nic, require_vm, tailtrap_bin, traffic_bin, vm_kernel,
};
pub use cgroup::Cgroup;
pub use cpu::{pin, CpuQuota, Hog};
pub use daemon::{
    baselines_warm, cli, cli_json, config_check, poll_until, Daemon, ScratchDir,
    SLOW_READER_DETECTOR,
};
pub use daemon_config::DaemonConfig;
pub use error::{Error, Result};
pub use k8s::{
    chart_dir, helm, helm_bin, helm_template, image_archive, k8s_tools, k8s_validate, object,
    repo_root,
};
pub use netns::Netns;
pub use otelcol::{
    any_value, attr, make_test_pki, otelcol_binary, resource_attr, OtelCollector,
    OtelCollectorOpts, OtelTls, TestPki,
};
pub use proc_status::rss_kib;
pub use prometheus::{
    find_on_path, free_port, http_get, prometheus_bin, url_encode, HttpAnswer, Prometheus,
};
pub use traffic::{
    run_client, ClientOpts, ClientStats, EchoServer, LoopingClient, Proto, ServerKind, ServerOpts,
    ServerProcess, SinkStream, TcpKind, TcpServer, UdpKind, UdpServer,
};
pub use veth::VethPair;
