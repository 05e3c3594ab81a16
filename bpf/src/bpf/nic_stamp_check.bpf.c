// SPDX-License-Identifier: GPL-2.0-only
/*
 * Runs nic-to-stack's stamp conversion (nic_stamp.bpf.h) in the kernel on a case the test
 * gives it, through BPF_PROG_RUN: the bpf-reference crate builds it for bpf's tests, never
 * for the product.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "nic_stamp.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* One case: the stamps and clock in, the verdict and latency out (the context is copied
 * back to the caller). */
struct nic_stamp_case {
	__u64 hw_ns;
	__u64 sw_ns;
	struct tt_nic_clock clock;
	__u64 latency_ns;
	__u32 verdict;
	__u32 pad;
};

SEC("syscall")
int nic_stamp_check(struct nic_stamp_case *c)
{
	struct tt_nic_clock clock = c->clock;
	__u64 latency_ns = 0;

	c->verdict = nic_stamp_latency(c->hw_ns, c->sw_ns, &clock, &latency_ns);
	c->latency_ns = latency_ns;
	return 0;
}
