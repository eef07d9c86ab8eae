// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
#include <errno.h>
#include <stdlib.h>
#include <bpf/libbpf.h>

#include "cref.h"

struct cref {
	struct perf_buffer *pb;
	uint64_t samples;
	uint64_t sum;
};

static void cref_on_sample(void *ctx, int cpu, void *data, __u32 size)
{
	struct cref *r = ctx;
	(void)cpu;

	r->sum += cref_read_all(data, size);
	r->samples++;
}

struct cref *cref_open(int map_fd, size_t page_cnt, int *err)
{
	struct cref *r = calloc(1, sizeof(*r));

	if (!r) {
		*err = -ENOMEM;
		return NULL;
	}
	r->pb = perf_buffer__new(map_fd, page_cnt, cref_on_sample, NULL, r, NULL);
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
