/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * TCP head-of-line filter for tcp-socket-read (netstacklat paper, section 4.4). Data that
 * waited in the out-of-order queue for a retransmission measures loss recovery, not the
 * receive path. When a socket's rcv_ooopack grows, remember where the out-of-order range
 * ends (the newest out-of-order skb's end_seq, or rcv_nxt once the gap has closed); reads
 * ending at or before it are suspect and skipped, the first read past it clears the mark.
 */
#ifndef TT_HOL_BPF_H
#define TT_HOL_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

const volatile bool hol_filter = true;

/* Sockets whose out-of-order state is tracked at once; the least recently read drop out. */
#define TT_HOL_TRACKED_SOCKETS 16384

struct tt_ooo_range {
	__u32 seen_ooopack;
	__u32 end_seq;
	__u32 active;
};

/*
 * Keyed by socket address, not socket storage: at tp_btf/skb_copy_datagram_iovec the
 * socket comes from skb->sk, an RCU pointer the verifier refuses to the sk-storage and
 * skc_to_tcp_sock helpers. A reused address starts over: its rcv_ooopack differs.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, TT_HOL_TRACKED_SOCKETS);
	__type(key, __u64);
	__type(value, struct tt_ooo_range);
} tcp_ooo_ranges SEC(".maps");

static __always_inline __u32 skb_end_seq(const struct sk_buff *skb)
{
	return ((const struct tcp_skb_cb *)skb->cb)->end_seq;
}

/* True when a read that ends at read_end_seq may have been head-of-line blocked; ooopack is
 * the socket's rcv_ooopack, which the probe reads (only the rare path here reads more). */
static __always_inline bool tcp_read_hol_blocked(const struct sock *sk, __u32 ooopack,
						 __u32 read_end_seq)
{
	const struct tcp_sock *tp = (const void *)sk;
	__u64 key = (__u64)sk;
	struct tt_ooo_range *range;

	if (!hol_filter)
		return false;
	if (!ooopack)
		return false;
	range = bpf_map_lookup_elem(&tcp_ooo_ranges, &key);
	if (!range || range->seen_ooopack != ooopack) {
		struct sk_buff *last = BPF_CORE_READ(tp, ooo_last_skb);
		struct tt_ooo_range fresh = {
			.seen_ooopack = ooopack,
			.end_seq = last ? BPF_CORE_READ((struct tcp_skb_cb *)&last->cb, end_seq)
					: BPF_CORE_READ(tp, rcv_nxt),
			.active = 1,
		};

		bpf_map_update_elem(&tcp_ooo_ranges, &key, &fresh, BPF_ANY);
		range = bpf_map_lookup_elem(&tcp_ooo_ranges, &key);
		/* Without a record there is no telling: the socket did see loss, so skip. */
		if (!range)
			return true;
	}
	if (!range->active)
		return false;
	if ((__s32)(read_end_seq - range->end_seq) <= 0)
		return true;
	range->active = 0;
	return false;
}

#endif /* TT_HOL_BPF_H */
