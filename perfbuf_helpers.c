// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "perfbuf_helpers.h"

/* Layout of a PERF_RECORD_SAMPLE written for bpf_perf_event_output
 * (attr.sample_type == PERF_SAMPLE_RAW): the raw size and the raw bytes. */
struct perfbuf_sample {
	struct perf_event_header hdr;
	uint32_t size;
	uint8_t data[];
};

/* PERF_RECORD_LOST: the kernel's count of records it could not write. */
struct perfbuf_lost {
	struct perf_event_header hdr;
	uint64_t id;
	uint64_t lost;
};

static inline size_t perfbuf_pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/* Copies a sample into the arena. Most samples are small, where an inline
 * copy of 8-byte words beats a call to memcpy. */
static inline void perfbuf_copy(uint8_t *dst, const uint8_t *src, uint32_t n)
{
	uint64_t w;

	if (n > 256) {
		memcpy(dst, src, n);
		return;
	}
	for (; n >= 8; n -= 8, dst += 8, src += 8) {
		__builtin_memcpy(&w, src, 8);
		__builtin_memcpy(dst, &w, 8);
	}
	for (; n; n--)
		*dst++ = *src++;
}

static inline void perfbuf_put_hdr(uint8_t *p, uint32_t size, uint32_t idx)
{
	memcpy(p, &size, 4);
	memcpy(p + 4, &idx, 4);
}

/* Puts a marker entry (PERFBUF_ENTRY_*) with its u64. */
static inline void perfbuf_put_marker(struct perfbuf_state *st, uint32_t marker, uint64_t v)
{
	uint8_t *p = st->arena + st->arena_len;

	perfbuf_put_hdr(p, marker, st->cur_idx);
	memcpy(p + PERFBUF_ENTRY_HDR, &v, 8);
	st->arena_len += PERFBUF_ENTRY_HDR + 8;
}

/* Called by libbpf for each record, with the record contiguous (libbpf copies
 * one that wraps the ring's end into its own buffer first). */
static enum bpf_perf_event_ret perfbuf_on_event(void *ctx, int cpu, struct perf_event_header *ev)
{
	struct perfbuf_state *st = ctx;
	uint8_t *p = st->arena + st->arena_len;
	(void)cpu; /* the entry carries the buffer index; Go maps it to the CPU */

	switch (ev->type) {
	case PERF_RECORD_SAMPLE: {
		struct perfbuf_sample *s = (void *)ev;
		uint32_t size = s->size;

		if (ev->size < sizeof(*s) || size > ev->size - sizeof(*s)) {
			/* A u32 size its u16 header cannot hold (a sample over
			 * 64 KiB wraps it): skipped, and counted. */
			perfbuf_put_marker(st, PERFBUF_ENTRY_BAD, ev->size);
			break;
		}
		perfbuf_put_hdr(p, size, st->cur_idx);
		perfbuf_copy(p + PERFBUF_ENTRY_HDR, s->data, size);
		st->arena_len += PERFBUF_ENTRY_HDR + perfbuf_pad8(size);
		break;
	}
	case PERF_RECORD_LOST: {
		struct perfbuf_lost *l = (void *)ev;

		if (ev->size < sizeof(*l)) {
			perfbuf_put_marker(st, PERFBUF_ENTRY_BAD, ev->size);
			break;
		}
		perfbuf_put_marker(st, PERFBUF_ENTRY_LOST, l->lost);
		break;
	}
	default:
		/* Other record types carry nothing for us (libbpf's own handler
		 * rejects them and stops): skipped, and counted. */
		perfbuf_put_marker(st, PERFBUF_ENTRY_OTHER, ev->type);
		break;
	}

	if (st->arena_cap - st->arena_len < st->reserve) {
		/* libbpf consumes this record, stops the pass and writes the tail. */
		st->full = 1;
		return LIBBPF_PERF_EVENT_DONE;
	}
	return LIBBPF_PERF_EVENT_CONT;
}

int perfbuf_event_for_test(struct perfbuf_state *st, void *record)
{
	return perfbuf_on_event(st, 0, record);
}

struct perfbuf_state *perfbuf_open(int map_fd, size_t page_cnt, uint64_t wakeup_events,
				   uint64_t wakeup_bytes, int cpu_cnt, int *cpus,
				   size_t arena_cap, size_t reserve, int *err)
{
	struct perf_event_attr attr = {};
	struct perfbuf_state *st;
	LIBBPF_OPTS(perf_buffer_raw_opts, opts,
		    .cpu_cnt = cpu_cnt,
		    .cpus = cpus,
		    .map_keys = cpus); /* map key i holds CPU i's ring, as perf_buffer__new does */

	/* Same event as perf_buffer__new: a BPF output software event. */
	attr.config = PERF_COUNT_SW_BPF_OUTPUT;
	attr.type = PERF_TYPE_SOFTWARE;
	attr.sample_type = PERF_SAMPLE_RAW;
	attr.sample_period = 1;
	if (wakeup_bytes) {
		attr.watermark = 1;
		attr.wakeup_watermark = wakeup_bytes;
	} else {
		attr.wakeup_events = wakeup_events;
	}

	st = calloc(1, sizeof(*st));
	if (!st) {
		*err = -ENOMEM;
		return NULL;
	}
	if (arena_cap < 2 * reserve) {
		free(st);
		*err = -EINVAL;
		return NULL;
	}
	st->reserve = reserve;
	st->arena = malloc(arena_cap);
	if (!st->arena) {
		free(st);
		*err = -ENOMEM;
		return NULL;
	}
	st->arena_cap = arena_cap;

	st->pb = perf_buffer__new_raw(map_fd, page_cnt, &attr, perfbuf_on_event, st, &opts);
	if (!st->pb) {
		*err = -errno;
		free(st->arena);
		free(st);
		return NULL;
	}
	*err = 0;
	return st;
}

void perfbuf_close(struct perfbuf_state *st)
{
	if (!st)
		return;
	perf_buffer__free(st->pb);
	free(st->arena);
	free(st);
}

/* perfbuf_drain consumes the rings idxs[st->pos..n) (all rings when idxs is
 * NULL) into an emptied arena. It stops early when the arena is nearly full,
 * leaving st->pos at the ring to resume with; st->pos == n means done.
 * Returns 0 or a negative errno from libbpf. */
int perfbuf_drain(struct perfbuf_state *st, const int32_t *idxs, int n)
{
	int i, err;

	st->arena_len = 0;
	for (i = st->pos; i < n; i++) {
		st->cur_idx = idxs ? idxs[i] : i;
		st->full = 0;
		err = perf_buffer__consume_buffer(st->pb, st->cur_idx);
		if (err < 0) {
			st->pos = i + 1; /* don't retry a failing ring forever */
			return err;
		}
		if (st->full) {
			st->pos = i;
			return 0;
		}
	}
	st->pos = n;
	return 0;
}

int perfbuf_map_info(int fd, uint32_t *id, uint32_t *type, uint32_t *max_entries, char *name, size_t name_len)
{
	struct bpf_map_info info = {};
	__u32 len = sizeof(info);
	int err;

	err = bpf_map_get_info_by_fd(fd, &info, &len);
	if (err)
		return -errno;
	*id = info.id;
	*type = info.type;
	*max_entries = info.max_entries;
	strncpy(name, info.name, name_len - 1);
	name[name_len - 1] = 0;
	return 0;
}
