// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* A buffer as a perfbuf.bpf.h older than the array of ring buffers
 * declared it (TestAnyOldConfig): the maps PERFBUF_BUFFER makes, and an
 * events_config of three __u64, with no cpus_per_ring. Prepare with Any
 * makes it one ring buffer. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__uint(value_size, 64);
} events_scratch SEC(".maps");

/* struct perfbuf_buffer_config before cpus_per_ring. */
struct old_config {
	__u64 ringbuf;
	__u64 wakeup_bytes;
	__u64 max_sample;
};

const volatile struct old_config events_config = {.ringbuf = 1, .max_sample = 64};

SEC("raw_tp")
int produce(void *ctx)
{
	__u64 v = 1;

	if (events_config.ringbuf == 1)
		bpf_ringbuf_output(&events, &v, sizeof(v), 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
