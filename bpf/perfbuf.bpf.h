/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* perfbuf's BPF side: counting the bpf_perf_event_output calls that fail
 * before they reach a ring.
 *
 * The kernel reports a sample dropped because its ring was full (the helper
 * returns -ENOSPC) in a PERF_RECORD_LOST, which perfbuf counts in
 * Stats.Lost. A call that fails for any other reason is counted nowhere:
 * no ring in the CPU's slot (-ENOENT), an index past max_entries (-E2BIG),
 * flags the helper rejects (-EINVAL), the slot's event not on this CPU
 * (-EOPNOTSUPP). perfbuf_output counts those, per CPU and by cause, in a map
 * that perfbuf reads into Stats.Failed (Options.FailureMap,
 * ReaderOptions.FailureMap), so that per CPU
 *
 *     outputs attempted == Samples + Lost + Failed.Total()
 *
 * Include it after vmlinux.h (or linux/bpf.h) and <bpf/bpf_helpers.h>:
 *
 *     PERFBUF_FAILURE_MAP(failures);
 *     ...
 *     perfbuf_output(ctx, &events, &failures, BPF_F_CURRENT_CPU, &e, sizeof(e));
 *
 * and pass the map to New or NewReader as FailureMap. docs/failures.md
 * says more. */
#ifndef PERFBUF_BPF_H
#define PERFBUF_BPF_H

/* The failed outputs of one CPU, by errno. perfbuf's Go side mirrors this
 * layout (type Failures, in this field order) and checks the map's value
 * size (40) at New: change both together. Every field is a __u64, so the
 * struct has no padding on any target. */
struct perfbuf_failures {
	__u64 noent;     /* -ENOENT: the slot holds no ring */
	__u64 e2big;     /* -E2BIG: the index is past the map's max_entries */
	__u64 einval;    /* -EINVAL: flags the helper rejects */
	__u64 opnotsupp; /* -EOPNOTSUPP: the slot's event is not on this CPU */
	__u64 other;     /* any other error */
};

/* Declares the failure map `name`: a per-CPU array of one struct
 * perfbuf_failures, which perfbuf checks at New (type, key and value sizes,
 * max_entries). */
#define PERFBUF_FAILURE_MAP(name)                                 \
	struct {                                                  \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);          \
		__uint(max_entries, 1);                           \
		__type(key, __u32);                               \
		__type(value, struct perfbuf_failures);           \
	} name SEC(".maps")

/* vmlinux.h defines no errno. These are the kernel's values on x86, arm64,
 * s390, powerpc, riscv and loongarch (asm-generic); EOPNOTSUPP differs on
 * MIPS and SPARC. A program that includes the kernel's errno headers keeps
 * theirs. */
#ifndef ENOENT
#define ENOENT 2
#endif
#ifndef E2BIG
#define E2BIG 7
#endif
#ifndef EINVAL
#define EINVAL 22
#endif
#ifndef ENOSPC
#define ENOSPC 28
#endif
#ifndef EOPNOTSUPP
#if defined(__TARGET_ARCH_mips)
#define EOPNOTSUPP 122
#elif defined(__TARGET_ARCH_sparc)
#define EOPNOTSUPP 45
#else
#define EOPNOTSUPP 95
#endif
#endif

/* perfbuf_output is bpf_perf_event_output(ctx, events, flags, data, size)
 * that also counts a failure in `failures` (a PERFBUF_FAILURE_MAP), on the
 * CPU it runs on, unless the failure is -ENOSPC (a full ring, which the
 * kernel reports itself). It returns the helper's result.
 *
 * The counters are this CPU's copy of a per-CPU value: no other CPU writes
 * it, and a BPF program does not migrate while it runs, so there is no
 * cross-CPU contention to pay for. The increment is still an atomic add,
 * not a load and a store: another program sharing the map can interrupt
 * this one on the same CPU (one in an irq or NMI over one in softirq or
 * task context), and would lose its count between the two. It costs an
 * uncontended locked add on this CPU's cache line, and only when the
 * output failed. */
static __always_inline long perfbuf_output(void *ctx, void *events, void *failures, __u64 flags,
					   void *data, __u64 size)
{
	long err = bpf_perf_event_output(ctx, events, flags, data, size);
	struct perfbuf_failures *f;
	__u32 zero = 0;

	if (err == 0 || err == -ENOSPC)
		return err;
	f = bpf_map_lookup_elem(failures, &zero);
	if (!f)
		return err; /* key 0 of a one-entry array exists: for the verifier */
	switch (err) {
	case -ENOENT:
		__sync_fetch_and_add(&f->noent, 1);
		break;
	case -E2BIG:
		__sync_fetch_and_add(&f->e2big, 1);
		break;
	case -EINVAL:
		__sync_fetch_and_add(&f->einval, 1);
		break;
	case -EOPNOTSUPP:
		__sync_fetch_and_add(&f->opnotsupp, 1);
		break;
	default:
		__sync_fetch_and_add(&f->other, 1);
		break;
	}
	return err;
}

#endif
