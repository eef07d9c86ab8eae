/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* The emit program of perfbench's two emitters, the perf event array's
 * (perfbench.bpf.c) and the ring buffer's (rbbench.bpf.c): one test run
 * emits up to EMIT_RUN_MAX samples, so that the saturation measurements
 * can make test runs of 256 and of 4096 samples (-batches) on either ring
 * kind alike.
 *
 * The including file defines emit_part, which emits up to EMIT_RUN_PART
 * samples into its ring kind, as a global function: the verifier checks a
 * global function once on its own, not once per call. Its loop is bounded
 * by a constant, not bpf_loop (5.17+), so that the programs load on 5.10:
 * the verifier walks every iteration, and EMIT_RUN_MAX of them in one
 * function pass its limit of 8192 jumps in a row.
 *
 * args (the raw_tp context, as emit.bpf.h's struct emit_args): count (at
 * most EMIT_RUN_MAX), size (of sample 0), span (sample n has size + n % span
 * bytes; 0: all equal), first (n of this run's first sample). Returns 0, 2
 * for a count over EMIT_RUN_MAX, or emit_part's first non-zero return. */
#ifndef PERFBENCH_EMIT_RUN_BPF_H
#define PERFBENCH_EMIT_RUN_BPF_H

#define EMIT_RUN_MAX 4096
#define EMIT_RUN_PART 256

/* Emits count (at most EMIT_RUN_PART) samples, sample n of size + n % span
 * bytes, numbered from first; 0 on success. A ring kind that needs the
 * program's context (bpf_perf_event_output does) defines EMIT_PART_CTX
 * before this header, and its emit_part takes ctx first; the other does
 * not take it at all: clang passes no value for an argument the callee
 * never reads, and the verifier rejects such a call ("expects pointer to
 * ctx"). */
#ifdef EMIT_PART_CTX
__attribute__((noinline)) int emit_part(struct bpf_raw_tracepoint_args *ctx, __u64 count, __u64 size,
					__u64 span, __u64 first);
#define EMIT_PART(ctx, count, size, span, first) emit_part(ctx, count, size, span, first)
#else
__attribute__((noinline)) int emit_part(__u64 count, __u64 size, __u64 span, __u64 first);
#define EMIT_PART(ctx, count, size, span, first) emit_part(count, size, span, first)
#endif

SEC("raw_tp")
int emit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], size = ctx->args[1], span = ctx->args[2], first = ctx->args[3];
	__u64 done = 0;
	__u32 i;
	int ret;

	if (count > EMIT_RUN_MAX)
		return 2;
	for (i = 0; i < EMIT_RUN_MAX / EMIT_RUN_PART && done < count; i++) {
		__u64 n = count - done < EMIT_RUN_PART ? count - done : EMIT_RUN_PART;

		ret = EMIT_PART(ctx, n, size, span, first + done);
		if (ret)
			return ret;
		done += n;
	}
	return 0;
}

#endif
