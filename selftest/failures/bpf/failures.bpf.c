// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Failure accounting scenarios (failures_test.go): outputs through
 * perfbuf_output (bpf/perfbuf.bpf.h) that succeed, that find a full ring
 * (-ENOSPC, reported by the kernel as lost), and that fail for each cause
 * the failure map counts. The program also counts every attempt and its
 * result itself, in `outcomes`, so that the test checks perfbuf_output's
 * counts against what the helper returned.
 *
 * The test runs it with BPF_PROG_TEST_RUN on a chosen CPU; its args (u64)
 * say what to output: */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "perfbuf.bpf.h"

struct output_args {
	__u64 count; /* outputs, at most OUTPUT_BATCH */
	__u64 size;  /* bytes each, in [sizeof(struct sample_hdr), SAMPLE_MAX] */
	__u64 flags; /* bpf_perf_event_output's flags, as given */
	__u64 map;   /* 0: events; 1: events1 */
};

#define OUTPUT_BATCH 64
#define SAMPLE_MAX 512

/* Every sample starts so (host byte order); the rest is zeros. */
struct sample_hdr {
	__u64 seq;  /* the CPU's attempt number: outcomes.attempts before it */
	__u32 cpu;  /* the CPU it was output on */
	__u32 size; /* its size as output */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

/* One slot: only CPU 0 gets a ring, and an output with BPF_F_CURRENT_CPU
 * on any other CPU fails with -E2BIG, counted for a CPU without a ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events1 SEC(".maps");

PERFBUF_FAILURE_MAP(failures);

/* What the program saw, per CPU, whatever perfbuf_output counted. */
struct outcome {
	__u64 attempts;
	__u64 ok;
	__u64 nospc;
	__u64 noent;
	__u64 e2big;
	__u64 einval;
	__u64 opnotsupp;
	__u64 other;
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

/* Maps that New must refuse as failure maps: another type; the right type
 * with another value size; the right map of another version of the header
 * (max_entries); the right map that user space may not read (BPF_F_WRONLY).
 * An array's keys are always 4 bytes, so no array can have the wrong key
 * size. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct perfbuf_failures);
} bad_type SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} bad_value SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* version 0: counts, no reader key */
	__type(key, __u32);
	__type(value, struct perfbuf_failures);
} old_version SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PERFBUF_BPF_VERSION + 2);
	__type(key, __u32);
	__type(value, struct perfbuf_failures);
} new_version SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PERFBUF_BPF_VERSION + 1);
	__uint(map_flags, BPF_F_WRONLY);
	__type(key, __u32);
	__type(value, struct perfbuf_failures);
} write_only SEC(".maps");

SEC("raw_tp")
int output(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 count = ctx->args[0], size = ctx->args[1], flags = ctx->args[2], map = ctx->args[3];
	__u32 zero = 0, cpu = bpf_get_smp_processor_id(), i;
	struct outcome *o = bpf_map_lookup_elem(&outcomes, &zero);
	struct sample_buf *b = bpf_map_lookup_elem(&scratch, &zero);
	struct sample_hdr *h;

	if (!o || !b)
		return 1;
	if (count > OUTPUT_BATCH || size < sizeof(*h) || size > SAMPLE_MAX)
		return 2;
	h = (void *)b->data;
	for (i = 0; i < OUTPUT_BATCH && i < count; i++) {
		__u64 n = size;
		long err;

		/* Checked above, but clang keeps size on the stack, where the
		 * verifier of kernels before 5.13 forgets a scalar's bounds:
		 * bound a copy again just before the output, hidden from
		 * clang (barrier_var) so that it keeps the check. */
		barrier_var(n);
		if (n > SAMPLE_MAX)
			return 2;
		h->seq = o->attempts;
		h->cpu = cpu;
		h->size = n;
		if (map)
			err = perfbuf_output(ctx, &events1, &failures, flags, b->data, n);
		else
			err = perfbuf_output(ctx, &events, &failures, flags, b->data, n);
		o->attempts++;
		switch (err) {
		case 0:
			o->ok++;
			break;
		case -ENOSPC:
			o->nospc++;
			break;
		case -ENOENT:
			o->noent++;
			break;
		case -E2BIG:
			o->e2big++;
			break;
		case -EINVAL:
			o->einval++;
			break;
		case -EOPNOTSUPP:
			o->opnotsupp++;
			break;
		default:
			o->other++;
			break;
		}
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
