/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Types and constants shared by the BPF programs and the Rust loader. Rust sees them
 * through the skeleton's generated `types` module, never through hand-written mirrors.
 * Only linux/types.h types here: this header is also compiled for the host by the bucket
 * test.
 */
#ifndef TAILTRAP_H
#define TAILTRAP_H

/* The log-linear bucket scheme of model::hist (272 buckets, 8 per power of two). */
#define TT_NUM_BUCKETS 272
#define TT_MAX_BUCKET (TT_NUM_BUCKETS - 1)

/* Probe ids: the numbering of model::Probe::id(). */
enum tt_probe {
	TT_PROBE_IP_START = 0,
	TT_PROBE_TCP_START = 1,
	TT_PROBE_UDP_START = 2,
	TT_PROBE_TCP_SOCKET_ENQUEUED = 3,
	TT_PROBE_UDP_SOCKET_ENQUEUED = 4,
	TT_PROBE_TCP_SOCKET_READ = 5,
	TT_PROBE_UDP_SOCKET_READ = 6,
	TT_PROBE_SEND_TO_QDISC = 7,
	TT_PROBE_QDISC_SOJOURN = 8,
	TT_PROBE_NIC_TO_STACK = 9,
	TT_PROBE_DRIVER_TO_COMPLETION = 10,
	TT_NUM_PROBES = 11,
};

/* Service slots: the catch-alls first, then configured or auto-grouped services. */
enum tt_service_slot {
	TT_SERVICE_HOST = 0,
	TT_SERVICE_OTHER = 1,
	TT_SERVICE_FIRST = 2,
};

/* Event counters: indexes of the one per-CPU counter array (counter.bpf.h). */
enum tt_counter {
	/* A sample found the histogram map full: dropped. */
	TT_COUNTER_MAP_FULL = 0,
	/* skb had no timestamp (RX timestamping off when it arrived). */
	TT_COUNTER_ZERO_TSTAMP = 1,
	/* Timestamp later than now in its clock: skipped. */
	TT_COUNTER_FUTURE_TSTAMP = 2,
	/* tcp-socket-read sample skipped as head-of-line blocked. */
	TT_COUNTER_HOL_EXCLUDED = 3,
	/* A sample went to "other" because the auto-service limit was reached. */
	TT_COUNTER_AUTO_OVERFLOW = 4,
	/* Capture (capture.bpf.h): records emitted, lost to a full ring, held back by the
	 * rate limit; for armed capture and for the flight recorder. */
	TT_CAPTURE_ARMED_EMITTED = 5,
	TT_CAPTURE_ARMED_RING_FULL = 6,
	TT_CAPTURE_ARMED_RATE_LIMITED = 7,
	TT_CAPTURE_FLIGHT_EMITTED = 8,
	TT_CAPTURE_FLIGHT_RING_FULL = 9,
	TT_CAPTURE_FLIGHT_RATE_LIMITED = 10,
	/* nic-to-stack (nic_stamp.bpf.h): a hardware stamp from a device whose clock offset
	 * the daemon does not hold (not stamping by its last look, or its offset read
	 * failed); a converted stamp too far after the software stamp or over 10 s before
	 * it. Both skipped, never timed. */
	TT_COUNTER_NIC_STAMP_NO_CLOCK = 11,
	TT_COUNTER_NIC_STAMP_OUT_OF_BOUNDS = 12,
	TT_NUM_COUNTERS = 13,
};

/* ---- driver-to-completion per device (send.bpf.h) ---- */

enum tt_device_limit {
	/* Devices with a driver-to-completion histogram of their own; a transmit on one more
	 * is timed for its service only and counted as a map-full drop. */
	TT_COMPLETION_DEVICES_MAX = 32,
};

/* A device: ifindexes are per network namespace (a NIC's virtual function moved into a
 * container's namespace can share its number with one of the host's). */
struct tt_device_key {
	__u32 ifindex;
	__u32 netns; /* the namespace's inode number */
};

/* ---- NIC hardware RX stamps (nic_stamp.bpf.h) ---- */

enum tt_nic_limit {
	/* Devices whose clock offset the probes can hold at once. */
	TT_NIC_CLOCKS_MAX = 64,
};

/* One device's clock, keyed by ifindex in nic_clocks: written by the daemon each interval
 * for every device with a PTP hardware clock. */
struct tt_nic_clock {
	/* CLOCK_REALTIME minus the device's PHC, ns: a hardware stamp plus this is REALTIME. */
	__s64 offset_ns;
	/* How far the offset may be off (half the narrowest read bracket), ns; at least 1. */
	__u64 uncertainty_ns;
	/* 1: the offset was read this interval and the device stamps; 0: its stamps are
	 * counted and skipped (stamping off by the daemon's last look, or the read failed). */
	__u32 usable;
	__u32 pad;
};

/* One histogram; the count is the sum of the buckets. */
struct tt_hist {
	__u64 buckets[TT_NUM_BUCKETS];
	__u64 sum_ns;
};

/* ---- In-kernel capture of slow SKBs (capture.bpf.h) ---- */

/* An enum, not a #define, so that Rust reads the limit from the skeleton's BTF. */
enum tt_capture_limit {
	/* Service slots that can be armed; later slots are never captured. */
	TT_CAPTURE_MAX_SLOTS = 1024,
};

/* Bits of capture_mode: which kinds of capture have thresholds set. */
enum tt_capture_mode {
	TT_CAPTURE_MODE_ARMED = 1,
	TT_CAPTURE_MODE_FLIGHT = 2,
};

/* Bits of tt_capture_record.flags. */
enum tt_capture_flag {
	/* Emitted by the flight recorder, not by armed capture. */
	TT_CAPTURE_F_FLIGHT = 1,
	/* tcp-socket-read only: the read may have waited behind a lost segment. */
	TT_CAPTURE_F_HOL_SUSPECT = 2,
	/* The probe ran in the reading process's context: pid and comm are set. */
	TT_CAPTURE_F_PROCESS = 4,
	/* A socket was known: the queue fields and the cgroup id are set. */
	TT_CAPTURE_F_SOCKET = 8,
	/* tcp_seq is set. */
	TT_CAPTURE_F_TCP_SEQ = 16,
	/* Armed capture kept one slow SKB in N (N > 1). */
	TT_CAPTURE_F_SUBSAMPLED = 32,
	/* Not in a process's context: the CPU's ksoftirqd thread ran the receive softirq (work
	 * deferred from interrupt exit), not the task an interrupt happened to hit. */
	TT_CAPTURE_F_KSOFTIRQD = 64,
	/* Socket reads under armed capture: runq_ns and off_cpu_ns split the wait
	 * (reader_wait.bpf.h). */
	TT_CAPTURE_F_READER_WAIT = 128,
	/* holder_pid and holder_comm are set. */
	TT_CAPTURE_F_CPU_HOLDER = 256,
	/* The skb carries a recorded RX queue: rx_queue is set. */
	TT_CAPTURE_F_RX_QUEUE = 512,
	/* Send side: pid is the sending process's, noted in its send call (the record is
	 * made at the driver's transmit, in whatever context that runs); comm is not set. */
	TT_CAPTURE_F_SENDER = 1024,
};

/* Thresholds of one (service slot, probe); 0 means that kind of capture is off. */
struct tt_capture_threshold {
	__u64 armed_ns;
	__u64 flight_ns;
};

/* One slow SKB, as the ring buffer delivers it. Addresses in network order, ports in host
 * order; IPv4 addresses in the first 4 bytes. src is the remote peer, dst the local end. */
struct tt_capture_record {
	__u64 time_ns; /* CLOCK_REALTIME */
	__u64 latency_ns;
	__u64 cgroup_id;
	__u32 probe;
	__u32 service;
	__u32 pid; /* tgid */
	__u32 cpu;
	__u32 ifindex;
	__u32 netns_ino;
	__u32 skb_len;
	__u32 queue_skbs;
	__u32 queue_bytes;
	__u32 rmem_alloc;
	__u32 rcvbuf;
	__u32 tcp_seq;
	__u32 flags;
	__u16 sport;
	__u16 dport;
	__u8 family; /* AF_INET, AF_INET6, or 0 when unknown */
	__u8 ip_proto;
	/* The RX queue the receiving driver recorded in the skb (skb_record_rx_queue:
	 * queue_mapping is the queue + 1, 0 when none was recorded), with
	 * TT_CAPTURE_F_RX_QUEUE. */
	__u16 rx_queue;
	__u8 saddr[16];
	__u8 daddr[16];
	__u8 comm[16];
	/* The skb's address (pwru's `skb`, for joining its trace); 0 when the probe has none. */
	__u64 skb_addr;
	/* Of the reading thread, within the packet's wait (TT_CAPTURE_F_READER_WAIT). */
	__u64 runq_ns;
	__u64 off_cpu_ns;
	/* The task that held the reader's CPU before its last run-queue wait ended
	 * (TT_CAPTURE_F_CPU_HOLDER). */
	__u32 holder_pid;
	__u32 pad2;
	__u8 holder_comm[16];
};

#endif /* TAILTRAP_H */
