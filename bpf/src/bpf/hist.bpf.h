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
 * Index service * hist_stride + hist_column[probe]. A per-CPU array, not a hash: the
 * lookup is an index (inlined by newer kernels) instead of hashing the key and inserting
 * on first use. max_entries is set by the loader: (service slots) x hist_stride, or a
 * configured override; a sample beyond it counts as a map-full drop.
 */

/* Set by the loader: one column per probe that runs, in probe order, so that the map holds
 * no entries for probes switched off (the send side, nic-to-stack where no device has a
 * clock): every service slot costs a histogram per CPU per column. */
const volatile __u32 hist_stride = TT_NUM_PROBES;
const volatile __u32 hist_column[TT_NUM_PROBES] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
_Static_assert(TT_NUM_PROBES == 11, "hist_column's default lists every probe");
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tt_hist);
} hists SEC(".maps");

/* One latency into a histogram value (this CPU's). */
static __always_inline void hist_record(struct tt_hist *h, __u64 latency_ns)
{
	__u32 idx = tt_bucket_index(latency_ns);

	/* Already clamped; repeated so the verifier sees the bound. */
	if (idx > TT_MAX_BUCKET)
		idx = TT_MAX_BUCKET;
	h->buckets[idx] += 1;
	h->sum_ns += latency_ns;
}

static __always_inline void hist_add(__u32 service, __u32 probe, __u64 latency_ns)
{
	struct tt_hist *h;
	__u32 key;

	if (probe >= TT_NUM_PROBES)
		return;
	key = service * hist_stride + hist_column[probe];
	h = bpf_map_lookup_elem(&hists, &key);
	if (!h) {
		count_event(TT_COUNTER_MAP_FULL);
		return;
	}
	hist_record(h, latency_ns);
}

#endif /* TT_HIST_BPF_H */
