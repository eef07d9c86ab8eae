// SPDX-License-Identifier: GPL-2.0
/* Fills the rings for the drain benchmarks (bench_test.go). */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";
