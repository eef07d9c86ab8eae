// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Reader scenarios, fullest-first and ordered (readers_test.go): the
 * emitter; and a ring buffer with a producer of its own
 * (ownership_test.go). */
#include "../../common/emit.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} rb_events SEC(".maps");

/* args[0]: records to output into rb_events, at most 64, of 32 bytes
 * each; returns 1 if one fails. */
SEC("raw_tp")
int produce_rb(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 n = ctx->args[0], data[4] = {};
	__u32 i;

	for (i = 0; i < 64 && i < n; i++) {
		data[0] = i;
		if (bpf_ringbuf_output(&rb_events, data, sizeof(data), 0))
			return 1;
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
