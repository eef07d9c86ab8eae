// SPDX-License-Identifier: Apache-2.0
/* mountrate: the workload of scripts/mountsnoop-vs-c.sh. In a mount
 * namespace of its own, in which every mount is private (nothing
 * propagates to the machine), it mounts a 4 KiB tmpfs whose source is
 * MARK-<n> on /tmp/MARK and unmounts it, RATE times a second for SECONDS,
 * paced by CLOCK_MONOTONIC. A pair is due a period after the one before, or
 * at once if that time has passed: after a stall (an umount waits for an
 * RCU grace period; the host preempts) the pairs resume at the rate, rather
 * than catch up in a burst that a tool's ring (29 events of the C tool's
 * 8.8 KB in its 256 KiB) cannot hold. So the run can last a little longer
 * than SECONDS; late_max_us is the longest stall. Each
 * pair is two events for a tracer: mount("MARK-<n>", "/tmp/MARK", "tmpfs",
 * 0x0, "size=4k") = 0 and umount("/tmp/MARK", 0x0) = 0.
 *
 *   mountrate RATE SECONDS MARK
 *
 * prints "pairs N failed F late_max_us L elapsed_s E" on stdout. Needs
 * CAP_SYS_ADMIN. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long ns(const struct timespec *t)
{
	return t->tv_sec * 1000000000LL + t->tv_nsec;
}

int main(int argc, char **argv)
{
	struct timespec start, ts, now;
	long long total, n, period, due, late, late_max = 0;
	long failed = 0;
	char dir[256], src[256];
	double rate, secs;

	if (argc != 4 || (rate = atof(argv[1])) <= 0 || (secs = atof(argv[2])) <= 0) {
		fprintf(stderr, "usage: mountrate RATE SECONDS MARK\n");
		return 2;
	}
	if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) {
		fprintf(stderr, "mountrate: private mount namespace: %s\n", strerror(errno));
		return 1;
	}
	snprintf(dir, sizeof(dir), "/tmp/%s", argv[3]);
	if (mkdir(dir, 0700) && errno != EEXIST) {
		fprintf(stderr, "mountrate: mkdir %s: %s\n", dir, strerror(errno));
		return 1;
	}
	total = (long long)(rate * secs);
	period = (long long)(1e9 / rate);
	clock_gettime(CLOCK_MONOTONIC, &start);
	due = ns(&start);
	for (n = 0; n < total; n++, due += period) {

		ts.tv_sec = due / 1000000000LL;
		ts.tv_nsec = due % 1000000000LL;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		clock_gettime(CLOCK_MONOTONIC, &now);
		late = (ns(&now) - due) / 1000;
		if (late > late_max)
			late_max = late;
		if (late > 0)
			due = ns(&now); /* the next one a period from now: no burst */
		snprintf(src, sizeof(src), "%s-%lld", argv[3], n);
		if (mount(src, dir, "tmpfs", 0, "size=4k")) {
			fprintf(stderr, "mountrate: mount %s: %s\n", src, strerror(errno));
			failed++;
			continue;
		}
		if (umount2(dir, 0)) {
			fprintf(stderr, "mountrate: umount %s: %s\n", dir, strerror(errno));
			failed++;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &now);
	rmdir(dir);
	printf("pairs %lld failed %ld late_max_us %lld elapsed_s %.3f\n", total, failed, late_max,
	       (ns(&now) - ns(&start)) / 1e9);
	return failed != 0;
}
