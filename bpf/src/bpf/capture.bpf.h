/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * In-kernel capture of slow SKBs. record_latency() hands every attributed sample here.
 * A sample below every threshold set (or with none set) costs one read of capture_min_ns:
 * with the flight recorder on that is nearly every sample. Armed capture emits a
 * ring-buffer record for a sample at or above its (service, probe) threshold, optionally
 * one in N, through a global rate limit; the flight recorder does the same with its own
 * (higher) threshold and its own small rate limit.
 */
#ifndef TT_CAPTURE_BPF_H
#define TT_CAPTURE_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

#include "tailtrap.h"
#include "cgroup.bpf.h"
#include "clock.bpf.h"
#include "counter.bpf.h"
#include "ip.bpf.h"
#include "sample.bpf.h"
#include "reader_wait.bpf.h"

/* The thresholds map is indexed in __u32 by service * TT_NUM_PROBES + probe. */
_Static_assert((__u64)TT_CAPTURE_MAX_SLOTS * TT_NUM_PROBES <= 0xffffffffULL,
	       "capture threshold index overflows __u32");

/* 4 MiB: ~30 000 records, 15 s at the default armed rate. */
#define TT_CAPTURE_RING_BYTES (4 << 20)

/* Set from user space through the mmapped .bss; every change takes effect at once. */
volatile __u32 capture_mode;
/* The lowest threshold set, armed or flight; 0 when none is. Nearly every sample is below
 * it (flight thresholds sit far in the tail) and leaves capture after this one read, with
 * no threshold lookup. */
volatile __u64 capture_min_ns;
volatile __u32 capture_one_in;
/* Rate limits as GCRA: one record per interval, bursts up to burst_ns ahead. 0: no limit. */
volatile __u64 armed_interval_ns;
volatile __u64 armed_burst_ns;
volatile __u64 flight_interval_ns;
volatile __u64 flight_burst_ns;
/* Theoretical arrival times of the two rate limits (CLOCK_TAI: the probes read it anyway
 * for REALTIME stamps and hand it over). */
__u64 armed_tat;
__u64 flight_tat;

/* Index service * TT_NUM_PROBES + probe. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TT_CAPTURE_MAX_SLOTS * TT_NUM_PROBES);
	__type(key, __u32);
	__type(value, struct tt_capture_threshold);
} capture_thresholds SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TT_CAPTURE_RING_BYTES);
} capture_ring SEC(".maps");

/* Wake the reader once a batch is waiting, not per record: a wakeup is an interrupt on this
 * CPU (an exit to the hypervisor in a VM), several times a record's cost. The reader also
 * drains the ring at every poll timeout (100 ms), so a record never waits longer. */
#define TT_CAPTURE_WAKEUP_BYTES (64 * sizeof(struct tt_capture_record))

static __always_inline __u64 ring_wakeup(void)
{
	return bpf_ringbuf_query(&capture_ring, BPF_RB_AVAIL_DATA) >= TT_CAPTURE_WAKEUP_BYTES
		       ? BPF_RB_FORCE_WAKEUP
		       : BPF_RB_NO_WAKEUP;
}

/*
 * Take one record's worth of the rate limit (GCRA: tat is the theoretical arrival time of
 * the next record). A plain load and store, no compare-and-exchange: kernels before 5.12
 * refuse any program that contains one, even on a path never taken. CPUs that race here
 * may each take the same token, so a burst can admit one extra record per racing CPU; the
 * limit never sticks, and the race needs two slow samples within nanoseconds.
 */
static __always_inline bool take_token(__u64 *tat, __u64 interval_ns, __u64 burst_ns,
				       __u64 now)
{
	__u64 old, start;

	if (!interval_ns)
		return true;
	if (!now)
		now = tai_now();
	old = *(volatile __u64 *)tat;
	start = old > now ? old : now;
	if (start - now > burst_ns)
		return false;
	*(volatile __u64 *)tat = start + interval_ns;
	return true;
}

static __always_inline void copy_in6(__u8 *dst, const struct in6_addr *a)
{
	bpf_probe_read_kernel(dst, 16, a);
}

/* Family, protocol and ports/addresses from the IP header at ip. The record's src is the
 * remote end: the sender of a received packet, the receiver of one sent (outgoing). */
static __always_inline void tuple_from_packet(struct tt_capture_record *r, const __u8 *ip,
					      bool outgoing)
{
	struct tt_ip_header h;
	__be16 ports[2] = {};

	if (!parse_ip_header(ip, &h, outgoing ? r->daddr : r->saddr,
			     outgoing ? r->saddr : r->daddr))
		return;
	r->family = h.family;
	r->ip_proto = h.proto;
	/* Ports stay 0 behind IPv6 extension headers (proto is then not TCP/UDP). */
	if (h.proto == TT_IPPROTO_TCP || h.proto == TT_IPPROTO_UDP) {
		bpf_probe_read_kernel(ports, sizeof(ports), h.l4);
		r->sport = bpf_ntohs(ports[outgoing ? 1 : 0]);
		r->dport = bpf_ntohs(ports[outgoing ? 0 : 1]);
	}
}

/* sk and skb are BTF-typed pointers here: plain loads (checked by the verifier, a fault
 * reads 0) instead of a kernel-read helper call per field, which made each record cost
 * microseconds. */
static __always_inline void tuple_from_sock(struct tt_capture_record *r, const struct sock *sk)
{
	__u16 family = sk->__sk_common.skc_family;

	r->ip_proto = sk->sk_protocol;
	r->sport = bpf_ntohs(sk->__sk_common.skc_dport);
	r->dport = sk->__sk_common.skc_num;
	if (family == TT_AF_INET) {
		__be32 saddr = sk->__sk_common.skc_daddr, daddr = sk->__sk_common.skc_rcv_saddr;

		r->family = TT_AF_INET;
		__builtin_memcpy(r->saddr, &saddr, 4);
		__builtin_memcpy(r->daddr, &daddr, 4);
	} else if (family == TT_AF_INET6) {
		r->family = TT_AF_INET6;
		copy_in6(r->saddr, &sk->__sk_common.skc_v6_daddr);
		copy_in6(r->daddr, &sk->__sk_common.skc_v6_rcv_saddr);
	}
}

/* PF_KTHREAD of include/linux/sched.h: a #define, so not in BTF. */
#define TT_PF_KTHREAD 0x00200000

/* The current task is a ksoftirqd thread. Called for slow SKBs only (a record is being
 * filled), so the comm copy costs nothing on the fast path. */
static __always_inline bool in_ksoftirqd(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	char comm[10] = {};

	if (!(BPF_CORE_READ(task, flags) & TT_PF_KTHREAD))
		return false;
	bpf_get_current_comm(comm, sizeof(comm));
	return comm[0] == 'k' && comm[1] == 's' && comm[2] == 'o' && comm[3] == 'f' &&
	       comm[4] == 't' && comm[5] == 'i' && comm[6] == 'r' && comm[7] == 'q' &&
	       comm[8] == 'd';
}

static __always_inline void fill_record(struct tt_capture_record *r, const struct tt_sample *s,
					__u32 service, __u64 latency_ns, __u64 now_tai,
					__u32 flags)
{
	const struct sk_buff *skb = s->skb;
	const struct sock *sk = s->sk;

	/* The probe's TAI reading when it made one: a clock read less. */
	r->time_ns = now_tai ? now_tai - tai_offset_ns : clock_now(TT_CLOCK_REALTIME);
	r->latency_ns = latency_ns;
	r->probe = s->probe;
	r->service = service;
	r->cpu = bpf_get_smp_processor_id();
	r->skb_len = skb ? skb->len : 0;
	/* The address itself, as pwru prints it: the exact key for joining its events. */
	r->skb_addr = (__u64)(unsigned long)skb;
	r->ifindex = skb ? skb->skb_iif : 0;
	/* A packet leaving the host: the device it leaves by (skb_iif is the receive side's). */
	if (s->send && skb && skb->dev)
		r->ifindex = skb->dev->ifindex;
	/* skb_rx_queue_recorded() / skb_get_rx_queue(): read here, for a slow SKB only. On the
	 * send side queue_mapping is the TX queue. */
	if (skb && !s->send) {
		__u16 mapping = BPF_CORE_READ(skb, queue_mapping);

		if (mapping) {
			r->rx_queue = mapping - 1;
			flags |= TT_CAPTURE_F_RX_QUEUE;
		}
	}
	if (s->process_context) {
		r->pid = bpf_get_current_pid_tgid() >> 32;
		bpf_get_current_comm(r->comm, sizeof(r->comm));
		flags |= TT_CAPTURE_F_PROCESS;
	} else if (s->sender_pid) {
		r->pid = s->sender_pid;
		flags |= TT_CAPTURE_F_SENDER;
	} else if (in_ksoftirqd()) {
		flags |= TT_CAPTURE_F_KSOFTIRQD;
	}
	if (sk) {
		r->cgroup_id = sock_cgroup_id(sk);
		r->netns_ino = sk->__sk_common.skc_net.net->ns.inum;
		r->queue_skbs = sk->sk_receive_queue.qlen;
		r->rmem_alloc = sk->sk_backlog.rmem_alloc.counter;
		r->rcvbuf = sk->sk_rcvbuf;
		tuple_from_sock(r, sk);
		if (r->ip_proto == TT_IPPROTO_TCP) {
			const struct tcp_sock *tp = (const void *)sk;

			r->queue_bytes = BPF_CORE_READ(tp, rcv_nxt) - BPF_CORE_READ(tp, copied_seq);
		} else {
			r->queue_bytes = r->rmem_alloc;
		}
		flags |= TT_CAPTURE_F_SOCKET;
	} else if (skb) {
		const __u8 *head = skb->head;

		r->netns_ino = skb->dev ? skb->dev->nd_net.net->ns.inum : 0;
		/* The netif_receive_skb tracepoint (ip-start on tp_btf) fires before the core
		 * sets skb_iif: the device receiving it is skb->dev then. Not at the socket
		 * probes, where UDP reuses the field as scratch space (dev_scratch). */
		if (!r->ifindex && skb->dev)
			r->ifindex = skb->dev->ifindex;
		/* At ip-start (and nic-to-stack, which it measures) skb->data is the IP header;
		 * later the network header offset is set. */
		if (s->probe == TT_PROBE_IP_START || s->probe == TT_PROBE_NIC_TO_STACK)
			tuple_from_packet(r, skb->data, false);
		else
			tuple_from_packet(r, head + skb->network_header, s->send);
	}
	/* The control block holds TCP's seq once tcp_v4_rcv/tcp_v6_rcv filled it in. */
	if (skb && r->ip_proto == TT_IPPROTO_TCP &&
	    (s->probe == TT_PROBE_TCP_SOCKET_ENQUEUED || s->probe == TT_PROBE_TCP_SOCKET_READ ||
	     (s->probe == TT_PROBE_TCP_START && sk))) {
		r->tcp_seq = ((const struct tcp_skb_cb *)skb->cb)->seq;
		flags |= TT_CAPTURE_F_TCP_SEQ;
	}
	r->flags = flags;
}

/* Emit a record for this sample if armed capture or the flight recorder wants it. */
static __always_inline void capture_sample(const struct tt_sample *s, __u32 service,
					   __u64 latency_ns, bool hol_suspect, __u64 now_tai)
{
	struct tt_capture_threshold *t;
	struct tt_capture_record *r;
	__u32 idx, mode, flags = 0;
	enum tt_counter emitted, ring_full;

	/* latency < min, and min 0 (nothing set) wraps to the largest value: one compare. */
	if (latency_ns <= capture_min_ns - 1)
		return;
	if (service >= TT_CAPTURE_MAX_SLOTS || s->probe >= TT_NUM_PROBES)
		return;
	mode = capture_mode;
	idx = service * TT_NUM_PROBES + s->probe;
	t = bpf_map_lookup_elem(&capture_thresholds, &idx);
	if (!t)
		return;
	if ((mode & TT_CAPTURE_MODE_ARMED) && t->armed_ns && latency_ns >= t->armed_ns) {
		__u32 one_in = capture_one_in;

		if (one_in > 1) {
			if (bpf_get_prandom_u32() % one_in)
				return;
			flags |= TT_CAPTURE_F_SUBSAMPLED;
		}
		if (!take_token(&armed_tat, armed_interval_ns, armed_burst_ns, now_tai)) {
			count_event(TT_CAPTURE_ARMED_RATE_LIMITED);
			return;
		}
		emitted = TT_CAPTURE_ARMED_EMITTED;
		ring_full = TT_CAPTURE_ARMED_RING_FULL;
	} else if ((mode & TT_CAPTURE_MODE_FLIGHT) && t->flight_ns && latency_ns >= t->flight_ns) {
		if (!take_token(&flight_tat, flight_interval_ns, flight_burst_ns, now_tai)) {
			count_event(TT_CAPTURE_FLIGHT_RATE_LIMITED);
			return;
		}
		flags |= TT_CAPTURE_F_FLIGHT;
		emitted = TT_CAPTURE_FLIGHT_EMITTED;
		ring_full = TT_CAPTURE_FLIGHT_RING_FULL;
	} else {
		return;
	}
	if (hol_suspect)
		flags |= TT_CAPTURE_F_HOL_SUSPECT;
	r = bpf_ringbuf_reserve(&capture_ring, sizeof(*r), 0);
	if (!r) {
		count_event(ring_full);
		return;
	}
	__builtin_memset(r, 0, sizeof(*r));
	fill_record(r, s, service, latency_ns, now_tai, flags);
	/* The reader-wait split explains reads; a sender's wait is not a reader's. */
	if (!(flags & TT_CAPTURE_F_FLIGHT) && s->process_context && !s->send)
		reader_wait_fill(r, latency_ns);
	bpf_ringbuf_submit(r, ring_wakeup());
	count_event(emitted);
}

#endif /* TT_CAPTURE_BPF_H */
