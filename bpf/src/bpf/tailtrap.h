/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Types and constants shared by the BPF programs and the Rust loader. Rust sees them
 * through the skeleton's generated `types` module, never through hand-written mirrors.
 * Only __u32/__u64 here: this header is also compiled for the host by the bucket test.
 */
#ifndef TAILTRAP_H
#define TAILTRAP_H

/* The log-linear bucket scheme of detector::hist (272 buckets, 8 per power of two). */
#define TT_NUM_BUCKETS 272
#define TT_MAX_BUCKET (TT_NUM_BUCKETS - 1)

/* Probe ids: the numbering of detector::Probe::id(). */
enum tt_probe {
	TT_PROBE_IP_START = 0,
	TT_PROBE_TCP_START = 1,
	TT_PROBE_UDP_START = 2,
	TT_PROBE_TCP_SOCKET_ENQUEUED = 3,
	TT_PROBE_UDP_SOCKET_ENQUEUED = 4,
	TT_PROBE_TCP_SOCKET_READ = 5,
	TT_PROBE_UDP_SOCKET_READ = 6,
	TT_NUM_PROBES = 7,
};

/* Service slots: the catch-alls first, then configured or auto-grouped services. */
enum tt_service_slot {
	TT_SERVICE_HOST = 0,
	TT_SERVICE_OTHER = 1,
	TT_SERVICE_FIRST = 2,
};

/* Event counters (per-CPU array index). */
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
	TT_NUM_COUNTERS = 5,
};

/* Key of the histogram map: one histogram per (service slot, probe). */
struct tt_hist_key {
	__u32 service;
	__u32 probe;
};

/* One histogram; the count is the sum of the buckets. */
struct tt_hist {
	__u64 buckets[TT_NUM_BUCKETS];
	__u64 sum_ns;
};

#endif /* TAILTRAP_H */
