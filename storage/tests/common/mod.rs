//! Helpers shared by the storage integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::net::{IpAddr, Ipv4Addr};

use capture::sample::{Comm, Flow, Sample, SampleFlags, SocketQueue, Transport};
use detector::Probe;
use storage::NewIncident;

pub const T0: u64 = 1_790_000_000_000_000_000;
pub const SEC: u64 = 1_000_000_000;

pub fn new_incident(service: &str, opened_ns: u64) -> NewIncident {
    NewIncident {
        service: service.to_string(),
        probes: vec![Probe::TcpSocketRead],
        opened_ns,
        evidence_json: r#"{"quantile":0.99,"observed_ns":21000000}"#.to_string(),
        stages_json: r#"{"stage":"application-read"}"#.to_string(),
    }
}

/// A sample whose fields vary with `i` so filters and summaries have something to tell.
pub fn sample(incident: u64, i: u64, time_ns: u64) -> Sample {
    Sample {
        time_ns,
        incident,
        probe: if i % 4 == 0 {
            Probe::TcpSocketEnqueued
        } else {
            Probe::TcpSocketRead
        },
        latency_ns: 1_000_000 + (i % 100) * 100_000,
        flow: Flow {
            transport: Transport::Tcp,
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, (i % 5) as u8 + 1)),
            sport: 40_000 + (i % 7) as u16,
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)),
            dport: 8080,
        },
        cgroup_id: 77,
        pid: Some(1000 + (i % 3) as u32),
        comm: Comm::from_kernel(b"server\0"),
        cpu: (i % 2) as u32,
        ifindex: 2,
        netns_ino: 4026531840,
        skb_len: 1448,
        socket_queue: Some(SocketQueue {
            bytes: 2896,
            skbs: 2,
            rmem_alloc: 4608,
            rcvbuf: 131072,
        }),
        tcp_seq: Some(i as u32),
        flags: if i < 10 {
            SampleFlags::PRE_TRIGGER
        } else {
            SampleFlags::empty()
        },
    }
}
