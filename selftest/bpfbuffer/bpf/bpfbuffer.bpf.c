// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* A buffer whose kind is chosen at load (bpfbuffer_test.go): one
 * PERFBUF_BUFFER written through perfbuf_buffer_output, _reserve, _submit
 * and _discard of bpf/perfbuf.bpf.h, loaded as a ring buffer, as a perf
 * event array, and as an array of ring buffers (percpu_test.go). The program counts
 * every attempt and its result itself, in `outcomes`, so that the test
 * accounts for every record against what perfbuf reports.
 *
 * Sample layout (host byte order), truncated to the sample's size:
 *   u64 seq (the CPU's attempt number); u32 cpu; u32 size; then zeros, or
 *   (HOW_STAMPED) the u64 time perfbuf_stamp read after the reserve. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "perfbuf.bpf.h"

#define RING_SIZE (64 * 1024)
#define SAMPLE_MAX 256
#define BATCH 64

PERFBUF_BUFFER(events, RING_SIZE, SAMPLE_MAX);

/* A map of ring buffers with its one slot left empty: an output to the
 * ring buffer it does not hold fails with a NULL inner map (noent). */
struct inner_rb {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE); /* a multiple of any page size: cilium/ebpf rounds nothing */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct inner_rb);
} rings SEC(".maps");

struct sample_hdr {
	__u64 seq;
	__u32 cpu;
	__u32 size;
};

/* What the program saw, per CPU. */
struct outcome {
	__u64 attempts;
	__u64 ok;        /* output, or reserved and submitted, without error */
	__u64 discarded; /* reserved, then discarded */
	__u64 full;      /* ring buffer: no room (reserve NULL, output -EAGAIN) */
	__u64 nospc;     /* perf event array: the CPU's ring full (a lost sample) */
	__u64 noent;     /* -ENOENT: no ring for the CPU, or no inner ring buffer */
	__u64 einval;    /* a reserve above SAMPLE_MAX */
	__u64 other;     /* any other error */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct outcome);
} outcomes SEC(".maps");

struct sample_buf {
	__u8 data[SAMPLE_MAX];
};

/* The program's own buffer for perfbuf_buffer_output's data. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_buf);
} data SEC(".maps");

enum how {
	HOW_OUTPUT,  /* perfbuf_buffer_output of `size` bytes */
	HOW_RESERVE, /* perfbuf_buffer_reserve, then _submit; of 32 bytes, or 256 for a size above 64 */
	HOW_DISCARD, /* as HOW_RESERVE, discarding every `every`-th */
	HOW_TOO_BIG, /* perfbuf_buffer_reserve above SAMPLE_MAX */
	HOW_INNER,   /* perfbuf_ringbuf_output to the empty slot of `rings` */
	HOW_STAMPED, /* as HOW_RESERVE of 32 bytes, perfbuf_stamp's key after the header */
};

static __always_inline void count_err(struct outcome *o, long err)
{
	if (!err)
		o->ok++;
	else if (err == -EAGAIN)
		o->full++;
	else if (err == -ENOSPC)
		o->nospc++;
	else if (err == -ENOENT)
		o->noent++;
	else
		o->other++;
}

static __always_inline void fill(struct sample_hdr *h, __u64 seq, __u32 cpu, __u32 size)
{
	h->seq = seq;
	h->cpu = cpu;
	h->size = size;
}

/* One record of `size` bytes (a constant at each call) reserved, filled,
 * and submitted or discarded. */
static __always_inline void reserve_submit(void *ctx, struct outcome *o, const __u64 size, __u64 seq, __u32 cpu,
					   int discard)
{
	struct sample_hdr *h = perfbuf_buffer_reserve(events, size);

	if (!h) {
		/* Within SAMPLE_MAX, only a ring buffer refuses: no room. */
		if (events_config.ringbuf)
			o->full++;
		else
			o->other++;
		return;
	}
	fill(h, seq, cpu, size);
	if (discard) {
		perfbuf_buffer_discard(events, h);
		o->discarded++;
		return;
	}
	count_err(o, perfbuf_buffer_submit(ctx, events, h, size));
}

/* args: count (<= BATCH), size (in [16, SAMPLE_MAX]), how, every. */
SEC("raw_tp")
int produce(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], size = ctx->args[1], how = ctx->args[2], every = ctx->args[3];
	__u32 zero = 0, cpu = bpf_get_smp_processor_id(), i;
	struct outcome *o = bpf_map_lookup_elem(&outcomes, &zero);
	struct sample_buf *b = bpf_map_lookup_elem(&data, &zero);

	if (!o || !b)
		return 1;
	if (count > BATCH || size < sizeof(struct sample_hdr) || size > SAMPLE_MAX || !every)
		return 2;
	for (i = 0; i < BATCH && i < count; i++) {
		__u64 seq = o->attempts++;
		struct sample_hdr *h;
		__u64 n = size;

		switch (how) {
		case HOW_OUTPUT:
		case HOW_INNER:
			fill((void *)b->data, seq, cpu, size);
			barrier_var(n);
			if (n > SAMPLE_MAX)
				return 2;
			if (how == HOW_OUTPUT) {
				count_err(o, perfbuf_buffer_output(ctx, events, b->data, n));
			} else {
				void *rb = bpf_map_lookup_elem(&rings, &zero);

				count_err(o, perfbuf_ringbuf_output(rb, &events_failures, b->data, n, 0));
			}
			continue;
		case HOW_STAMPED:
			/* 32 bytes, a path of its own: a flag through reserve_submit
			 * doubled the states the verifier walks (past its million
			 * instructions on the perf path). */
			h = perfbuf_buffer_reserve(events, 32);
			if (!h) {
				if (events_config.ringbuf)
					o->full++;
				else
					o->other++;
				continue;
			}
			fill(h, seq, cpu, 32);
			perfbuf_stamp((__u64 *)(h + 1));
			count_err(o, perfbuf_buffer_submit(ctx, events, h, 32));
			continue;
		case HOW_TOO_BIG:
			h = perfbuf_buffer_reserve(events, SAMPLE_MAX + 8);
			if (h) {
				perfbuf_buffer_discard(events, h);
				o->other++;
			} else {
				o->einval++;
			}
			continue;
		}
		/* perfbuf_buffer_reserve takes a constant size: two sizes, each
		 * reserved, filled and submitted on a path of its own (the
		 * verifier of kernels before 5.13 lost the record's reference
		 * where the two paths joined). */
		if (size > 64)
			reserve_submit(ctx, o, 256, seq, cpu, how == HOW_DISCARD && seq % every == every - 1);
		else
			reserve_submit(ctx, o, 32, seq, cpu, how == HOW_DISCARD && seq % every == every - 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
