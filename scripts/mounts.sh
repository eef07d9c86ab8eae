#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Mounts the file systems the privileged tests use, where a booted host has
# them and a fresh VM or container may not: a bpffs at /sys/fs/bpf (pinned
# maps) and tracefs at /sys/kernel/tracing (libbpf reads a tracepoint's id
# there to attach it; perfbench's host measurement and the tools attach
# tracepoints). Both stay mounted. Once, before make test's packages run
# at once: the tests share them. Not root: nothing (the privileged tests
# skip, or fail under CI, on their own).
set -euo pipefail
[ "$(id -u)" = 0 ] || exit 0
fstype() { stat -f -c %T "$1" 2>/dev/null || true; }
if [ "$(fstype /sys/fs/bpf)" != bpf_fs ]; then
	mount -t bpf bpf /sys/fs/bpf
	echo "mounts: bpffs at /sys/fs/bpf"
fi
if [ ! -e /sys/kernel/tracing/events ] && [ ! -e /sys/kernel/debug/tracing/events ]; then
	mount -t tracefs tracefs /sys/kernel/tracing
	echo "mounts: tracefs at /sys/kernel/tracing"
fi
