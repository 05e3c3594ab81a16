/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Protocol numbers, and the one parser of the IPv4/IPv6 header that both the local-port
 * lookup (probes.bpf.c) and capture's 5-tuple (capture.bpf.h) use. Reads go through
 * bpf_probe_read_kernel: at ip-start skb->data points into packet memory.
 */
#ifndef TT_IP_BPF_H
#define TT_IP_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define TT_ETH_P_IP 0x0800
#define TT_ETH_P_IPV6 0x86DD
#define TT_IPPROTO_TCP 6
#define TT_IPPROTO_UDP 17
#define TT_AF_INET 2
#define TT_AF_INET6 10
#define TT_IP_OFFSET_MASK 0x1fff
#define TT_SOCK_STREAM 1

/* What the receive path needs from an IP header. */
struct tt_ip_header {
	const __u8 *l4; /* the transport header; for IPv6 right after the fixed header */
	__u8 family; /* TT_AF_INET or TT_AF_INET6 */
	__u8 proto; /* transport protocol (IPv6: next header); 0 if unreadable */
	/* IPv4 fragment other than the first (or its offset unreadable): no transport header */
	bool later_fragment;
};

/*
 * Parse the IPv4 or IPv6 header at ip; false when it is neither (or unreadable). With
 * saddr/daddr (16 bytes each) the addresses are copied too, network order, IPv4 in the
 * first 4 bytes; callers that pass NULL pay nothing for them once inlined. IPv6 extension
 * headers are not walked: behind one, proto is the extension's and l4 points at it.
 */
static __always_inline bool parse_ip_header(const __u8 *ip, struct tt_ip_header *h, __u8 *saddr,
					    __u8 *daddr)
{
	__u8 first;

	if (bpf_probe_read_kernel(&first, 1, ip))
		return false;
	if (first >> 4 == 4) {
		__be16 frag;

		/* A failed read zeroes its destination: proto 0 is "not TCP/UDP". */
		bpf_probe_read_kernel(&h->proto, 1, ip + 9);
		h->later_fragment = bpf_probe_read_kernel(&frag, 2, ip + 6) ||
				    (bpf_ntohs(frag) & TT_IP_OFFSET_MASK);
		h->family = TT_AF_INET;
		h->l4 = ip + (first & 0xf) * 4;
		if (saddr)
			bpf_probe_read_kernel(saddr, 4, ip + 12);
		if (daddr)
			bpf_probe_read_kernel(daddr, 4, ip + 16);
		return true;
	}
	if (first >> 4 == 6) {
		bpf_probe_read_kernel(&h->proto, 1, ip + 6);
		h->later_fragment = false;
		h->family = TT_AF_INET6;
		h->l4 = ip + 40;
		if (saddr)
			bpf_probe_read_kernel(saddr, 16, ip + 8);
		if (daddr)
			bpf_probe_read_kernel(daddr, 16, ip + 24);
		return true;
	}
	return false;
}

/* A TCP or UDP socket over IPv4 or IPv6 (any other owner of an skb is not a service's). */
static __always_inline bool is_tcp_sock(const struct sock *sk)
{
	return sk && sk->sk_protocol == TT_IPPROTO_TCP && sk->sk_type == TT_SOCK_STREAM &&
	       (sk->__sk_common.skc_family == TT_AF_INET ||
		sk->__sk_common.skc_family == TT_AF_INET6);
}

static __always_inline bool is_udp_sock(const struct sock *sk)
{
	return sk && sk->sk_protocol == TT_IPPROTO_UDP &&
	       (sk->__sk_common.skc_family == TT_AF_INET ||
		sk->__sk_common.skc_family == TT_AF_INET6);
}

#endif /* TT_IP_BPF_H */
