/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/* perfbuf's BPF side: outputs that count their failures, to a perf event
 * array, to a BPF ring buffer, or to a buffer whose kind perfbuf's Go side
 * chooses when the object loads.
 *
 * A perf event array reports a sample dropped because its ring was full
 * (bpf_perf_event_output returns -ENOSPC) in a PERF_RECORD_LOST, which
 * perfbuf counts in Stats.Lost. A call that fails for any other reason is
 * counted nowhere: no ring in the CPU's slot (-ENOENT), an index past
 * max_entries (-E2BIG), flags the helper rejects (-EINVAL), the slot's
 * event not on this CPU (-EOPNOTSUPP). A ring buffer reports nothing at
 * all: a full ring makes bpf_ringbuf_reserve return NULL and
 * bpf_ringbuf_output -EAGAIN, and that return value is the only trace.
 *
 * The outputs here count those failures, per CPU and by cause, in a
 * failure map that perfbuf reads into Stats.Failed (Options.FailureMap),
 * so that, once the reader is closed,
 *
 *     perf event array, per CPU:
 *         outputs attempted == Samples + Lost + Left + Failed.Total()
 *     ring buffer, per ring (the CPUs' Failed summed):
 *         outputs attempted == Samples + Discarded + Left + Failed.Total()
 *
 * Include it after vmlinux.h (or linux/bpf.h) and <bpf/bpf_helpers.h>.
 * Three ways to use it:
 *
 *   - perfbuf_output: bpf_perf_event_output that counts its failures, into
 *     a PERFBUF_FAILURE_MAP;
 *   - perfbuf_ringbuf_output, perfbuf_ringbuf_reserve: the same for a ring
 *     buffer of your own (an inner map of a map-in-map too);
 *   - PERFBUF_BUFFER and perfbuf_buffer_output, _reserve, _submit,
 *     _discard: one buffer that perfbuf's Go side makes a ring buffer, an
 *     array of ring buffers (a ring per CPU or per N CPUs) or a perf event
 *     array before the object loads (package bpfbuffer), with its failure
 *     map declared alongside.
 *
 * docs/failures.md and docs/bpfbuffer.md say more. */
#ifndef PERFBUF_BPF_H
#define PERFBUF_BPF_H

/* The failed outputs of one CPU, by cause. perfbuf's Go side mirrors this
 * layout (type Failures, in this field order) and checks the map's value
 * size at New: change both together. Every field is a __u64, so the struct
 * has no padding on any target. */
struct perfbuf_failures {
	__u64 noent;     /* -ENOENT: the slot holds no ring, or a NULL inner ring buffer */
	__u64 e2big;     /* -E2BIG: the index is past the map's max_entries */
	__u64 einval;    /* -EINVAL: flags the helper rejects, or a reserve above max_sample */
	__u64 opnotsupp; /* -EOPNOTSUPP: the slot's event is not on this CPU */
	__u64 other;     /* any other error */
	__u64 full;      /* ring buffer: no room (reserve NULL, output -EAGAIN) */
};

/* The version of this header's maps and of their protocol with perfbuf's
 * Go side (the failure map's keys and words, what a reader writes there).
 * A failure map carries it in its max_entries, PERFBUF_BPF_VERSION + 1:
 * each version adds a key (a key a version does not use stays reserved).
 * So the Go side reads a pinned map's version from its info alone, without
 * privilege, and refuses a map of another version with an error that names
 * both; and libbpf refuses to reuse a pinned map whose max_entries differs
 * from the object's (a program built with another version of this header
 * fails to load over it rather than write a layout the readers do not
 * know). CHANGELOG.md states what a new version may change. */
#define PERFBUF_BPF_VERSION 1

/* Declares the failure map `name`: a per-CPU array of struct
 * perfbuf_failures, which perfbuf checks at New (type, key and value sizes,
 * and max_entries, the version). Key 0 holds the counts. Key 1 is the readers': perfbuf
 * sets its first word (on every CPU) to 1 when the last reader alive of a
 * ring buffer closes, and back to 0 when one opens (which readers are
 * alive, in every process, perfbuf keeps outside the map), so that ring
 * buffer outputs after
 * that Close fail in the program, counted as noent (no reader, as a perf
 * event array's slot with no ring), rather than land in a ring that nobody
 * reads: Close can then count what is left in the ring exactly. */
#define PERFBUF_FAILURE_MAP(name)                                 \
	struct {                                                  \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);          \
		__uint(max_entries, PERFBUF_BPF_VERSION + 1);     \
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
#ifndef EAGAIN
#define EAGAIN 11
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

/* __perfbuf_fail adds one to the counter of the failure err (a helper's
 * negative errno) in `failures`, on the CPU it runs on.
 *
 * The counters are this CPU's copy of a per-CPU value: no other CPU writes
 * it, and a BPF program does not migrate while it runs, so there is no
 * cross-CPU contention to pay for. The increment is still an atomic add,
 * not a load and a store: another program sharing the map can interrupt
 * this one on the same CPU (one in an irq or NMI over one in softirq or
 * task context), and would lose its count between the two. It costs an
 * uncontended locked add on this CPU's cache line, and only when the
 * output failed. */
static __always_inline void __perfbuf_fail(void *failures, long err)
{
	struct perfbuf_failures *f;
	__u32 zero = 0;

	f = bpf_map_lookup_elem(failures, &zero);
	if (!f)
		return; /* key 0 of a one-entry array exists: for the verifier */
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
	case -EAGAIN: /* only a ring buffer's: bpf_perf_event_output never returns it */
		__sync_fetch_and_add(&f->full, 1);
		break;
	default:
		__sync_fetch_and_add(&f->other, 1);
		break;
	}
}

/* perfbuf_output is bpf_perf_event_output(ctx, events, flags, data, size)
 * that also counts a failure in `failures` (a PERFBUF_FAILURE_MAP), on the
 * CPU it runs on, unless the failure is -ENOSPC (a full ring, which the
 * kernel reports itself). It returns the helper's result. */
static __always_inline long perfbuf_output(void *ctx, void *events, void *failures, __u64 flags,
					   void *data, __u64 size)
{
	long err = bpf_perf_event_output(ctx, events, flags, data, size);

	if (err != 0 && err != -ENOSPC)
		__perfbuf_fail(failures, err);
	return err;
}

/* Whether the ring buffer's reader has closed (key 1 of the failure map,
 * this CPU's copy: only user space writes it). A failure map of one entry
 * (an older PERFBUF_FAILURE_MAP) never says closed. */
static __always_inline int __perfbuf_closed(void *failures)
{
	__u32 one = 1;
	struct perfbuf_failures *c = bpf_map_lookup_elem(failures, &one);

	return c && c->noent;
}

/* BPF_RINGBUF_HDR_SZ: each ring buffer record's header. */
#define __PERFBUF_RB_HDR 8

/* perfbuf_ringbuf_output is bpf_ringbuf_output(rb, data, size, flags) that
 * also counts a failure in `failures`: -EAGAIN (no room, or a record larger
 * than the ring) as full, a NULL rb (an inner map that a map-in-map lookup
 * did not find), or a reader that has closed (see PERFBUF_FAILURE_MAP), as
 * noent without calling the helper, any other by its errno. It returns the
 * helper's result, or -ENOENT for a NULL rb or a closed reader.
 *
 * A full ring buffer reports nothing to its reader: counting here is the
 * only way its reader learns what the ring refused. */
static __always_inline long perfbuf_ringbuf_output(void *rb, void *failures, void *data, __u64 size,
						   __u64 flags)
{
	long err;

	if (!rb || __perfbuf_closed(failures)) {
		__perfbuf_fail(failures, -ENOENT);
		return -ENOENT;
	}
	err = bpf_ringbuf_output(rb, data, size, flags);
	if (err)
		__perfbuf_fail(failures, err);
	return err;
}

/* perfbuf_ringbuf_reserve is bpf_ringbuf_reserve(rb, size, 0) that also
 * counts a failure in `failures`: NULL from the helper (no room, a record
 * larger than the ring, or in NMI context the ring's lock taken) as full,
 * a NULL rb or a closed reader as noent. size must be a constant, as for the helper. Submit
 * or discard the record with bpf_ringbuf_submit or bpf_ringbuf_discard. */
static __always_inline void *perfbuf_ringbuf_reserve(void *rb, void *failures, __u64 size)
{
	void *p;

	if (!rb || __perfbuf_closed(failures)) {
		__perfbuf_fail(failures, -ENOENT);
		return (void *)0;
	}
	p = bpf_ringbuf_reserve(rb, size, 0);
	if (!p)
		__perfbuf_fail(failures, -EAGAIN);
	return p;
}

/* One buffer, its layout chosen at load.
 *
 * PERFBUF_BUFFER(name, ring_bytes, sample_max) declares:
 *
 *   name           the buffer: a BPF_MAP_TYPE_RINGBUF of ring_bytes (a
 *                  power of two, a multiple of the page size), which the Go
 *                  side may turn into a BPF_MAP_TYPE_PERF_EVENT_ARRAY, or
 *                  into a BPF_MAP_TYPE_ARRAY_OF_MAPS of ring buffers, a
 *                  ring per CPU or per cpus_per_ring CPUs;
 *   name_failures  its PERFBUF_FAILURE_MAP, for Options.FailureMap;
 *   name_scratch   a per-CPU array of one sample_max-byte value, where
 *                  perfbuf_buffer_reserve builds a record on the perf path
 *                  (not created on the ring buffer paths);
 *   name_config    its struct perfbuf_buffer_config, in read-only data.
 *
 * Without the Go side the object loads as compiled: a ring buffer, with
 * libbpf's wakeups. perfbuf's bpfbuffer.Prepare, called after the object
 * is opened and before it loads, probes the kernel and sets the map's
 * type and sizes and name_config to match (for the array of ring buffers
 * it creates the array and its rings itself, and has libbpf use them).
 * name_config is const volatile: once the object is loaded it is frozen,
 * the verifier reads it as a constant, and the branches of the layouts
 * not chosen are dead code that it never checks and removes (so a perf
 * event array program loads on a kernel without ring buffer helpers, the
 * perf path may use name_scratch although the ring buffer paths never
 * create it, and the shared ring's helpers never see an array of maps). A
 * bpf_core_type_exists(struct bpf_ringbuf) test in the program would be a
 * second decision, which could disagree with the Go side's and cannot be
 * forced off for a test. */

/* The layouts, in perfbuf_buffer_config.ringbuf. */
#define PERFBUF_LAYOUT_PERF_ARRAY 0    /* a perf event array: a perf ring per CPU */
#define PERFBUF_LAYOUT_RINGBUF 1       /* one ring buffer, every CPU's */
#define PERFBUF_LAYOUT_RINGBUF_ARRAY 2 /* an array of ring buffers: slot cpu / cpus_per_ring */

struct perfbuf_buffer_config {
	__u64 ringbuf;       /* the layout, a PERFBUF_LAYOUT_*; nonzero: ring buffers. Set by Prepare. */
	__u64 wakeup_bytes;  /* ring buffer: force a wakeup at this much unread data in the ring (0: never). Set by Prepare. */
	__u64 max_sample;    /* the largest record perfbuf_buffer_reserve makes. Set here, kept by Prepare. */
	__u64 cpus_per_ring; /* array of ring buffers: CPUs per ring; CPU c writes slot c / cpus_per_ring. Set by Prepare. */
};

#define PERFBUF_BUFFER(name, ring_bytes, sample_max)                          \
	struct {                                                              \
		__uint(type, BPF_MAP_TYPE_RINGBUF);                           \
		__uint(max_entries, ring_bytes);                              \
	} name SEC(".maps");                                                  \
	PERFBUF_FAILURE_MAP(name##_failures);                                 \
	struct {                                                              \
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);                      \
		__uint(max_entries, 1);                                       \
		__uint(key_size, sizeof(__u32));                              \
		__uint(value_size, sample_max);                               \
	} name##_scratch SEC(".maps");                                        \
	const volatile struct perfbuf_buffer_config name##_config = {         \
		.ringbuf = PERFBUF_LAYOUT_RINGBUF,                            \
		.wakeup_bytes = 0,                                            \
		.max_sample = (sample_max),                                   \
		.cpus_per_ring = 1}

/* This CPU's ring of the array of ring buffers buf, or NULL for an empty
 * slot (Prepare fills every slot of a possible CPU; user space may empty
 * one) or a slot past the array. A BPF program does not migrate while it
 * runs, so a reserve and its submit look up the same slot. */
static __always_inline void *__perfbuf_cpu_ring(void *buf, const volatile struct perfbuf_buffer_config *cfg)
{
	__u32 key = bpf_get_smp_processor_id() / (__u32)cfg->cpus_per_ring;

	return bpf_map_lookup_elem(buf, &key);
}

/* The flags of a ring buffer record that makes `adding` more bytes
 * available: BPF_RB_FORCE_WAKEUP once the unread data reaches the
 * watermark (>=, as CPUs racing past an exact value would miss it), else
 * the default, with which the kernel wakes the reader for the first record
 * committed after it caught up (libbpf's behaviour). With no watermark the
 * verifier drops the query. */
static __always_inline __u64 __perfbuf_rb_flags(void *rb, const volatile struct perfbuf_buffer_config *cfg,
						__u64 adding)
{
	__u64 mark = cfg->wakeup_bytes;

	if (mark && bpf_ringbuf_query(rb, BPF_RB_AVAIL_DATA) + adding >= mark)
		return BPF_RB_FORCE_WAKEUP;
	return 0;
}

/* The flags of a ring buffer record of buf (the PERFBUF_BUFFER's map)
 * that makes `adding` more bytes available: __perfbuf_rb_flags on the one
 * ring buffer, or on this CPU's ring of an array of them. With no
 * watermark the verifier drops the lookup with the query. */
static __always_inline __u64 __perfbuf_buffer_flags(void *buf, const volatile struct perfbuf_buffer_config *cfg,
						    __u64 adding)
{
	void *rb;

	if (!cfg->wakeup_bytes)
		return 0;
	if (cfg->ringbuf != PERFBUF_LAYOUT_RINGBUF_ARRAY)
		return __perfbuf_rb_flags(buf, cfg, adding);
	rb = __perfbuf_cpu_ring(buf, cfg);
	return rb ? __perfbuf_rb_flags(rb, cfg, adding) : 0;
}

static __always_inline long __perfbuf_buffer_output(void *ctx, void *buf, void *failures,
						    const volatile struct perfbuf_buffer_config *cfg,
						    void *data, __u64 size)
{
	__u64 rec = (size + __PERFBUF_RB_HDR + 7) & ~7ULL;

	if (cfg->ringbuf == PERFBUF_LAYOUT_RINGBUF_ARRAY) {
		void *rb = __perfbuf_cpu_ring(buf, cfg);

		/* An empty slot: noent, as a perf event array's (and the
		 * query below needs a ring). */
		if (!rb) {
			__perfbuf_fail(failures, -ENOENT);
			return -ENOENT;
		}
		return perfbuf_ringbuf_output(rb, failures, data, size, __perfbuf_rb_flags(rb, cfg, rec));
	}
	if (cfg->ringbuf)
		return perfbuf_ringbuf_output(buf, failures, data, size, __perfbuf_rb_flags(buf, cfg, rec));
	return perfbuf_output(ctx, buf, failures, BPF_F_CURRENT_CPU, data, size);
}

static __always_inline void *__perfbuf_buffer_reserve(void *buf, void *scratch, void *failures,
						      const volatile struct perfbuf_buffer_config *cfg,
						      __u64 size)
{
	__u32 zero = 0;
	void *p;

	if (size > cfg->max_sample) {
		__perfbuf_fail(failures, -EINVAL);
		return (void *)0;
	}
	if (cfg->ringbuf == PERFBUF_LAYOUT_RINGBUF_ARRAY)
		return perfbuf_ringbuf_reserve(__perfbuf_cpu_ring(buf, cfg), failures, size);
	if (cfg->ringbuf)
		return perfbuf_ringbuf_reserve(buf, failures, size);
	p = bpf_map_lookup_elem(scratch, &zero);
	if (!p)
		__perfbuf_fail(failures, -ENOENT); /* key 0 of a one-entry array exists */
	return p;
}

static __always_inline long __perfbuf_buffer_submit(void *ctx, void *buf, void *failures,
						    const volatile struct perfbuf_buffer_config *cfg,
						    void *data, __u64 size)
{
	if (cfg->ringbuf) {
		bpf_ringbuf_submit(data, __perfbuf_buffer_flags(buf, cfg, 0));
		return 0;
	}
	return perfbuf_output(ctx, buf, failures, BPF_F_CURRENT_CPU, data, size);
}

static __always_inline void __perfbuf_buffer_discard(void *buf, const volatile struct perfbuf_buffer_config *cfg,
						     void *data)
{
	if (cfg->ringbuf)
		bpf_ringbuf_discard(data, __perfbuf_buffer_flags(buf, cfg, 0));
}

/* perfbuf_buffer_output(ctx, name, data, size) outputs size bytes at data
 * to the PERFBUF_BUFFER `name` (the name itself, not its address), counting
 * a failure in name_failures: bpf_ringbuf_output with the flags of the
 * buffer's wakeup watermark (to the current CPU's ring of an array of ring
 * buffers; an empty slot is noent, -ENOENT), or bpf_perf_event_output to
 * the current CPU's ring. It returns the helper's result. */
#define perfbuf_buffer_output(ctx, name, data, size) \
	__perfbuf_buffer_output(ctx, &name, &name##_failures, &name##_config, data, size)

/* perfbuf_buffer_reserve(name, size) returns size bytes to fill, or NULL
 * (counted in name_failures: full, or einval for a size above the
 * buffer's max_sample; noent for an empty slot of an array of ring
 * buffers). size must be a constant. On the ring buffer paths it is a
 * record in the ring (the current CPU's); on the perf path this CPU's scratch value,
 * which another program that runs on this CPU meanwhile (an irq, an NMI)
 * and reserves from the same buffer overwrites: the perf path copies at
 * submit. Follow it with perfbuf_buffer_submit or perfbuf_buffer_discard
 * on every path, as the verifier requires for a ring buffer record. */
#define perfbuf_buffer_reserve(name, size) \
	__perfbuf_buffer_reserve(&name, &name##_scratch, &name##_failures, &name##_config, size)

/* perfbuf_buffer_submit(ctx, name, data, size) hands a reserved record to
 * the reader: bpf_ringbuf_submit (which cannot fail), or
 * bpf_perf_event_output of its size bytes (counting a failure). It returns
 * 0 or the perf helper's error. */
#define perfbuf_buffer_submit(ctx, name, data, size) \
	__perfbuf_buffer_submit(ctx, &name, &name##_failures, &name##_config, data, size)

/* perfbuf_buffer_discard(name, data) drops a reserved record: the ring
 * buffer's reader skips it (Stats.Discarded); on the perf path nothing was
 * written. */
#define perfbuf_buffer_discard(name, data) __perfbuf_buffer_discard(&name, &name##_config, data)

/* perfbuf_stamp(key) stores bpf_ktime_get_ns() in *key, a u64 of a record
 * that perfbuf_ringbuf_reserve or perfbuf_buffer_reserve returned: call it
 * after the reserve, before the submit, and read the key nowhere earlier.
 * The reservation moves the ring's producer position before the clock is
 * read, so a reader that finds a ring buffer empty at time R knows that
 * every record still to come has a key at or after R (give or take the
 * store's way to the reader). A Reader with Order.StampedKeys uses that to
 * deliver in key order without waiting for MaxDelay at a trickle. A key
 * read before the reserve has no such bound (the program may be preempted,
 * or an interrupt's program reserve first, in between); nor does the perf
 * path, whose record the reader sees only once its output ended. */
static __always_inline void perfbuf_stamp(__u64 *key)
{
	*key = bpf_ktime_get_ns();
}

#endif
