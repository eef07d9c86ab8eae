// SPDX-License-Identifier: GPL-2.0
/* CPU hotplug scenarios (hotplug_test.go): the emitter alone. */
#include "../../common/emit.bpf.h"

char LICENSE[] SEC("license") = "GPL";
