/* SPDX-License-Identifier: GPL-2.0-only */
/* Per-CPU histograms, one per (service slot, probe). */
#ifndef TT_HIST_BPF_H
#define TT_HIST_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "tailtrap.h"
#include "bucket.h"
#include "counter.bpf.h"

/*
 * Index service * hist_stride + probe. A per-CPU array, not a hash: the lookup is an index
 * (inlined by newer kernels) instead of hashing the key and inserting on first use.
 * max_entries is set by the loader: (service slots) x hist_stride, or a configured
 * override; a sample beyond it counts as a map-full drop.
 */

/* Entries per service slot, set by the loader: TT_NUM_PROBES with the send side, else only
 * the receive probes (ids below the send probes'), so that map keeps its size. */
const volatile __u32 hist_stride = TT_NUM_PROBES;
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tt_hist);
} hists SEC(".maps");

static __always_inline void hist_add(__u32 service, __u32 probe, __u64 latency_ns)
{
	__u32 key = service * hist_stride + probe;
	struct tt_hist *h;
	__u32 idx;

	h = bpf_map_lookup_elem(&hists, &key);
	if (!h) {
		count_event(TT_COUNTER_MAP_FULL);
		return;
	}
	idx = tt_bucket_index(latency_ns);
	/* Already clamped; repeated so the verifier sees the bound. */
	if (idx > TT_MAX_BUCKET)
		idx = TT_MAX_BUCKET;
	h->buckets[idx] += 1;
	h->sum_ns += latency_ns;
}

#endif /* TT_HIST_BPF_H */
