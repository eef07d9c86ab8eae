// SPDX-License-Identifier: GPL-2.0
/* Fills the rings for the drain benchmarks (bench_test.go). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

#include "../../common/emit.bpf.h"

SEC("raw_tp")
int emit(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_samples(ctx, ctx->args);
}

char LICENSE[] SEC("license") = "GPL";
