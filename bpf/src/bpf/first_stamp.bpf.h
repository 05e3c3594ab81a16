/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A receive stamp for packets that arrive with their sender's delivery time. TCP over
 * a veth (so every pod's TCP), like loopback TCP, keeps the sender's MONOTONIC departure time in
 * skb->tstamp, and the kernel takes no receive stamp at netif_rx because one is "already
 * there"; it replaces it only in ip_local_deliver_finish. ip-start could not measure such
 * packets, so the "driver and softirq" stage of container traffic was never seen.
 *
 * netif_rx is where such a packet enters the receive path (the veth transmit hands it to
 * the CPU's backlog there): this hook notes the time in a per-CPU slot chosen by the skb's
 * address, with the address and the sender's stamp, and ip-start, which runs from that
 * CPU's backlog, measures from it. A per-CPU array, not a hash: no lock, no allocation, no
 * delete (an LRU hash cost about 500 ns at each end). A slot taken over by another packet
 * before ip-start, or a packet steered to another CPU (RPS), is simply not measured there;
 * address and sender's stamp must both match, so a stamp is never given to the wrong
 * packet. Only non-loopback packets with a delivery time pay; any other packet leaves
 * after a few loads and compares. veth in NAPI mode (XDP or GRO on the
 * device) bypasses netif_rx: its TCP packets stay unmeasured at ip-start.
 */
#ifndef TT_FIRST_STAMP_BPF_H
#define TT_FIRST_STAMP_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "tailtrap.h"
#include "clock.bpf.h"

/* [probes] first_hook_stamps, and ip-start attached. */
const volatile bool first_hook_stamps = false;

struct tt_first_stamp {
	__u64 skb;
	/* The sender's stamp the packet carried: a reused skb address never matches. */
	__u64 delivery_ns;
	/* CLOCK_MONOTONIC at netif_rx. */
	__u64 stamp_ns;
};

/* Slots per CPU: packets between netif_rx and ip-start wait in the CPU's backlog
 * (netdev_max_backlog, 1000 by default). A power of two: the index is masked. */
#define TT_FIRST_STAMP_SLOTS 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TT_FIRST_STAMP_SLOTS);
	__type(key, __u32);
	__type(value, struct tt_first_stamp);
} first_stamps SEC(".maps");

/* skbs are slab objects of a few hundred bytes: the address above bit 8 tells neighbours
 * apart, the higher bits spread the rest. */
static __always_inline __u32 first_stamp_slot(__u64 skb)
{
	return (__u32)((skb >> 8) ^ (skb >> 18)) & (TT_FIRST_STAMP_SLOTS - 1);
}

/* Loopback TCP is left as it was: a host's local traffic can be its busiest, the time it
 * waits in the backlog is rarely the question, and it would pay a map update and delete
 * per segment. */
static __always_inline bool from_loopback(const struct sk_buff *skb)
{
	const struct net_device *dev = skb->dev;

	return dev && (dev->flags & IFF_LOOPBACK);
}

/* Sections name only the attach kind; the loader sets the tracepoint (probes.rs). */
SEC("tp_btf")
int BPF_PROG(first_hook_stamp, struct sk_buff *skb)
{
	__u64 delivery_ns = skb->tstamp, addr = (__u64)(unsigned long)skb;
	struct tt_first_stamp *v;
	__u32 slot;

	if (!delivery_ns || skb_clock(skb) == TT_CLOCK_REALTIME || from_loopback(skb))
		return 0;
	slot = first_stamp_slot(addr);
	v = bpf_map_lookup_elem(&first_stamps, &slot);
	if (!v)
		return 0;
	v->skb = addr;
	v->delivery_ns = delivery_ns;
	v->stamp_ns = bpf_ktime_get_ns();
	return 0;
}

/* The stamp netif_rx took for this packet (MONOTONIC), if it did; taken once. */
static __always_inline bool first_stamp_of(const struct sk_buff *skb, __u64 delivery_ns,
					   __u64 *stamp_ns)
{
	__u64 addr = (__u64)(unsigned long)skb;
	struct tt_first_stamp *v;
	__u32 slot;

	if (!first_hook_stamps || from_loopback(skb))
		return false;
	slot = first_stamp_slot(addr);
	v = bpf_map_lookup_elem(&first_stamps, &slot);
	if (!v || v->skb != addr || v->delivery_ns != delivery_ns)
		return false;
	*stamp_ns = v->stamp_ns;
	v->skb = 0;
	return true;
}

#endif /* TT_FIRST_STAMP_BPF_H */
