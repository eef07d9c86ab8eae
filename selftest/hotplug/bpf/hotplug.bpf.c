// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* CPU hotplug scenarios (hotplug_test.go): the emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";
