// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Two processes over one pinned perf event array (upgrade_test.go): the
 * emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
