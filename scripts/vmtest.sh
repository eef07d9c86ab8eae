#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every privileged test (selftest/... and the commands' tests) inside QEMU
# on Debian's own kernels, with 8 vCPUs, the oldest and the newest kernel with
# 2 as well (the matrix), one short boot with nohz_full (the nohz boot), then
# the CPU hotplug tests in a guest with many
# vCPUs, most of them offline at boot (the big run): what `make vmtest` calls.
# The arm64 part runs them in an arm64 guest (`make vmtest-arm64`).
#
#   scripts/vmtest.sh [matrix] [big] [arm64]   the parts to run (default matrix
#                                      and big; `make vmtest64` runs the big one,
#                                      `make vmtest-arm64` the arm64 one)
#
#   KERNELS   which kernels (default "5.10 6.1 6.12 7.3"):
#               5.10  bullseye's linux-image-amd64
#               6.1   bookworm's
#               6.12  bookworm-backports'
#               7.3   trixie-backports'
#   CPUS      vCPU counts (default "2 8")
#             By default the matrix is every kernel with 8 vCPUs (which adds the
#             offline pass) and 5.10 and 7.3 with 2 as well: six boots, and the
#             short nohz boot (NOHZ_KERNELS), two at a time on a 2-core host
#             (VMTEST_JOBS), which keeps CI under 40 minutes (docs/kernels.md). With KERNELS or CPUS set, every kernel of KERNELS
#             runs with every count of CPUS.
#   VMTEST_CACHE  downloaded kernels and apt lists (default /var/cache/perfbuf-vmtest)
#   VMTEST_MEM    guest memory (default 2G)
#   VMTEST_TIMEOUT  seconds one boot may take before it counts as failed (default 900:
#                   an 8-vCPU boot of 7.3, both passes, took more than 600 s on a loaded host)
#   VMTEST_PACKAGES, VMTEST_OFFLINE_PACKAGES  the packages of each pass (defaults below)
#   VMTEST_RUN, VMTEST_COUNT  -test.run and -test.count in the matrix and the big
#                   run (default: every test, once)
#   VMTEST_LOGLEVEL the guest kernel's console loglevel (default 4; 7 shows stack traces)
#   NOHZ_KERNELS  the nohz boot's kernels (default 7.3, whose Debian config has
#                 CONFIG_NO_HZ_FULL=y; 5.10 to 6.12's have not; empty: no nohz
#                 boot), part of the matrix: 2 vCPUs, CPU 1 nohz_full, where the
#                 kernel refuses membarrier(MEMBARRIER_CMD_GLOBAL). It runs only
#                 the tests of Pause, Close's count and Snapshot (NOHZ_PACKAGES,
#                 NOHZ_RUN), with PERFBUF_VMTEST_NOHZ_FULL=1 in their
#                 environment (selftest/failures' TestNohzFull checks the refusal).
#   BIG_KERNELS   the big run's kernels (default 6.12; empty: no big run)
#   BIG_CPUS      its vCPUs (default 64): all possible, as on a large host
#   BIG_BOOT_CPUS how many of them the guest brings up at boot (default 16,
#                 maxcpus=): the others are possible but offline, holes the
#                 tests bring online while they read
#   BIG_PACKAGES  what it runs (default selftest/hotplug selftest/opener)
#   BIG_MEM       its memory (default 1G; 2G from 128 CPUs)
#   BIG_SPARSE    1: the guest leaves only its even CPUs online before the tests
#                 (default: 1 from 128 CPUs, where that online list is longer than
#                 the 128 bytes libbpf reads it into, so perfbuf opens the rings
#                 itself; 0 below)
#   ARM64_KERNELS the arm64 part's kernels (default 7.3): Debian's
#                 linux-image-arm64 of the kernel's suite; 7.3-16k: its
#                 linux-image-arm64-16k (16 KiB pages)
#   ARM64_CPUS    its vCPU counts (default 2)
#   VMTEST_JOBS   boots run at once (default: the host's CPUs, nproc): a TCG guest is
#                 one host thread (below), so a 2-core host runs two (figures:
#                 docs/kernels.md)
#   VMTEST_TCG_THREAD  QEMU's TCG threading (default single). With multi (a host thread
#                   per vCPU) 5.10 guests hung now and then, both vCPUs stuck in
#                   syscall_trace_enter at a jump-label site while libbpf attached a
#                   syscall tracepoint; single never did, and on a 2-core host it is
#                   also the faster (figures: the commit that chose it).
#
# The test binaries are built on the host (go test -c) and run as root from an
# initramfs that holds them, their shared libraries (ldd), the BPF objects and
# busybox. For arm64 they are cross-built with cgo and linked statically
# against libbpf, libelf and zlib from Debian's arm64 packages, unpacked into a
# sysroot in VMTEST_CACHE; the BPF objects are the host's (CO-RE). With 4 CPUs
# or more, a second pass takes CPU 3 offline and runs the ring tests again:
# buffer indexes must follow the online CPUs, not CPU numbers.
# Hotplug is only ever done inside the guest.
#
# Output: each package's tests, then one line per kernel and CPU count,
# "vmtest 6.1 8cpu: N passed, N failed", and a non-zero exit if any failed.
# Logs: build/vmtest/<kernel>-<cpus>cpu.{results,console}, the big run's
# <kernel>-<cpus>cpu-<boot>up.*, the arm64 part's arm64-<kernel>-<cpus>cpu.* (the
# results are its console).
set -euo pipefail
cd "$(dirname "$0")/.."

# RUNS: the matrix's boots, KERNEL:CPUS each.
if [ -n "${KERNELS:-}" ] || [ -n "${CPUS:-}" ]; then
	KERNELS=${KERNELS:-"5.10 6.1 6.12 7.3"}
	CPUS=${CPUS:-"2 8"}
	RUNS=$(for ver in $KERNELS; do for ncpu in $CPUS; do echo "$ver:$ncpu"; done; done)
else
	KERNELS="5.10 6.1 6.12 7.3"
	RUNS="5.10:2 5.10:8 6.1:8 6.12:8 7.3:2 7.3:8"
fi
CACHE=${VMTEST_CACHE:-/var/cache/perfbuf-vmtest}
MEM=${VMTEST_MEM:-2G}
TIMEOUT=${VMTEST_TIMEOUT:-900}
JOBS=${VMTEST_JOBS:-$(nproc)}
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
	echo "vmtest: VMTEST_JOBS must be a count of boots, 1 or more (it is '$JOBS')" >&2
	exit 2
fi
GO=${GO:-go}
OUT=$PWD/build/vmtest

# The packages with privileged tests, run in this order; the offline pass
# runs the ring packages again.
PACKAGES=${VMTEST_PACKAGES:-"selftest/callback selftest/raw selftest/readers selftest/failures selftest/ringbuf selftest/bpfbuffer selftest/ciliumbuffer selftest/overwrite selftest/upgrade selftest/crossproc selftest/hotplug cmd/execsnoop cmd/mountsnoop bench/selftest bench/perfbench"}
OFFLINE_PACKAGES=${VMTEST_OFFLINE_PACKAGES:-"selftest/callback selftest/raw selftest/readers selftest/failures"}
# Of the default PACKAGES, those that run only in the boots of 2 vCPUs:
# the two-process scenarios, whose producers flood every CPU. What they
# test (processes, locks, pinned maps) does not change with the CPU count,
# and in an 8-vCPU TCG guest they took 3 minutes of the boot's 12, near
# VMTEST_TIMEOUT. And the benchmark tooling's tests (bench/): perfbench
# and its harness measure on the bench host's shape, 2 CPUs, and took
# 51-65 s of each 8-vCPU boot (30 November). With VMTEST_PACKAGES set,
# every boot runs what it says.
FEW_CPU_PACKAGES=""
[ -z "${VMTEST_PACKAGES:-}" ] && FEW_CPU_PACKAGES="selftest/crossproc bench/selftest bench/perfbench"
OFFLINE_CPU=3

NOHZ_KERNELS=${NOHZ_KERNELS-7.3}
NOHZ_PACKAGES=${NOHZ_PACKAGES:-selftest/failures selftest/overwrite selftest/bpfbuffer}
NOHZ_RUN=${NOHZ_RUN:-'^(TestNohzFull|TestCloseLedger|TestFailureAccounting|TestRecorder|TestBackwardRing|TestReaderPause|TestOpenPaused|TestRingBufCloseLedger)'}

BIG_KERNELS=${BIG_KERNELS-6.12}
BIG_CPUS=${BIG_CPUS:-64}
BIG_BOOT_CPUS=${BIG_BOOT_CPUS:-16}
BIG_PACKAGES=${BIG_PACKAGES:-selftest/hotplug selftest/opener}
if [ "$BIG_CPUS" -ge 128 ]; then
	BIG_MEM=${BIG_MEM:-2G}
	BIG_SPARSE=${BIG_SPARSE:-1}
else
	BIG_MEM=${BIG_MEM:-1G}
	BIG_SPARSE=${BIG_SPARSE:-0}
fi

ARM64_KERNELS=${ARM64_KERNELS:-7.3}
ARM64_CPUS=${ARM64_CPUS:-2}

PARTS=${*:-matrix big}
case " $PARTS " in *" matrix "*) MATRIX=true ;; *) MATRIX=false ;; esac
case " $PARTS " in *" big "*) BIG=true ;; *) BIG=false ;; esac
case " $PARTS " in *" arm64 "*) ARM64=true ;; *) ARM64=false ;; esac
for part in $PARTS; do
	case $part in matrix | big | arm64) ;; *) echo "vmtest: unknown part $part (matrix, big, arm64)" >&2; exit 2 ;; esac
done
$ARM64 || ARM64_KERNELS=""
$MATRIX || { KERNELS=""; RUNS=""; NOHZ_KERNELS=""; }
$BIG || BIG_KERNELS=""
# The initramfs holds what any part runs.
if ! $MATRIX && ! $ARM64; then
	PACKAGES=$BIG_PACKAGES
else
	more=""
	[ -n "$BIG_KERNELS" ] && more=$BIG_PACKAGES
	[ -n "$NOHZ_KERNELS" ] && more="$more $NOHZ_PACKAGES"
	for pkg in $more; do
		case " $PACKAGES " in *" $pkg "*) ;; *) PACKAGES="$PACKAGES $pkg" ;; esac
	done
fi

log() { echo "vmtest: $*" >&2; }

# VMARCH: the architecture of the guests being prepared or run (amd64, arm64).
VMARCH=amd64

suite_of() {
	case ${1%-16k} in
	5.10) echo bullseye ;;
	6.1) echo bookworm ;;
	6.12) echo bookworm-backports ;;
	7.3) echo trixie-backports ;;
	*) log "unknown kernel $1 (known: 5.10 6.1 6.12 7.3)"; return 1 ;;
	esac
}

# apt_dir SUITE: the apt state of the suite for VMARCH.
apt_dir() {
	if [ "$VMARCH" = amd64 ]; then echo "$CACHE/apt/$1"; else echo "$CACHE/apt/$1-$VMARCH"; fi
}

# apt_suite SUITE ARGS...: apt-get or apt-cache (first arg) with a sources list and
# state of the suite's own, for VMARCH, so the host's apt sources stay as they are.
# The lists are refreshed when a day old.
apt_suite() {
	local suite=$1 tool=$2 dir opts
	shift 2
	dir=$(apt_dir "$suite")
	mkdir -p "$dir/lists/partial" "$dir/archives/partial"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" >"$dir/sources.list"
	opts=(-q -o APT::Architecture="$VMARCH" -o APT::Architectures="$VMARCH"
		-o Dir::Etc::sourcelist="$dir/sources.list" -o Dir::Etc::sourceparts=-
		-o Dir::State::Lists="$dir/lists" -o Dir::Cache="$dir" -o APT::Get::List-Cleanup=0)
	if [ -z "$(find "$dir/lists" -name '*Packages*' -mtime -1 2>/dev/null)" ]; then
		apt-get "${opts[@]}" update >/dev/null
	fi
	"$tool" "${opts[@]}" "$@"
}

# kernel VERSION: prints the path of the kernel's vmlinuz, downloading and
# unpacking its package once, resolved from linux-image-VMARCH of the suite in
# the suite's own apt state (a VERSION ending in -16k: linux-image-arm64-16k). That
# package depends on linux-image-RELEASE, which holds boot/vmlinuz-RELEASE
# up to bookworm; from trixie on it is a small package too, and the image is
# in linux-binary-RELEASE at usr/lib/modules/RELEASE/vmlinuz.
kernel() {
	local ver=$1 suite image pkg path deb dir release flavour=$VMARCH
	suite=$(suite_of "$ver")
	dir=$CACHE/kernels/$ver
	[ "$VMARCH" = amd64 ] || dir=$CACHE/kernels/$VMARCH/$ver
	case $ver in *-16k) flavour=$VMARCH-16k ;; esac
	if [ -f "$dir/vmlinuz" ] && [ -n "$(find "$dir/vmlinuz" -mtime -7)" ]; then
		echo "$dir/vmlinuz"
		return
	fi
	image=$(apt_suite "$suite" apt-cache depends "linux-image-$flavour" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	[ -n "$image" ] || { log "no linux-image package in $suite"; return 1; }
	release=${image#linux-image-}
	pkg=$(apt_suite "$suite" apt-cache depends "$image" | awk -v want="linux-binary-$release" '$1 == "Depends:" && $2 == want {print $2; exit}')
	if [ -n "$pkg" ]; then
		path=./usr/lib/modules/$release/vmlinuz
	else
		pkg=$image
		path=./boot/vmlinuz-$release
	fi
	mkdir -p "$CACHE/debs" "$dir"
	deb=$(ls "$CACHE/debs/${pkg}_"*.deb 2>/dev/null | head -n1 || true)
	if [ -z "$deb" ]; then
		log "downloading $pkg ($suite)"
		(cd "$CACHE/debs" && apt_suite "$suite" apt-get download "$pkg" 2>&1 | grep -v 'unsandboxed' >&2 || true)
		deb=$(ls "$CACHE/debs/${pkg}_"*.deb 2>/dev/null | head -n1 || true)
		[ -n "$deb" ] || { log "download of $pkg failed"; return 1; }
	fi
	local tmp
	tmp=$(mktemp -d)
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" "$path" ||
		{ log "$deb holds no $path"; rm -rf "$tmp"; return 1; }
	mv "$tmp/$path" "$dir/vmlinuz"
	touch "$dir/vmlinuz" # the week above counts from now, not from the build
	echo "$release" >"$dir/release"
	rm -rf "$tmp"
	echo "$dir/vmlinuz"
}

# copy_with_libs FILE ROOT: FILE and the shared libraries it loads, at their paths.
copy_with_libs() {
	local f=$1 root=$2 lib
	mkdir -p "$root$(dirname "$f")"
	cp -L "$f" "$root$f"
	for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
		[ -e "$root$lib" ] && continue
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
}

# arm64_sysroot: prints the path of a sysroot with Debian's arm64 libbpf
# (bookworm-backports), libelf, zlib, zstd (libelf's) and a static busybox,
# unpacked from their packages once.
arm64_sysroot() {
	local root=$CACHE/arm64/sysroot debs=$CACHE/arm64/debs deb
	if [ ! -f "$root/usr/lib/aarch64-linux-gnu/libbpf.a" ] || [ ! -x "$root/bin/busybox" ]; then
		rm -rf "$root" "$debs"
		mkdir -p "$root" "$debs"
		log "downloading arm64 libbpf-dev, libelf-dev, zlib1g-dev, libzstd-dev, busybox-static"
		(cd "$debs" && apt_suite bookworm-backports apt-get download libbpf-dev &&
			apt_suite bookworm apt-get download libelf-dev zlib1g-dev libzstd-dev busybox-static) 2>&1 |
			grep -v unsandboxed >&2 || true
		for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
		[ -f "$root/usr/lib/aarch64-linux-gnu/libbpf.a" ] && [ -x "$root/bin/busybox" ] ||
			{ log "arm64 sysroot incomplete ($root)"; return 1; }
	fi
	echo "$root"
}

# build_initramfs: test binaries, BPF objects, busybox, libraries, /init, for
# VMARCH, in $OUT/initramfs-VMARCH.gz.
build_initramfs() {
	local root=$OUT/root-$VMARCH pkg name cc=gcc sysroot=""
	rm -rf "$root"
	mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,vmtest}
	if [ "$VMARCH" = arm64 ]; then
		sysroot=$(arm64_sysroot)
		cc=aarch64-linux-gnu-gcc
		cp "$sysroot/bin/busybox" "$root/bin/busybox"
	else
		cp /bin/busybox "$root/bin/busybox"
	fi
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	for pkg in $PACKAGES; do
		name=${pkg//\//_}
		log "building $pkg tests ($VMARCH)"
		mkdir -p "$root/vmtest/$pkg"
		if [ "$VMARCH" = arm64 ]; then
			# Static: no arm64 loader or libraries in the guest to find. The
			# linker's warning about getaddrinfo (net's cgo resolver) is dropped.
			CGO_ENABLED=1 GOARCH=arm64 CC=$cc CGO_CFLAGS="-g -O2 -I$sysroot/usr/include" \
				CGO_LDFLAGS="-L$sysroot/usr/lib/aarch64-linux-gnu -lzstd" \
				$GO test -tags perfbuf_static -ldflags=-extldflags=-static -c \
				-o "$root/vmtest/$pkg/pkg.test" "./$pkg" 2>&1 |
				{ grep -Ev 'getaddrinfo|^# .*\.test$' || true; } >&2
			[ -x "$root/vmtest/$pkg/pkg.test" ] || { log "build of $pkg for arm64 failed"; return 1; }
		else
			$GO test $GOTAGS -c -o "$OUT/bin/$name.test" "./$pkg"
			copy_with_libs "$OUT/bin/$name.test" "$root"
			mv "$root$OUT/bin/$name.test" "$root/vmtest/$pkg/pkg.test"
		fi
		if [ -d "$pkg/bpf" ]; then
			mkdir -p "$root/vmtest/$pkg/bpf"
			cp "$pkg"/bpf/*.bpf.o "$root/vmtest/$pkg/bpf/"
		fi
		if [ -d "$pkg/testdata" ]; then cp -r "$pkg/testdata" "$root/vmtest/$pkg/"; fi
	done
	rm -rf "${root:?}/${OUT#/}"
	# execsnoop's tests exec a C helper that no compiler in the guest could build,
	# and exec /bin/true with an empty argv, which busybox cannot take (it finds
	# its applet by argv[0]): a true of its own, before busybox installs its links.
	$cc -O1 -static -pthread -o "$root/vmtest/execsnoop-helper" cmd/execsnoop/testdata/helper.c
	echo 'int main(void) { return 0; }' | $cc -O1 -static -x c -o "$root/bin/true" -
	echo "$PACKAGES" >"$root/vmtest/packages"
	# The offline pass runs only what the initramfs holds.
	for pkg in $OFFLINE_PACKAGES; do
		case " $PACKAGES " in *" $pkg "*) echo "$pkg" ;; esac
	done >"$root/vmtest/offline-packages"
	echo "$OFFLINE_CPU" >"$root/vmtest/offline-cpu"
	cp scripts/vmtest-init.sh "$root/init"
	chmod +x "$root/init"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$OUT/initramfs-$VMARCH.gz"
	log "initramfs ($VMARCH): $(du -h "$OUT/initramfs-$VMARCH.gz" | cut -f1)"
}

# Signs that the guest kernel itself broke (an oops, a lockup, a panic): the
# tests cannot finish, and waiting for the timeout would only cost time.
GUEST_FAULT='Oops:|BUG: soft lockup|Kernel panic'

# boot KERNEL CPUS TAG [MEM ARGS]: one boot, with MEM of memory (default
# $MEM) and ARGS added to the kernel's command line; the results and console
# land in $OUT/TAG.*. Returns 3 if the guest kernel faulted (the boot is
# stopped then), 124 on the timeout, else qemu's status.
boot() {
	local vmlinuz=$1 ncpu=$2 tag=$3 mem=${4:-$MEM} args=${5:-} qpid rc=0 faulted=false
	rm -f "$OUT/$tag.results" "$OUT/$tag.console"
	if [ "$VMARCH" = arm64 ]; then
		# virt has one UART (ttyAMA0): the kernel's console and the tests'
		# output share it (vmtest_out tells /init), copied to results below.
		# pauth=off: TCG's pointer authentication costs much and tests nothing here.
		timeout "$TIMEOUT" qemu-system-aarch64 -M virt -accel "tcg,thread=${VMTEST_TCG_THREAD:-single}" \
			-cpu max,pauth=off -smp "$ncpu" -m "$mem" \
			-kernel "$vmlinuz" -initrd "$OUT/initramfs-arm64.gz" \
			-append "console=ttyAMA0 panic=-1 quiet loglevel=${VMTEST_LOGLEVEL:-4} mitigations=off vmtest_out=ttyAMA0${args:+ $args}" \
			-display none -monitor none -no-reboot \
			-serial "file:$OUT/$tag.console" &
	else
		# ttyS0: the kernel's console; ttyS1: the tests' output (results).
		# -cpu qemu64: the features every x86-64 has; with -cpu max (TCG's
		# every feature) guests hit kernel oopses that real CPUs do not.
		timeout "$TIMEOUT" qemu-system-x86_64 -accel "tcg,thread=${VMTEST_TCG_THREAD:-single}" \
			-cpu qemu64 -smp "$ncpu" -m "$mem" \
			-kernel "$vmlinuz" -initrd "$OUT/initramfs-amd64.gz" \
			-append "console=ttyS0 panic=-1 quiet loglevel=${VMTEST_LOGLEVEL:-4} mitigations=off${args:+ $args}" \
			-display none -monitor none -no-reboot \
			-serial "file:$OUT/$tag.console" -serial "file:$OUT/$tag.results" &
	fi
	qpid=$!
	while kill -0 "$qpid" 2>/dev/null; do
		if grep -Eq "$GUEST_FAULT" "$OUT/$tag.console" 2>/dev/null; then
			sleep 10 # the rest of the trace
			kill "$qpid" 2>/dev/null || true
			faulted=true
			break
		fi
		sleep 2
	done
	wait "$qpid" || rc=$?
	if [ "$VMARCH" = arm64 ] && [ -f "$OUT/$tag.console" ]; then cp "$OUT/$tag.console" "$OUT/$tag.results"; fi
	[ -f "$OUT/$tag.results" ] && sed -i 's/\r$//' "$OUT/$tag.results"
	# A panic reboots, and so ends qemu (-no-reboot), before the loop sees it.
	if $faulted || grep -Eq "$GUEST_FAULT" "$OUT/$tag.console" 2>/dev/null; then return 3; fi
	return "$rc"
}

# run_vm KERNEL CPUS [BOOTCPUS|nohz]: boots, waits, and prints the per-package
# counts and the summary line. With BOOTCPUS, the big run: only that many
# CPUs come up at boot, and the guest runs BIG_PACKAGES. With nohz, the nohz
# boot: CPU 1 nohz_full, NOHZ_RUN of NOHZ_PACKAGES. Returns non-zero if
# anything failed or the guest did not finish. A boot whose guest kernel
# faulted is tried once more, and the fault is reported either way: it is
# the emulated machine's or the kernel's, and it must not pass unseen.
run_vm() {
	local ver=$1 ncpu=$2 up=${3:-} vmlinuz tag results console start rc=0 note="" mem="" args="" mode=""
	vmlinuz=$(kernel "$ver")
	tag="$ver-${ncpu}cpu"
	[ "$VMARCH" = amd64 ] || tag="$VMARCH-$tag"
	if [ "$up" = nohz ]; then
		tag="$tag-nohz"
		# nohz_full=1: CPU 1 runs without the tick (CPU 0 keeps it); the
		# kernel then refuses membarrier's global command. vmtest_nohz_full=1:
		# /init tells the tests (PERFBUF_VMTEST_NOHZ_FULL).
		mode=" nohz_full=1"
		args="nohz_full=1 vmtest_nohz_full=1 vmtest_packages=$(echo $NOHZ_PACKAGES | tr ' ' ,) vmtest_run=$NOHZ_RUN vmtest_offline=none"
		up=""
	elif [ -n "$up" ]; then
		tag="$tag-${up}up"
		mem=$BIG_MEM
		# maxcpus=: CPUs up to $up come up at boot, the others stay
		# possible and offline. lpj=: each CPU brought online later would
		# calibrate its delay loop first, about a second under TCG; x86
		# delays use the TSC, so any plausible value will do.
		# vmtest_packages: what /init runs (it sees the parameter in its
		# environment), with no offline pass.
		# vmtest_sparse=1: only the even CPUs online (BIG_SPARSE).
		args="maxcpus=$up lpj=10000000 vmtest_packages=$(echo $BIG_PACKAGES | tr ' ' ,) vmtest_offline=none vmtest_sparse=$BIG_SPARSE"
	elif [ "$ncpu" -gt 2 ] && [ -n "$FEW_CPU_PACKAGES" ]; then
		local pkg list=""
		for pkg in $PACKAGES; do
			case " $FEW_CPU_PACKAGES " in *" $pkg "*) ;; *) list="$list,$pkg" ;; esac
		done
		args="vmtest_packages=${list#,}"
	fi
	# VMTEST_RUN, VMTEST_COUNT: the matrix's and the big run's -test.run and
	# -test.count (a flake hunted on one kernel).
	if [ -z "$mode" ]; then # not the nohz boot, whose vmtest_run is NOHZ_RUN
		[ -n "${VMTEST_RUN:-}" ] && args="$args vmtest_run=$VMTEST_RUN"
		[ -n "${VMTEST_COUNT:-}" ] && args="$args vmtest_count=$VMTEST_COUNT"
	fi
	results=$OUT/$tag.results
	console=$OUT/$tag.console
	start=$(date +%s)
	boot "$vmlinuz" "$ncpu" "$tag" "$mem" "$args" || rc=$?
	if [ "$rc" -eq 3 ]; then
		log "$tag: the guest kernel faulted; its console is kept in $OUT/$tag.fault.console; booting again"
		grep -E -m1 -A12 "$GUEST_FAULT" "$console" >&2 || true
		mv "$console" "$OUT/$tag.fault.console"
		mv "$results" "$OUT/$tag.fault.results" 2>/dev/null || true
		note=" after a guest kernel fault, retried"
		rc=0
		boot "$vmlinuz" "$ncpu" "$tag" "$mem" "$args" || rc=$?
	fi
	local secs=$(($(date +%s) - start))
	[ "$rc" -eq 124 ] && log "$tag: timed out after ${TIMEOUT}s"
	[ "$rc" -eq 3 ] && log "$tag: the guest kernel faulted again (console: $console)"
	local passed failed line
	passed=$(grep -Ec '^\s*--- PASS' "$results" 2>/dev/null || true)
	failed=$(grep -Ec '^\s*--- FAIL' "$results" 2>/dev/null || true)
	# A package that crashed or did not build counts as one failure more.
	failed=$((failed + $(grep -Ec '^vmtest-pkg .* rc=[1-9]' "$results" 2>/dev/null || true)))
	if ! grep -q '^vmtest-done' "$results" 2>/dev/null; then
		log "$tag: the guest did not finish (console: $console)"
		tail -n 20 "$console" >&2 || true
		failed=$((failed + 1))
	fi
	# Per package: its exit status, time, and counts.
	awk -v tag="$tag" '/^vmtest-start/ {p = 0; f = 0} /^[ \t]*--- PASS/ {p++} /^[ \t]*--- FAIL/ {f++}
		/^vmtest-pkg / {sub(/^vmtest-pkg /, ""); printf "  %s %s: %d passed, %d failed\n", tag, $0, p, f}' "$results" 2>/dev/null || true
	# What the many-ring tests report rather than assert (losses depend on
	# scheduling, and TCG's is not a real machine's).
	grep -E 'rings, lost over|CPUs in order|came online while reading|^vmtest-sparse|libbpf alone|own opener opened' "$results" | sed -E "s/^ *[a-z_]+\.go:[0-9]+: /  $tag   /" || true
	local arch=""
	[ "$VMARCH" = amd64 ] || arch="$VMARCH "
	line="vmtest $arch$ver ${ncpu}cpu${up:+ (${up} up at boot)}$mode ($(cat "$(dirname "$vmlinuz")/release")): $passed passed, $failed failed (${secs}s$note)"
	# What failed, by name, for the summary at the end (reap): CI shows the
	# tail of the output, and a count alone does not say what to look at.
	grep -E '^\s*--- FAIL|^vmtest-pkg .* rc=[1-9]' "$results" 2>/dev/null |
		sed -E "s/^\s*//; s/^vmtest-pkg //; s/^/vmtest-failed $tag: /" || true
	echo "$line"
	SUMMARY+=("$line")
	[ "$failed" -eq 0 ]
}

MIRROR=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1 | awk '{print $2}' || true)
: "${MIRROR:=http://deb.debian.org/debian}"
GOTAGS=${GOTAGS:-}

mkdir -p "$OUT"
if [ -n "$KERNELS$NOHZ_KERNELS$BIG_KERNELS" ]; then
	bash scripts/deps.sh qemu-system-x86 busybox-static cpio
	for ver in $KERNELS $NOHZ_KERNELS $BIG_KERNELS; do kernel "$ver" >/dev/null; done
	build_initramfs
fi
if [ -n "$ARM64_KERNELS" ]; then
	bash scripts/deps.sh qemu-system-arm gcc-aarch64-linux-gnu libc6-dev-arm64-cross cpio
	VMARCH=arm64
	for ver in $ARM64_KERNELS; do kernel "$ver" >/dev/null; done
	build_initramfs
	VMARCH=amd64
fi

# The boots run JOBS at a time, each in the background with its output in
# $OUT/jobs/N.out, printed whole when it ends. Under TCG a guest is one host
# thread (VMTEST_TCG_THREAD single), whatever its vCPUs, so one boot at a
# time leaves all but one host CPU idle.
SUMMARY=()
FAILED=() # the failed tests and packages, "TAG: --- FAIL: TestX (Ns)"
status=0
total_start=$(date +%s)
rm -rf "$OUT/jobs"
mkdir -p "$OUT/jobs"
njobs=0     # boots started
nrunning=0  # and not yet reaped
declare -A reaped=()

# reap: prints the output of every boot that ended since the last call, and
# takes its summary line and status.
reap() {
	local i f rc line
	for ((i = 0; i < njobs; i++)); do
		f=$OUT/jobs/$i
		[ -f "$f.rc" ] && [ -z "${reaped[$i]:-}" ] || continue
		reaped[$i]=1
		nrunning=$((nrunning - 1))
		rc=$(cat "$f.rc")
		cat "$f.out"
		line=$(grep -E '^vmtest ' "$f.out" | tail -n1 || true)
		SUMMARY+=("${line:-vmtest: $(head -n1 "$f.out"): no summary, status $rc}")
		mapfile -t -O "${#FAILED[@]}" FAILED < <(grep -E '^vmtest-failed ' "$f.out" | sed 's/^vmtest-failed //')
		[ "$rc" -eq 0 ] || status=1
	done
}

# launch ARCH KERNEL CPUS [BOOTCPUS]: run_vm in the background, once fewer
# than JOBS boots run.
launch() {
	local f=$OUT/jobs/$njobs
	while [ "$nrunning" -ge "$JOBS" ]; do
		wait -n || true
		reap
	done
	log "boot ${*:2} ($1) starts"
	echo "boot ${*:2} ($1)" >"$f.out"
	(
		rc=0
		VMARCH=$1
		shift
		run_vm "$@" || rc=$?
		echo "$rc" >"$f.rc"
	) >>"$f.out" 2>&1 &
	njobs=$((njobs + 1))
	nrunning=$((nrunning + 1))
}

# The longest boots first, so that none is left to run alone at the end:
# the most vCPUs first, and of those the newest kernel (7.3 takes the
# longest), then the big boot (about a minute).
for run in $(printf '%s\n' $RUNS | sort -t: -k2,2nr -k1,1Vr); do
	launch amd64 "${run%:*}" "${run#*:}"
done
for ver in $NOHZ_KERNELS; do
	launch amd64 "$ver" 2 nohz
done
for ver in $BIG_KERNELS; do
	launch amd64 "$ver" "$BIG_CPUS" "$BIG_BOOT_CPUS"
done
for ver in $ARM64_KERNELS; do
	for ncpu in $ARM64_CPUS; do
		launch arm64 "$ver" "$ncpu"
	done
done
while [ "$nrunning" -gt 0 ]; do
	wait -n || true
	reap
done
echo
echo "vmtest summary ($(($(date +%s) - total_start))s, $JOBS boots at a time):"
printf '%s\n' "${SUMMARY[@]}"
if [ "${#FAILED[@]}" -gt 0 ]; then
	echo "vmtest failures:"
	printf '  %s\n' "${FAILED[@]}"
fi
exit $status
