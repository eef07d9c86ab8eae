// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* perfbench's host measurement (bench/internal/benchrun/host.go): producers
 * the kernel runs. Two tracepoint programs on getppid(2), one per ring kind,
 * each writing a 16-byte record for every call made by the thread that
 * host_config names, and by no other: perfbench attaches one of them at a
 * time, and its workload calls getppid at a set rate.
 *
 * Record (host byte order): u64 seq; u64 ktime_ns (bpf_ktime_get_ns, which
 * is CLOCK_MONOTONIC: the reader measures the delivery latency from it). The
 * quiet emitters put their ktime at the same offset.
 *
 * host_config.rb_flags are host_rb's bpf_ringbuf_output flags, set per mode
 * (BPF_RB_NO_WAKEUP for the hand-tuned C consumer, which drains on a timer). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define HOST_RB_BYTES (4 << 20) /* benchrun.HostRBBytes */

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} host_perf_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, HOST_RB_BYTES);
} host_rb_events SEC(".maps");

struct host_config {
	__u32 tid;	/* the workload's thread, in the PID namespace below: the only caller recorded */
	__u32 pad;
	__u64 rb_flags; /* host_rb's output flags */
	__u64 ns_dev;	/* the workload's PID namespace: /proc/self/ns/pid's device */
	__u64 ns_ino;	/* and inode (a container's namespace numbers threads its own way) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct host_config);
} host_config SEC(".maps");

/* emit_stats, as emit.bpf.h names and lays it out (bpfrun.Stats reads it). */
struct host_stats {
	__u64 emitted; /* the output succeeded */
	__u64 failed;  /* it failed: no room (or, perf, no reader) */
	__u64 seq;     /* next sequence number */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct host_stats);
} emit_stats SEC(".maps");

struct host_record {
	__u64 seq;
	__u64 ktime_ns;
};

/* host_begin returns the stats to count into if the current thread is the
 * workload's, and fills rec; NULL otherwise. */
static __always_inline struct host_stats *host_begin(struct host_config **cfg, struct host_record *rec)
{
	__u32 zero = 0;
	struct host_stats *st;

	struct bpf_pidns_info ns;

	*cfg = bpf_map_lookup_elem(&host_config, &zero);
	if (!*cfg || bpf_get_ns_current_pid_tgid((*cfg)->ns_dev, (*cfg)->ns_ino, &ns, sizeof(ns)) || ns.pid != (*cfg)->tid)
		return NULL;
	st = bpf_map_lookup_elem(&emit_stats, &zero);
	if (!st)
		return NULL;
	rec->seq = st->seq++;
	rec->ktime_ns = bpf_ktime_get_ns();
	return st;
}

static __always_inline void host_count(struct host_stats *st, long err)
{
	if (err)
		st->failed++;
	else
		st->emitted++;
}

SEC("tp/syscalls/sys_enter_getppid")
int host_perf(void *ctx)
{
	struct host_config *cfg;
	struct host_record rec;
	struct host_stats *st = host_begin(&cfg, &rec);

	if (!st)
		return 0;
	host_count(st, bpf_perf_event_output(ctx, &host_perf_events, BPF_F_CURRENT_CPU, &rec, sizeof(rec)));
	return 0;
}

SEC("tp/syscalls/sys_enter_getppid")
int host_rb(void *ctx)
{
	struct host_config *cfg;
	struct host_record rec;
	struct host_stats *st = host_begin(&cfg, &rec);

	if (!st)
		return 0;
	host_count(st, bpf_ringbuf_output(&host_rb_events, &rec, sizeof(rec), cfg->rb_flags));
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
