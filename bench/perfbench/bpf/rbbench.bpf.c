// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* perfbench's ring buffer emitter: selftest/common/emit.bpf.h's emit program
 * and counts, writing a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) instead of a
 * perf event array, under the same names (the map `events`, the program
 * `emit`, the per-CPU `emit_stats`) and with the same arguments, so that
 * internal/bpfrun loads, copies and drives it as it does the perf emitter.
 *
 * Sample layout (host byte order), truncated to the sample's size, as
 * emit.bpf.h's:
 *   u64 seq; u64 ktime_ns; u32 len; u32 cpu; then byte i = i * 7 + seq (mod 256)
 *
 * A ring buffer reports no lost records: a bpf_ringbuf_output that finds
 * the ring full fails with -EAGAIN, and this program counts it in
 * emit_stats.failed, the loss the saturation measurement reports. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "emit_run.bpf.h" /* the emit program: runs of up to 4096 samples */

/* 4 MiB: the drain measurements fill it to 90 %. */
#define RB_BYTES (4 << 20)
#define EMIT_MAX_SIZE 1024 /* largest sample; a power of two */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RB_BYTES);
} events SEC(".maps");

struct emit_hdr {
	__u64 seq;
	__u64 ts;
	__u32 len;
	__u32 cpu;
};

struct emit_stats {
	__u64 emitted; /* bpf_ringbuf_output returned 0 */
	__u64 failed;  /* it failed: the ring was full */
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

/* emit_run.bpf.h's part: count (at most EMIT_RUN_PART) samples, sample n of
 * size0 + n % span bytes (span 0: all of size0), numbered from first.
 * Returns 0, or 1 and 2 as emit.bpf.h's emit_samples does. */
__attribute__((noinline)) int emit_part(__u64 count, __u64 size0, __u64 span, __u64 first)
{
	__u32 zero = 0, cpu = bpf_get_smp_processor_id();
	struct emit_stats *st = bpf_map_lookup_elem(&emit_stats, &zero);
	struct emit_buf *buf = bpf_map_lookup_elem(&emit_scratch, &zero);
	struct emit_hdr *h;
	__u32 i, j;

	if (!st || !buf)
		return 1;
	if (count > EMIT_RUN_PART || size0 < 1 || size0 > EMIT_MAX_SIZE || span > EMIT_MAX_SIZE + 1 - size0)
		return 2;
	/* Bytes past the first 32 are the same for every sample, i * 7, and
	 * no sample rewrites them: written once per CPU. */
	if (!buf->filled) {
		for (j = 0; j < EMIT_MAX_SIZE; j++)
			buf->data[j] = j * 7;
		buf->filled = 1;
	}
	h = (void *)buf->data;
	for (i = 0; i < EMIT_RUN_PART && i < count; i++) {
		__u64 size = size0;
		long err;

		if (span)
			size += (first + i) % span;
		/* Checked above; said again for the verifier. */
		if (size > EMIT_MAX_SIZE || size < 1)
			return 2;

		h->seq = st->seq++;
		h->ts = bpf_ktime_get_ns();
		h->len = size;
		h->cpu = cpu;
		/* byte i = i * 7 + seq for i in [24, 32), as emit.bpf.h's. */
		for (j = sizeof(*h); j < sizeof(*h) + 8; j++)
			buf->data[j] = j * 7 + h->seq;

		err = bpf_ringbuf_output(&events, buf->data, size, 0);
		if (err)
			st->failed++;
		else
			st->emitted++;
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
