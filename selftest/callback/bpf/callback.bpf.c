// SPDX-License-Identifier: GPL-2.0
/* Callback-mode scenarios: accounting under overload, sizes, lost records,
 * Close while polling. Driven by callback_test.go. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

/* Not a perf event array: New must refuse it by name and type. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} not_perf SEC(".maps");

#include "../../common/emit.bpf.h"

SEC("raw_tp")
int emit(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_samples(ctx, ctx->args);
}

char LICENSE[] SEC("license") = "GPL";
