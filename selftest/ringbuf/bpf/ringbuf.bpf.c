// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* BPF ring buffer scenarios (ringbuf_test.go): a ring buffer map written
 * three ways, on a CPU chosen with BPF_PROG_TEST_RUN, with the program's
 * own count of every attempt and its result, so that the test accounts for
 * every record: delivered + discarded + refused (a full ring) == attempted.
 *
 * Sample layout (host byte order), truncated to the sample's size:
 *   u64 seq (the CPU's attempt number); u32 cpu; u32 size; then zeros. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#define RING_SIZE (64 * 1024)
#define EAGAIN 11
#define BATCH 64
#define SAMPLE_MAX 1024

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
} events SEC(".maps");

/* A second ring buffer, for a second reader at once. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
} events2 SEC(".maps");

/* An array of ring buffers, as Falco's modern probe keeps one a CPU: slots
 * 0 and 1 hold a ring each, 2 and 3 are empty (output to them fails). */
struct ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
};
struct ring inner0 SEC(".maps"), inner1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 4);
	__type(key, __u32);
	__array(values, struct ring);
} rings SEC(".maps") = {
	.values = { [0] = &inner0, [1] = &inner1 },
};

struct sample_hdr {
	__u64 seq;
	__u32 cpu;
	__u32 size;
};

struct outcome {
	__u64 attempts;
	__u64 ok;        /* submitted or output */
	__u64 discarded; /* reserved, then discarded */
	__u64 full;      /* reserve failed / output -EAGAIN: no room */
	__u64 other;     /* any other error */
	__u64 noring;    /* no ring in the slot of `rings` */
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_buf);
} scratch SEC(".maps");

/* args: count (<= BATCH), size (in [16, SAMPLE_MAX]), how (0: output;
 * 1: reserve and submit; 2: reserve, and discard every `every`-th attempt,
 * else submit), flags (for output, submit and discard), every, map (0:
 * events, 1: events2, 2 + k: slot k of rings). */
SEC("raw_tp")
int produce(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], size = ctx->args[1], how = ctx->args[2], flags = ctx->args[3];
	__u64 every = ctx->args[4], which = ctx->args[5];
	__u32 zero = 0, cpu = bpf_get_smp_processor_id(), i;
	struct outcome *o = bpf_map_lookup_elem(&outcomes, &zero);
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &zero);
	void *rb = which ? (void *)&events2 : (void *)&events;

	if (!o || !b)
		return 1;
	if (which >= 2) {
		__u32 slot = which - 2;

		rb = bpf_map_lookup_elem(&rings, &slot);
		if (!rb) {
			o->attempts += count;
			o->noring += count;
			return 0;
		}
	}
	if (count > BATCH || size < sizeof(struct sample_hdr) || size > SAMPLE_MAX || !every)
		return 2;
	for (i = 0; i < BATCH && i < count; i++) {
		__u64 seq = o->attempts++;

		if (how == 0) {
			struct sample_hdr *h = (void *)b->data;
			__u64 n = size;
			long err;

			h->seq = seq;
			h->cpu = cpu;
			h->size = size;
			barrier_var(n);
			if (n > SAMPLE_MAX)
				return 2;
			err = bpf_ringbuf_output(rb, b->data, n, flags);
			if (!err)
				o->ok++;
			else if (err == -EAGAIN)
				o->full++;
			else
				o->other++;
			continue;
		}
		/* bpf_ringbuf_reserve needs a constant size: two sizes. */
		struct sample_hdr *h;
		if (size > 64)
			h = bpf_ringbuf_reserve(rb, 256, 0);
		else
			h = bpf_ringbuf_reserve(rb, 32, 0);
		if (!h) {
			o->full++;
			continue;
		}
		h->seq = seq;
		h->cpu = cpu;
		h->size = size > 64 ? 256 : 32;
		if (how == 2 && seq % every == every - 1) {
			bpf_ringbuf_discard(h, flags);
			o->discarded++;
		} else {
			bpf_ringbuf_submit(h, flags);
			o->ok++;
		}
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
