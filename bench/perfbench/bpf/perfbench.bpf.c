// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* perfbench's emitter: the selftests' emit program (emit.bpf.h), with
 * samples up to 1024 bytes, the largest perfbench measures (a smaller
 * scratch buffer makes each test run cheaper), and test runs of up to 4096
 * samples (emit_run.bpf.h) where emit.bpf.h's take 256. */
#define EMIT_MAX_SIZE 1024
#define EMIT_OWN_PROG /* emit_run.bpf.h's emit, not emit.bpf.h's */
#include "../../../selftest/common/emit.bpf.h"
#define EMIT_PART_CTX /* bpf_perf_event_output needs the context */
#include "emit_run.bpf.h"

_Static_assert(EMIT_RUN_PART <= EMIT_BATCH, "a part is one emit_samples call");

/* emit.bpf.h's emit_samples over one part of a run. */
__attribute__((noinline)) int emit_part(struct bpf_raw_tracepoint_args *ctx, __u64 count, __u64 size,
					__u64 span, __u64 first)
{
	__u64 args[4] = {count, size, span, first};

	return emit_samples(ctx, args);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
