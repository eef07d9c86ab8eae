// SPDX-License-Identifier: Apache-2.0

//go:build !perfbuf_nolibbpf

#include <errno.h>
#include <linux/perf_event.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "perfbuf_helpers.h"

/* libbpf wants an event callback, which it calls only from
 * perf_buffer__consume*: perfbuf reads the rings itself and never calls
 * those, so this never runs. */
static enum bpf_perf_event_ret perfbuf_unused_event(void *ctx, int cpu, struct perf_event_header *ev)
{
	(void)ctx;
	(void)cpu;
	(void)ev;
	return LIBBPF_PERF_EVENT_CONT;
}

struct perf_buffer *perfbuf_open(int map_fd, const struct perfbuf_config *cfg, int *err)
{
	struct perf_event_attr attr = {};
	struct perf_buffer *pb;
	LIBBPF_OPTS(perf_buffer_raw_opts, opts,
		    .cpu_cnt = cfg->cpu_cnt,
		    .cpus = cfg->cpus,
		    .map_keys = cfg->cpus); /* map key i holds CPU i's ring, as perf_buffer__new does */

	/* Same event as perf_buffer__new: a BPF output software event. */
	attr.config = PERF_COUNT_SW_BPF_OUTPUT;
	attr.type = PERF_TYPE_SOFTWARE;
	attr.sample_type = PERF_SAMPLE_RAW;
	attr.sample_period = 1;
	/* read(2) of the event then returns the outputs it refused. */
	if (cfg->count_lost)
		attr.read_format = 1U << 4; /* PERF_FORMAT_LOST, which older headers lack */
	if (cfg->wakeup_bytes) {
		attr.watermark = 1;
		attr.wakeup_watermark = cfg->wakeup_bytes;
	} else {
		attr.wakeup_events = cfg->wakeup_events;
	}

	pb = perf_buffer__new_raw(map_fd, cfg->page_cnt, &attr, perfbuf_unused_event, NULL, &opts);
	if (!pb) {
		*err = -errno;
		return NULL;
	}
	*err = 0;
	return pb;
}
