// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* execsnoop: trace execve() system-wide, the BPF half of cmd/execsnoop.
 *
 * sys_enter_execve stores what is known before the exec (pid, parent, uid,
 * comm, filename and arguments) in `execs`, keyed by process id (tgid: a
 * thread that execs takes the leader's id, so the exit sees the same tgid
 * but not always the same thread id);
 * sys_exit_execve completes it with the return value, the new comm and a
 * timestamp, and writes it to the perf event array `events` through
 * perfbuf_output, which counts the outputs that fail before a ring by cause
 * in `failures` (bpf/perfbuf.bpf.h; the reader's Stats report them).
 *
 * PID and PPID are numbered as the reader's PID namespace numbers them
 * (pid_in_readers_ns below), or as the kernel does when user space asks.
 *
 * struct event is read by cmd/execsnoop/event.go, which mirrors its offsets:
 * change both together. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "perfbuf.bpf.h"

#define TASK_COMM_LEN 16
#define TOTAL_MAX_ARGS 60 /* largest --max-args */
#define ARGSIZE 128       /* longest argument kept, NUL included */
#define ARGS_BUF_SIZE (TOTAL_MAX_ARGS * ARGSIZE)
#define LAST_ARG (ARGS_BUF_SIZE - ARGSIZE)
#define INVALID_UID ((__u32)-1)

#define EVENT_ARGS_TRUNCATED 1 /* argv had more than max_args entries */
#define EVENT_OTHER_PIDNS 2    /* not output: the task has no PID in the reader's namespace */

/* The kernel's limit: PID namespaces nest at most this deep below the initial
 * one (MAX_PID_NS_LEVEL in include/linux/pid_namespace.h). */
#define MAX_PID_NS_LEVEL 32

struct event {
	__u64 ts;          /* 0: bpf_ktime_get_ns() at exit; the readers' ordering key */
	__u32 pid;         /* 8: tgid, in the reader's PID namespace (or the kernel's) */
	__u32 ppid;        /* 12: tgid of real_parent, so; 0 if it has none there */
	__u32 uid;         /* 16 */
	__s32 retval;      /* 20: execve's return value: 0 or -errno */
	__u32 args_count;  /* 24: strings in args: the filename, then argv[1..] */
	__u32 args_size;   /* 28: bytes used in args, NULs included */
	__u32 flags;       /* 32: EVENT_ARGS_* */
	char comm[TASK_COMM_LEN]; /* 36: comm after the exec (before it, if it failed) */
	char args[ARGS_BUF_SIZE]; /* 52: NUL-terminated strings; only args_size bytes are output */
};

/* Set by user space before load (libbpfgo InitGlobalVariable). */
const volatile __u32 targ_uid = INVALID_UID;
const volatile bool ignore_failed = true;
const volatile __u32 max_args = 20;
/* The inode number of the reader's PID namespace (stat of /proc/self/ns/pid),
 * whose numbers pid and ppid carry; 0: the kernel's numbers (the initial
 * namespace's, as bpf_get_current_pid_tgid gives them). */
const volatile __u32 pidns_ino = 0;

/* Events between enter and exit, by tgid. Not preallocated: an entry is
 * ~7.7 KiB and only execs in flight need one. Two threads of one process in
 * execve at once share an entry (the later enter wins); only one of their
 * execs can succeed. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct event);
} execs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} events SEC(".maps");

PERFBUF_FAILURE_MAP(failures);

/* Execs dropped in the kernel, per CPU: index DROP_OUTPUT, events that did
 * not fit in the ring (-ENOSPC; other failures are in `failures`);
 * DROP_MAP_FULL, execs not traced because `execs` was full; DROP_OTHER_PIDNS,
 * execs by tasks outside the reader's PID namespace (with pidns_ino set),
 * which have no PID to print there. Each counts the execs that the uid and
 * failed-exec filters let through. User space sums them at the end. */
enum { DROP_OUTPUT, DROP_MAP_FULL, DROP_OTHER_PIDNS, DROP_KINDS };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_KINDS);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

static void count_drop(__u32 kind)
{
	__u64 *n = bpf_map_lookup_elem(&drops, &kind);

	if (n)
		(*n)++;
}

static const struct event empty_event = {};

/* pid_in_readers_ns returns pid's number in the reader's PID namespace, 0 if
 * it has none there: pid_nr_ns() of kernel/pid.c. A struct pid holds one
 * number per level, from the initial namespace's (numbers[0]) to the task's
 * own namespace's (numbers[pid->level]); the reader's namespace is among
 * them at its own level, or the task is outside it. That level is found here
 * by the namespace's inode number, because user space cannot learn it:
 * NSpid in /proc/self/status lists the levels from the namespace of the
 * /proc mount down, so in a container with its own /proc it shows one
 * number whatever the depth. numbers[] is a flexible array: the loop is
 * bounded by the kernel's deepest level, and every read is a probe read. */
static __u32 pid_in_readers_ns(struct pid *pid)
{
	unsigned int level = BPF_CORE_READ(pid, level);
	struct pid_namespace *ns;
	__u32 i;

	for (i = 0; i <= MAX_PID_NS_LEVEL && i <= level; i++) {
		ns = BPF_CORE_READ(pid, numbers[i].ns);
		if (BPF_CORE_READ(ns, ns.inum) == pidns_ino)
			return BPF_CORE_READ(pid, numbers[i].nr);
	}
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_execve")
int tracepoint__syscalls__sys_enter_execve(struct trace_event_raw_sys_enter *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 uid = (__u32)bpf_get_current_uid_gid();
	const char *const *argv = (const char *const *)ctx->args[1];
	const char *argp;
	struct task_struct *task;
	struct event *e;
	__u32 i;
	long ret;

	if (targ_uid != INVALID_UID && uid != targ_uid)
		return 0;
	/* BPF_ANY: an entry left by an exec whose exit we missed is replaced. */
	if (bpf_map_update_elem(&execs, &pid, &empty_event, BPF_ANY)) {
		count_drop(DROP_MAP_FULL);
		return 0;
	}
	e = bpf_map_lookup_elem(&execs, &pid);
	if (!e)
		return 0;

	task = (struct task_struct *)bpf_get_current_task();
	e->uid = uid;
	if (!pidns_ino) {
		e->pid = pid;
		e->ppid = BPF_CORE_READ(task, real_parent, tgid);
	} else {
		/* tgid is the group leader's pid. */
		e->pid = pid_in_readers_ns(BPF_CORE_READ(task, group_leader, thread_pid));
		if (!e->pid) {
			/* Counted at the exit, once its result is known. */
			e->flags |= EVENT_OTHER_PIDNS;
			return 0;
		}
		/* 0 for a parent outside the namespace, as /proc shows it. */
		e->ppid = pid_in_readers_ns(BPF_CORE_READ(task, real_parent, group_leader, thread_pid));
	}
	bpf_get_current_comm(e->comm, sizeof(e->comm));

	/* The path as passed to execve comes first, in place of argv[0]. A
	 * read can fail where the exec succeeds: bpf_probe_read_user_str
	 * cannot fault a page in, and a path in a page not yet touched (a
	 * string literal of a fresh child) is not present yet. The path is then
	 * empty and the arguments are still read, as the C tool does. */
	ret = bpf_probe_read_user_str(e->args, ARGSIZE, (const char *)ctx->args[0]);
	if (ret < 0) {
		e->args[0] = '\0';
		ret = 1;
	}
	e->args_count = 1;
	e->args_size = ret;

	/* argv[0] is not kept (the filename is), but an empty argv ends here:
	 * argv[1] would lie past its NULL. */
	argp = NULL;
	if (bpf_probe_read_user(&argp, sizeof(argp), &argv[0]) || !argp)
		return 0;
	for (i = 1; i < TOTAL_MAX_ARGS && i < max_args; i++) {
		argp = NULL;
		if (bpf_probe_read_user(&argp, sizeof(argp), &argv[i]) || !argp)
			return 0;
		if (e->args_size > LAST_ARG)
			return 0;
		ret = bpf_probe_read_user_str(&e->args[e->args_size], ARGSIZE, argp);
		if (ret < 0)
			return 0;
		e->args_count++;
		e->args_size += ret;
	}
	/* All max_args slots used: is there one more? */
	argp = NULL;
	if (!bpf_probe_read_user(&argp, sizeof(argp), &argv[i]) && argp)
		e->flags |= EVENT_ARGS_TRUNCATED;
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_execve")
int tracepoint__syscalls__sys_exit_execve(struct trace_event_raw_sys_exit *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct event *e;
	__u64 size;
	long ret = ctx->ret;

	e = bpf_map_lookup_elem(&execs, &pid);
	if (!e)
		return 0;
	if (ignore_failed && ret < 0)
		goto cleanup;
	if (e->flags & EVENT_OTHER_PIDNS) {
		count_drop(DROP_OTHER_PIDNS);
		goto cleanup;
	}

	e->retval = ret;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	e->ts = bpf_ktime_get_ns();
	size = offsetof(struct event, args) + e->args_size;
	/* A full ring: the kernel reports the loss only once a later sample
	 * fits, which may never come; count it here too. perfbuf_output
	 * counts the other failures. */
	if (size <= sizeof(*e) &&
	    perfbuf_output(ctx, &events, &failures, BPF_F_CURRENT_CPU, e, size) == -ENOSPC)
		count_drop(DROP_OUTPUT);
cleanup:
	bpf_map_delete_elem(&execs, &pid);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
