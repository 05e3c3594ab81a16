// SPDX-License-Identifier: GPL-2.0-only
/*
 * Empty programs on every hook the probes use: the probe-cost benchmark attaches them next
 * to the probes and reports their cost per call as the floor (the price of being called).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

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
