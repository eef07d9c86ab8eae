# SPDX-License-Identifier: Apache-2.0
# perfbuf: build, test and benchmark.
#
#   make deps     install what is missing (idempotent; quick when all is there)
#   make run      the main job: execsnoop for a few seconds, with a demo (root)
#   make test     deps, build, unit tests, privileged selftests, the unit tests on a
#                 big-endian host (s390x under qemu) and on arm64 (under qemu), a
#                 bounded fuzz run, the tests of a build without cgo (test-nocgo) and
#                 of a cgo build without libbpf (test-nolibbpf), every benchmark once
#   make bench    Go benchmarks, then perfbench (bench/): every mode beside the C reference
#                 (table; build/perfbench.csv; docs/perfbench.svg), the quiet
#                 measurement's C consumer built first (build/perfbench-cquiet), then
#                 bench-execsnoop. Needs root.
#   make bench-execsnoop  cmd/execsnoop beside libbpf-tools' C execsnoop on one workload
#                 (300 execs/s for 20 s), CPU and context switches of each (table;
#                 build/execsnoop-vs-c.csv). Needs root; about 25 s.
#   make bench-mountsnoop  cmd/mountsnoop (a ring buffer per CPU, in order)
#                 beside libbpf-tools' C mountsnoop (bpf_buffer) on one workload (200
#                 mount+umount pairs/s for 20 s), CPU and context switches of each
#                 (table; build/mountsnoop-vs-c.csv). Needs root; about 25 s.
#   make lint     gofmt, go vet, staticcheck, and scripts/lint: the packages' layering,
#                 the modules' requirements, cgo in perfbuf_cgo.go alone, no comment
#                 naming a file that is gone; and that -tags perfbuf_nolibbpf links no libbpf
#   make modcheck every module built alone from an empty module cache, as a user
#                 gets it, and what a user's go.mod gains (docs/release.md)
#   make vmtest   the privileged tests in VMs: Debian's 5.10, 6.1, 6.12, 7.3 kernels with
#                 8 CPUs, 5.10 and 7.3 with 2 as well, then the hotplug tests on 64 CPUs
#                 (6.12), most offline at boot
#   make vmtest64 that 64-CPU run alone; BIG_CPUS=128 boots 128 with only the even ones
#                 online (an online list past libbpf's 128 bytes: perfbuf opens the rings itself)
#   make vmtest-arm64  the privileged tests in an arm64 guest (Debian's 7.3, 2 CPUs);
#                 ARM64_KERNELS="7.3 7.3-16k" adds the 16 KiB-page kernel. Not in CI.
#
# libbpf: static from ./libbpf when the submodule is populated, else the
# system libbpf (>= 1.4) through pkg-config. Either way the Go package builds
# with a plain `go build` against the system libbpf; the static link is an
# option on top, selected with the perfbuf_static build tag. The tag
# perfbuf_nolibbpf leaves libbpf out of a cgo build of the root package
# (perfbuf's own perf ring opener, as with CGO_ENABLED=0).

SHELL := /bin/bash
# Every package of every module of the workspace (go.work: the root,
# bpfbuffer, bpfbuffer/ciliumbuffer, prom, selftest, cmd, bench,
# internal/bpfrun). `./...` would stop at the root module's boundary.
ALL := github.com/perfbuf/perfbuf/...
.SHELLFLAGS := -o pipefail -ec

GO ?= go
export GO
CLANG ?= clang-19
LLVM_STRIP ?= llvm-strip-19
BPFTOOL ?= $(shell command -v bpftool || echo /usr/sbin/bpftool)
BUILD := $(CURDIR)/build
# Fuzzing budgets, in executions (about 30 s each here): scripts/fuzz.sh.
# The ring parsers' targets also compare keyed runs since issue 49: 2M and
# 1.2M executions had grown to 91 s and 50 s in CI (30 November).
FUZZ_BUDGETS ?= FuzzPerfParse=700000x FuzzReaderRingBufs=300000x FuzzOrderedModel=5000x FuzzBPFRingParse=600000x FuzzPerf=1000000x FuzzBPF=1000000x
export FUZZ_BUDGETS
# A -race binary sleeps a second as it exits (the race runtime's
# atexit_sleep_ms, 1000 by default), which every test binary and every
# child process of the two-process tests paid: selftest/crossproc took
# 101 s under -race, 29 s without the sleep. Reports are printed when a
# race is found, not at exit. A GORACE of the caller's own is kept.
GORACE ?= atexit_sleep_ms=0
export GORACE
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')

ifneq ($(wildcard libbpf/src/Makefile),)
LIBBPF := static
LIBBPF_OUT := $(BUILD)/libbpf
LIBBPF_A := $(LIBBPF_OUT)/libbpf.a
LIBBPF_INCLUDE := $(LIBBPF_OUT)
GOTAGS := -tags perfbuf_static
# Setting CGO_CFLAGS replaces cgo's default "-g -O2", so it is kept here.
export CGO_CFLAGS := -g -O2 -I$(LIBBPF_INCLUDE)
export CGO_LDFLAGS := -L$(LIBBPF_OUT)
else
LIBBPF := system
LIBBPF_A :=
LIBBPF_INCLUDE := /usr/include
GOTAGS :=
endif

BPF_SRC := $(wildcard selftest/*/bpf/*.bpf.c cmd/*/bpf/*.bpf.c bench/*/bpf/*.bpf.c)
BPF_OBJ := $(BPF_SRC:.bpf.c=.bpf.o)
BPF_HDR := $(wildcard selftest/common/*.h bpf/*.h bench/*/bpf/*.h)
VMLINUX := $(BUILD)/vmlinux.h

.PHONY: all deps libbpf-info bpf modcheck build build-execsnoop build-mountsnoop bench-mountsnoop run test test-bigendian test-arm64 test-nocgo test-nolibbpf test-oldest test-bench nolibbpf-check mounts unit selftest vmtest vmtest64 vmtest-arm64 fuzz bench bench-execsnoop lint clean docker-test

all: build

deps:
	@bash scripts/deps.sh

libbpf-info: deps
ifeq ($(LIBBPF),static)
	@echo "libbpf: static, from the ./libbpf submodule ($(LIBBPF_A))"
else
	@echo "libbpf: system $$(pkg-config --modversion libbpf) via pkg-config (./libbpf submodule is empty)"
endif

# libbpf.a lands in $(LIBBPF_OUT), its headers in $(LIBBPF_OUT)/bpf.
$(LIBBPF_OUT)/libbpf.a: $(wildcard libbpf/src/*.[ch] libbpf/src/Makefile)
	$(MAKE) -C libbpf/src BUILD_STATIC_ONLY=1 OBJDIR=$(LIBBPF_OUT)/obj DESTDIR=$(LIBBPF_OUT) \
		INCLUDEDIR= LIBDIR= UAPIDIR= install

$(VMLINUX): | deps
	@mkdir -p $(BUILD)
	$(BPFTOOL) btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp
	@mv $@.tmp $@

# BPF programs include perfbuf's header bpf/perfbuf.bpf.h as "perfbuf.bpf.h".
%.bpf.o: %.bpf.c $(VMLINUX) $(BPF_HDR) $(LIBBPF_A)
	$(CLANG) -g -O2 -Wall -target bpf -D__TARGET_ARCH_$(ARCH) \
		-I$(BUILD) -I$(CURDIR)/bpf -I$(LIBBPF_INCLUDE) -c $< -o $@
	$(LLVM_STRIP) -g $@

# crossproc's program is bpfbuffer's, included.
selftest/crossproc/bpf/crossproc.bpf.o: selftest/bpfbuffer/bpf/bpfbuffer.bpf.c

bpf: deps $(BPF_OBJ)

build: libbpf-info bpf
	$(GO) build $(GOTAGS) $(ALL)
	$(GO) vet $(GOTAGS) $(ALL)

# The main job: execsnoop (cmd/execsnoop, ported from libbpf-tools) traces
# every exec while --demo starts a handful of processes, and RUN_SECONDS more.
RUN_SECONDS ?= 3
run: build-execsnoop
	$(BUILD)/execsnoop --demo -T -x -d $(RUN_SECONDS)

# build/execsnoop, its BPF object embedded (so after `make bpf`). Always run:
# go build knows when nothing changed.
build-execsnoop: libbpf-info bpf
	$(GO) build $(GOTAGS) -o $(BUILD)/execsnoop ./cmd/execsnoop

# Every test: unit tests and privileged selftests, with the race detector.
# Under CI (CI=true) a selftest that cannot get its privileges fails.
# It ends with one line, the total of every run's counts (TEST_TALLY).
TALLY := $(BUILD)/test-tally
test: build mounts
	@rm -f $(TALLY)
	@TEST_TALLY=$(TALLY) bash scripts/gotest.sh $(GOTAGS) -race -count=1 $(ALL)
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-bigendian
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-arm64
	@$(MAKE) --no-print-directory fuzz
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-nocgo
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-nolibbpf
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-oldest
	@TEST_TALLY=$(TALLY) $(MAKE) --no-print-directory test-bench
	@awk '{p += $$1; f += $$2; s += $$3} END {printf "total: %d passed, %d failed, %d skipped\n", p, f, s}' $(TALLY)

# Every benchmark once (-benchtime 1x, without -race): each checks what it
# measured, so one that breaks fails here rather than when someone next
# measures. About 30 s; the benchmarks' figures come from make bench.
test-bench: bpf mounts
	@echo "benchmarks: each once (-benchtime 1x)"
	@bash scripts/gotest.sh -count=1 -run '^$$' -bench . -benchtime 1x $(ALL)

# A build without cgo (CGO_ENABLED=0, as static binaries and cross-compiles
# are built): the package's unit tests, internal/kernel's (the bpf(2) and
# perf_event_open calls in Go), selftest/nocgo (a ring buffer and a perf
# event array read in every form, loaded with cilium/ebpf; privileged),
# selftest/ciliumbuffer (ciliumbuffer's Prepare and Map; privileged),
# selftest/upgrade (two processes over a pinned perf event array; privileged) and
# selftest/crossproc (readers in child processes over both kinds; privileged).
# No -race: the race detector needs cgo.
test-nocgo: bpf
	@echo "no cgo: the package, internal/owner, internal/kernel, ciliumbuffer, selftest/nocgo, selftest/ciliumbuffer, selftest/upgrade and selftest/crossproc with CGO_ENABLED=0"
	@CGO_ENABLED=0 bash scripts/gotest.sh -count=1 . ./internal/owner ./internal/kernel ./buflayout ./bpfbuffer/ciliumbuffer ./selftest/nocgo ./selftest/ciliumbuffer ./selftest/upgrade ./selftest/crossproc
# The root module alone (GOWORK=off), at the oldest versions its go.mod
# states (golang.org/x/sys v0.9.0): the workspace builds with the highest
# that any module requires. Without -race; about 15 s.
test-oldest:
	@echo "oldest: the root module alone at $$(GOWORK=off $(GO) list -m golang.org/x/sys)"
	@GOWORK=off bash scripts/gotest.sh -count=1 ./...
# A cgo build with the tag perfbuf_nolibbpf: perfbuf's own opener opens
# every perf ring, as without cgo, but with the race detector. The
# package's tests (privileged ones included) and selftest/nocgo (every
# reader over real maps loaded with cilium/ebpf, so nothing in the binary
# links libbpf); nolibbpf-check first. The selftests that force perfbuf's
# opener in the default build (opener, upgrade, failures) cover the rest.
# About 90 s on 2 loaded cores, most of it the package's tests under -race.
test-nolibbpf: bpf nolibbpf-check
	@echo "no libbpf: the package, internal/owner and selftest/nocgo with -tags perfbuf_nolibbpf -race"
	@bash scripts/gotest.sh -tags perfbuf_nolibbpf -race -count=1 . ./internal/owner ./selftest/nocgo
# A program on the root package and ciliumbuffer (selftest/ciliumbuffer's
# test binary), built with cgo (-race needs it) and -tags perfbuf_nolibbpf
# where pkg-config cannot run (PKG_CONFIG=false: a cgo file that asked for
# libbpf would fail to build), links libc and no libbpf (ldd).
NOLIBBPF_BIN := $(BUILD)/nolibbpf-ciliumbuffer.test
nolibbpf-check:
	@mkdir -p $(BUILD)
	@CGO_ENABLED=1 PKG_CONFIG=false $(GO) test -c -race -tags perfbuf_nolibbpf -o $(NOLIBBPF_BIN) ./selftest/ciliumbuffer
	@libs=$$(ldd $(NOLIBBPF_BIN) | awk '{print $$1}' | tr '\n' ' '); \
		case "$$libs" in *libbpf*|*"not a dynamic"*) echo "nolibbpf-check: $(NOLIBBPF_BIN) links $$libs; want libc and no libbpf" >&2; exit 1;; esac; \
		echo "nolibbpf-check: a cgo build with -tags perfbuf_nolibbpf links $$libs(no libbpf)"

# The package's tests that need no cgo (the parser, the readers over fake
# rings, the fuzz corpora) on a big-endian host: built for s390x and run under
# qemu-user. The kernel writes records in the host's byte order, so the
# parser must read them so, and the fake rings must be written so.
test-bigendian:
	@bash scripts/deps.sh qemu-user
	@echo "big-endian: the package's, the ring kinds', the wait's and the snapshots' tests for s390x (no cgo), under qemu-s390x"
	@PERFBUF_TEST_EMULATOR=qemu-s390x CGO_ENABLED=0 GOARCH=s390x bash scripts/gotest.sh -exec qemu-s390x -count=1 . ./internal/owner ./internal/ring ./internal/wait ./internal/snapshot

# The same tests for arm64, under qemu-user: the parsers' and the wake rule's
# atomics as the arm64 compiler emits them, the race tests' producers running
# beside the readers, the fuzz corpora. Without -race: Go's arm64 race runtime
# needs a 48-bit address space, and qemu-aarch64 on an x86-64 host (47 bits for
# user space) cannot give one ("ThreadSanitizer: unsupported VMA range").
# On one host CPU (taskset): with two, qemu-aarch64 7.2 lets a store-release
# pass a later load-acquire, which arm64 forbids, and Go's sequentially
# consistent atomics break (Dekker's pattern fails in 2-5% of rounds; so does
# the ring buffer's wake rule, TestBPFRingRace). On one CPU the guest's
# threads interleave and its order is the program's: the orderings only arm64
# allows are not produced here (docs/kernels.md, "arm64").
test-arm64:
	@bash scripts/deps.sh qemu-user
	@echo "arm64: the package's, the ring kinds', the wait's and the snapshots' tests for arm64 (no cgo), under qemu-aarch64 on one CPU"
	@PERFBUF_TEST_EMULATOR=qemu-aarch64 CGO_ENABLED=0 GOARCH=arm64 bash scripts/gotest.sh -exec 'taskset -c 0 qemu-aarch64' -count=1 . ./internal/owner ./internal/ring ./internal/wait ./internal/snapshot

# bpffs and tracefs, mounted once where missing (scripts/mounts.sh): the
# privileged tests of several packages, running at once, share them.
mounts:
	@bash scripts/mounts.sh

unit: build
	@bash scripts/gotest.sh $(GOTAGS) -race -count=1 .

# The privileged tests: the selftests, the commands' tests (execsnoop) and the
# benchmark tooling's (bench/: perfbench, and the benchmarks' harness checks).
selftest: build mounts
	@bash scripts/gotest.sh $(GOTAGS) -race -count=1 ./selftest/... ./cmd/... ./bench/...

# The privileged tests inside QEMU on Debian's kernels 5.10, 6.1, 6.12 and 7.3,
# each with 8 vCPUs and again with CPU 3 offline, 5.10 and 7.3 with 2 vCPUs as
# well; then vmtest64's run (scripts/vmtest.sh). KERNELS="6.1 7.3" CPUS="2 8"
# run every kernel given with every count given.
vmtest: build
	@GOTAGS="$(GOTAGS)" bash scripts/vmtest.sh

# The CPU hotplug tests alone in a 64-vCPU guest (6.12) that boots with 16
# CPUs up: the others come online while the readers read.
vmtest64: build
	@GOTAGS="$(GOTAGS)" bash scripts/vmtest.sh big

# The privileged tests in an arm64 guest under TCG (qemu-system-aarch64, Debian's
# linux-image-arm64 of 7.3), the test binaries cross-built with cgo and linked
# statically (scripts/vmtest.sh arm64). About as long as one 2-vCPU boot of the
# matrix; CI leaves it out to stay under 40 minutes (docs/kernels.md, "arm64").
vmtest-arm64: build
	@GOTAGS="$(GOTAGS)" bash scripts/vmtest.sh arm64

# Bounded fuzzing of every fuzz target: the ring parser and the ordered
# merge's model (their corpora in testdata/ run in `test`). Budgets are counts
# of executions (FUZZ_BUDGETS above; why not durations: scripts/fuzz.sh).
# FUZZTIME=10m make fuzz runs each target for a duration instead.
fuzz: build
	@bash scripts/fuzz.sh $(GOTAGS)

BENCHTIME ?= 1000000x
PERFBENCH_FLAGS ?=

# perfbench's quiet measurement runs its C reference as a program of its own
# (bench/perfbench/cquiet), linked with the libbpf the Go package links.
CQUIET := $(BUILD)/perfbench-cquiet
ifeq ($(LIBBPF),static)
CQUIET_CFLAGS := -I$(LIBBPF_INCLUDE)
CQUIET_LIBS := $(LIBBPF_A) -lelf -lz
else
CQUIET_CFLAGS = $(shell pkg-config --cflags libbpf)
CQUIET_LIBS = $(shell pkg-config --libs libbpf)
endif

$(CQUIET): bench/perfbench/cquiet/cquiet.c bench/internal/cref/cref.h $(LIBBPF_A) | deps
	@mkdir -p $(BUILD)
	$(CC) -O2 -g -Wall -Wextra -Ibench/internal/cref $(CQUIET_CFLAGS) -o $@ $< $(CQUIET_LIBS)

bench: build mounts $(CQUIET)
	$(GO) test $(GOTAGS) -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(ALL)
	$(GO) build $(GOTAGS) -o $(BUILD)/perfbench ./bench/perfbench
	$(BUILD)/perfbench -bpf-obj bench/perfbench/bpf/perfbench.bpf.o -cquiet $(CQUIET) \
		-csv $(BUILD)/perfbench.csv -svg docs/perfbench.svg $(PERFBENCH_FLAGS)
	@$(MAKE) --no-print-directory bench-execsnoop

# The tool beside the C one: build/execsnoop and libbpf-tools' execsnoop (installed
# when missing) trace the same scripted workload at once, each under /usr/bin/time -v
# (scripts/execsnoop-vs-c.sh). EXECSNOOP_RATE, EXECSNOOP_SECONDS and
# EXECSNOOP_ALONE=1 (each tool alone too) pass through.
bench-execsnoop: build-execsnoop
	@bash scripts/execsnoop-vs-c.sh $(BUILD)/execsnoop

# build/mountsnoop, its BPF object embedded (so after `make bpf`).
build-mountsnoop: libbpf-info bpf
	$(GO) build $(GOTAGS) -o $(BUILD)/mountsnoop ./cmd/mountsnoop

# cmd/mountsnoop beside libbpf-tools' mountsnoop, as bench-execsnoop
# (scripts/mountsnoop-vs-c.sh). MOUNTSNOOP_RATE, MOUNTSNOOP_SECONDS,
# MOUNTSNOOP_ALONE=1 and MOUNTSNOOP_GO_FLAGS (--buffer perf_event_array)
# pass through.
bench-mountsnoop: build-mountsnoop
	@bash scripts/mountsnoop-vs-c.sh $(BUILD)/mountsnoop

lint: deps
	@files=$$(git ls-files '*.go') && [ -n "$$files" ] || { echo "lint: no Go files from git ls-files" >&2; exit 1; }; \
		out=$$(gofmt -l $$files); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet $(GOTAGS) $(ALL)
	$(GO) run $(STATICCHECK) $(GOTAGS) $(ALL)
	@# The packages' layering, the modules' requirements, cgo in one file, the
	@# files comments name (scripts/lint).
	$(GO) run ./scripts/lint
	@$(MAKE) --no-print-directory nolibbpf-check
	@# Every source file names its license (README, License): Apache-2.0, or
	@# GPL-2.0-only OR BSD-2-Clause for the BPF C.
	@out=$$(git ls-files '*.go' '*.c' '*.h' '*.sh' Makefile Dockerfile.build .ci/run | \
		grep -v '^libbpf/' | xargs grep -L 'SPDX-License-Identifier: ' || true); \
		if [ -n "$$out" ]; then echo "no SPDX-License-Identifier line:" $$out; exit 1; fi

# Every module as a user gets it (scripts/modcheck): each built alone
# (GOWORK=off) from an empty module cache, the repository's modules served
# at the release version from the working tree, and what go mod tidy
# gives a module that imports only the root (golang.org/x/sys alone) and a
# cilium/ebpf one that adds ciliumbuffer (no version raised). Needs the
# module proxy; a few minutes. docs/release.md runs it before tagging.
modcheck:
	$(GO) run ./scripts/modcheck
# The selftests in a privileged container built from Dockerfile.build
# (docs/docker.md). Settings such as DOCKER_RUN_FLAGS pass through.
docker-test:
	@bash scripts/docker-test.sh

clean:
	rm -rf $(BUILD) $(BPF_OBJ)
	$(GO) clean -testcache
