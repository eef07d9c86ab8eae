// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Raw-mode scenarios (raw_test.go): the emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
