// SPDX-License-Identifier: GPL-2.0
/* perfbench's emitter: the selftests' emit program (emit.bpf.h), with
 * samples up to 1024 bytes, the largest perfbench measures (a smaller
 * scratch buffer makes each test run cheaper). */
#define EMIT_MAX_SIZE 1024
#include "../../../selftest/common/emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";
