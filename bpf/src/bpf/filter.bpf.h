/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * netstacklat's filters. Each applies where its subject is known: pid in process context
 * (the read probes) and for a sent packet whose send call was seen (its sender), cgroup
 * and queue length where there is a socket, ifindex and network namespace from the socket
 * or the skb's device. Sampling applies everywhere.
 */
#ifndef TT_FILTER_BPF_H
#define TT_FILTER_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "cgroup.bpf.h"

const volatile bool filter_pids = false;
const volatile bool filter_cgroups = false;
const volatile bool filter_ifindexes = false;
const volatile bool filter_netns = false;
const volatile __u32 min_queue_len = 0;
const volatile __u32 sample_one_in = 0;

/* Allow-lists; max_entries set by the loader, value unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} allowed_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u8);
} allowed_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} allowed_ifindexes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u8);
} allowed_netns SEC(".maps");

/* struct inet_sock before 5.18 (CO-RE flavour: matched by name without the suffix). */
struct inet_sock___pre_5_18 {
	int rx_dst_ifindex;
} __attribute__((preserve_access_index));

static __always_inline __u32 sample_ifindex(const struct sk_buff *skb, const struct sock *sk)
{
	if (skb) {
		if (skb->dev)
			return skb->dev->ifindex;
		if (skb->skb_iif)
			return skb->skb_iif;
	}
	if (!sk)
		return 0;
	/* In struct sock since 5.18; before, inet_sock's. */
	if (bpf_core_field_exists(sk->sk_rx_dst_ifindex))
		return sk->sk_rx_dst_ifindex;
	return BPF_CORE_READ((const struct inet_sock___pre_5_18 *)sk, rx_dst_ifindex);
}

static __always_inline __u32 sample_netns(const struct sk_buff *skb, const struct sock *sk)
{
	if (sk)
		return sk->__sk_common.skc_net.net->ns.inum;
	if (skb && skb->dev)
		return skb->dev->nd_net.net->ns.inum;
	return 0;
}

/* sender: the process of a sent packet's send call when it is known (0: not known); a
 * receive sample's process is the current one, in process context only. */
static __always_inline bool filters_pass(const struct sk_buff *skb, const struct sock *sk,
					 bool process_context, __u32 sender, bool send)
{
	if (sample_one_in > 1 && bpf_get_prandom_u32() % sample_one_in)
		return false;
	if (filter_pids && (process_context || sender)) {
		__u32 tgid = sender ? sender : bpf_get_current_pid_tgid() >> 32;

		if (!bpf_map_lookup_elem(&allowed_pids, &tgid))
			return false;
	}
	if (filter_cgroups && sk) {
		__u64 id = sock_cgroup_id(sk);

		if (!bpf_map_lookup_elem(&allowed_cgroups, &id))
			return false;
	}
	if (filter_ifindexes) {
		__u32 ifindex = sample_ifindex(skb, sk);

		if (!bpf_map_lookup_elem(&allowed_ifindexes, &ifindex))
			return false;
	}
	if (filter_netns) {
		__u32 inum = sample_netns(skb, sk);

		if (!bpf_map_lookup_elem(&allowed_netns, &inum))
			return false;
	}
	/* A receive-queue filter: the send side has no such queue to compare. */
	if (min_queue_len && sk && !send && sk->sk_receive_queue.qlen < min_queue_len)
		return false;
	return true;
}

#endif /* TT_FILTER_BPF_H */
