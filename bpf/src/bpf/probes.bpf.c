// SPDX-License-Identifier: GPL-2.0-only
/*
 * tailtrap's receive-path probes. Every probe exists as fentry/fexit (primary) and, where a
 * tracepoint stands in, as tp_btf (fallback); both share one body. The loader enables one
 * variant per probe. Every sample goes through record_latency(); the send-side probes
 * (send.bpf.h) too.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>

#include "tailtrap.h"
#include "counter.bpf.h"
#include "hist.bpf.h"
#include "clock.bpf.h"
#include "ip.bpf.h"
#include "sample.bpf.h"
#include "service.bpf.h"
#include "filter.bpf.h"
#include "hol.bpf.h"
#include "capture.bpf.h"
#include "first_stamp.bpf.h"
#include "record.bpf.h"
#include "send.bpf.h"
#include "nic_stamp.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Sections name only the attach kind: the loader sets each program's kernel function or
 * tracepoint from the one table in Rust (model::Probe::hooks), so no second copy lives here. */

/* Emit the shared types into BTF so the skeleton generates them for Rust. */
struct tt_hist tt_type_hist;
enum tt_probe tt_type_probe;
enum tt_service_slot tt_type_service_slot;
enum tt_counter tt_type_counter;
struct tt_capture_record tt_type_capture_record;
struct tt_capture_threshold tt_type_capture_threshold;
enum tt_capture_mode tt_type_capture_mode;
enum tt_capture_flag tt_type_capture_flag;
enum tt_capture_limit tt_type_capture_limit;
struct tt_nic_clock tt_type_nic_clock;
enum tt_nic_limit tt_type_nic_limit;
struct tt_device_key tt_type_device_key;
enum tt_device_limit tt_type_device_limit;

static __always_inline void record_skb(__u32 probe, const struct sk_buff *skb,
				       const struct sock *sk, __u16 local_port)
{
	struct tt_sample s = {
		.skb = skb,
		.sk = sk,
		.stamp_ns = skb->tstamp,
		.probe = probe,
		.local_port = local_port,
		.clock = skb_clock(skb),
	};

	record_latency(&s);
}

/*
 * Kernels >= 6.2 have bpf_rdonly_cast (bpf_core_cast): it types a kernel address for the
 * verifier at no cost (the call becomes a register move), so fields behind it are plain
 * loads (a fault reads 0) instead of one kernel-read helper call each, which on the
 * development VM costs about 40 ns. Older kernels take the helper path; the verifier drops
 * whichever branch the running kernel cannot take.
 */
#define have_core_cast() bpf_ksym_exists(bpf_rdonly_cast)

/* Destination port of a TCP/UDP header at addr (0 if unreadable). */
static __always_inline __u16 read_dport(const void *l4)
{
	__be16 port = 0;

	bpf_probe_read_kernel(&port, sizeof(port), l4 + 2);
	return bpf_ntohs(port);
}

/* An IP header up to the destination port right after a fixed-size header: IPv4 without
 * options (20 + 4 bytes) or IPv6 (40 + 4). */
#define TT_IP_PREFIX 44

/* Local port from a packet whose data starts at the IP header; only when port rules exist.
 * One read of the first 44 bytes covers both families' header and ports: each kernel read
 * costs about as much as the rest of the probe, so the per-field reads of parse_ip_header
 * stay with capture. The bytes past a short packet are its buffer's tail room, never
 * unmapped; they are only used when the header says the ports are there. */
/* [probes] ip_start_ports: off, ip-start reads no header and counts everything as host. */
const volatile bool ip_start_ports = true;

/* dport_at_network_header with typed loads; v6 says which header data points at. */
static __always_inline __u16 dport_cast(const unsigned char *data, bool v6)
{
	const struct iphdr *ip4;
	__u8 proto;

	if (v6) {
		proto = bpf_core_cast(data, struct ipv6hdr)->nexthdr;
		if (proto != TT_IPPROTO_TCP && proto != TT_IPPROTO_UDP)
			return 0;
		return bpf_ntohs(bpf_core_cast(data + 40, struct udphdr)->dest);
	}
	ip4 = bpf_core_cast(data, struct iphdr);
	if (bpf_ntohs(ip4->frag_off) & TT_IP_OFFSET_MASK)
		return 0;
	proto = ip4->protocol;
	if (proto != TT_IPPROTO_TCP && proto != TT_IPPROTO_UDP)
		return 0;
	/* TCP's and UDP's destination port are at the same offset. */
	return bpf_ntohs(
		bpf_core_cast(data + BPF_CORE_READ_BITFIELD(ip4, ihl) * 4, struct udphdr)->dest);
}

static __always_inline __u16 dport_at_network_header(const struct sk_buff *skb, bool v6)
{
	__u8 b[TT_IP_PREFIX];
	__u32 ihl;

	if (!have_port_rules || !ip_start_ports)
		return 0;
	if (have_core_cast())
		return dport_cast(skb->data, v6);
	if (bpf_probe_read_kernel(b, sizeof(b), skb->data))
		return 0;
	/* Later fragments carry no transport header; behind IPv6 extension headers proto is
	 * not TCP/UDP, and such packets count toward "host". */
	switch (b[0] >> 4) {
	case 4:
		if (((b[6] << 8) | b[7]) & TT_IP_OFFSET_MASK)
			return 0;
		if (b[9] != TT_IPPROTO_TCP && b[9] != TT_IPPROTO_UDP)
			return 0;
		ihl = (b[0] & 0xf) * 4;
		if (ihl == 20)
			return (b[22] << 8) | b[23];
		return read_dport(skb->data + ihl);
	case 6:
		if (b[6] != TT_IPPROTO_TCP && b[6] != TT_IPPROTO_UDP)
			return 0;
		return (b[42] << 8) | b[43];
	default:
		return 0;
	}
}

/* Local port when skb->data is at the transport header (tcp_v4_rcv, udp_rcv, ...). */
static __always_inline __u16 dport_at_transport_header(const struct sk_buff *skb)
{
	if (!have_port_rules)
		return 0;
	if (have_core_cast())
		return bpf_ntohs(bpf_core_cast(skb->data, struct udphdr)->dest);
	return read_dport(skb->data);
}

/* Before 5.16 the device a connected socket's packets come in on lived in inet_sock. */
struct inet_sock___pre_5_16 {
	int rx_dst_ifindex;
} __attribute__((preserve_access_index));

/* The ifindex a socket's packets arrive on (the cached input route's device). */
static __always_inline __u32 sock_rx_ifindex(const struct sock *sk)
{
	if (bpf_core_field_exists(sk->sk_rx_dst_ifindex))
		return BPF_CORE_READ(sk, sk_rx_dst_ifindex);
	return BPF_CORE_READ((const struct inet_sock___pre_5_16 *)sk, rx_dst_ifindex);
}

/* The newest skb on a socket's receive queue, or NULL. */
static __always_inline const struct sk_buff *receive_queue_tail(const struct sock *sk)
{
	if (!sk->sk_receive_queue.qlen)
		return NULL;
	return sk->sk_receive_queue.prev;
}

/* ---- ip-start, and nic-to-stack which it measures ---- */

/* The packet's NIC stage, after ip-start took its own sample: only packets with a receive
 * stamp (REALTIME) and a hardware stamp; attributed by port like ip-start. */
static __always_inline void record_nic_to_stack(struct tt_sample *s)
{
	__u64 latency_ns;

	if (!nic_to_stack(s->skb, s->stamp_ns, &latency_ns))
		return;
	if (!filters_pass(s->skb, NULL, false, 0, false))
		return;
	s->probe = TT_PROBE_NIC_TO_STACK;
	record_measured(s, service_of_port(s->local_port), latency_ns, false, 0);
}

/*
 * At ip-start only a REALTIME stamp is a receive stamp. A MONOTONIC (or TAI) stamp is a
 * delivery time the sender set: loopback TCP arrives with the sender's departure time,
 * which the receive path replaces in ip_local_deliver_finish; a forwarded packet's is its
 * sender's too. Measuring it would time the send path: such packets are measured from the
 * stamp netif_rx took for them (first_stamp.bpf.h) where it did, else they leave, like
 * zero stamps (RX timestamping off), before any clock read, uncounted: the later probes
 * count zero stamps.
 */
static __always_inline void ip_start(const struct sk_buff *skb, bool v6)
{
	__u64 stamp = skb->tstamp;
	struct tt_sample s = {
		.skb = skb,
		.probe = TT_PROBE_IP_START,
		.clock = TT_CLOCK_REALTIME,
	};

	if (!stamp)
		return;
	if (skb_clock(skb) != TT_CLOCK_REALTIME) {
		if (!first_stamp_of(skb, stamp, &stamp))
			return;
		s.clock = TT_CLOCK_MONOTONIC;
	}
	s.stamp_ns = stamp;
	s.local_port = dport_at_network_header(skb, v6);
	record_latency(&s);
	if (s.clock == TT_CLOCK_REALTIME)
		record_nic_to_stack(&s);
}

SEC("fentry")
int BPF_PROG(ip_start_fentry_v4, struct sk_buff *skb)
{
	ip_start(skb, false);
	return 0;
}

SEC("fentry")
int BPF_PROG(ip_start_fentry_v6, struct sk_buff *skb)
{
	ip_start(skb, true);
	return 0;
}

SEC("tp_btf")
int BPF_PROG(ip_start_tp, struct sk_buff *skb)
{
	__u16 proto = skb->protocol;

	if (proto != bpf_htons(TT_ETH_P_IP) && proto != bpf_htons(TT_ETH_P_IPV6))
		return 0;
	ip_start(skb, proto == bpf_htons(TT_ETH_P_IPV6));
	return 0;
}

/* ---- tcp-start ---- */

SEC("fentry")
int BPF_PROG(tcp_start_fentry_v4, struct sk_buff *skb)
{
	record_skb(TT_PROBE_TCP_START, skb, NULL, dport_at_transport_header(skb));
	return 0;
}

SEC("fentry")
int BPF_PROG(tcp_start_fentry_v6, struct sk_buff *skb)
{
	record_skb(TT_PROBE_TCP_START, skb, NULL, dport_at_transport_header(skb));
	return 0;
}

/* tcp_probe fires first thing in tcp_rcv_established: established sockets only. */
SEC("tp_btf")
int BPF_PROG(tcp_start_tp, struct sock *sk, struct sk_buff *skb)
{
	record_skb(TT_PROBE_TCP_START, skb, sk, 0);
	return 0;
}

/* ---- udp-start (no tracepoint stands in) ---- */

SEC("fentry")
int BPF_PROG(udp_start_fentry_v4, struct sk_buff *skb)
{
	record_skb(TT_PROBE_UDP_START, skb, NULL, dport_at_transport_header(skb));
	return 0;
}

SEC("fentry")
int BPF_PROG(udp_start_fentry_v6, struct sk_buff *skb)
{
	record_skb(TT_PROBE_UDP_START, skb, NULL, dport_at_transport_header(skb));
	return 0;
}

/* ---- socket enqueue ---- */

SEC("fexit")
int BPF_PROG(tcp_socket_enqueued_fexit, struct sock *sk, struct sk_buff *skb, bool *fragstolen,
	     int ret)
{
	record_skb(TT_PROBE_TCP_SOCKET_ENQUEUED, skb, sk, 0);
	return 0;
}

SEC("fexit")
int BPF_PROG(udp_socket_enqueued_fexit, struct sock *sk, struct sk_buff *skb, int ret)
{
	if (ret == 0)
		record_skb(TT_PROBE_UDP_SOCKET_ENQUEUED, skb, sk, 0);
	return 0;
}

/* Which probes the shared sk_data_ready program serves (one may use fexit instead). */
const volatile bool sk_data_ready_tcp = false;
const volatile bool sk_data_ready_udp = false;

/* sk_data_ready follows the enqueue: the queue's newest skb is the one just added. */
SEC("tp_btf")
int BPF_PROG(socket_enqueued_tp, const struct sock *sk)
{
	const struct sk_buff *skb;
	__u32 probe;

	if (sk_data_ready_tcp && is_tcp_sock(sk))
		probe = TT_PROBE_TCP_SOCKET_ENQUEUED;
	else if (sk_data_ready_udp && is_udp_sock(sk))
		probe = TT_PROBE_UDP_SOCKET_ENQUEUED;
	else
		return 0;
	skb = receive_queue_tail(sk);
	if (skb)
		record_skb(probe, skb, sk, 0);
	return 0;
}

/* ---- socket read ---- */

/* The stamp of the last skb read, from tss->ts[0] (REALTIME): the skb may be freed already. */
SEC("fentry")
int BPF_PROG(tcp_socket_read_fentry, struct msghdr *msg, struct sock *sk,
	     struct scm_timestamping_internal *tss)
{
	struct tt_sample s = {
		.sk = sk,
		.stamp_ns = read_stamp_ns(tss),
		.probe = TT_PROBE_TCP_SOCKET_READ,
		.clock = TT_CLOCK_REALTIME,
		.process_context = true,
		.tcp_read = true,
	};

	/* The NIC's stamp of that skb, and the device the socket's packets come in on. */
	if (nic_origin_wanted()) {
		s.hw_stamp_ns = read_hw_stamp_ns(tss);
		s.hw_ifindex = sock_rx_ifindex(sk);
	}
	/* The read ended where copying stopped. */
	if (have_core_cast()) {
		const struct tcp_sock *tp = bpf_core_cast(sk, struct tcp_sock);

		s.read_end_seq = tp->copied_seq;
		s.ooopack = tp->rcv_ooopack;
	} else {
		/* One helper call for both fields instead of a kernel read each. */
		const struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

		if (tp) {
			s.read_end_seq = tp->copied_seq;
			s.ooopack = tp->rcv_ooopack;
		}
	}
	record_latency(&s);
	return 0;
}

SEC("tp_btf")
int BPF_PROG(tcp_socket_read_tp, const struct sk_buff *skb, int len)
{
	const struct sock *sk = skb->sk;

	struct tt_sample s = {
		.skb = skb,
		.sk = sk,
		.stamp_ns = skb->tstamp,
		.probe = TT_PROBE_TCP_SOCKET_READ,
		.clock = skb_clock(skb),
		.process_context = true,
		.tcp_read = true,
		.read_end_seq = skb_end_seq(skb),
	};

	if (!is_tcp_sock(sk))
		return 0;
	/* skb->sk is a pointer the verifier refuses to bpf_skc_to_tcp_sock. */
	if (have_core_cast())
		s.ooopack = bpf_core_cast(sk, struct tcp_sock)->rcv_ooopack;
	else
		s.ooopack = BPF_CORE_READ((const struct tcp_sock *)sk, rcv_ooopack);
	record_latency(&s);
	return 0;
}

SEC("fentry")
int BPF_PROG(udp_socket_read_fentry, struct sock *sk, struct sk_buff *skb, int len)
{
	struct tt_sample s = {
		.skb = skb,
		.sk = sk,
		.stamp_ns = skb->tstamp,
		.probe = TT_PROBE_UDP_SOCKET_READ,
		.clock = skb_clock(skb),
		.process_context = true,
	};

	record_latency(&s);
	return 0;
}
