#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cmd/mountsnoop beside the C mountsnoop of libbpf-tools (Debian's package) on one
# scripted workload: what each tool costs, as a whole process, under /usr/bin/time -v.
# Both read BPF ring buffers where the kernel has them: the C tool one shared
# ring (libbpf-tools' bpf_buffer), the Go tool by default a ring per CPU
# (perfbuf's PERFBUF_BUFFER and bpfbuffer.Prepare), read in the order of the
# events' timestamps so that it prints the C tool's lines in its order.
#
#   scripts/mountsnoop-vs-c.sh [GO_MOUNTSNOOP]     (default build/mountsnoop)
#
# `make bench-mountsnoop` builds the Go tool and runs this. Needs root. Installs what
# is missing: `time`, `libbpf-tools`, `bpftool`, `gcc` (apt), and compiles the
# workload's generator (cmd/mountsnoop/testdata/mountrate.c) with cc.
#
# The workload: mountrate, in a private mount namespace of its own, mounts a 4 KiB
# tmpfs with the source <mark>-<n> on /tmp/<mark> and unmounts it, MOUNTSNOOP_RATE
# pairs a second (default 200: 400 events a second) for MOUNTSNOOP_SECONDS (default
# 20), paced by the clock, without catching up in a burst after a stall (mountrate.c
# says why). Both tools run with no flags (MOUNTSNOOP_GO_FLAGS adds to
# the Go tool's: --buffer perf_event_array), output to a file. Each is started under
# `/usr/bin/time -v`, waited for until its four tracepoints are attached (bpftool
# perf), given 1 s more; then the workload runs; 1 s later each gets SIGINT.
# Captured = the tool's output lines that carry this run's mark (a mount and a
# umount per pair), expected = twice the pairs made; "same lines" = the two tools'
# marked lines are identical, in the same order (COMM, PID, TID, MNT_NS and CALL:
# both trace the same calls); when not, whether the Go tool's are the C tool's
# in order with some missing (a full ring) or some out of place.
#
# What the table reports: both tools traced the SAME workload AT ONCE (one run,
# "concurrent"), so that the host's drift weighs on both alike. Before it, a
# "baseline" run does the same steps with no workload (start-up, BTF and BPF load,
# 2 s idle, exit); the per-event lines are (run - baseline) / expected.
# MOUNTSNOOP_ALONE=1 then runs each tool alone on the same workload ("alone" rows).
#
# Figures: user and system CPU seconds, voluntary and involuntary context switches,
# max RSS, of the tool's process (every thread). /usr/bin/time prints CPU to 10 ms;
# compare the sums of user and system (scripts/execsnoop-vs-c.sh says why).
#
# Table on stdout; every row also in build/mountsnoop-vs-c.csv; the tools' outputs
# and time reports in build/mountsnoop-vs-c/. Exits 1 if a tool missed a marked
# event or failed, or if their marked lines differ. About 25 s with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=${MOUNTSNOOP_RATE:-200}
DURATION=${MOUNTSNOOP_SECONDS:-20}
ALONE=${MOUNTSNOOP_ALONE:-0}
GO_FLAGS=${MOUNTSNOOP_GO_FLAGS:-}
BUILD=${BUILD:-$PWD/build}
GO_TOOL=${1:-$BUILD/mountsnoop}
OUT=$BUILD/mountsnoop-vs-c
CSV=$BUILD/mountsnoop-vs-c.csv
started=$(date +%s.%N)

log() { echo "mountsnoop-vs-c: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (BPF tracing)"
[ -x "$GO_TOOL" ] || die "$GO_TOOL not found: run 'make bench-mountsnoop' (it builds it)"

# --- what the comparison needs, installed when missing (as scripts/deps.sh) ---
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
need=()
for p in time libbpf-tools bpftool gcc; do have_pkg "$p" || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
C_TOOL=${MOUNTSNOOP_C:-$(dpkg -L libbpf-tools | grep -m1 '/s\?bin/mountsnoop$' || true)}
[ -x "${C_TOOL:-/nonexistent}" ] || die "no mountsnoop in libbpf-tools (dpkg -L libbpf-tools)"
BPFTOOL=$(command -v bpftool || echo /usr/sbin/bpftool)
c_version=$(dpkg-query -W -f='${Version}' libbpf-tools)

mkdir -p "$OUT"
GEN=$BUILD/mountrate
if [ ! -x "$GEN" ] || [ cmd/mountsnoop/testdata/mountrate.c -nt "$GEN" ]; then
	cc -O2 -Wall -Wextra -o "$GEN" cmd/mountsnoop/testdata/mountrate.c
fi

# --- one run: start TOOLS, attach, workload of N seconds (0: none), stop -------
declare -A bin=([C]="$C_TOOL" [Go]="$GO_TOOL")
# The tools' flags: none for C; MOUNTSNOOP_GO_FLAGS for Go (word-split).
declare -A flags=([C]="" [Go]="$GO_FLAGS")
declare -A tpid pid

# child_of TIMEPID: the tool's pid, /usr/bin/time's only child.
child_of() {
	local c="" i
	for ((i = 0; i < 200; i++)); do
		c=$(cat "/proc/$1/task/$1/children" 2>/dev/null || pgrep -P "$1" || true)
		c=${c%% *}
		[ -n "$c" ] && { echo "$c"; return; }
		sleep 0.01
	done
	return 1
}

# attached PID: the tool's four tracepoints have a program attached.
attached() {
	[ "$("$BPFTOOL" perf show 2>/dev/null | grep -cE "^pid $1 .*tracepoint +sys_(enter|exit)_u?mount$")" -eq 4 ]
}

# run PHASE SECONDS TOOL...: writes $OUT/PHASE-TOOL.{out,err,time} and
# $OUT/PHASE.gen (the generator's line), or returns 1.
run() {
	local phase=$1 secs=$2 t i waited
	shift 2
	for t in "$@"; do
		# shellcheck disable=SC2086 # flags are words
		/usr/bin/time -v -o "$OUT/$phase-$t.time" "${bin[$t]}" ${flags[$t]} \
			>"$OUT/$phase-$t.out" 2>"$OUT/$phase-$t.err" &
		tpid[$t]=$!
	done
	for t in "$@"; do
		pid[$t]=$(child_of "${tpid[$t]}") || { log "$phase: $t did not start"; return 1; }
	done
	for t in "$@"; do
		for ((waited = 0; ; waited++)); do
			attached "${pid[$t]}" && break
			if ! kill -0 "${pid[$t]}" 2>/dev/null; then
				log "$phase: $t exited before attaching:"; cat "$OUT/$phase-$t.err" >&2; return 1
			elif ((waited >= 150)); then
				log "$phase: $t did not attach in 15 s:"; cat "$OUT/$phase-$t.err" >&2; return 1
			fi
			sleep 0.1
		done
	done
	sleep 1
	if [ "$secs" != 0 ]; then
		"$GEN" "$RATE" "$secs" "$mark" >"$OUT/$phase.gen" || { log "$phase: workload failed: $(cat "$OUT/$phase.gen")"; return 1; }
	else
		echo "pairs 0 failed 0 late_max_us 0 elapsed_s 0" >"$OUT/$phase.gen"
	fi
	sleep 1
	for t in "$@"; do kill -INT "${pid[$t]}"; done
	# Both stop within a second; one that has not after 10 s is killed, and the run fails.
	for t in "$@"; do
		for ((i = 0; i < 100; i++)); do kill -0 "${tpid[$t]}" 2>/dev/null || break; sleep 0.1; done
		if kill -0 "${tpid[$t]}" 2>/dev/null; then
			log "$phase: $t still running 10 s after SIGINT; killing it"
			kill -KILL "${pid[$t]}" 2>/dev/null || true
		fi
		wait "${tpid[$t]}" || { log "$phase: $t exited with status $?:"; tail -5 "$OUT/$phase-$t.err" >&2; return 1; }
		unset "tpid[$t]" "pid[$t]"
	done
}

# On the way out (an error above), stop the tools this script started and that still
# run: SIGINT, then SIGKILL for one that ignored it (SIGINT is ignored in a
# background job until the tool sets its handler).
stop_tools() {
	local t p i
	for t in "${!tpid[@]}"; do
		kill -0 "${tpid[$t]}" 2>/dev/null || continue
		p=${pid[$t]:-$(child_of "${tpid[$t]}" || true)}
		[ -n "$p" ] || continue
		kill -INT "$p" 2>/dev/null || true
		for ((i = 0; i < 30; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null || true
	done
}
trap stop_tools EXIT

# field FILE LABEL: the value after "LABEL: " in a /usr/bin/time -v report.
field() { awk -F': ' -v l="$2" '{ sub(/^[ \t]+/, "", $1) } $1 == l { print $2; exit }' "$1"; }

# --- the runs ----------------------------------------------------------------
mark=perfbuf-mnt-$$-$(date +%s)
echo "phase,tool,user_s,sys_s,vol_csw,invol_csw,maxrss_kib,wall,captured,distinct,expected,same_lines" >"$CSV"
declare -A row
missed=0

# in_order A B: whether B's lines are A's in A's order, some missing ("in
# order with N missing"), or not ("N out of place and M missing": N of B's
# lines are not in the longest common subsequence, as diff finds it). No
# comma: the words go into the CSV.
in_order() {
	local moved gone
	moved=$(diff "$1" "$2" | grep -c '^>' || true)
	gone=$(diff "$1" "$2" | grep -c '^<' || true)
	if [ "$moved" -eq 0 ]; then
		echo "in order with $gone missing"
	else
		echo "$moved out of place and $((gone - moved)) missing"
	fi
}

# record PHASE TOOL...: parses the run's files into row[PHASE,TOOL,*] and the CSV.
record() {
	local phase=$1 t f expected
	shift
	expected=$(awk '{ print 2 * $2 }' "$OUT/$phase.gen")
	for t in "$@"; do
		f=$OUT/$phase-$t.time
		row[$phase,$t,user]=$(field "$f" 'User time (seconds)')
		row[$phase,$t,sys]=$(field "$f" 'System time (seconds)')
		row[$phase,$t,vcsw]=$(field "$f" 'Voluntary context switches')
		row[$phase,$t,icsw]=$(field "$f" 'Involuntary context switches')
		row[$phase,$t,rss]=$(field "$f" 'Maximum resident set size (kbytes)')
		row[$phase,$t,wall]=$(field "$f" 'Elapsed (wall clock) time (h:mm:ss or m:ss)')
		row[$phase,$t,captured]=$(grep -c -- "$mark" "$OUT/$phase-$t.out" || true)
		row[$phase,$t,distinct]=$(grep -o -- "$mark-[0-9]*" "$OUT/$phase-$t.out" | sort -u | wc -l || true)
		grep -- "$mark" "$OUT/$phase-$t.out" >"$OUT/$phase-$t.marked" || true
		row[$phase,$t,expected]=$expected
		if [ "${row[$phase,$t,captured]}" -ne "$expected" ] || [ "${row[$phase,$t,distinct]}" -ne $((expected / 2)) ]; then
			log "$phase: $t captured ${row[$phase,$t,captured]} marked events (${row[$phase,$t,distinct]} distinct mounts) of $expected"
			missed=1
		fi
		if grep -qiE '^lost|failed output' "$OUT/$phase-$t.err"; then
			log "$phase: $t reported losses: $(grep -iE '^lost|failed output' "$OUT/$phase-$t.err" | head -3 | tr '\n' ' ')"
		fi
	done
	# Both tools at once: are their marked lines the same?
	same=-
	if [ $# -eq 2 ]; then
		same=no
		cmp -s "$OUT/$phase-C.marked" "$OUT/$phase-Go.marked" && same=yes
		if [ "$same" = no ] && [ "$expected" -gt 0 ]; then
			# Lines missing (a full ring), or lines in another order?
			same="no ($(in_order "$OUT/$phase-C.marked" "$OUT/$phase-Go.marked"))"
			log "$phase: the marked lines differ, $same: diff $OUT/$phase-C.marked $OUT/$phase-Go.marked"
			missed=1
		fi
	fi
	row[$phase,same]=$same
	for t in "$@"; do
		echo "$phase,$t,${row[$phase,$t,user]},${row[$phase,$t,sys]},${row[$phase,$t,vcsw]},${row[$phase,$t,icsw]},${row[$phase,$t,rss]},${row[$phase,$t,wall]},${row[$phase,$t,captured]},${row[$phase,$t,distinct]},$expected,$same" >>"$CSV"
	done
}

log "baseline: both tools, no workload"
run baseline 0 C Go
record baseline C Go
log "concurrent: both tools, $RATE mount+umount pairs/s for $DURATION s"
run concurrent "$DURATION" C Go
record concurrent C Go
phases=(baseline concurrent)
if [ "$ALONE" = 1 ]; then
	for t in C Go; do
		log "alone-$t: $t alone, $RATE pairs/s for $DURATION s"
		run "alone-$t" "$DURATION" "$t"
		record "alone-$t" "$t"
		phases+=("alone-$t")
	done
fi

# --- the table ---------------------------------------------------------------
echo
echo "mountsnoop: Go ($GO_TOOL${GO_FLAGS:+ $GO_FLAGS}) beside C ($C_TOOL, libbpf-tools $c_version), output to a file"
for ph in "${phases[@]}"; do
	[ "$ph" = baseline ] && continue
	read -r _ n _ _ _ late _ el <"$OUT/$ph.gen"
	echo "workload, $ph: $n mount+umount pairs ($((2 * n)) events) in ${el} s ($RATE/s, latest pair ${late} us behind the clock)"
done
echo
printf '%-12s %-3s %7s %7s %7s %8s %9s %8s %9s %9s\n' phase tool "user s" "sys s" "CPU s" "vol csw" "invol csw" "RSS MiB" captured expected
for ph in "${phases[@]}"; do
	for t in C Go; do
		[ -n "${row[$ph,$t,user]:-}" ] || continue
		awk -v ph="$ph" -v t="$t" -v u="${row[$ph,$t,user]}" -v s="${row[$ph,$t,sys]}" \
			-v v="${row[$ph,$t,vcsw]}" -v i="${row[$ph,$t,icsw]}" -v r="${row[$ph,$t,rss]}" \
			-v c="${row[$ph,$t,captured]}" -v e="${row[$ph,$t,expected]}" \
			'BEGIN { printf "%-12s %-3s %7.2f %7.2f %7.2f %8d %9d %8.1f %9d %9d\n", ph, t, u, s, u + s, v, i, r / 1024, c, e }'
	done
done

# ratio A B: A/B to two decimals, or "-" when B <= 0 or A < 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b <= 0 || a < 0) print "-"; else printf "%.2fx", a / b }'; }
cpu() { awk -v u="${row[$1,$2,user]}" -v s="${row[$1,$2,sys]}" 'BEGIN { print u + s }'; }
echo
echo "same marked lines (concurrent): ${row[concurrent,same]}"
echo "Go/C, concurrent: CPU $(ratio "$(cpu concurrent Go)" "$(cpu concurrent C)"), voluntary csw $(ratio "${row[concurrent,Go,vcsw]}" "${row[concurrent,C,vcsw]}"), involuntary csw $(ratio "${row[concurrent,Go,icsw]}" "${row[concurrent,C,icsw]}")"
if [ "$ALONE" = 1 ]; then
	echo "Go/C, alone: CPU $(ratio "$(cpu alone-Go Go)" "$(cpu alone-C C)"), voluntary csw $(ratio "${row[alone-Go,Go,vcsw]}" "${row[alone-C,C,vcsw]}"), involuntary csw $(ratio "${row[alone-Go,Go,icsw]}" "${row[alone-C,C,icsw]}")"
fi

# Per event, net of the baseline (start-up, load, idle, exit): (run - baseline) / expected.
# net PHASE TOOL: "CPU-us vol-csw invol-csw" per event.
net() {
	awk -v n="${row[$1,$2,expected]}" -v c="$(cpu "$1" "$2")" -v c0="$(cpu baseline "$2")" \
		-v v="${row[$1,$2,vcsw]}" -v v0="${row[baseline,$2,vcsw]}" \
		-v i="${row[$1,$2,icsw]}" -v i0="${row[baseline,$2,icsw]}" \
		'BEGIN { printf "%.2f %.4f %.4f\n", (c - c0) * 1e6 / n, (v - v0) / n, (i - i0) / n }'
}
echo
echo "per event, net of the baseline run:"
printf '%-12s %-4s %9s %9s %9s\n' phase tool "CPU us" "vol csw" "invol csw"
for ph in "${phases[@]}"; do
	[ "$ph" = baseline ] && continue
	for t in C Go; do
		[ -n "${row[$ph,$t,user]:-}" ] || continue
		read -r nc nv ni < <(net "$ph" "$t")
		printf '%-12s %-4s %9.1f %9.3f %9.3f\n' "$ph" "$t" "$nc" "$nv" "$ni"
		row[$ph,$t,net]="$nc $nv $ni"
	done
	if [ "$ph" = concurrent ]; then
		# No ratio of involuntary switches per event: preemptions, set by the host's load.
		read -r gc gv _ <<<"${row[$ph,Go,net]}"
		read -r cc cv _ <<<"${row[$ph,C,net]}"
		printf '%-12s %-4s %9s %9s %9s\n' "$ph" Go/C "$(ratio "$gc" "$cc")" "$(ratio "$gv" "$cv")" -
	fi
done

echo
echo "csv: $CSV; outputs: $OUT/"
echo "wall time: $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
if [ "$missed" -ne 0 ]; then
	die "a tool missed marked events, or the tools' lines differ (above)"
fi
