/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The event counters: one per-CPU array indexed by enum tt_counter (tailtrap.h), holding
 * both the probes' and capture's counters, and the one helper that bumps them.
 */
#ifndef TT_COUNTER_BPF_H
#define TT_COUNTER_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "tailtrap.h"

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TT_NUM_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count_event(enum tt_counter counter)
{
	__u32 key = counter;
	__u64 *n = bpf_map_lookup_elem(&counters, &key);

	if (n)
		*n += 1;
}

#endif /* TT_COUNTER_BPF_H */
