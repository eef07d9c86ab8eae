/* The C reference: libbpf's perf_buffer__new and perf_buffer__consume with a
 * C sample callback that reads every byte. Its time per sample is the limit
 * the Go modes are measured against. */
#ifndef CREF_H
#define CREF_H

#include <stddef.h>
#include <stdint.h>

struct cref;

struct cref *cref_open(int map_fd, size_t page_cnt, int *err);
/* Drains every ring; returns samples read, or a negative errno. */
long cref_consume(struct cref *r);
uint64_t cref_sum(const struct cref *r);
void cref_close(struct cref *r);

/* Sums data 8 bytes at a time, then the tail bytes: the read every mode's
 * benchmark callback does, so that all of them touch each byte once. */
static inline uint64_t cref_read_all(const uint8_t *p, size_t n)
{
	uint64_t sum = 0, w;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__builtin_memcpy(&w, p + i, 8);
		sum += w;
	}
	for (; i < n; i++)
		sum += p[i];
	return sum;
}

#endif
