// SPDX-License-Identifier: Apache-2.0
#include <errno.h>
#include <stdlib.h>
#include <bpf/libbpf.h>

#include "cref.h"

struct cref {
	struct perf_buffer *pb;
	uint64_t samples;
	uint64_t lost;
	uint64_t sum;
};

static void cref_on_sample(void *ctx, int cpu, void *data, __u32 size)
{
	struct cref *r = ctx;
	(void)cpu;

	r->sum += cref_read_all(data, size);
	r->samples++;
}

static void cref_on_lost(void *ctx, int cpu, __u64 cnt)
{
	struct cref *r = ctx;
	(void)cpu;

	r->lost += cnt;
}

struct cref *cref_open(int map_fd, size_t page_cnt, uint32_t wakeup_events, int *err)
{
	LIBBPF_OPTS(perf_buffer_opts, opts, .sample_period = wakeup_events ? wakeup_events : 1);
	struct cref *r = calloc(1, sizeof(*r));

	if (!r) {
		*err = -ENOMEM;
		return NULL;
	}
	r->pb = perf_buffer__new(map_fd, page_cnt, cref_on_sample, cref_on_lost, r, &opts);
	if (!r->pb) {
		*err = -errno;
		free(r);
		return NULL;
	}
	*err = 0;
	return r;
}

long cref_consume(struct cref *r)
{
	uint64_t before = r->samples;
	int err = perf_buffer__consume(r->pb);

	if (err < 0)
		return err;
	return (long)(r->samples - before);
}

long cref_poll(struct cref *r, int timeout_ms)
{
	uint64_t before = r->samples;
	int err = perf_buffer__poll(r->pb, timeout_ms);

	if (err < 0 && err != -EINTR)
		return err;
	return (long)(r->samples - before);
}

uint64_t cref_samples(const struct cref *r)
{
	return r->samples;
}

uint64_t cref_lost(const struct cref *r)
{
	return r->lost;
}

uint64_t cref_sum(const struct cref *r)
{
	return r->sum;
}

void cref_close(struct cref *r)
{
	if (!r)
		return;
	perf_buffer__free(r->pb);
	free(r);
}

/* The BPF ring buffer reference: ring_buffer__new with a C callback that
 * reads every byte, as cref_on_sample does. */
struct cref_rb {
	struct ring_buffer *rb;
	uint64_t samples;
	uint64_t sum;
};

static int cref_rb_on_sample(void *ctx, void *data, size_t size)
{
	struct cref_rb *r = ctx;

	r->sum += cref_read_all(data, size);
	r->samples++;
	return 0;
}

struct cref_rb *cref_rb_open(int map_fd, int *err)
{
	struct cref_rb *r = calloc(1, sizeof(*r));

	if (!r) {
		*err = -ENOMEM;
		return NULL;
	}
	r->rb = ring_buffer__new(map_fd, cref_rb_on_sample, r, NULL);
	if (!r->rb) {
		*err = -errno;
		free(r);
		return NULL;
	}
	*err = 0;
	return r;
}

long cref_rb_consume(struct cref_rb *r)
{
	uint64_t before = r->samples;
	int err = ring_buffer__consume(r->rb);

	if (err < 0)
		return err;
	return (long)(r->samples - before);
}

long cref_rb_poll(struct cref_rb *r, int timeout_ms)
{
	uint64_t before = r->samples;
	int err = ring_buffer__poll(r->rb, timeout_ms);

	if (err < 0 && err != -EINTR)
		return err;
	return (long)(r->samples - before);
}

uint64_t cref_rb_samples(const struct cref_rb *r)
{
	return r->samples;
}

uint64_t cref_rb_sum(const struct cref_rb *r)
{
	return r->sum;
}

void cref_rb_close(struct cref_rb *r)
{
	if (!r)
		return;
	ring_buffer__free(r->rb);
	free(r);
}
