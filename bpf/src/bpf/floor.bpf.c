// SPDX-License-Identifier: GPL-2.0-only
/*
 * Reference programs for the probe-cost benchmark, two per hook the probes use:
 * - floor_*: empty, the price of being called at all (dispatch and run-time accounting);
 * - clock_*: the part no latency probe can avoid: read the stamp the probe reads and, if
 *   it can be measured, the clock that stamp is in. A probe's cost above this program is
 *   what tailtrap adds (histogram, attribution, capture checks).
 * The scheduler hooks of the reader-wait split (reader_wait.bpf.h) read no stamp: they get
 * the empty floor only.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "clock.bpf.h"

char LICENSE[] SEC("license") = "GPL";

#define FLOOR(section, name)                   \
	SEC(section)                           \
	int BPF_PROG(name)                     \
	{                                      \
		return 0;                      \
	}

FLOOR("tp_btf/netif_receive_skb", floor_netif_receive_skb)
FLOOR("tp_btf/tcp_probe", floor_tcp_probe)
FLOOR("tp_btf/sk_data_ready", floor_sk_data_ready)
FLOOR("tp_btf/skb_copy_datagram_iovec", floor_skb_copy_datagram_iovec)
FLOOR("tp_btf/netif_rx", floor_netif_rx)
FLOOR("fentry/ip_rcv_core", floor_ip_rcv_core)
FLOOR("fentry/ip6_rcv_core", floor_ip6_rcv_core)
FLOOR("fentry/tcp_v4_rcv", floor_tcp_v4_rcv)
FLOOR("fentry/tcp_v6_rcv", floor_tcp_v6_rcv)
FLOOR("fentry/udp_rcv", floor_udp_rcv)
FLOOR("fentry/udpv6_rcv", floor_udpv6_rcv)
FLOOR("fexit/tcp_queue_rcv", floor_tcp_queue_rcv)
FLOOR("fexit/__udp_enqueue_schedule_skb", floor_udp_enqueue_schedule_skb)
FLOOR("fentry/tcp_recv_timestamp", floor_tcp_recv_timestamp)
FLOOR("fentry/skb_consume_udp", floor_skb_consume_udp)
/* The send side (send.bpf.h). */
FLOOR("tp_btf/net_dev_queue", floor_net_dev_queue)
FLOOR("tp_btf/net_dev_start_xmit", floor_net_dev_start_xmit)
FLOOR("tp_btf/consume_skb", floor_consume_skb)
FLOOR("fentry/tcp_sendmsg", floor_tcp_sendmsg)
FLOOR("fentry/udp_sendmsg", floor_udp_sendmsg)
FLOOR("fentry/udpv6_sendmsg", floor_udpv6_sendmsg)
FLOOR("fexit/tcp_sendmsg", floor_tcp_sendmsg_exit)
FLOOR("fexit/udp_sendmsg", floor_udp_sendmsg_exit)
FLOOR("fexit/udpv6_sendmsg", floor_udpv6_sendmsg_exit)
FLOOR("fexit/sk_stream_wait_memory", floor_sk_stream_wait_memory)
/* The bench attaches these only while capture is armed, as the loader does the hooks. */
FLOOR("tp_btf/sched_switch", floor_sched_switch)
FLOOR("tp_btf/sched_wakeup", floor_sched_wakeup)

/* Written only when now equals the stamp (never in practice): keeps the clock read from
 * being optimised away without a store, and a shared cache line, per call. */
__u64 clock_sink;

static __always_inline int use_clock(__u64 stamp, __u8 clock)
{
	__u64 now;

	if (!stamp)
		return 0;
	now = clock_now(clock);
	if (now == stamp)
		clock_sink = now;
	return 0;
}

/* A clock program that only returns `measure`, an expression of the hook's arguments `args`
 * (declared as BPF_PROG declares them). */
#define CLOCK(section, name, measure, args...) \
	SEC(section)                           \
	int BPF_PROG(name, args)               \
	{                                      \
		return measure;                \
	}

static __always_inline int clock_skb(const struct sk_buff *skb)
{
	return use_clock(skb->tstamp, skb_clock(skb));
}

/* ip-start measures REALTIME stamps only (a delivery time there is the sender's). */
static __always_inline int clock_ip_start(const struct sk_buff *skb)
{
	__u64 stamp = skb->tstamp;

	if (!stamp || skb_clock(skb) != TT_CLOCK_REALTIME)
		return 0;
	return use_clock(stamp, TT_CLOCK_REALTIME);
}

CLOCK("tp_btf/netif_receive_skb", clock_netif_receive_skb, clock_ip_start(skb),
      struct sk_buff *skb)
CLOCK("tp_btf/tcp_probe", clock_tcp_probe, clock_skb(skb),
      struct sock *sk, struct sk_buff *skb)

SEC("tp_btf/sk_data_ready")
int BPF_PROG(clock_sk_data_ready, const struct sock *sk)
{
	const struct sk_buff *skb;

	if (!sk->sk_receive_queue.qlen)
		return 0;
	skb = sk->sk_receive_queue.prev;
	return skb ? clock_skb(skb) : 0;
}

CLOCK("tp_btf/skb_copy_datagram_iovec", clock_skb_copy_datagram_iovec, clock_skb(skb),
      const struct sk_buff *skb, int len)
CLOCK("fentry/ip_rcv_core", clock_ip_rcv_core, clock_ip_start(skb), struct sk_buff *skb)
CLOCK("fentry/ip6_rcv_core", clock_ip6_rcv_core, clock_ip_start(skb), struct sk_buff *skb)
CLOCK("fentry/tcp_v4_rcv", clock_tcp_v4_rcv, clock_skb(skb), struct sk_buff *skb)
CLOCK("fentry/tcp_v6_rcv", clock_tcp_v6_rcv, clock_skb(skb), struct sk_buff *skb)
CLOCK("fentry/udp_rcv", clock_udp_rcv, clock_skb(skb), struct sk_buff *skb)
CLOCK("fentry/udpv6_rcv", clock_udpv6_rcv, clock_skb(skb), struct sk_buff *skb)
CLOCK("fexit/tcp_queue_rcv", clock_tcp_queue_rcv, clock_skb(skb),
      struct sock *sk, struct sk_buff *skb)
CLOCK("fexit/__udp_enqueue_schedule_skb", clock_udp_enqueue_schedule_skb, clock_skb(skb),
      struct sock *sk, struct sk_buff *skb)

SEC("fentry/tcp_recv_timestamp")
int BPF_PROG(clock_tcp_recv_timestamp, struct msghdr *msg, struct sock *sk,
	     struct scm_timestamping_internal *tss)
{
	return use_clock(read_stamp_ns(tss),
			 TT_CLOCK_REALTIME);
}

CLOCK("fentry/skb_consume_udp", clock_skb_consume_udp, clock_skb(skb),
      struct sock *sk, struct sk_buff *skb)

/* The send side has no stamp to read: its clock floor is one MONOTONIC read, as each of
 * its timing programs makes. */
static __always_inline int clock_send(void)
{
	return use_clock(1, TT_CLOCK_MONOTONIC);
}

CLOCK("tp_btf/net_dev_queue", clock_net_dev_queue, clock_send(), struct sk_buff *skb)
CLOCK("tp_btf/net_dev_start_xmit", clock_net_dev_start_xmit, clock_send(),
      const struct sk_buff *skb)
CLOCK("fentry/tcp_sendmsg", clock_tcp_sendmsg, clock_send(), struct sock *sk)
CLOCK("fentry/udp_sendmsg", clock_udp_sendmsg, clock_send(), struct sock *sk)
CLOCK("fentry/udpv6_sendmsg", clock_udpv6_sendmsg, clock_send(), struct sock *sk)
