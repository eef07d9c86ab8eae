/* C side of perfbuf's callback mode. Only perfbuf_cgo.go includes this.
 *
 * libbpf drains a ring by calling an event callback once per record and
 * writes data_tail when its pass over the ring ends. Calling into Go once per
 * record costs ~35 ns, so the callback never calls Go: it copies each record
 * into an arena (C memory) and Go walks the arena after the cgo call returns,
 * one crossing per pass. The copy is what makes this safe: once the pass is
 * over, the kernel may overwrite the ring, but not the arena.
 */
#ifndef PERFBUF_HELPERS_H
#define PERFBUF_HELPERS_H

#include <stddef.h>
#include <stdint.h>

struct perf_buffer;

/* Arena entry: an 8-byte header, then the payload padded to 8 bytes.
 * size is the payload length for a sample, or one of the markers below,
 * whose payload is a u64. idx is the buffer index. perfbuf.go parses these;
 * keep arenaEntry* there in step.
 *   PERFBUF_ENTRY_LOST   a lost record; the u64 is the lost count.
 *   PERFBUF_ENTRY_OTHER  a record of another type, skipped; the u64 is its type.
 *   PERFBUF_ENTRY_BAD    a sample or lost record too short for what it
 *                        says it holds, skipped; the u64 is its header size. */
#define PERFBUF_ENTRY_HDR 8
#define PERFBUF_ENTRY_LOST 0xffffffffu
#define PERFBUF_ENTRY_OTHER 0xfffffffeu
#define PERFBUF_ENTRY_BAD 0xfffffffdu

struct perfbuf_state {
	struct perf_buffer *pb;
	uint8_t *arena;
	size_t arena_cap;
	size_t arena_len;
	/* Room the arena keeps free before it accepts another record: the
	 * entry of the largest record this ring can hold. A record handed to
	 * the callback is consumed whatever the callback returns, so there
	 * must always be room for one. */
	size_t reserve;
	int cur_idx;   /* buffer index being consumed, stamped on entries */
	int pos;       /* perfbuf_drain's position in its index list */
	int full;      /* the pass stopped early: arena needs draining */
};

struct perfbuf_state *perfbuf_open(int map_fd, size_t page_cnt, uint64_t wakeup_events,
				   uint64_t wakeup_bytes, int cpu_cnt, int *cpus,
				   size_t arena_cap, size_t reserve, int *err);
void perfbuf_close(struct perfbuf_state *st);
int perfbuf_drain(struct perfbuf_state *st, const int32_t *idxs, int n);
int perfbuf_map_info(int fd, uint32_t *id, uint32_t *type, uint32_t *max_entries, char *name, size_t name_len);
/* Runs the event callback on one record, as libbpf would: for tests of the
 * arena entries. Returns the callback's enum bpf_perf_event_ret. */
int perfbuf_event_for_test(struct perfbuf_state *st, void *record);

#endif
