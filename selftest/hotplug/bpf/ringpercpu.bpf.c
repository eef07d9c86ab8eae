// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* A PERFBUF_BUFFER for the hotplug test of a ring buffer per CPU
 * (ringpercpu_test.go), which bpfbuffer.Prepare makes an array of ring
 * buffers. produce writes args[0] records (at most 64) of 16 bytes with
 * perfbuf_buffer_output: u64 seq, u32 cpu, u32 zero. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "perfbuf.bpf.h"

PERFBUF_BUFFER(events, 4096, 16);

struct rec {
	__u64 seq;
	__u32 cpu;
	__u32 zero;
};

SEC("raw_tp")
int produce(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0];
	struct rec r = {.cpu = bpf_get_smp_processor_id()};
	__u32 i;

	for (i = 0; i < 64 && i < count; i++) {
		r.seq = i;
		perfbuf_buffer_output(ctx, events, &r, sizeof(r));
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
