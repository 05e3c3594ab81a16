/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The bucket index of detector::hist::bucket_index, in C. Plain C on purpose: the BPF
 * programs include it, and the host test (bpf/tests/bucket_agreement.rs) compiles it with
 * the system compiler to compare both at every bucket boundary.
 */
#ifndef TT_BUCKET_H
#define TT_BUCKET_H

#include "tailtrap.h"

/* floor(log2(v)) for v > 0. BPF has no count-leading-zeros instruction: binary search. */
static inline __attribute__((always_inline)) __u32 tt_log2(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) {
		v >>= 32;
		r += 32;
	}
	if (v >> 16) {
		v >>= 16;
		r += 16;
	}
	if (v >> 8) {
		v >>= 8;
		r += 8;
	}
	if (v >> 4) {
		v >>= 4;
		r += 4;
	}
	if (v >> 2) {
		v >>= 2;
		r += 2;
	}
	if (v >> 1)
		r += 1;
	return r;
}

/* v < 16: v; else 8*(k-2) + ((v >> (k-3)) & 7) with k = floor(log2 v), clamped. */
static inline __attribute__((always_inline)) __u32 tt_bucket_index(__u64 v)
{
	__u32 k;
	__u64 idx;

	if (v < 16)
		return (__u32)v;
	k = tt_log2(v);
	idx = 8 * (__u64)(k - 2) + ((v >> (k - 3)) & 7);
	return idx > TT_MAX_BUCKET ? TT_MAX_BUCKET : (__u32)idx;
}

#endif /* TT_BUCKET_H */
