#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Bounded fuzzing of every fuzz target of the packages that have them
# (FUZZ_PACKAGES: the root package, the ring kinds, the snapshot parsers).
#
#   scripts/fuzz.sh [go test flags...]
#
# Each target runs for its budget in FUZZ_BUDGETS ("Target=N ..."), a count of
# executions, sized to about 30 s here. A count rather than a duration because
# Go 1.26's coordinator can fail a target with a bare "context deadline
# exceeded" when a duration runs out while a worker is mid-call
# (golang/go#75804, fixed in Go 1.27); a count sets no deadline to race.
# FUZZTIME, when set (e.g. FUZZTIME=10m), replaces every budget.
#
# A target without a budget is an error, so a new one cannot go unfuzzed.
# Any failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

budget_of() {
	local t
	for t in ${FUZZ_BUDGETS:-}; do
		if [ "${t%%=*}" = "$1" ]; then echo "${t#*=}"; return; fi
	done
}

packages=${FUZZ_PACKAGES:-". ./internal/ring ./internal/snapshot"}
found=0
for pkg in $packages; do
	targets=$("${GO:-go}" test "$@" -list '^Fuzz' "$pkg" | grep '^Fuzz' || true)
	for f in $targets; do
		found=1
		budget=${FUZZTIME:-$(budget_of "$f")}
		if [ -z "$budget" ]; then
			echo "fuzz: $f has no budget in FUZZ_BUDGETS (Makefile)" >&2
			exit 1
		fi
		echo "fuzz: $pkg $f for $budget"
		"${GO:-go}" test "$@" -run '^$' -fuzz "^$f\$" -fuzztime "$budget" "$pkg"
	done
done
if [ "$found" = 0 ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi
