// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Callback-mode scenarios (callback_test.go): the emitter, and a map of
 * another type for New to refuse. */
/* Samples up to 16 KiB: TestLargestSample fills one page with one, on
 * 16 KiB pages too (emitMaxSize in callback_test.go). */
#define EMIT_MAX_SIZE 16384
#include "../../common/emit.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} not_perf SEC(".maps");

char LICENSE[] SEC("license") = "Dual BSD/GPL";
