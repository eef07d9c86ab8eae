#!/bin/busybox sh
# SPDX-License-Identifier: Apache-2.0
# /init of the guest that scripts/vmtest.sh boots: mounts what the tests
# need, runs each package's test binary as root with its output on ttyS1,
# and powers off. Lines that start with "vmtest-" are read by the host.
# Kernel parameters the kernel does not know reach /init as environment
# variables: vmtest_packages=a,b runs those packages instead of the
# initramfs's list, vmtest_offline=none skips the offline pass,
# vmtest_sparse=1 leaves only the even CPUs online (below), vmtest_out=ttyAMA0
# writes the output there (an arm64 guest's one UART) instead of ttyS1,
# vmtest_run=REGEXP runs only the tests it matches (-test.run),
# vmtest_count=N runs each N times (-test.count),
# vmtest_nohz_full=1 tells the tests that the kernel was booted with
# nohz_full (PERFBUF_VMTEST_NOHZ_FULL=1).
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root TMPDIR=/tmp CI=true PERFBUF_VMTEST=1 # PERFBUF_VMTEST: hotplug is allowed here
export EXECSNOOP_TEST_HELPER=/vmtest/execsnoop-helper
[ "$vmtest_nohz_full" = 1 ] && export PERFBUF_VMTEST_NOHZ_FULL=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ln -sf /proc/self/fd /dev/fd
# Pseudo-terminals (execsnoop's stdout test) and loopback (its /metrics test).
mkdir -p /dev/pts && mount -t devpts -o ptmxmode=0666 devpts /dev/pts 2>/dev/null
[ -e /dev/ptmx ] || ln -sf pts/ptmx /dev/ptmx
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
out=/dev/${vmtest_out:-ttyS1}
stty -F $out raw -echo 2>/dev/null

# run PASS PACKAGES: each package's tests from its own directory, where they
# find bpf/*.bpf.o as they do on the host. -test.short: emulated CPUs are
# ten times slower or more, and the loops that repeat a race a thousand
# times (TestCloseWhilePolling) run a hundred rounds here.
run() {
	pass=$1
	shift
	for pkg in "$@"; do
		echo "vmtest-start $pkg ($pass)" >$out
		start=$(date +%s)
		(cd "/vmtest/$pkg" && ./pkg.test -test.v -test.count=${vmtest_count:-1} -test.short -test.timeout=10m ${vmtest_run:+"-test.run=$vmtest_run"}) >$out 2>&1
		rc=$?
		echo "vmtest-pkg $pkg ($pass): rc=$rc $(($(date +%s) - start))s" >$out
	done
}

echo "vmtest-kernel $(uname -r) cpus online $(cat /sys/devices/system/cpu/online) possible $(cat /sys/devices/system/cpu/possible) up $(cut -d' ' -f1 /proc/uptime)s" >$out
# vmtest_sparse=1 (the big run with 128 CPUs or more): every even CPU
# online, every odd one offline, before the tests run. The online list is
# then longer than the 128 bytes libbpf reads it into (201 bytes with 128
# CPUs): libbpf's perf_buffer refuses with E2BIG, and perfbuf opens its
# rings itself.
if [ "$vmtest_sparse" = 1 ]; then
	for f in /sys/devices/system/cpu/cpu[0-9]*/online; do
		n=${f#/sys/devices/system/cpu/cpu}
		n=${n%/online}
		echo $((1 - n % 2)) >"$f" || echo "vmtest-pkg sparse-cpu$n: rc=1 could not set cpu$n online=$((1 - n % 2))" >$out
	done
	list=$(cat /sys/devices/system/cpu/online)
	echo "vmtest-sparse: online list of $(($(printf '%s\n' "$list" | wc -c))) bytes: $list" >$out
fi
packages=$(cat /vmtest/packages)
[ -n "$vmtest_packages" ] && packages=$(echo "$vmtest_packages" | tr , ' ')
run "all cpus" $packages

cpu=$(cat /vmtest/offline-cpu)
if [ "$vmtest_offline" != none ] && [ -e "/sys/devices/system/cpu/cpu$cpu/online" ]; then
	if echo 0 >"/sys/devices/system/cpu/cpu$cpu/online"; then
		export PERFBUF_OFFLINE_CPU=$cpu
		echo "vmtest-offline cpu$cpu: online now $(cat /sys/devices/system/cpu/online)" >$out
		run "cpu$cpu offline" $(cat /vmtest/offline-packages)
	else
		echo "vmtest-pkg offline-cpu$cpu: rc=1 could not take cpu$cpu offline" >$out
	fi
fi
echo "vmtest-done" >$out
sync
poweroff -f
