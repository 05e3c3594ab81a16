/* SPDX-License-Identifier: GPL-2.0-only */
/*
 * Where the reading thread was while a slow packet waited for it: runnable but waiting for
 * a CPU, off CPU (sleeping, blocked), or on a CPU. Armed capture of socket reads only.
 *
 * A thread is followed from its first slow read under armed capture: capture gives it task
 * storage, and the scheduler's tracepoints (sched_switch, sched_wakeup) keep its last spans
 * of run-queue wait and of off-CPU time there. Every other thread costs each hook one
 * task-storage lookup that finds nothing (a pointer read). The loader attaches the two
 * hooks only while some service is armed, so a disarmed host pays nothing per context
 * switch. A later slow read of a followed thread sums the spans that overlap its packet's
 * wait. Kernels without task storage in tracing programs (before 5.11) never load these
 * programs; the verifier drops the capture side through have_task_storage.
 */
#ifndef TT_READER_WAIT_BPF_H
#define TT_READER_WAIT_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "tailtrap.h"

/* Spans kept per kind: a read whose wait holds more than this many switches of its thread
 * gets no split (lost_until_ns), never a wrong one. A power of two: the index is masked. */
#define TT_WAIT_SPANS 8

const volatile bool have_task_storage = true;
/* CLOCK_MONOTONIC when the hooks were last attached; 0 while detached. Storage of an older
 * epoch is stale (the hooks missed switches in between) and is started again. */
volatile __u64 reader_wait_epoch_ns;

struct tt_wait_span {
	__u64 start_ns;
	__u64 end_ns;
};

struct tt_reader_wait {
	__u64 epoch_ns;
	/* Followed (every switch seen) since then. */
	__u64 since_ns;
	/* A span ending after this was overwritten: the split of an older wait is unknown. */
	__u64 lost_until_ns;
	/* Runnable (preempted, or woken) since then; 0 when not. */
	__u64 runq_since_ns;
	/* Switched out to sleep since then; 0 when not. */
	__u64 off_since_ns;
	__u32 runq_head;
	__u32 off_head;
	struct tt_wait_span runq[TT_WAIT_SPANS];
	struct tt_wait_span off[TT_WAIT_SPANS];
	/* The task the thread took its CPU back from after its last run-queue wait. */
	__u64 holder_at_ns;
	__u32 holder_pid;
	__u32 pad;
	__u8 holder_comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tt_reader_wait);
} reader_waits SEC(".maps");

/* task_struct.state before 5.14 renamed it __state. */
struct task_struct___pre_5_14 {
	long state;
} __attribute__((preserve_access_index));

/* t is a BTF pointer of the tracepoint: plain loads, no kernel-read helper call (each of
 * those costs tens of ns, and this runs on every switch of a followed thread). */
static __always_inline long task_state(const struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((const struct task_struct___pre_5_14 *)t)->state;
}

/* The followed thread's storage for the current epoch; NULL for every other thread. */
static __always_inline struct tt_reader_wait *followed(struct task_struct *t)
{
	struct tt_reader_wait *w = bpf_task_storage_get(&reader_waits, t, 0, 0);

	if (!w || w->epoch_ns != reader_wait_epoch_ns || !w->epoch_ns)
		return NULL;
	return w;
}

static __always_inline void push_span(struct tt_reader_wait *w, bool runq, __u64 start,
				      __u64 end)
{
	struct tt_wait_span *span;
	__u32 i;

	if (runq) {
		i = w->runq_head++ & (TT_WAIT_SPANS - 1);
		span = &w->runq[i];
	} else {
		i = w->off_head++ & (TT_WAIT_SPANS - 1);
		span = &w->off[i];
	}
	if (span->end_ns > w->lost_until_ns)
		w->lost_until_ns = span->end_ns;
	span->start_ns = start;
	span->end_ns = end;
}

/* Sections name only the attach kind; the loader sets the tracepoint (probes.rs). */
SEC("tp_btf")
int BPF_PROG(reader_wait_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next)
{
	struct tt_reader_wait *w;
	__u64 now = 0;

	w = followed(prev);
	if (w) {
		now = bpf_ktime_get_ns();
		/* Still runnable (preempted, yielded): it waits in the run queue from here. */
		if (preempt || task_state(prev) == 0)
			w->runq_since_ns = now;
		else
			w->off_since_ns = now;
	}
	w = followed(next);
	if (w) {
		if (!now)
			now = bpf_ktime_get_ns();
		if (w->runq_since_ns) {
			push_span(w, true, w->runq_since_ns, now);
			w->runq_since_ns = 0;
			w->holder_at_ns = now;
			w->holder_pid = prev->tgid;
			__builtin_memcpy(w->holder_comm, prev->comm, sizeof(w->holder_comm));
		} else if (w->off_since_ns) {
			/* Woken without a wakeup seen (woken before the hooks attached). */
			push_span(w, false, w->off_since_ns, now);
		}
		w->off_since_ns = 0;
	}
	return 0;
}

SEC("tp_btf")
int BPF_PROG(reader_wait_wakeup, struct task_struct *p)
{
	struct tt_reader_wait *w = followed(p);
	__u64 now;

	if (!w || !w->off_since_ns)
		return 0;
	now = bpf_ktime_get_ns();
	push_span(w, false, w->off_since_ns, now);
	w->off_since_ns = 0;
	w->runq_since_ns = now;
	return 0;
}

/* Sum of the spans' overlap with [t0, t1]. */
static __always_inline __u64 overlap(const struct tt_wait_span *spans, __u64 t0, __u64 t1)
{
	__u64 sum = 0;

	for (int i = 0; i < TT_WAIT_SPANS; i++) {
		__u64 s = spans[i].start_ns > t0 ? spans[i].start_ns : t0;
		__u64 e = spans[i].end_ns < t1 ? spans[i].end_ns : t1;

		if (e > s)
			sum += e - s;
	}
	return sum;
}

/*
 * A slow socket read in the reader's own context: split the packet's wait if the thread
 * was followed for all of it, and follow the thread from now on if it was not yet.
 */
static __always_inline void reader_wait_fill(struct tt_capture_record *r, __u64 latency_ns)
{
	struct tt_reader_wait *w;
	__u64 epoch = reader_wait_epoch_ns, t0, t1;

	if (!have_task_storage || !epoch)
		return;
	w = bpf_task_storage_get(&reader_waits, bpf_get_current_task_btf(), 0,
				 BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!w)
		return;
	t1 = bpf_ktime_get_ns();
	if (w->epoch_ns != epoch) {
		__builtin_memset(w, 0, sizeof(*w));
		w->epoch_ns = epoch;
		w->since_ns = t1;
		return;
	}
	t0 = t1 - latency_ns;
	if (latency_ns > t1 || w->since_ns > t0 || w->lost_until_ns > t0)
		return;
	r->runq_ns = overlap(w->runq, t0, t1);
	r->off_cpu_ns = overlap(w->off, t0, t1);
	r->flags |= TT_CAPTURE_F_READER_WAIT;
	if (w->holder_at_ns >= t0) {
		r->holder_pid = w->holder_pid;
		__builtin_memcpy(r->holder_comm, w->holder_comm, sizeof(r->holder_comm));
		r->flags |= TT_CAPTURE_F_CPU_HOLDER;
	}
}

#endif /* TT_READER_WAIT_BPF_H */
