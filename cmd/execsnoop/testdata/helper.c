// SPDX-License-Identifier: Apache-2.0
/* execsnoop's tests run this: "empty TOK" execs /bin/true with an empty argv
 * (TOK lies past the NULL), "thread TOK" execs it from a second thread after
 * printing that thread's id, "untouched TOK FILE" execs the path that FILE
 * holds (NUL-terminated) from a mapping of FILE that nothing has read yet, so
 * that the path's page is not present when execve's tracepoint runs. Built by buildHelper, or by scripts/vmtest.sh for
 * guests that have no compiler (EXECSNOOP_TEST_HELPER). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
extern char **environ;
static char *tok;
static void *thr(void *a) {
	char *av[] = {"/bin/true", tok, NULL};
	printf("%ld\n", (long)syscall(SYS_gettid));
	fflush(stdout);
	execve("/bin/true", av, environ);
	perror("execve");
	_exit(127);
}
int main(int argc, char **argv) {
	tok = argv[2];
	if (!strcmp(argv[1], "empty")) {
		/* argc 0: the kernel sees no arguments; tok lies past the NULL. */
		char *av[] = {NULL, tok, NULL};
		execve("/bin/true", av, environ);
		perror("execve");
		return 127;
	}
	if (!strcmp(argv[1], "untouched")) {
		int fd = open(argv[3], O_RDONLY);
		char *path;

		if (fd < 0) {
			perror("open");
			return 127;
		}
		path = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
		if (path == MAP_FAILED) {
			perror("mmap");
			return 127;
		}
		char *av[] = {"true", tok, NULL};
		execve(path, av, environ);
		perror("execve");
		return 127;
	}
	pthread_t t;
	pthread_create(&t, NULL, thr, NULL);
	pthread_join(t, NULL);
	return 1;
}
