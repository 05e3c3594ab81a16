// SPDX-License-Identifier: GPL-2.0-only
/*
 * Kernel feature probes. Each program uses one feature that kernels before 6.1 may lack;
 * the loader loads them one at a time (never attaches them) and tells the probes, through
 * read-only flags, which stand-ins to use. A rejected load here means the feature is
 * missing; probes.bpf.c then never reaches the code that needs it, so the verifier of an
 * older kernel does not see it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";

__u64 feature_word;

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} feature_sk_storage_map SEC(".maps");

/* bpf_ktime_get_tai_ns: 6.1. */
SEC("tp_btf/netif_receive_skb")
int BPF_PROG(feature_tai_clock, struct sk_buff *skb)
{
	feature_word = bpf_ktime_get_tai_ns();
	return 0;
}

/* Socket storage from a tracing program: 5.11. */
SEC("tp_btf/netif_receive_skb")
int BPF_PROG(feature_sk_storage, struct sk_buff *skb)
{
	struct sock *sk = skb->sk;

	if (sk)
		bpf_sk_storage_get(&feature_sk_storage_map, sk, 0, 0);
	return 0;
}

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} feature_task_storage_map SEC(".maps");

/* Task storage from a tracing program: 5.11. The map itself is created only for this
 * program's trial load (a 5.10 kernel refuses the map type outright). */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(feature_task_storage, struct task_struct *p)
{
	bpf_task_storage_get(&feature_task_storage_map, p, 0, 0);
	return 0;
}
