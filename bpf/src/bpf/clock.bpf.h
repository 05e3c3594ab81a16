/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Which clock skb->tstamp is in, and "now" in that clock.
 * Since 6.11 skb->tstamp_type is 2 bits (0 REALTIME, 1 MONOTONIC, 2 TAI); before, the same
 * bit was the 1-bit mono_delivery_time (1 = MONOTONIC). CO-RE picks the layout at load.
 */
#ifndef TT_CLOCK_BPF_H
#define TT_CLOCK_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#include "counter.bpf.h"

enum tt_clock {
	TT_CLOCK_REALTIME = 0,
	TT_CLOCK_MONOTONIC = 1,
	TT_CLOCK_TAI = 2,
};

/* The pre-6.11 layout of the bit. */
struct sk_buff___pre_6_11 {
	__u8 mono_delivery_time : 1;
} __attribute__((preserve_access_index));

/* Kernel 7.2 keeps the receive stamps of a read (tcp_recv_timestamp's tss) as ktime_t;
 * before, as struct timespec64. Both are CLOCK_REALTIME. */
struct scm_timestamping_internal___ktime {
	ktime_t ts[3];
} __attribute__((preserve_access_index));

/* The software stamp of the last skb a read copied (tss->ts[0]), ns. */
static __always_inline __u64 read_stamp_ns(const struct scm_timestamping_internal *tss)
{
	const struct scm_timestamping_internal___ktime *k = (const void *)tss;

	/* Exists only where ts is an array of ktime_t: the types must match for CO-RE. */
	if (bpf_core_field_exists(k->ts))
		return k->ts[0];
	return tss->ts[0].tv_sec * 1000000000ULL + tss->ts[0].tv_nsec;
}

/* The hardware stamp of the last skb a read copied (tss->ts[2], the NIC's clock), ns; 0
 * when it had none. */
static __always_inline __u64 read_hw_stamp_ns(const struct scm_timestamping_internal *tss)
{
	const struct scm_timestamping_internal___ktime *k = (const void *)tss;

	if (bpf_core_field_exists(k->ts))
		return k->ts[2];
	return tss->ts[2].tv_sec * 1000000000ULL + tss->ts[2].tv_nsec;
}

/* CLOCK_TAI - CLOCK_REALTIME in ns, kept current by user space (leap seconds, NTP). */
volatile __s64 tai_offset_ns;

/* bpf_ktime_get_tai_ns exists (6.1+); the loader finds out with features.bpf.c. Without it,
 * CLOCK_TAI is CLOCK_MONOTONIC plus their difference, which user space re-reads every
 * interval: the two only drift apart when the clock is stepped, never by NTP slewing. */
const volatile bool have_tai_clock = true;
volatile __s64 tai_minus_mono_ns;

static __always_inline __u64 tai_now(void)
{
	/* A read-only constant: the verifier drops the branch not taken, so a kernel without
	 * the helper never sees its call. */
	if (have_tai_clock)
		return bpf_ktime_get_tai_ns();
	return bpf_ktime_get_ns() + tai_minus_mono_ns;
}

static __always_inline __u8 skb_clock(const struct sk_buff *skb)
{
	if (bpf_core_field_exists(skb->tstamp_type))
		return BPF_CORE_READ_BITFIELD(skb, tstamp_type);
	if (bpf_core_field_exists(((struct sk_buff___pre_6_11 *)skb)->mono_delivery_time)) {
		struct sk_buff___pre_6_11 *old = (void *)skb;

		return BPF_CORE_READ_BITFIELD(old, mono_delivery_time) ? TT_CLOCK_MONOTONIC
								       : TT_CLOCK_REALTIME;
	}
	return TT_CLOCK_REALTIME;
}

/* "now" in the stamp's clock; *tai gets now in CLOCK_TAI when that came for free (else 0),
 * so that capture's rate limit need not read a clock of its own. */
static __always_inline __u64 clock_now_tai(__u8 clock, __u64 *tai)
{
	switch (clock) {
	case TT_CLOCK_MONOTONIC:
		*tai = 0;
		return bpf_ktime_get_ns();
	case TT_CLOCK_TAI:
		*tai = tai_now();
		return *tai;
	default:
		*tai = tai_now();
		return *tai - tai_offset_ns;
	}
}

static __always_inline __u64 clock_now(__u8 clock)
{
	switch (clock) {
	case TT_CLOCK_MONOTONIC:
		return bpf_ktime_get_ns();
	case TT_CLOCK_TAI:
		return tai_now();
	default:
		return tai_now() - tai_offset_ns;
	}
}

/*
 * Latency from a stamp to now. Zero stamps (RX timestamping was off) and future stamps
 * (clock mismatch, sender-side EDT times) are counted and yield false.
 */
static __always_inline bool latency_since(__u64 stamp, __u8 clock, __u64 *latency_ns,
					  __u64 *now_tai)
{
	__u64 now;

	if (!stamp) {
		count_event(TT_COUNTER_ZERO_TSTAMP);
		return false;
	}
	now = clock_now_tai(clock, now_tai);
	if (stamp > now) {
		count_event(TT_COUNTER_FUTURE_TSTAMP);
		return false;
	}
	*latency_ns = now - stamp;
	return true;
}

#endif /* TT_CLOCK_BPF_H */
