/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Service attribution. Configured services match by the socket's cgroup (or an ancestor)
 * and by local port; probes before socket lookup only have the packet's local port.
 * Unmatched traffic goes to TT_SERVICE_HOST. With no services configured, sockets are
 * grouped by their own cgroup (sk->sk_cgrp_data, not the running task's) into slots handed
 * out here, up to auto_service_limit; the rest go to TT_SERVICE_OTHER. The loader fills
 * auto_free_slots with every slot, and a new cgroup pops one: the queue map is the only
 * allocator, so no atomic fetch-and-add (5.12+) is needed. User space frees the slots of
 * cgroups that are gone (see docs/probes.md): it deletes the auto_cgroups entry, bumps the
 * slot's generation and, one interval later, pushes the slot back to auto_free_slots.
 */
#ifndef TT_SERVICE_BPF_H
#define TT_SERVICE_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "tailtrap.h"
#include "counter.bpf.h"
#include "cgroup.bpf.h"

/* Deepest cgroup ancestor checked against the configured cgroups. */
#define TT_MAX_CGROUP_DEPTH 16

const volatile bool auto_services = false;
const volatile __u32 auto_service_limit = 0;
const volatile bool have_cgroup_rules = false;
const volatile bool have_port_rules = false;
/* Tracing programs may use socket storage (5.11+); set by the loader. */
const volatile bool have_sk_storage = true;

/* Configured: cgroup id -> service slot; max_entries set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u32);
} service_cgroups SEC(".maps");

/* Configured: local port (host order) -> service slot, 0 (host) where no rule names it. An
 * array indexed by port (65536 entries with port rules) so that the pre-socket probes pay an
 * inlined index, not a hash, per packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} service_ports SEC(".maps");

/* Per socket: its service slot + 1 once resolved (0: not yet) and, for auto slots, the
 * slot's generation then. A socket's cgroup and local port do not change while it
 * receives, so the cgroup walk and port lookup run once per socket instead of once per
 * sample. */
struct sock_service {
	__u32 slot_plus_1;
	__u32 gen;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_service);
} sock_services SEC(".maps");

/* Without socket storage: socket cgroup id -> the slot its cgroup rules give (host when
 * none), so that the ancestor walk runs once per cgroup. Rules do not change while loaded,
 * so an entry never goes stale; max_entries set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u32);
} cgroup_rule_slots SEC(".maps");

/* Auto-grouping: socket cgroup id -> slot, filled here; the loader reads it for names. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, __u32);
} auto_cgroups SEC(".maps");

/* Auto slots (relative to TT_SERVICE_FIRST) not in use: all of them at load, and those
 * user space freed since. */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 1);
	__type(value, __u32);
} auto_free_slots SEC(".maps");

/* Per auto slot (relative to TT_SERVICE_FIRST): its generation, bumped by user space when
 * it frees the slot. A socket's cached slot carries the generation it was resolved at, so
 * a socket that outlives its cgroup stops counting to a slot once it is freed, before the
 * slot can go to another cgroup. An array lookup is inlined: a load on the hot path. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} auto_slot_gen SEC(".maps");

static __always_inline __u32 service_of_port(__u16 port)
{
	__u32 key = port, *slot;

	if (!have_port_rules || !port)
		return TT_SERVICE_HOST;
	slot = bpf_map_lookup_elem(&service_ports, &key);
	/* Unset entries are 0, TT_SERVICE_HOST. */
	return slot ? *slot : TT_SERVICE_HOST;
}

/* The configured service whose cgroup is the socket's cgroup or its nearest ancestor. */
static __always_inline __u32 service_of_cgroup(const struct sock *sk)
{
	struct cgroup *cg = sock_cgroup(sk);

	for (int depth = 0; depth < TT_MAX_CGROUP_DEPTH && cg; depth++) {
		/* Probe reads: the verifier types the parent as a css, not the cgroup it is. */
		__u64 id = BPF_CORE_READ(cg, kn, id);
		__u32 *slot = bpf_map_lookup_elem(&service_cgroups, &id);

		if (slot)
			return *slot;
		/* css "self" is the first member of struct cgroup. */
		cg = (struct cgroup *)BPF_CORE_READ(cg, self.parent);
	}
	return TT_SERVICE_HOST;
}

static __always_inline __u32 auto_service(const struct sock *sk)
{
	__u64 id = sock_cgroup_id(sk);
	__u32 *known, slot;

	if (!id)
		return TT_SERVICE_HOST;
	known = bpf_map_lookup_elem(&auto_cgroups, &id);
	if (known)
		return *known;
	if (bpf_map_pop_elem(&auto_free_slots, &slot)) {
		count_event(TT_COUNTER_AUTO_OVERFLOW);
		return TT_SERVICE_OTHER;
	}
	slot += TT_SERVICE_FIRST;
	if (bpf_map_update_elem(&auto_cgroups, &id, &slot, BPF_NOEXIST)) {
		/* Another CPU registered this cgroup first: use its slot and hand ours back. */
		slot -= TT_SERVICE_FIRST;
		bpf_map_push_elem(&auto_free_slots, &slot, 0);
		known = bpf_map_lookup_elem(&auto_cgroups, &id);
		return known ? *known : TT_SERVICE_OTHER;
	}
	return slot;
}

/* The generation of an auto slot now (0 for host, other and slots out of range). */
static __always_inline __u32 auto_generation(__u32 slot)
{
	__u32 index = slot - TT_SERVICE_FIRST, *gen;

	if (!auto_services || slot < TT_SERVICE_FIRST)
		return 0;
	gen = bpf_map_lookup_elem(&auto_slot_gen, &index);
	return gen ? *gen : 0;
}

static __always_inline __u32 resolve_service_of_sock(const struct sock *sk)
{
	__u32 slot;

	if (auto_services)
		return auto_service(sk);
	if (have_cgroup_rules) {
		slot = service_of_cgroup(sk);
		if (slot != TT_SERVICE_HOST)
			return slot;
	}
	return service_of_port(sk->__sk_common.skc_num);
}

/* The stand-in for the socket cache before 5.11: a lookup per packet keyed by the
 * socket's cgroup. Auto-grouping's own map is keyed that way already. */
static __always_inline __u32 service_of_sock_by_cgroup(const struct sock *sk)
{
	__u64 id;
	__u32 *known, slot;

	if (auto_services)
		return auto_service(sk);
	id = sock_cgroup_id(sk);
	known = bpf_map_lookup_elem(&cgroup_rule_slots, &id);
	if (known) {
		slot = *known;
	} else {
		slot = service_of_cgroup(sk);
		bpf_map_update_elem(&cgroup_rule_slots, &id, &slot, BPF_ANY);
	}
	if (slot != TT_SERVICE_HOST)
		return slot;
	return service_of_port(sk->__sk_common.skc_num);
}

static __always_inline __u32 service_of_sock(const struct sock *sk)
{
	struct sock_service *cached;
	__u32 slot;

	/* Without services or auto-grouping every socket is "host": nothing to cache. With port
	 * rules alone, the port lookup is an inlined array index: cheaper than the cache's
	 * helper call, and no storage is created. */
	if (!auto_services && !have_cgroup_rules)
		return service_of_port(sk->__sk_common.skc_num);
	/* A read-only constant: on kernels with socket storage this branch is dropped. */
	if (!have_sk_storage)
		return service_of_sock_by_cgroup(sk);
	/* NULL for sockets without storage (not full sockets) or out of memory: resolve. */
	cached = bpf_sk_storage_get(&sock_services, (struct sock *)sk, 0,
				    BPF_SK_STORAGE_GET_F_CREATE);
	if (cached && cached->slot_plus_1) {
		slot = cached->slot_plus_1 - 1;
		/* A freed auto slot has a new generation: resolve again (the cgroup, if it
		 * still lives, gets a slot again; a dead one's is freed at the next interval). */
		if (!auto_services || cached->gen == auto_generation(slot))
			return slot;
	}
	slot = resolve_service_of_sock(sk);
	if (cached) {
		cached->slot_plus_1 = slot + 1;
		cached->gen = auto_generation(slot);
	}
	return slot;
}

#endif /* TT_SERVICE_BPF_H */
