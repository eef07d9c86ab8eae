// SPDX-License-Identifier: Apache-2.0
/* perfbench-cquiet: the C reference of perfbench's quiet measurement
 * (bench/internal/benchrun/quiet.go), a process of its own so that its CPU time
 * and context switches are libbpf's and the kernel's alone, with no Go
 * runtime beside them.
 *
 *   perfbench-cquiet [-ringbuf] MAP_FD COUNT TIMEOUT_MS
 *
 * Opens libbpf's perf_buffer over the perf event array at MAP_FD (inherited
 * from perfbench), 64 pages per CPU, a wakeup per sample; or with -ringbuf,
 * libbpf's ring_buffer over the BPF ring buffer at MAP_FD (its program's
 * flags say when it wakes the reader). Prints "ready"; loops on
 * perf_buffer__poll (ring_buffer__poll) until COUNT samples are accounted
 * for (read or lost) or TIMEOUT_MS is up (COUNT 0: until then); prints the
 * "result" line with what it read, the polls that delivered a sample, and
 * the differences over that window of its task clock (a perf software
 * counter on each of its threads, as benchrun's taskclock.go counts a Go
 * consumer) and of getrusage(RUSAGE_SELF). The sample
 * callbacks read every byte, as every mode's does.
 *
 * Built by `make bench` into build/perfbench-cquiet. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>
#include <bpf/libbpf.h>

#include "cref.h"

#define QUIET_PAGES 64 /* benchrun.QuietPages */

struct counts {
	uint64_t received;
	uint64_t lost;
	uint64_t sum;
};

static void on_sample(void *ctx, int cpu, void *data, __u32 size)
{
	struct counts *c = ctx;
	(void)cpu;

	c->sum += cref_read_all(data, size);
	c->received++;
}

static void on_lost(void *ctx, int cpu, __u64 cnt)
{
	struct counts *c = ctx;
	(void)cpu;

	c->lost += cnt;
}

static int on_rb_sample(void *ctx, void *data, size_t size)
{
	struct counts *c = ctx;

	c->sum += cref_read_all(data, size);
	c->received++;
	return 0;
}

/* One ring kind's consumer: libbpf's poll and free for it. */
struct consumer {
	const char *poll_name;
	void *buf;
	int (*poll)(void *buf, int timeout_ms);
	void (*free)(void *buf);
};

static int pb_poll(void *buf, int timeout_ms) { return perf_buffer__poll(buf, timeout_ms); }
static void pb_free(void *buf) { perf_buffer__free(buf); }
static int rb_poll(void *buf, int timeout_ms) { return ring_buffer__poll(buf, timeout_ms); }
static void rb_free(void *buf) { ring_buffer__free(buf); }

/* open_consumer opens the kind's consumer over fd, counting into c; 0, or a
 * negative errno. */
static int open_consumer(struct consumer *k, int ringbuf, int fd, struct counts *c)
{
	if (ringbuf) {
		*k = (struct consumer){"ring_buffer__poll", ring_buffer__new(fd, on_rb_sample, c, NULL), rb_poll,
				       rb_free};
	} else {
		LIBBPF_OPTS(perf_buffer_opts, opts, .sample_period = 1);

		*k = (struct consumer){"perf_buffer__poll",
				       perf_buffer__new(fd, QUIET_PAGES, on_sample, on_lost, c, &opts), pb_poll,
				       pb_free};
	}
	return k->buf ? 0 : -errno;
}

#define MAX_THREADS 64

/* The task clock of the process's threads: a counter per thread that exists
 * when task_clock_open runs, inherited by the threads it starts. */
struct task_clock {
	int fds[MAX_THREADS];
	int n;
};

/* task_clock_open opens the counters; 0, or a negative errno. */
static int task_clock_open(struct task_clock *tc)
{
	struct perf_event_attr attr = {
		.type = PERF_TYPE_SOFTWARE,
		.size = sizeof(attr),
		.config = PERF_COUNT_SW_TASK_CLOCK,
		.inherit = 1,
	};
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int fd;

	if (!d)
		return -errno;
	tc->n = 0;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		if (tc->n == MAX_THREADS) {
			closedir(d);
			return -E2BIG;
		}
		fd = syscall(SYS_perf_event_open, &attr, atoi(e->d_name), -1, -1, PERF_FLAG_FD_CLOEXEC);
		if (fd < 0 && errno != ESRCH) {
			closedir(d);
			return -errno;
		}
		if (fd >= 0)
			tc->fds[tc->n++] = fd;
	}
	closedir(d);
	return 0;
}

/* task_clock_read returns the task clock so far in ns, or -1. */
static int64_t task_clock_read(struct task_clock *tc)
{
	uint64_t v, sum = 0;

	for (int i = 0; i < tc->n; i++) {
		if (read(tc->fds[i], &v, sizeof(v)) != sizeof(v))
			return -1;
		sum += v;
	}
	return (int64_t)sum;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t tv_us(struct timeval tv)
{
	return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* parse reads a non-negative decimal argument. */
static int parse(const char *s, long long *out)
{
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	return errno == 0 && end != s && *end == '\0' && *out >= 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	long long fd, count, timeout_ms;
	struct counts c = {0};
	struct consumer k;
	struct rusage r0, r1;
	struct task_clock tc;
	int64_t c0, c1;
	int64_t t0, deadline, left;
	uint64_t polls = 0, before;
	int ringbuf = argc > 1 && strcmp(argv[1], "-ringbuf") == 0;
	char **args = argv + ringbuf;
	int err;

	if (argc - ringbuf != 4 || parse(args[1], &fd) || parse(args[2], &count) || parse(args[3], &timeout_ms) ||
	    timeout_ms == 0) {
		fprintf(stderr, "usage: %s [-ringbuf] MAP_FD COUNT TIMEOUT_MS (COUNT 0: wait until the timeout)\n",
			argv[0]);
		return 2;
	}
	err = open_consumer(&k, ringbuf, (int)fd, &c);
	if (err) {
		fprintf(stderr, "perfbench-cquiet: %s: %s\n", ringbuf ? "ring_buffer__new" : "perf_buffer__new",
			strerror(-err));
		return 1;
	}

	err = task_clock_open(&tc);
	if (err) {
		fprintf(stderr, "perfbench-cquiet: open task clock: %s\n", strerror(-err));
		k.free(k.buf);
		return 1;
	}
	getrusage(RUSAGE_SELF, &r0);
	c0 = task_clock_read(&tc);
	t0 = now_ns();
	deadline = t0 + (int64_t)timeout_ms * 1000000;
	printf("ready\n");
	fflush(stdout);
	err = 0;
	while (count == 0 || c.received + c.lost < (uint64_t)count) {
		left = deadline - now_ns();
		if (left <= 0)
			break;
		before = c.received + c.lost;
		/* Rounded up to libbpf's milliseconds, as bench/internal/cref's Poll does. */
		err = k.poll(k.buf, (int)((left + 999999) / 1000000));
		if (err < 0 && err != -EINTR)
			break;
		err = 0;
		polls += c.received + c.lost > before;
	}
	c1 = task_clock_read(&tc);
	getrusage(RUSAGE_SELF, &r1);
	if (err == 0 && (c0 < 0 || c1 < 0)) {
		fprintf(stderr, "perfbench-cquiet: read task clock: %s\n", strerror(errno));
		k.free(k.buf);
		return 1;
	}
	if (err < 0) {
		fprintf(stderr, "perfbench-cquiet: %s: %s\n", k.poll_name, strerror(-err));
		k.free(k.buf);
		return 1;
	}
	printf("result received=%llu lost=%llu task_clock_ns=%lld utime_us=%lld stime_us=%lld nvcsw=%ld nivcsw=%ld wall_us=%lld polls=%llu sum=%llu\n",
	       (unsigned long long)c.received, (unsigned long long)c.lost, (long long)(c1 - c0),
	       (long long)(tv_us(r1.ru_utime) - tv_us(r0.ru_utime)),
	       (long long)(tv_us(r1.ru_stime) - tv_us(r0.ru_stime)),
	       r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw,
	       (long long)((now_ns() - t0) / 1000), (unsigned long long)polls, (unsigned long long)c.sum);
	fflush(stdout);
	k.free(k.buf);
	return 0;
}
