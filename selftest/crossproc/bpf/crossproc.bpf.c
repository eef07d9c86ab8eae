// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* The producer of selftest/crossproc: selftest/bpfbuffer's program, built
 * here too, so that the package finds its object beside it (make vmtest
 * packs each package's bpf/ alone). */
#include "../../bpfbuffer/bpf/bpfbuffer.bpf.c"
