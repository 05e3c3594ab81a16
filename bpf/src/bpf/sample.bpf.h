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
	/* tcp-socket-read: check head-of-line blocking of a read ending at read_end_seq on tp,
	 * the socket as a tcp_sock (NULL elsewhere); tp_typed when tp is the verifier's
	 * tcp_sock (from bpf_skc_to_tcp_sock: plain loads) and not just the sock cast. */
	const struct tcp_sock *tp;
	bool tp_typed;
	__u32 read_end_seq;
};

#endif /* TT_SAMPLE_BPF_H */
