/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A receive stamp for packets that arrive with their sender's delivery time. TCP over
 * a veth (so every pod's TCP), like loopback TCP, keeps the sender's MONOTONIC departure time in
 * skb->tstamp, and the kernel takes no receive stamp at netif_rx because one is "already
 * there"; it replaces it only in ip_local_deliver_finish. ip-start could not measure such
 * packets, so the "driver and softirq" stage of container traffic was never seen.
 *
 * netif_rx is where such a packet enters the receive path (the veth transmit hands it to
 * the CPU's backlog there): this hook notes the time, keyed by the skb and
 * checked against the sender's stamp, and ip-start measures from it. Only non-loopback
 * packets with a delivery time pay (one LRU update here, one lookup and delete at
 * ip-start); any other packet leaves after a few loads and compares. veth in NAPI mode (XDP or GRO on the
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
	/* The sender's stamp the packet carried: a reused skb address never matches. */
	__u64 delivery_ns;
	/* CLOCK_MONOTONIC at netif_rx. */
	__u64 stamp_ns;
};

/* Packets between netif_rx and ip-start: at most the CPUs' backlogs (netdev_max_backlog,
 * 1000 per CPU by default); an entry of a packet dropped on the way is evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct tt_first_stamp);
} first_stamps SEC(".maps");

/* Loopback TCP is left as it was: a host's local traffic can be its busiest, the time it
 * waits in the backlog is rarely the question, and it would pay a map update and delete
 * per segment. */
static __always_inline bool from_loopback(const struct sk_buff *skb)
{
	const struct net_device *dev = skb->dev;

	return dev && (dev->flags & IFF_LOOPBACK);
}

SEC("tp_btf/netif_rx")
int BPF_PROG(first_hook_stamp, struct sk_buff *skb)
{
	struct tt_first_stamp v;
	__u64 key;

	v.delivery_ns = skb->tstamp;
	if (!v.delivery_ns || skb_clock(skb) == TT_CLOCK_REALTIME || from_loopback(skb))
		return 0;
	v.stamp_ns = bpf_ktime_get_ns();
	key = (__u64)(unsigned long)skb;
	bpf_map_update_elem(&first_stamps, &key, &v, BPF_ANY);
	return 0;
}

/* The stamp netif_rx took for this packet (MONOTONIC), if it did; taken once. */
static __always_inline bool first_stamp_of(const struct sk_buff *skb, __u64 delivery_ns,
					   __u64 *stamp_ns)
{
	__u64 key = (__u64)(unsigned long)skb;
	struct tt_first_stamp *v;
	bool same;

	if (!first_hook_stamps || from_loopback(skb))
		return false;
	v = bpf_map_lookup_elem(&first_stamps, &key);
	if (!v)
		return false;
	same = v->delivery_ns == delivery_ns;
	*stamp_ns = v->stamp_ns;
	bpf_map_delete_elem(&first_stamps, &key);
	return same;
}

#endif /* TT_FIRST_STAMP_BPF_H */
