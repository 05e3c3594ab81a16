/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * A socket's cgroup (sk->sk_cgrp_data), on both of its layouts. Since 5.15 it is a plain
 * pointer; before, a u64 that holds the pointer unless cgroup v1's net_prio/net_cls tagged
 * it (low bits set) or it was never set, both meaning the root cgroup. CO-RE picks the
 * layout at load.
 */
#ifndef TT_CGROUP_BPF_H
#define TT_CGROUP_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

/* kernfs id of every cgroup2 hierarchy's root. */
#define TT_ROOT_CGROUP_ID 1

struct sock_cgroup_data___pre_5_15 {
	__u64 val;
} __attribute__((preserve_access_index));

struct sock___pre_5_15 {
	struct sock_cgroup_data___pre_5_15 sk_cgrp_data;
} __attribute__((preserve_access_index));

static __always_inline bool sock_cgroup_is_pointer(const struct sock *sk)
{
	return bpf_core_field_exists(sk->sk_cgrp_data.cgroup);
}

/* The socket's cgroup; NULL on the old layout when it is the root (see above). Walk it with
 * BPF_CORE_READ only: on the old layout it is not a typed pointer to the verifier. */
static __always_inline struct cgroup *sock_cgroup(const struct sock *sk)
{
	__u64 v;

	if (sock_cgroup_is_pointer(sk))
		return sk->sk_cgrp_data.cgroup;
	v = BPF_CORE_READ((const struct sock___pre_5_15 *)sk, sk_cgrp_data.val);
	return (v & 3) ? NULL : (struct cgroup *)(unsigned long)v;
}

/* The kernfs id of the socket's cgroup, as user space reads it from the cgroup's directory
 * (0: no cgroup, on the new layout only). */
static __always_inline __u64 sock_cgroup_id(const struct sock *sk)
{
	struct cgroup *cg;

	if (sock_cgroup_is_pointer(sk)) {
		cg = sk->sk_cgrp_data.cgroup;
		return cg ? cg->kn->id : 0;
	}
	cg = sock_cgroup(sk);
	return cg ? BPF_CORE_READ(cg, kn, id) : TT_ROOT_CGROUP_ID;
}

#endif /* TT_CGROUP_BPF_H */
