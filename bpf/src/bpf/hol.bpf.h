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

const volatile bool hol_filter = true;

struct tt_ooo_range {
	__u32 seen_ooopack;
	__u32 end_seq;
	__u32 active;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tt_ooo_range);
} tcp_ooo_ranges SEC(".maps");

static __always_inline __u32 skb_end_seq(const struct sk_buff *skb)
{
	return ((const struct tcp_skb_cb *)skb->cb)->end_seq;
}

/* True when a read that ends at read_end_seq may have been head-of-line blocked. */
static __always_inline bool tcp_read_hol_blocked(const struct sock *sk, __u32 read_end_seq)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
	struct tt_ooo_range *range;
	__u32 ooopack;

	if (!hol_filter || !tp)
		return false;
	ooopack = tp->rcv_ooopack;
	if (!ooopack)
		return false;
	range = bpf_sk_storage_get(&tcp_ooo_ranges, (struct sock *)sk, NULL,
				   BPF_SK_STORAGE_GET_F_CREATE);
	/* Without storage there is no telling: the socket did see loss, so skip. */
	if (!range)
		return true;
	if (range->seen_ooopack != ooopack) {
		struct sk_buff *last = tp->ooo_last_skb;

		range->seen_ooopack = ooopack;
		range->end_seq = last ? skb_end_seq(last) : tp->rcv_nxt;
		range->active = 1;
	}
	if (!range->active)
		return false;
	if ((__s32)(read_end_seq - range->end_seq) <= 0)
		return true;
	range->active = 0;
	return false;
}

#endif /* TT_HOL_BPF_H */
