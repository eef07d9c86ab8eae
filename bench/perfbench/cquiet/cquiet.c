// SPDX-License-Identifier: Apache-2.0
/* perfbench-cquiet: the C reference of perfbench's quiet measurement
 * (bench/internal/benchrun/quiet.go), a process of its own so that its CPU time
 * and context switches are libbpf's and the kernel's alone, with no Go
 * runtime beside them.
 *
 *   perfbench-cquiet [-ringbuf] [-pages N] [-tick-ms MS] [-latency] MAP_FD COUNT TIMEOUT_MS
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
 * perfbench's host measurement (bench/internal/benchrun/host.go) adds:
 * -pages, the perf rings' data pages a CPU (default 64); -tick-ms, the
 * hand-tuned consumer: it drains every MS ms on an absolute clock
 * (perf_buffer__consume, ring_buffer__consume) and waits in between, a perf
 * ring then waking it only at a watermark of half the ring (its program
 * writes a ring buffer with BPF_RB_NO_WAKEUP, so nothing wakes it there);
 * -latency, each record's delivery latency, CLOCK_MONOTONIC at its callback
 * less the ktime at offset 8 of the record, reported as lat_n, lat_p50_ns,
 * lat_p99_ns and lat_max_ns (nearest rank, as benchrun.Percentile).
 * SIGUSR1 ends the reading early, as the timeout does: the host
 * measurement sends it when its records are all delivered or lost.
 *
 * Built by `make bench` into build/perfbench-cquiet. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
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
	int64_t *lat; /* -latency: a delivery latency a record, up to cap */
	uint64_t nlat, cap;
};

static int64_t now_ns(void);

/* LAT_OFFSET is where a record holds its ktime (benchrun.HostKtimeOffset). */
#define LAT_OFFSET 8

static void note_latency(struct counts *c, const void *data, size_t size)
{
	uint64_t ktime;

	if (!c->lat || c->nlat == c->cap || size < LAT_OFFSET + sizeof(ktime))
		return;
	memcpy(&ktime, (const char *)data + LAT_OFFSET, sizeof(ktime));
	c->lat[c->nlat++] = now_ns() - (int64_t)ktime;
}

static void on_sample(void *ctx, int cpu, void *data, __u32 size)
{
	struct counts *c = ctx;
	(void)cpu;

	c->sum += cref_read_all(data, size);
	c->received++;
	note_latency(c, data, size);
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
	note_latency(c, data, size);
	return 0;
}

/* on_raw_event is the hand-tuned perf consumer's callback
 * (perf_buffer__new_raw): a sample or a lost record. */
static enum bpf_perf_event_ret on_raw_event(void *ctx, int cpu, struct perf_event_header *h)
{
	struct raw_sample {
		struct perf_event_header h;
		uint32_t size;
		char data[];
	} *s = (void *)h;
	struct raw_lost {
		struct perf_event_header h;
		uint64_t id;
		uint64_t lost;
	} *l = (void *)h;

	if (h->type == PERF_RECORD_SAMPLE)
		on_sample(ctx, cpu, s->data, s->size);
	else if (h->type == PERF_RECORD_LOST)
		on_lost(ctx, cpu, l->lost);
	return LIBBPF_PERF_EVENT_CONT;
}

/* One ring kind's consumer: libbpf's poll and free for it. */
struct consumer {
	const char *poll_name;
	void *buf;
	int (*poll)(void *buf, int timeout_ms);
	int (*consume)(void *buf);
	void (*free)(void *buf);
};

static int pb_poll(void *buf, int timeout_ms) { return perf_buffer__poll(buf, timeout_ms); }
static int pb_consume(void *buf) { return perf_buffer__consume(buf); }
static void pb_free(void *buf) { perf_buffer__free(buf); }
static int rb_poll(void *buf, int timeout_ms) { return ring_buffer__poll(buf, timeout_ms); }
static int rb_consume(void *buf) { return ring_buffer__consume(buf); }
static void rb_free(void *buf) { ring_buffer__free(buf); }

/* open_consumer opens the kind's consumer over fd, counting into c, a perf
 * ring of pages data pages a CPU; watermark (perf only) is the bytes a ring
 * holds before it wakes the reader, 0 for a wakeup a sample. 0, or a
 * negative errno. */
static int open_consumer(struct consumer *k, int ringbuf, int fd, size_t pages, size_t watermark, struct counts *c)
{
	if (ringbuf) {
		*k = (struct consumer){"ring_buffer__poll", ring_buffer__new(fd, on_rb_sample, c, NULL), rb_poll,
				       rb_consume, rb_free};
	} else if (watermark) {
		struct perf_event_attr attr = {
			.type = PERF_TYPE_SOFTWARE,
			.size = sizeof(attr),
			.config = PERF_COUNT_SW_BPF_OUTPUT,
			.sample_type = PERF_SAMPLE_RAW,
			.watermark = 1,
			.wakeup_watermark = watermark,
		};

		*k = (struct consumer){"perf_buffer__poll", perf_buffer__new_raw(fd, pages, &attr, on_raw_event, c, NULL),
				       pb_poll, pb_consume, pb_free};
	} else {
		LIBBPF_OPTS(perf_buffer_opts, opts, .sample_period = 1);

		*k = (struct consumer){"perf_buffer__poll", perf_buffer__new(fd, pages, on_sample, on_lost, c, &opts),
				       pb_poll, pb_consume, pb_free};
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

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* percentile is the p-th percentile of the n sorted values, by nearest rank
 * (benchrun.Percentile): the value at rank ceil(p n / 100); 0 for none. */
static int64_t percentile(const int64_t *sorted, uint64_t n, uint64_t p)
{
	uint64_t rank = (p * n + 99) / 100;

	if (n == 0)
		return 0;
	return sorted[rank ? rank - 1 : 0];
}

struct options {
	int ringbuf;
	long long pages;   /* perf: data pages a CPU */
	long long tick_ms; /* 0: poll; else drain every tick_ms ms */
	int latency;
	long long fd, count, timeout_ms;
};

/* parse_args fills o from argv; 0, or -1 for a usage error. */
static int parse_args(int argc, char **argv, struct options *o)
{
	int i = 1;

	*o = (struct options){.pages = QUIET_PAGES};
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "-ringbuf") == 0)
			o->ringbuf = 1;
		else if (strcmp(argv[i], "-latency") == 0)
			o->latency = 1;
		else if (strcmp(argv[i], "-pages") == 0 && i + 1 < argc && !parse(argv[i + 1], &o->pages) && o->pages)
			i++;
		else if (strcmp(argv[i], "-tick-ms") == 0 && i + 1 < argc && !parse(argv[i + 1], &o->tick_ms))
			i++;
		else
			return -1;
	}
	if (argc - i != 3 || parse(argv[i], &o->fd) || parse(argv[i + 1], &o->count) ||
	    parse(argv[i + 2], &o->timeout_ms) || o->timeout_ms == 0)
		return -1;
	return 0;
}

/* stopped is set by SIGUSR1. Its handler is installed without SA_RESTART:
 * a wait it interrupts returns EINTR, and the loop looks at stopped. */
static volatile sig_atomic_t stopped;

static void on_stop(int sig)
{
	(void)sig;
	stopped = 1;
}

/* wait_ms is the milliseconds from now to at, rounded up, as
 * bench/internal/cref's Poll rounds. */
static int wait_ms(int64_t at)
{
	int64_t left = at - now_ns();

	return left <= 0 ? 0 : (int)((left + 999999) / 1000000);
}

int main(int argc, char **argv)
{
	struct options o;
	struct counts c = {0};
	struct consumer k;
	struct rusage r0, r1;
	struct task_clock tc;
	int64_t c0, c1;
	int64_t t0, deadline, tick = 0, next = 0;
	uint64_t polls = 0, before;
	int err;

	if (parse_args(argc, argv, &o)) {
		fprintf(stderr, "usage: %s [-ringbuf] [-pages N] [-tick-ms MS] [-latency] MAP_FD COUNT TIMEOUT_MS "
				"(COUNT 0: wait until the timeout)\n",
			argv[0]);
		return 2;
	}
	if (o.latency && o.count > 0) {
		c.cap = (uint64_t)o.count;
		c.lat = malloc(c.cap * sizeof(*c.lat));
		if (!c.lat) {
			fprintf(stderr, "perfbench-cquiet: no memory for %llu latencies\n", o.count);
			return 1;
		}
		memset(c.lat, 0, c.cap * sizeof(*c.lat)); /* faulted in before the window */
	}
	err = open_consumer(&k, o.ringbuf, (int)o.fd, o.pages,
			    o.tick_ms && !o.ringbuf ? (size_t)o.pages * sysconf(_SC_PAGESIZE) / 2 : 0, &c);
	if (err) {
		fprintf(stderr, "perfbench-cquiet: %s: %s\n", o.ringbuf ? "ring_buffer__new" : "perf_buffer__new",
			strerror(-err));
		return 1;
	}

	if (sigaction(SIGUSR1, &(struct sigaction){.sa_handler = on_stop}, NULL)) {
		fprintf(stderr, "perfbench-cquiet: sigaction: %s\n", strerror(errno));
		k.free(k.buf);
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
	deadline = t0 + (int64_t)o.timeout_ms * 1000000;
	if (o.tick_ms) {
		tick = (int64_t)o.tick_ms * 1000000;
		next = t0 + tick;
	}
	printf("ready\n");
	fflush(stdout);
	err = 0;
	while (o.count == 0 || c.received + c.lost < (uint64_t)o.count) {
		int64_t now = now_ns();

		if (now >= deadline || stopped)
			break;
		before = c.received + c.lost;
		if (tick && now >= next) {
			err = k.consume(k.buf);
			while (next <= now) /* on the absolute clock: a late tick moves no later one */
				next += tick;
		} else {
			err = k.poll(k.buf, wait_ms(tick && next < deadline ? next : deadline));
		}
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
	printf("result received=%llu lost=%llu task_clock_ns=%lld utime_us=%lld stime_us=%lld nvcsw=%ld nivcsw=%ld wall_us=%lld polls=%llu sum=%llu",
	       (unsigned long long)c.received, (unsigned long long)c.lost, (long long)(c1 - c0),
	       (long long)(tv_us(r1.ru_utime) - tv_us(r0.ru_utime)),
	       (long long)(tv_us(r1.ru_stime) - tv_us(r0.ru_stime)),
	       r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw,
	       (long long)((now_ns() - t0) / 1000), (unsigned long long)polls, (unsigned long long)c.sum);
	if (o.latency) {
		qsort(c.lat, c.nlat, sizeof(*c.lat), cmp_i64);
		printf(" lat_n=%llu lat_p50_ns=%lld lat_p99_ns=%lld lat_max_ns=%lld", (unsigned long long)c.nlat,
		       (long long)percentile(c.lat, c.nlat, 50), (long long)percentile(c.lat, c.nlat, 99),
		       (long long)percentile(c.lat, c.nlat, 100));
	}
	printf("\n");
	fflush(stdout);
	k.free(k.buf);
	free(c.lat);
	return 0;
}
