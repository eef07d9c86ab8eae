/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* Shared by the selftests' BPF programs: emit `count` samples on the CPU the
 * program runs on (BPF_PROG_TEST_RUN with BPF_F_TEST_RUN_ON_CPU picks it),
 * each carrying a per-CPU sequence number, and count in a per-CPU array
 * what was emitted and what failed (a full ring: the kernel counts those as
 * lost and reports them in a PERF_RECORD_LOST).
 *
 * Sample layout (host byte order), truncated to the sample's size:
 *   u64 seq; u64 ktime_ns; u32 len; u32 cpu; then byte i = i * 7 + seq (mod 256)
 *
 * Including this header defines the perf event array `events` and the
 * raw_tp program `emit` (its args: struct emit_args; not with
 * EMIT_OWN_PROG); a scenario's
 * .bpf.c adds what else it needs and its license. */
#ifndef PERFBUF_EMIT_BPF_H
#define PERFBUF_EMIT_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

#ifndef EMIT_MAX_SIZE
#define EMIT_MAX_SIZE 8192 /* largest sample; a power of two */
#endif

struct emit_hdr {
	__u64 seq;
	__u64 ts;
	__u32 len;
	__u32 cpu;
};

struct emit_stats {
	__u64 emitted; /* bpf_perf_event_output returned 0 */
	__u64 failed;  /* it failed: the kernel counted the sample lost */
	__u64 seq;     /* next sequence number */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emit_stats);
} emit_stats SEC(".maps");

struct emit_buf {
	__u8 data[EMIT_MAX_SIZE];
	__u8 filled; /* data past the header holds its pattern */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emit_buf);
} emit_scratch SEC(".maps");

/* Samples one run emits at most: bpfrun.Emit splits larger counts into
 * runs. The loops are bounded by constants, not bpf_loop (5.17+), so that
 * the program loads on 5.10: the verifier walks every iteration, and this
 * bound keeps that walk well inside its 1M-instruction limit. */
#define EMIT_BATCH 256

/* The test run passes these as the raw_tp context (u64 args). */
struct emit_args {
	__u64 count; /* samples to emit, at most EMIT_BATCH */
	__u64 size;  /* size of sample 0 */
	__u64 span;  /* sample n has size + n % span bytes (span 0: all equal) */
	__u64 first; /* n of this run's first sample */
};

static __always_inline int emit_samples(void *ctx, __u64 *args)
{
	__u32 zero = 0, cpu = bpf_get_smp_processor_id();
	struct emit_stats *st = bpf_map_lookup_elem(&emit_stats, &zero);
	struct emit_buf *buf = bpf_map_lookup_elem(&emit_scratch, &zero);
	struct emit_hdr *h;
	__u64 count = args[0], size0 = args[1], span = args[2], first = args[3];
	__u32 i, j;

	if (!st || !buf)
		return 1;
	if (count > EMIT_BATCH || size0 < 1 || size0 + span > EMIT_MAX_SIZE + 1)
		return 2;
	/* Bytes past the first 32 are the same for every sample, i * 7, and
	 * no sample rewrites them: written once per CPU. */
	if (!buf->filled) {
		for (j = 0; j < EMIT_MAX_SIZE; j++)
			buf->data[j] = j * 7;
		buf->filled = 1;
	}
	h = (void *)buf->data;
	for (i = 0; i < EMIT_BATCH && i < count; i++) {
		__u64 size = size0;
		long err;

		if (span)
			size += (first + i) % span;
		/* Checked above; said again for the verifier. */
		if (size > EMIT_MAX_SIZE)
			return 2;

		h->seq = st->seq++;
		h->ts = bpf_ktime_get_ns();
		h->len = size;
		h->cpu = cpu;
		/* The pattern after the header depends on seq through its
		 * first bytes only (a full rewrite per sample would cost more
		 * than the output): byte i = i * 7 + seq for i in [24, 32). */
		for (j = sizeof(*h); j < sizeof(*h) + 8; j++)
			buf->data[j] = j * 7 + h->seq;

		err = bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, buf->data, size);
		if (err)
			st->failed++;
		else
			st->emitted++;
	}
	return 0;
}

/* A file that defines EMIT_OWN_PROG brings its own emit program, which
 * calls emit_samples (perfbench's, for longer test runs). */
#ifndef EMIT_OWN_PROG
SEC("raw_tp")
int emit(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_samples(ctx, ctx->args);
}
#endif

#endif
