/* SPDX-License-Identifier: GPL-2.0-only */
/* record_latency() and record_measured(): every probe's sample, the receive side's and
 * the send side's, goes through them. */
#ifndef TT_RECORD_BPF_H
#define TT_RECORD_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "tailtrap.h"
#include "counter.bpf.h"
#include "hist.bpf.h"
#include "clock.bpf.h"
#include "sample.bpf.h"
#include "service.bpf.h"
#include "filter.bpf.h"
#include "hol.bpf.h"
#include "capture.bpf.h"
#include "nic_stamp.bpf.h"

/* A sample already filtered, timed and attributed: into its histogram (unless a
 * head-of-line suspect) and offered to capture. now_tai: 0 when no TAI reading was made. */
static __always_inline void record_measured(const struct tt_sample *s, __u32 service,
					    __u64 latency_ns, bool hol_suspect, __u64 now_tai)
{
	if (!hol_suspect)
		hist_add(service, s->probe, latency_ns);
	capture_sample(s, service, latency_ns, hol_suspect, now_tai);
}

/*
 * The one place a receive sample is filtered, timed, attributed, added to a histogram and
 * offered to capture (the send side, which times two intervals per packet, filters and
 * attributes once and calls record_measured for each). Head-of-line suspects stay out of
 * the histograms but armed capture records them, flagged.
 */
static __always_inline void record_latency(const struct tt_sample *s)
{
	bool hol_suspect = false;
	__u64 latency_ns, now_tai, stamp = s->stamp_ns;
	__u32 service;

	if (!filters_pass(s->skb, s->sk, s->process_context, 0, s->send))
		return;
	/* A receive stamp (REALTIME) moves back to the NIC's stamp with hw_stamp_origin: the
	 * read-only switch first, so the verifier drops the rest when it is off. */
	if (hw_stamp_origin && stamp && s->clock == TT_CLOCK_REALTIME && !s->send)
		stamp = nic_origin(s->skb, s->hw_stamp_ns, s->hw_ifindex, stamp);
	/* Timed first: a read without a usable stamp counts as that, not as head-of-line, so
	 * each sample lands in exactly one of a histogram and the counters. */
	if (!latency_since(stamp, s->clock, &latency_ns, &now_tai))
		return;
	if (s->tcp_read && s->sk && tcp_read_hol_blocked(s->sk, s->ooopack, s->read_end_seq)) {
		count_event(TT_COUNTER_HOL_EXCLUDED);
		if (!capture_mode)
			return;
		hol_suspect = true;
	}
	service = s->sk ? service_of_sock(s->sk) : service_of_port(s->local_port);
	record_measured(s, service, latency_ns, hol_suspect, now_tai);
}

#endif /* TT_RECORD_BPF_H */
