// SPDX-License-Identifier: GPL-2.0
/* Reader scenarios, fullest-first and ordered (readers_test.go): the
 * emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";
