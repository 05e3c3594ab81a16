/* SPDX-License-Identifier: GPL-2.0-only */
/* One latency sample, as the probes hand it to record_latency() and on to capture. */
#ifndef TT_SAMPLE_BPF_H
#define TT_SAMPLE_BPF_H

#include "vmlinux.h"

/* One latency sample: where it was taken and what is known about it there. */
struct tt_sample {
	const struct sk_buff *skb; /* NULL when the probe has no skb */
	const struct sock *sk; /* NULL before socket lookup */
	__u64 stamp_ns;
	__u32 probe;
	__u16 local_port; /* host order; 0 when unknown */
	__u8 clock;
	bool process_context;
	/* A packet leaving the host (send probes): receive-side filters and fields skip it. */
	bool send;
	/* tcp-socket-read: check head-of-line blocking of a read ending at read_end_seq on a
	 * socket whose rcv_ooopack is ooopack (read by the probe, which knows how to read it
	 * cheaply there) */
	bool tcp_read;
	__u32 ooopack;
	__u32 read_end_seq;
	/* A probe without the skb: the hardware stamp it found (0: none, or look in skb) and
	 * the device it came in on, for hw_stamp_origin (nic_stamp.bpf.h). */
	__u64 hw_stamp_ns;
	__u32 hw_ifindex;
	/* Send side: the sending process (tgid) when its send call was seen; 0: unknown. */
	__u32 sender_pid;
};

#endif /* TT_SAMPLE_BPF_H */
