// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Backward perf rings (overwrite_test.go): the emitter alone, its perf event
 * array filled with internal/kernel's backward rings. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
