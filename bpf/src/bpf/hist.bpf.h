/* SPDX-License-Identifier: GPL-2.0-only */
/* Per-CPU histograms keyed by (service slot, probe). */
#ifndef TT_HIST_BPF_H
#define TT_HIST_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "tailtrap.h"
#include "bucket.h"
#include "counter.bpf.h"

#define TT_EEXIST 17

/* max_entries is set by the loader: (service slots) x (probes), or a configured override. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1);
	__type(key, struct tt_hist_key);
	__type(value, struct tt_hist);
} hists SEC(".maps");

/* A zeroed histogram to insert from: 2 KiB does not fit on the 512-byte BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tt_hist);
} empty_hist SEC(".maps");

static __always_inline void hist_add(__u32 service, __u32 probe, __u64 latency_ns)
{
	struct tt_hist_key key = { .service = service, .probe = probe };
	struct tt_hist *h;
	__u32 idx;

	h = bpf_map_lookup_elem(&hists, &key);
	if (!h) {
		__u32 zero = 0;
		struct tt_hist *empty = bpf_map_lookup_elem(&empty_hist, &zero);
		long err;

		if (!empty)
			return;
		err = bpf_map_update_elem(&hists, &key, empty, BPF_NOEXIST);
		/* EEXIST: another CPU inserted the key first, which is fine. */
		if (err && err != -TT_EEXIST) {
			count_event(TT_COUNTER_MAP_FULL);
			return;
		}
		h = bpf_map_lookup_elem(&hists, &key);
		if (!h) {
			count_event(TT_COUNTER_MAP_FULL);
			return;
		}
	}
	idx = tt_bucket_index(latency_ns);
	/* Already clamped; repeated so the verifier sees the bound. */
	if (idx > TT_MAX_BUCKET)
		idx = TT_MAX_BUCKET;
	h->buckets[idx] += 1;
	h->sum_ns += latency_ns;
}

#endif /* TT_HIST_BPF_H */
