/* SPDX-License-Identifier: Apache-2.0 */

//go:build !perfbuf_nolibbpf

/* C side of perfbuf: opening the rings through libbpf. Only perfbuf_cgo.go
 * includes this.
 *
 * libbpf opens, maps and frees the rings (perf_buffer__new_raw,
 * perf_buffer__free); the rings are read by perfbuf's pure-Go reader
 * (rawbuf.go) in every mode, so nothing here reads a record.
 */
#ifndef PERFBUF_HELPERS_H
#define PERFBUF_HELPERS_H

#include <stddef.h>
#include <stdint.h>

struct perf_buffer;

/* The rings' configuration, checked and with its defaults resolved on the
 * Go side (checks.go). */
struct perfbuf_config {
	size_t page_cnt;        /* data pages per ring, a power of two */
	uint64_t wakeup_events; /* >= 1; ignored when wakeup_bytes is set */
	uint64_t wakeup_bytes;  /* 0: wake by events */
	int cpu_cnt;            /* rings to open */
	int *cpus;              /* their CPUs; map key i holds cpus[i]'s ring */
	int count_lost;         /* read_format PERF_FORMAT_LOST (kernel 6.0) */
};

struct perf_buffer *perfbuf_open(int map_fd, const struct perfbuf_config *cfg, int *err);

#endif
