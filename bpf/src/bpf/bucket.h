/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The bucket index of model::hist::bucket_index, in C. Plain C on purpose: the BPF
 * programs include it, and the host test (bpf/tests/bucket_agreement.rs) compiles it with
 * the system compiler to compare both at every bucket boundary.
 */
#ifndef TT_BUCKET_H
#define TT_BUCKET_H

#include "tailtrap.h"

/*
 * One step of the binary search below, without a branch: w when v >> w is non-zero, else 0.
 * For v < 2^(2w), (v >> w) + 2^w - 1 < 2^(w+1), so its bit w is exactly "v >> w != 0".
 */
#define TT_LOG2_STEP(v, w) (((((v) >> (w)) + ((1ULL << (w)) - 1)) >> (w)) * (w))

/* Applies one step to v (shifting it down by the step's result) and adds the result to r:
 * a fixed sequence of these, not a loop, so the verifier sees straight-line code. */
#define TT_LOG2_APPLY(v, r, w)                       \
	do {                                         \
		__u64 tt_step_ = TT_LOG2_STEP(v, w); \
		(v) >>= tt_step_;                    \
		(r) += tt_step_;                     \
	} while (0)

/* floor(log2(v)) for v > 0. BPF has no count-leading-zeros instruction: a binary search,
 * branch-free so that latencies of varying magnitude cost no mispredicted jumps. */
static inline __attribute__((always_inline)) __u32 tt_log2(__u64 v)
{
	__u64 r = 0;

	TT_LOG2_APPLY(v, r, 32);
	TT_LOG2_APPLY(v, r, 16);
	TT_LOG2_APPLY(v, r, 8);
	TT_LOG2_APPLY(v, r, 4);
	TT_LOG2_APPLY(v, r, 2);
	return (__u32)(r + (v >> 1));
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
