/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * The send-side probes. A packet leaving the host carries no kernel stamp to subtract
 * (skb->tstamp is TCP's departure time or 0), so the start of each interval is kept here:
 *
 * - the send call's start, per thread: fentry of tcp_sendmsg / udp_sendmsg / udpv6_sendmsg
 *   writes it, fexit clears it, so packets the kernel sends after the call (TCP's window,
 *   pacing and small-queue limits: the network's and the peer's time) are never timed from
 *   it; fexit of sk_stream_wait_memory restarts it after a wait for send-buffer space
 *   (unacknowledged data: the peer's time);
 * - per packet, at the device layer (net_dev_queue): when it got there, and the call's start
 *   if it got there inside its sender's call, from the same socket.
 *
 * The driver's transmit (net_dev_start_xmit) takes the packet's entry and records both
 * intervals at once: send-to-qdisc (the call's start to the device layer) and qdisc-sojourn
 * (the device layer to the driver), one service lookup and one filter pass for the two.
 * A device without a queue (noqueue: loopback, veth, most virtual devices) gets no entry
 * and no clock read at the device layer: its transmit follows at once, in the sender's
 * context, and times send-to-qdisc from the call alone; it has no qdisc-sojourn.
 *
 * Both tables are plain arrays indexed by a hash of their key (the thread id, the skb's
 * address), like first_stamp.bpf.h's, not hash maps: an LRU hash update and delete cost
 * about 100 ns each on the development host, per packet. A slot taken over by another
 * thread or packet is simply not measured; the key is checked (and the packet's device and
 * length), so a start is never given to the wrong packet. No entry needs deleting: a stale
 * one never matches a live key... except a recycled skb address, which must also arrive
 * at the same device with the same length without passing net_dev_queue (only a qdisc
 * bypass, such as AF_PACKET's, could).
 *
 * driver-to-completion: the transmit notes, for hardware devices only, when the driver
 * took the packet (transmitted_packets); the packet's release after transmission (the
 * consume_skb tracepoint, which the drivers' TX-completion frees fire) times it. A virtual
 * device's "release" is another path's (veth hands the skb to its peer's receive path),
 * so devices without a parent bus device are skipped. A packet dropped after the transmit
 * leaves a stale entry: it is matched again only by the same skb address with the same
 * data buffer, length and device, and never after 10 s.
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

/* Which send probes the loader planned; the device-layer programs serve all three. */
const volatile bool send_to_qdisc_on = false;
const volatile bool qdisc_sojourn_on = false;
const volatile bool driver_to_completion_on = false;

/* Qdisc flag of a multiqueue root (mq, mqprio), which has no enqueue of its own
 * (include/net/sch_generic.h; a #define, so not in BTF). */
#define TT_TCQ_F_MQROOT 0x08

/* TCP states of sockets that are not full sockets (include/net/tcp_states.h). */
#define TT_TCP_TIME_WAIT 6
#define TT_TCP_NEW_SYN_RECV 12

/* Threads inside a send call at once, as slots (a power of two: the index is masked). */
#define TT_SEND_CALL_SLOTS 8192
/* Packets between the device layer and the driver at once, on all devices. */
#define TT_QDISC_SLOTS 32768

struct tt_send_call {
	__u64 thread; /* pid_tgid; 0: free */
	__u64 start_ns;
	__u64 sk;
	/* The packet last timed from this call: a device below the one that timed it (a
	 * VLAN's, a bond's) must not time it again. */
	__u64 last_skb;
	/* The thread's voluntary context switches when start_ns was taken (see slept()). */
	__u64 switches;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TT_SEND_CALL_SLOTS);
	__type(key, __u32);
	__type(value, struct tt_send_call);
} send_calls SEC(".maps");

struct tt_queued_packet {
	__u64 skb; /* the skb's address; 0: free */
	__u64 queued_ns;
	__u64 call_start_ns; /* 0: not sent inside its sender's call */
	__u32 ifindex;
	__u32 len;
	__u32 sender_pid; /* tgid of that call's process; 0: none */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TT_QDISC_SLOTS);
	__type(key, __u32);
	__type(value, struct tt_queued_packet);
} queued_packets SEC(".maps");

/* A packet a hardware device's driver took, until its release. */
struct tt_transmitted_packet {
	__u64 skb; /* the skb's address; 0: free */
	__u64 head; /* its data buffer: a recycled skb address rarely comes with the same */
	__u64 xmit_ns;
	__u32 service;
	__u32 ifindex;
	__u32 len;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TT_QDISC_SLOTS);
	__type(key, __u32);
	__type(value, struct tt_transmitted_packet);
} transmitted_packets SEC(".maps");

/* driver-to-completion per device: a transmit queue's completions are the driver's and
 * the device's doing, whichever service sent. An entry is made by the first completion on
 * a device (copied from completion_hist_zero); the daemon names the devices and deletes
 * those gone. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, TT_COMPLETION_DEVICES_MAX);
	__type(key, struct tt_device_key);
	__type(value, struct tt_hist);
} completion_device_hists SEC(".maps");

/* An all-zero histogram: the first value of a device's entry (too large for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tt_hist);
} completion_hist_zero SEC(".maps");

static __always_inline void completion_device_add(const struct net_device *dev,
						 __u64 latency_ns)
{
	struct tt_device_key key = {
		.ifindex = dev->ifindex,
		.netns = BPF_CORE_READ(dev, nd_net.net, ns.inum),
	};
	struct tt_hist *h = bpf_map_lookup_elem(&completion_device_hists, &key);
	__u32 zero = 0;

	if (!h) {
		const struct tt_hist *empty = bpf_map_lookup_elem(&completion_hist_zero, &zero);

		/* NOEXIST: another CPU may have made the entry since the lookup. */
		if (empty)
			bpf_map_update_elem(&completion_device_hists, &key, empty, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&completion_device_hists, &key);
		if (!h) {
			count_event(TT_COUNTER_MAP_FULL);
			return;
		}
	}
	hist_record(h, latency_ns);
}

/* A transmit older than this is not a completion's: the entry is stale. */
#define TT_COMPLETION_MAX_NS (10ULL * 1000 * 1000 * 1000)

/* The thread's slot: thread ids are handed out in sequence, so their low bits spread. */
static __always_inline struct tt_send_call *send_call_slot(__u64 thread)
{
	__u32 slot = (__u32)thread & (TT_SEND_CALL_SLOTS - 1);

	return bpf_map_lookup_elem(&send_calls, &slot);
}

/* skbs are slab objects of a few hundred bytes: the address above bit 8 tells neighbours
 * apart, the higher bits spread the rest. Only the low 32 bits: the verifier allows no
 * shift of a pointer, but a 32-bit copy of one is a plain number. */
static __always_inline __u32 skb_slot(const struct sk_buff *skb)
{
	__u32 low = (__u32)(unsigned long)skb;

	return ((low >> 8) ^ (low >> 23)) & (TT_QDISC_SLOTS - 1);
}

static __always_inline struct tt_queued_packet *queued_slot(const struct sk_buff *skb)
{
	__u32 slot = skb_slot(skb);

	return bpf_map_lookup_elem(&queued_packets, &slot);
}

static __always_inline struct tt_transmitted_packet *transmitted_slot(const struct sk_buff *skb)
{
	__u32 slot = skb_slot(skb);

	return bpf_map_lookup_elem(&transmitted_packets, &slot);
}

/* A device on a bus (a NIC, virtio-net): it sends the packet and releases it after. */
static __always_inline bool hardware_device(const struct net_device *dev)
{
	return dev && BPF_CORE_READ(dev, dev.parent);
}

/* The driver took the packet: note it for its release. */
static __always_inline void note_transmit(const struct sk_buff *skb,
					  const struct net_device *dev, __u32 service,
					  __u64 now)
{
	struct tt_transmitted_packet *t;

	if (!hardware_device(dev))
		return;
	t = transmitted_slot(skb);
	if (!t)
		return;
	t->skb = 0;
	t->head = (__u64)(unsigned long)skb->head;
	t->xmit_ns = now;
	t->service = service;
	t->ifindex = dev->ifindex;
	t->len = skb->len;
	t->skb = (__u64)(unsigned long)skb;
}

/* A packet released (consume_skb): if a hardware driver took it, its completion time. */
SEC("tp_btf")
int BPF_PROG(send_complete, struct sk_buff *skb)
{
	__u64 addr = (__u64)(unsigned long)skb, now;
	struct tt_transmitted_packet *t = transmitted_slot(skb);
	struct tt_sample s = {
		.skb = skb,
		.probe = TT_PROBE_DRIVER_TO_COMPLETION,
		.clock = TT_CLOCK_MONOTONIC,
		.send = true,
	};

	if (!t || t->skb != addr)
		return 0;
	t->skb = 0;
	if (t->head != (__u64)(unsigned long)skb->head || t->len != skb->len ||
	    !skb->dev || t->ifindex != skb->dev->ifindex)
		return 0;
	now = bpf_ktime_get_ns();
	if (t->xmit_ns > now || now - t->xmit_ns > TT_COMPLETION_MAX_NS)
		return 0;
	record_measured(&s, t->service, now - t->xmit_ns, false, 0);
	completion_device_add(skb->dev, now - t->xmit_ns);
	return 0;
}

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

/* The current thread's voluntary context switches: it slept once for each. */
static __always_inline __u64 voluntary_switches(void)
{
	const struct task_struct *task = (const struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, nvcsw);
}

/*
 * A TCP sender that slept inside its call since start_ns waited for the peer: for send
 * buffer space (unacknowledged data) or for its socket. Its packet is not timed, and the
 * call's clock restarts from now. fexit of sk_stream_wait_memory restarts it too, but a
 * kernel may inline that wait where tcp_sendmsg calls it (Debian's 7.2 showed a 1 s
 * in-call wait): the switch count does not depend on it. A UDP sender's sleep is the
 * device's queue holding its buffer (host time), and stays in.
 */
static __always_inline bool tcp_call_slept(struct tt_send_call *call, const struct sock *sk,
					   __u64 now)
{
	__u64 switches;

	if (!is_tcp_sock(sk))
		return false;
	switches = voluntary_switches();
	if (switches == call->switches)
		return false;
	call->switches = switches;
	call->start_ns = now;
	return true;
}

static __always_inline void send_call_start(const struct sock *sk)
{
	__u64 thread = bpf_get_current_pid_tgid();
	struct tt_send_call *call = send_call_slot(thread);

	if (!call)
		return;
	call->thread = thread;
	call->start_ns = bpf_ktime_get_ns();
	call->sk = (__u64)(unsigned long)sk;
	call->last_skb = 0;
	if (is_tcp_sock(sk))
		call->switches = voluntary_switches();
}

static __always_inline void send_call_end(void)
{
	__u64 thread = bpf_get_current_pid_tgid();
	struct tt_send_call *call = send_call_slot(thread);

	if (call && call->thread == thread)
		call->thread = 0;
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
	struct tt_send_call *call = send_call_slot(thread);

	if (call && call->thread == thread && call->sk == (__u64)(unsigned long)sk)
		call->start_ns = bpf_ktime_get_ns();
	return 0;
}

/* The device has no queue (noqueue, the default of loopback, veth and most virtual
 * devices): its root qdisc has no enqueue and is not a multiqueue root, whose children
 * queue. The driver's transmit then follows the device layer at once, in the sender's
 * context: nothing to stamp, no clock to read. */
static __always_inline bool without_queue(const struct net_device *dev)
{
	const struct Qdisc *root;

	if (!dev)
		return false;
	root = dev->qdisc;
	return root && !root->enqueue && !(root->flags & TT_TCQ_F_MQROOT);
}

/* The packet reaches the device layer (__dev_queue_xmit). A virtual device's packet comes
 * here again on the device below it: the later entry wins, so qdisc-sojourn times the last
 * device's queue, and the call's start is kept from the first. */
SEC("tp_btf")
int BPF_PROG(send_dev_queue, struct sk_buff *skb)
{
	__u64 addr = (__u64)(unsigned long)skb, now, call_start = 0;
	struct tt_queued_packet *q;
	__u32 sender = 0;

	if (without_queue(skb->dev))
		return 0;
	q = queued_slot(skb);
	if (!q)
		return 0;
	now = bpf_ktime_get_ns();
	if (send_to_qdisc_on && skb->sk) {
		__u64 thread = bpf_get_current_pid_tgid();
		struct tt_send_call *call = send_call_slot(thread);

		if (call && call->thread == thread && call->sk == (__u64)(unsigned long)skb->sk &&
		    call->last_skb != addr) {
			call_start = tcp_call_slept(call, skb->sk, now) ? 0 : call->start_ns;
			sender = thread >> 32;
			/* The call's next packet is timed from this one's handoff: a call of many
			 * packets is not timed as the sum of their sends. A device below this one
			 * (a VLAN's, with a queue of its own) must not time this packet again. */
			call->start_ns = now;
			call->last_skb = addr;
		} else if (q->skb == addr) {
			/* Again, on the device below: keep the first device's call start. */
			call_start = q->call_start_ns;
			sender = q->sender_pid;
		}
	}
	/* Cleared first and set last: a reader on another CPU never takes a half-written
	 * entry for this packet's. */
	q->skb = 0;
	q->queued_ns = now;
	q->call_start_ns = call_start;
	q->sender_pid = sender;
	q->ifindex = skb->dev ? skb->dev->ifindex : 0;
	q->len = skb->len;
	q->skb = addr;
	return 0;
}

/* A device without a queue: send-to-qdisc from the sender's call, which is still running
 * (nothing deferred the transmit). No qdisc-sojourn: there was no queue to sojourn in. */
static __always_inline void send_unqueued(const struct sk_buff *skb, struct tt_sample *s)
{
	__u64 thread = bpf_get_current_pid_tgid(), addr = (__u64)(unsigned long)skb, now;
	struct tt_send_call *call = send_call_slot(thread);
	__u32 service;

	if (!call || call->thread != thread || call->sk != (__u64)(unsigned long)skb->sk)
		return;
	s->sk = sending_sock(skb);
	if (!s->sk || !filters_pass(skb, s->sk, false, thread >> 32, true))
		return;
	now = bpf_ktime_get_ns();
	if (call->start_ns > now || tcp_call_slept(call, s->sk, now))
		return;
	service = service_of_sock(s->sk);
	s->probe = TT_PROBE_SEND_TO_QDISC;
	s->sender_pid = thread >> 32;
	record_measured(s, service, now - call->start_ns, false, 0);
	call->start_ns = now;
	call->last_skb = addr;
}

/* The driver's transmit: both intervals of the packet, if it was seen at the device
 * layer. */
SEC("tp_btf")
int BPF_PROG(send_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	__u64 addr = (__u64)(unsigned long)skb, queued, call_start, now;
	struct tt_queued_packet *q = queued_slot(skb);
	struct tt_sample s = {
		.skb = skb,
		.clock = TT_CLOCK_MONOTONIC,
		.send = true,
	};
	__u32 service;

	if (!q || q->skb != addr) {
		if (send_to_qdisc_on && skb->sk && without_queue(dev))
			send_unqueued(skb, &s);
		return 0;
	}
	queued = q->queued_ns;
	call_start = q->call_start_ns;
	s.sender_pid = q->sender_pid;
	/* Another packet at a reused address, or one changed on the way (segmented), or the
	 * entry rewritten while it was read: no sound start. */
	if (q->ifindex != dev->ifindex || q->len != skb->len || q->skb != addr)
		return 0;
	q->skb = 0;
	s.sk = sending_sock(skb);
	if (!filters_pass(skb, s.sk, false, s.sender_pid, true))
		return 0;
	now = bpf_ktime_get_ns();
	service = s.sk ? service_of_sock(s.sk) : TT_SERVICE_HOST;
	if (send_to_qdisc_on && call_start && call_start <= queued) {
		s.probe = TT_PROBE_SEND_TO_QDISC;
		record_measured(&s, service, queued - call_start, false, 0);
	}
	if (qdisc_sojourn_on && queued <= now) {
		s.probe = TT_PROBE_QDISC_SOJOURN;
		record_measured(&s, service, now - queued, false, 0);
	}
	if (driver_to_completion_on)
		note_transmit(skb, dev, service, now);
	return 0;
}

#endif /* TT_SEND_BPF_H */
