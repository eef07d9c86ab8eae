// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Fills the rings for the benchmarks (bench_test.go, bench/internal/benchrun).
 * Samples go up to 1024 bytes: a smaller scratch buffer makes each test run
 * cheaper (emit.bpf.h rewrites all of it once per run). */
#define EMIT_MAX_SIZE 1024
#include "../../../selftest/common/emit.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
