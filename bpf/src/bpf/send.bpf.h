/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The send-side probes. A packet leaving the host carries no kernel stamp to subtract
 * (skb->tstamp is TCP's departure time or 0), so each probe keeps its own start:
 *
 * send-to-qdisc: the send call's start, per thread (send_calls), from fentry of
 *   tcp_sendmsg / udp_sendmsg / udpv6_sendmsg; fexit removes it, so packets the kernel sends
 *   after the call (TCP's window, pacing and small-queue limits: the network's and the
 *   peer's time) are never timed from it. fexit of sk_stream_wait_memory restarts the clock
 *   after a wait for send-buffer space (unacknowledged data: the peer's time). Each packet
 *   the call hands to the device layer (net_dev_queue, still inside the call, from the
 *   same socket) is one sample.
 * qdisc-sojourn: net_dev_queue stamps the skb (qdisc_stamps, keyed by its address, with
 *   its device and length as a check against a reused address); the driver's transmit
 *   (net_dev_start_xmit) takes the stamp and records the time in between.
 *
 * Both maps are LRU hashes: a thread killed inside a send call, or an skb the qdisc drops,
 * leaves an entry the LRU evicts; no entry outlives its use otherwise. Both use the
 * MONOTONIC clock at both ends.
 */
#ifndef TT_SEND_BPF_H
#define TT_SEND_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "tailtrap.h"
#include "clock.bpf.h"
#include "ip.bpf.h"
#include "record.bpf.h"
#include "sample.bpf.h"

/* Which send probes the loader planned; the shared net_dev_queue program serves both. */
const volatile bool send_to_qdisc_on = false;
const volatile bool qdisc_sojourn_on = false;

/* TCP states of sockets that are not full sockets (include/net/tcp_states.h). */
#define TT_TCP_TIME_WAIT 6
#define TT_TCP_NEW_SYN_RECV 12

struct send_call {
	__u64 start_ns;
	const struct sock *sk;
};

/* Thread (pid_tgid) inside a send call -> the call's start; max_entries set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct send_call);
} send_calls SEC(".maps");

struct qdisc_stamp {
	__u64 queued_ns;
	__u32 ifindex;
	__u32 len;
};

/* skb address -> when it reached the device layer; max_entries set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct qdisc_stamp);
} qdisc_stamps SEC(".maps");

/* The skb's owner when it is a full TCP or UDP socket (a request or timewait socket is
 * smaller than struct sock: nothing past the common part may be read from it). */
static __always_inline const struct sock *sending_sock(const struct sk_buff *skb)
{
	const struct sock *sk = skb->sk;
	__u8 state;

	if (!sk)
		return NULL;
	state = sk->__sk_common.skc_state;
	if (state == TT_TCP_TIME_WAIT || state == TT_TCP_NEW_SYN_RECV)
		return NULL;
	return is_tcp_sock(sk) || is_udp_sock(sk) ? sk : NULL;
}

static __always_inline void send_call_start(const struct sock *sk)
{
	__u64 thread = bpf_get_current_pid_tgid();
	struct send_call call = { .start_ns = bpf_ktime_get_ns(), .sk = sk };

	bpf_map_update_elem(&send_calls, &thread, &call, BPF_ANY);
}

static __always_inline void send_call_end(void)
{
	__u64 thread = bpf_get_current_pid_tgid();

	bpf_map_delete_elem(&send_calls, &thread);
}

SEC("fentry")
int BPF_PROG(send_enter_tcp, struct sock *sk)
{
	send_call_start(sk);
	return 0;
}

SEC("fentry")
int BPF_PROG(send_enter_udp, struct sock *sk)
{
	send_call_start(sk);
	return 0;
}

SEC("fentry")
int BPF_PROG(send_enter_udp6, struct sock *sk)
{
	send_call_start(sk);
	return 0;
}

SEC("fexit")
int BPF_PROG(send_exit_tcp, struct sock *sk)
{
	send_call_end();
	return 0;
}

SEC("fexit")
int BPF_PROG(send_exit_udp, struct sock *sk)
{
	send_call_end();
	return 0;
}

SEC("fexit")
int BPF_PROG(send_exit_udp6, struct sock *sk)
{
	send_call_end();
	return 0;
}

/* The wait for buffer space is over: the host's own time starts again. */
SEC("fexit")
int BPF_PROG(send_wait_memory_exit, struct sock *sk)
{
	__u64 thread = bpf_get_current_pid_tgid();
	struct send_call *call = bpf_map_lookup_elem(&send_calls, &thread);

	if (call && call->sk == sk)
		call->start_ns = bpf_ktime_get_ns();
	return 0;
}

/* The packet reaches the device layer (__dev_queue_xmit). A virtual device's packet comes
 * here again on the device below it: the later stamp wins, so qdisc-sojourn is the last
 * device's queue, and send-to-qdisc takes the first. */
SEC("tp_btf")
int BPF_PROG(send_dev_queue, struct sk_buff *skb)
{
	const struct sock *sk = sending_sock(skb);
	__u64 now = bpf_ktime_get_ns();

	if (qdisc_sojourn_on) {
		__u64 key = (__u64)(unsigned long)skb;
		struct qdisc_stamp stamp = {
			.queued_ns = now,
			.ifindex = skb->dev ? skb->dev->ifindex : 0,
			.len = skb->len,
		};

		bpf_map_update_elem(&qdisc_stamps, &key, &stamp, BPF_ANY);
	}
	if (send_to_qdisc_on && sk) {
		__u64 thread = bpf_get_current_pid_tgid();
		struct send_call *call = bpf_map_lookup_elem(&send_calls, &thread);

		if (call && call->sk == sk) {
			struct tt_sample s = {
				.skb = skb,
				.sk = sk,
				.stamp_ns = call->start_ns,
				.probe = TT_PROBE_SEND_TO_QDISC,
				.clock = TT_CLOCK_MONOTONIC,
				.process_context = true,
				.send = true,
			};

			/* One sample per packet: the next packet of this call starts from its
			 * handoff, not the call's start, so a call of many packets is not timed
			 * as the sum of their sends. */
			call->start_ns = now;
			record_latency(&s);
		}
	}
	return 0;
}

SEC("tp_btf")
int BPF_PROG(qdisc_sojourn_tp, const struct sk_buff *skb, const struct net_device *dev)
{
	__u64 key = (__u64)(unsigned long)skb;
	struct qdisc_stamp *stamp = bpf_map_lookup_elem(&qdisc_stamps, &key);
	struct tt_sample s = {
		.skb = skb,
		.probe = TT_PROBE_QDISC_SOJOURN,
		.clock = TT_CLOCK_MONOTONIC,
		.send = true,
	};
	bool same;

	if (!stamp)
		return 0;
	s.stamp_ns = stamp->queued_ns;
	same = stamp->ifindex == dev->ifindex && stamp->len == skb->len;
	bpf_map_delete_elem(&qdisc_stamps, &key);
	/* Another packet at a reused address, or one changed on the way (segmented): no
	 * sound start. */
	if (!same)
		return 0;
	s.sk = sending_sock(skb);
	record_latency(&s);
	return 0;
}

#endif /* TT_SEND_BPF_H */
