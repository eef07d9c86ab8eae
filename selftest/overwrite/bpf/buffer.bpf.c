// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* A PERFBUF_BUFFER that bpfbuffer.Prepare and ciliumbuffer.Prepare make a
 * ring per CPU in overwrite mode (prepare_test.go). `produce` outputs
 * records of { u64 seq; u32 cpu; u32 zero }. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "perfbuf.bpf.h"

#define BATCH 256

PERFBUF_BUFFER(events, 4096, 16);

struct rec {
	__u64 seq;
	__u32 cpu;
	__u32 zero;
};

/* args: count (at most BATCH), seq of the first record. */
SEC("raw_tp")
int produce(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], seq = ctx->args[1];
	struct rec r = { .cpu = bpf_get_smp_processor_id() };
	__u32 i;

	for (i = 0; i < BATCH && i < count; i++) {
		r.seq = seq + i;
		perfbuf_buffer_output(ctx, events, &r, sizeof(r));
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
