// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* mountsnoop: trace mount() and umount() system-wide, the BPF half of
 * cmd/mountsnoop.
 *
 * A syscall's entry tracepoint keeps its arguments (user-space pointers, the
 * flags) and the time in `calls`, keyed by thread id: a syscall enters and
 * exits on the same thread. The exit tracepoint takes that entry, reserves
 * an event in the PERFBUF_BUFFER `events`, fills it (the strings are read
 * from user memory now, after the call, as the C tool reads them) and
 * submits it. Whether `events` is a ring buffer or a perf event array is
 * chosen by user space before load (bpfbuffer.Prepare); both paths count a
 * failed reserve or output in `events_failures`, which the reader's Stats
 * report (bpf/perfbuf.bpf.h).
 *
 * struct event is read by cmd/mountsnoop/event.go, which mirrors its
 * offsets: change both together. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "perfbuf.bpf.h"

#define TASK_COMM_LEN 16
/* The string sizes of the C tool's event, so that both print the same
 * (a file system type is cut at 7 bytes there too). */
#define FS_LEN 8
#define PATH_LEN 4096
#define DATA_LEN 512

enum op {
	OP_MOUNT = 0,
	OP_UMOUNT = 1,
};

/* A call between its entry and its exit. */
struct call {
	__u64 ts;    /* bpf_ktime_get_ns() at entry */
	__u64 flags; /* mount's mountflags, umount's flags */
	const char *src;
	const char *dest;
	const char *fs;
	const char *data;
	__u32 op;
};

struct event {
	__u64 ts;               /* 0: bpf_ktime_get_ns() at exit */
	__u64 delta;            /* 8: ns from entry to exit */
	__u64 flags;            /* 16 */
	__u32 pid;              /* 24: tgid, in the reader's PID namespace (or the kernel's); 0 outside it */
	__u32 tid;              /* 28: so numbered too */
	__u32 mnt_ns;           /* 32: the caller's mount namespace inode */
	__s32 ret;              /* 36: 0 or -errno */
	__u32 op;               /* 40: enum op */
	__u32 pad;              /* 44 */
	char comm[TASK_COMM_LEN]; /* 48 */
	char fs[FS_LEN];        /* 64: mount's filesystemtype */
	char src[PATH_LEN];     /* 72: mount's source */
	char dest[PATH_LEN];    /* 4168: mount's target, umount's target */
	char data[DATA_LEN];    /* 8264: mount's data, as a string */
};                              /* 8776 bytes */

/* Set by user space before load: only this process (tgid, numbered as pid
 * and tid are); 0 for all. */
const volatile __u32 target_pid = 0;
/* The inode number of the reader's PID namespace (stat of
 * /proc/self/ns/pid), whose numbers pid and tid carry; 0: the kernel's
 * numbers (the initial namespace's), as the C tool prints them. */
const volatile __u32 pidns_ino = 0;

/* PID namespaces nest at most this deep (MAX_PID_NS_LEVEL in
 * include/linux/pid_namespace.h). */
#define MAX_PID_NS_LEVEL 32

/* pid_in_readers_ns returns pid's number in the reader's PID namespace, 0 if
 * it has none there (pid_nr_ns() of kernel/pid.c), as execsnoop's does: the
 * namespace's level is found by its inode number, since user space cannot
 * learn it (NSpid counts from the /proc mount's namespace). */
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

/* current_ids returns the current task's tgid and tid, in the reader's PID
 * namespace when pidns_ino is set (0, 0 for a task outside it). */
static __always_inline void current_ids(__u32 *pid, __u32 *tid)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct task_struct *task;

	if (!pidns_ino) {
		*pid = id >> 32;
		*tid = (__u32)id;
		return;
	}
	task = (struct task_struct *)bpf_get_current_task();
	*pid = pid_in_readers_ns(BPF_CORE_READ(task, group_leader, thread_pid));
	*tid = pid_in_readers_ns(BPF_CORE_READ(task, thread_pid));
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, struct call);
} calls SEC(".maps");

/* 256 KiB when it is a ring buffer, as the C tool's; user space sizes it
 * (and a perf event array's rings) with Options.RingBytes. */
PERFBUF_BUFFER(events, 256 * 1024, sizeof(struct event));

/* Events a full perf ring dropped, per CPU (the perf path only: a full ring
 * buffer fails the reserve, which events_failures counts). The kernel
 * reports them in a lost record too, but only once a later event fits in
 * that ring, which may never come; user space sums this at the end. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} perf_full SEC(".maps");

static int enter(struct call *c)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id, pid, nstid;

	if (target_pid) {
		current_ids(&pid, &nstid);
		if (pid != target_pid)
			return 0;
	}
	c->ts = bpf_ktime_get_ns();
	/* BPF_ANY: an entry left by a call whose exit was missed (the tool
	 * attached between the two) is replaced. */
	bpf_map_update_elem(&calls, &tid, c, BPF_ANY);
	return 0;
}

/* read_str copies the user string at p into dst, or makes dst empty for a
 * NULL p (mount(2) allows NULL for all but the target) or one that cannot
 * be read. */
static __always_inline void read_str(char *dst, __u32 size, const char *p)
{
	dst[0] = '\0';
	if (p && bpf_probe_read_user_str(dst, size, p) < 0)
		dst[0] = '\0';
}

static int leave(void *ctx, long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct task_struct *task;
	struct event *e;
	struct call *c;

	c = bpf_map_lookup_elem(&calls, &tid);
	if (!c)
		return 0;
	e = perfbuf_buffer_reserve(events, sizeof(*e));
	if (!e)
		goto cleanup; /* counted in events_failures */

	task = (struct task_struct *)bpf_get_current_task();
	e->ts = bpf_ktime_get_ns();
	e->delta = e->ts - c->ts;
	e->flags = c->flags;
	current_ids(&e->pid, &e->tid);
	e->mnt_ns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
	e->ret = ret;
	e->op = c->op;
	e->pad = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	read_str(e->fs, sizeof(e->fs), c->fs);
	read_str(e->src, sizeof(e->src), c->src);
	read_str(e->dest, sizeof(e->dest), c->dest);
	read_str(e->data, sizeof(e->data), c->data);
	if (perfbuf_buffer_submit(ctx, events, e, sizeof(*e)) == -ENOSPC) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&perf_full, &zero);

		if (n)
			(*n)++;
	}
cleanup:
	bpf_map_delete_elem(&calls, &tid);
	return 0;
}

SEC("tracepoint/syscalls/sys_enter_mount")
int mount_entry(struct trace_event_raw_sys_enter *ctx)
{
	struct call c = {
		.op = OP_MOUNT,
		.src = (const char *)ctx->args[0],
		.dest = (const char *)ctx->args[1],
		.fs = (const char *)ctx->args[2],
		.flags = ctx->args[3],
		.data = (const char *)ctx->args[4],
	};

	return enter(&c);
}

SEC("tracepoint/syscalls/sys_exit_mount")
int mount_exit(struct trace_event_raw_sys_exit *ctx)
{
	return leave(ctx, ctx->ret);
}

SEC("tracepoint/syscalls/sys_enter_umount")
int umount_entry(struct trace_event_raw_sys_enter *ctx)
{
	struct call c = {
		.op = OP_UMOUNT,
		.dest = (const char *)ctx->args[0],
		.flags = ctx->args[1],
	};

	return enter(&c);
}

SEC("tracepoint/syscalls/sys_exit_umount")
int umount_exit(struct trace_event_raw_sys_exit *ctx)
{
	return leave(ctx, ctx->ret);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
