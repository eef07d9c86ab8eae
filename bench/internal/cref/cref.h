/* SPDX-License-Identifier: Apache-2.0 */
/* The C reference: libbpf's perf_buffer__new, perf_buffer__consume and
 * perf_buffer__poll with C callbacks, and for BPF ring buffers
 * ring_buffer__new, ring_buffer__consume and ring_buffer__poll; the sample
 * callbacks read every byte. Its time per sample is the limit the Go modes
 * are measured against. */
#ifndef CREF_H
#define CREF_H

#include <stddef.h>
#include <stdint.h>

struct cref;

/* Opens a perf_buffer over map_fd with page_cnt pages per CPU, waking up
 * every wakeup_events samples (perf_buffer_opts.sample_period; 0 means 1).
 * On failure returns NULL and sets *err to a negative errno. */
struct cref *cref_open(int map_fd, size_t page_cnt, uint32_t wakeup_events, int *err);
/* Drains every ring; returns the samples read, or a negative errno. */
long cref_consume(struct cref *r);
/* Waits up to timeout_ms (-1: no limit) for rings to be ready, drains
 * them; returns the samples read, or a negative errno. An interrupted wait
 * (EINTR) reads nothing and returns 0. */
long cref_poll(struct cref *r, int timeout_ms);
/* Counts since cref_open: samples read, samples the kernel reported lost,
 * and the sum of every byte read (so the reads cannot be elided). */
uint64_t cref_samples(const struct cref *r);
uint64_t cref_lost(const struct cref *r);
uint64_t cref_sum(const struct cref *r);
void cref_close(struct cref *r);

struct cref_rb;

/* Opens a ring_buffer over the BPF ring buffer map_fd. On failure returns
 * NULL and sets *err to a negative errno. */
struct cref_rb *cref_rb_open(int map_fd, int *err);
/* Drains the ring (ring_buffer__consume); returns the samples read, or a
 * negative errno. */
long cref_rb_consume(struct cref_rb *r);
/* Waits up to timeout_ms (-1: no limit) for records, drains the ring
 * (ring_buffer__poll); returns the samples read, or a negative errno (EINTR:
 * 0). */
long cref_rb_poll(struct cref_rb *r, int timeout_ms);
/* Counts since cref_rb_open: samples read, and the sum of every byte. */
uint64_t cref_rb_samples(const struct cref_rb *r);
uint64_t cref_rb_sum(const struct cref_rb *r);
void cref_rb_close(struct cref_rb *r);

/* Sums data 8 bytes at a time, then the tail bytes: the read every mode's
 * benchmark callback does, so that all of them touch each byte once. */
static inline uint64_t cref_read_all(const uint8_t *p, size_t n)
{
	uint64_t sum = 0, w[4];
	size_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__builtin_memcpy(w, p + i, 32);
		sum += w[0] + w[1] + w[2] + w[3];
	}
	for (; i + 8 <= n; i += 8) {
		__builtin_memcpy(w, p + i, 8);
		sum += w[0];
	}
	for (; i < n; i++)
		sum += p[i];
	return sum;
}

#endif
