// SPDX-License-Identifier: Apache-2.0
/* execrate RATE SECONDS MARK: the workload of scripts/execsnoop-vs-c.sh.
 *
 * Runs `/bin/true MARK-<n>` for n = 0 .. RATE*SECONDS-1, the n-th at
 * start + n/RATE seconds on CLOCK_MONOTONIC (absolute sleeps, so the rate
 * does not drift with the cost of each spawn; a spawn that comes late is
 * made at once, not skipped). posix_spawn (a vfork in glibc) keeps the
 * generator's own cost small; children are reaped as they exit. The unique
 * argument lets the tracers' outputs be counted exec by exec.
 *
 * Prints one line to stdout: "spawned N failed F late_max_us L elapsed_s E",
 * failed counting spawns that failed and children that did not exit 0.
 * Exits 1 if any failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* reap collects the children that have exited (all of them when block),
 * and returns how many did not exit with status 0. */
static long reap(int block)
{
	long bad = 0;
	int st;
	pid_t pid;

	while ((pid = waitpid(-1, &st, block ? 0 : WNOHANG)) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad++;
	return bad;
}

int main(int argc, char **argv)
{
	char arg[256];
	char *av[] = {"/bin/true", arg, NULL};
	long long start, target, late, late_max = 0, n, total;
	long failed = 0;
	double rate, seconds;

	if (argc != 4 || (rate = atof(argv[1])) <= 0 || (seconds = atof(argv[2])) <= 0) {
		fprintf(stderr, "usage: execrate RATE SECONDS MARK\n");
		return 2;
	}
	total = (long long)(rate * seconds + 0.5);
	start = now_ns();
	for (n = 0; n < total; n++) {
		struct timespec ts;
		pid_t pid;
		int err;

		target = start + (long long)(n * 1e9 / rate);
		ts.tv_sec = target / 1000000000LL;
		ts.tv_nsec = target % 1000000000LL;
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
		late = now_ns() - target;
		if (late > late_max)
			late_max = late;
		snprintf(arg, sizeof(arg), "%s-%lld", argv[3], n);
		err = posix_spawn(&pid, av[0], NULL, NULL, av, environ);
		if (err) {
			fprintf(stderr, "execrate: spawn %s: %s\n", av[0], strerror(err));
			failed++;
		}
		failed += reap(0);
	}
	failed += reap(1);
	printf("spawned %lld failed %ld late_max_us %lld elapsed_s %.3f\n", total, failed,
	       late_max / 1000, (now_ns() - start) / 1e9);
	return failed != 0;
}
