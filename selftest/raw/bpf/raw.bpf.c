// SPDX-License-Identifier: GPL-2.0
/* Raw-mode scenarios (raw_test.go): the emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";
