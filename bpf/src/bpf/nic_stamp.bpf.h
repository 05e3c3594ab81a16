/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * nic-to-stack: from the NIC's hardware RX stamp to the kernel's software stamp, for the
 * packets a device stamped. Measured by ip-start's programs, which already hold the skb.
 *
 * A hardware stamp is in the device's PTP clock (PHC), not the system's. The daemon reads
 * each stamping device's PHC offset every interval and writes it to nic_clocks, with every
 * other device that has a PHC marked unusable; a stamp from an unusable clock is counted
 * and skipped, and so is a converted stamp outside the bounds below, so mixed clocks
 * never become latencies. A device without an entry has no PHC: a packet a NIC stamped
 * that reaches the stack again through a veth or tunnel is timed only where it came in.
 *
 * [probes] hw_stamp_origin: every receive stage is then measured from the converted
 * hardware stamp instead of the software stamp, for packets that carry one (nic_origin).
 */
#ifndef TT_NIC_STAMP_BPF_H
#define TT_NIC_STAMP_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "tailtrap.h"
#include "counter.bpf.h"

/* A converted stamp more than this before the software stamp is taken as a wrong clock
 * (a PHC stepped since its offset was read), not as a packet that waited. */
#define TT_NIC_MAX_LATENCY_NS (10ULL * 1000 * 1000 * 1000)

/* Set by the loader: the stage runs (ip-start runs and nic-to-stack is not switched off). */
const volatile bool nic_to_stack_on = false;
/* Set by the loader: receive stages start at the hardware stamp where there is one. */
const volatile bool hw_stamp_origin = false;
/* Entries in nic_clocks, written by the daemon with them: while 0 (no device stamps, the
 * usual case) the stage costs ip-start one load and a compare. */
volatile __u32 nic_clocks_live;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TT_NIC_CLOCKS_MAX);
	__type(key, __u32); /* ifindex */
	__type(value, struct tt_nic_clock);
} nic_clocks SEC(".maps");

enum tt_nic_verdict {
	TT_NIC_TIMED = 0,
	/* The converted stamp lies after the software stamp by more than the offset's
	 * uncertainty, or more than TT_NIC_MAX_LATENCY_NS before it. */
	TT_NIC_OUT_OF_BOUNDS = 1,
};

/*
 * The time from a hardware stamp (PHC ns) to a software stamp (CLOCK_REALTIME ns) through
 * the device's offset. A converted stamp up to the offset's uncertainty after the software
 * stamp is a packet that took no measurable time (0); beyond that, the clocks disagree.
 * Pure, so the bpf-reference crate's test runs it in the kernel on recorded offsets.
 */
static __always_inline enum tt_nic_verdict nic_stamp_latency(__u64 hw_ns, __u64 sw_ns,
							     const struct tt_nic_clock *clock,
							     __u64 *latency_ns)
{
	/* sw - (hw + offset), signed: either stamp may be the later one. Both are below 2^63
	 * (ns since 1970 or since the PHC's start), so the differences cannot wrap. */
	__s64 d = (__s64)(sw_ns - hw_ns) - clock->offset_ns;

	if (d < -(__s64)clock->uncertainty_ns || d > (__s64)TT_NIC_MAX_LATENCY_NS)
		return TT_NIC_OUT_OF_BOUNDS;
	*latency_ns = d > 0 ? d : 0;
	return TT_NIC_TIMED;
}

/* Whether a probe without the skb should look for the hardware stamp elsewhere (the read
 * probe's copy of it): only when it would be used. */
static __always_inline bool nic_origin_wanted(void)
{
	return hw_stamp_origin && nic_to_stack_on && nic_clocks_live;
}

/* The skb's hardware RX stamp (skb_hwtstamps(skb)->hwtstamp), 0 when none. The shared
 * info sits at head + end; the union's first member is the stamp on every kernel. */
static __always_inline __u64 skb_hw_stamp(const struct sk_buff *skb)
{
	const struct skb_shared_info *shinfo;
	unsigned char *head = BPF_CORE_READ(skb, head);
	__u64 end = BPF_CORE_READ(skb, end);

	shinfo = (const void *)(head + end);
	return BPF_CORE_READ(shinfo, hwtstamps.hwtstamp);
}

/* The time from hardware stamp hw of device ifindex to software stamp sw_ns: false when
 * the device has no PHC, or its clock is unusable or the stamp out of bounds (the last
 * two counted when `count`: once per packet, by nic-to-stack). */
static __always_inline bool nic_stamp_time(__u64 hw, __u32 ifindex, __u64 sw_ns,
					   __u64 *latency_ns, bool count)
{
	const struct tt_nic_clock *clock = bpf_map_lookup_elem(&nic_clocks, &ifindex);

	if (!clock)
		return false;
	if (!clock->usable) {
		if (count)
			count_event(TT_COUNTER_NIC_STAMP_NO_CLOCK);
		return false;
	}
	if (nic_stamp_latency(hw, sw_ns, clock, latency_ns) != TT_NIC_TIMED) {
		if (count)
			count_event(TT_COUNTER_NIC_STAMP_OUT_OF_BOUNDS);
		return false;
	}
	return true;
}

/*
 * The packet's nic-to-stack time: false (nothing to record) when the stage is off, no
 * device stamps, the packet carries no hardware stamp, or its stamp cannot be trusted
 * (counted). sw_ns is the software stamp, CLOCK_REALTIME.
 */
static __always_inline bool nic_to_stack(const struct sk_buff *skb, __u64 sw_ns,
					 __u64 *latency_ns)
{
	__u64 hw;

	if (!nic_to_stack_on || !nic_clocks_live)
		return false;
	hw = skb_hw_stamp(skb);
	if (!hw)
		return false;
	/* The device the stamp came from: at ip-start skb->dev is still the receiving one
	 * (a VLAN's or bond's upper device once they took it; the daemon keys those too
	 * when they report the lower device's clock). */
	return nic_stamp_time(hw, BPF_CORE_READ(skb, dev, ifindex), sw_ns, latency_ns, true);
}

/*
 * With hw_stamp_origin: the origin a receive stage is measured from, the software stamp
 * sw_ns moved back by the packet's nic-to-stack time when it has a usable hardware stamp;
 * else sw_ns. hw and ifindex: the stamp and its device as the probe knows them (hw 0:
 * read them from skb, which came in on skb_iif, or skb->dev before the core set that).
 */
static __always_inline __u64 nic_origin(const struct sk_buff *skb, __u64 hw, __u32 ifindex,
					__u64 sw_ns)
{
	__u64 nic_ns;

	if (!nic_origin_wanted())
		return sw_ns;
	if (!hw && skb) {
		hw = skb_hw_stamp(skb);
		ifindex = BPF_CORE_READ(skb, skb_iif);
		if (!ifindex)
			ifindex = BPF_CORE_READ(skb, dev, ifindex);
	}
	if (!hw || !nic_stamp_time(hw, ifindex, sw_ns, &nic_ns, false))
		return sw_ns;
	return sw_ns - nic_ns;
}

#endif /* TT_NIC_STAMP_BPF_H */
