// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Runs the kernel skips (notrun_test.go). `outer`, a kprobe on getppid(2)
 * of the process in `traced_pid`, writes one record and calls bpf_printk,
 * which fires the tracepoint bpf_trace/bpf_trace_printk from inside outer's
 * run. `inner`, on that tracepoint, is then skipped: a BPF program is
 * already running on the CPU (trace_call_bpf's bpf_prog_active). The
 * kernel counts the skipped run in inner's recursion_misses from 6.7;
 * before, it skips it all the same and counts nothing. (A syscall
 * tracepoint as outer would not do: perf's own recursion guard drops the
 * inner event before any BPF check, and nothing counts it.) If inner ever ran for the process,
 * its record would tell. So each getppid makes one record and one run of
 * inner not run. (No other program here calls bpf_printk: it is only
 * called from programs, so inner never runs outside another's run.) */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32); /* the process (tgid) traced */
} traced_pid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

static __always_inline int traced(void)
{
	__u32 k = 0, *pid = bpf_map_lookup_elem(&traced_pid, &k);

	return pid && *pid == bpf_get_current_pid_tgid() >> 32;
}

/* Attached by the test to the architecture's getppid entry
 * (__x64_sys_getppid, __arm64_sys_getppid): the object is the same for
 * every architecture. */
SEC("kprobe")
int outer(void *ctx)
{
	__u32 rec = 0;

	if (!traced())
		return 0;
	bpf_ringbuf_output(&events, &rec, sizeof(rec), 0);
	bpf_printk("perfbuf notrun selftest");
	return 0;
}

SEC("tp/bpf_trace/bpf_trace_printk")
int inner(void *ctx)
{
	__u32 rec = 1; /* never written: the kernel skips this program */

	if (traced())
		bpf_ringbuf_output(&events, &rec, sizeof(rec), 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
