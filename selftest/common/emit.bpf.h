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
 * raw_tp program `emit` (its args: count, size, span); a scenario's
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
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct emit_buf);
} emit_scratch SEC(".maps");

/* The test run passes these as the raw_tp context (u64 args). */
struct emit_args {
	__u64 count; /* samples to emit */
	__u64 size;  /* size of sample 0 */
	__u64 span;  /* sample i has size + i % span bytes (span 0: all equal) */
};

struct emit_ctx {
	void *ctx;
	struct emit_args args;
	struct emit_stats *st;
	struct emit_buf *buf;
	__u32 cpu;
};

static long emit_one(__u64 i, void *data)
{
	struct emit_ctx *c = data;
	struct emit_hdr *h = (void *)c->buf->data;
	__u64 size = c->args.size;
	__u32 j;
	long err;

	if (c->args.span)
		size += i % c->args.span;
	if (size < 1 || size > EMIT_MAX_SIZE)
		return 1;

	h->seq = c->st->seq++;
	h->ts = bpf_ktime_get_ns();
	h->len = size;
	h->cpu = c->cpu;
	/* The pattern after the header depends on seq through its first
	 * bytes only (a full rewrite per sample would cost more than the
	 * output): byte i = i * 7 + seq for i in [24, 32). */
	for (j = sizeof(*h); j < sizeof(*h) + 8; j++)
		c->buf->data[j] = j * 7 + h->seq;

	err = bpf_perf_event_output(c->ctx, &events, BPF_F_CURRENT_CPU, c->buf->data, size);
	if (err)
		c->st->failed++;
	else
		c->st->emitted++;
	return 0;
}

static long emit_fill(__u64 i, void *data)
{
	struct emit_ctx *c = data;

	if (i >= EMIT_MAX_SIZE)
		return 1;
	c->buf->data[i] = i * 7;
	return 0;
}

static __always_inline int emit_samples(void *ctx, __u64 *args)
{
	__u32 zero = 0;
	struct emit_ctx c = {.ctx = ctx, .cpu = bpf_get_smp_processor_id()};

	c.args.count = args[0];
	c.args.size = args[1];
	c.args.span = args[2];
	c.st = bpf_map_lookup_elem(&emit_stats, &zero);
	c.buf = bpf_map_lookup_elem(&emit_scratch, &zero);
	if (!c.st || !c.buf)
		return 1;
	/* Bytes past the first 32 are the same for every sample: i * 7. */
	bpf_loop(EMIT_MAX_SIZE, emit_fill, &c, 0);
	bpf_loop(c.args.count, emit_one, &c, 0);
	return 0;
}

SEC("raw_tp")
int emit(struct bpf_raw_tracepoint_args *ctx)
{
	return emit_samples(ctx, ctx->args);
}

#endif
