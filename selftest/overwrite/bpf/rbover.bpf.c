// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* A BPF ring buffer in overwrite mode (kernel 6.19; overwrite_test.go): `fill`
 * outputs records with sequence numbers past the ring's size, then asks the
 * kernel where its positions are (bpf_ringbuf_query), so that the test can
 * check the offsets at which it reads them in the mapped producer page. The
 * object loads only where the kernel knows the flag. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "perfbuf.bpf.h"

/* Not in a 6.18 vmlinux.h (include/uapi/linux/bpf.h, 6.19). */
#define PB_F_RB_OVERWRITE (1U << 19)	/* BPF_F_RB_OVERWRITE */
#define PB_RB_OVERWRITE_POS 4		/* BPF_RB_OVERWRITE_POS */

#define RING_SIZE (64 << 10)
#define MAX_SIZE 256	/* largest record */
#define BATCH 256	/* most records a run outputs */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
	__uint(map_flags, PB_F_RB_OVERWRITE);
} rb SEC(".maps");

/* What bpf_ringbuf_query said after the last run. */
struct positions {
	__u64 overwrite;
	__u64 producer;
	__u64 consumer;
	__u64 avail;
	__u64 failed;	/* outputs that failed, over every run */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct positions);
} positions SEC(".maps");

struct scratch {
	__u8 data[MAX_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* args: count (at most BATCH), size (8 to MAX_SIZE), seq of the first record.
 * Record: u64 seq, then byte i = i * 7 (written once a run: the verifier walks
 * every iteration, and a pattern per record would cost it BATCH times more). */
SEC("raw_tp")
int fill(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], size = ctx->args[1], seq = ctx->args[2];
	__u32 zero = 0, i, j;
	struct positions *pos = bpf_map_lookup_elem(&positions, &zero);
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (!pos || !s)
		return 1;
	if (count > BATCH || size < 8 || size > MAX_SIZE)
		return 2;
	for (j = 8; j < MAX_SIZE; j++)
		s->data[j] = j * 7;
	for (i = 0; i < BATCH && i < count; i++) {
		*(__u64 *)s->data = seq + i;
		if (bpf_ringbuf_output(&rb, s->data, size, 0))
			pos->failed++;
	}
	pos->overwrite = bpf_ringbuf_query(&rb, PB_RB_OVERWRITE_POS);
	pos->producer = bpf_ringbuf_query(&rb, BPF_RB_PROD_POS);
	pos->consumer = bpf_ringbuf_query(&rb, BPF_RB_CONS_POS);
	pos->avail = bpf_ringbuf_query(&rb, BPF_RB_AVAIL_DATA);
	return 0;
}

/* A second ring in overwrite mode that `fill_counted` writes through
 * perfbuf.bpf.h, its failures counted in `failures`: a Recorder pauses it
 * through the failure map's reader key (recorder_test.go). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_SIZE);
	__uint(map_flags, PB_F_RB_OVERWRITE);
} rbc SEC(".maps");

PERFBUF_FAILURE_MAP(failures);

/* args: count (at most BATCH), seq of the first record. Record: u64 seq. */
SEC("raw_tp")
int fill_counted(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], seq = ctx->args[1];
	__u32 i;

	for (i = 0; i < BATCH && i < count; i++) {
		__u64 v = seq + i;

		perfbuf_ringbuf_output(&rbc, &failures, &v, sizeof(v), 0);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
