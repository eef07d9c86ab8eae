#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs `go test -v "$@"`, shows the usual output, and ends with one summary
# line: "tests: N passed, N failed, N skipped". Exits non-zero on failure.
# With TEST_TALLY set, it also adds the counts to that file (make test's total).
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"${GO:-go}" test -v "$@" 2>&1 | tee "$log" | grep -Ev '^(=== (RUN|PAUSE|CONT|NAME)|    --- PASS|--- PASS)'
rc=${PIPESTATUS[0]}
# A benchmark that ran to its end prints its result line: it passed.
passed=$(( $(grep -Ec '^\s*--- PASS' "$log") + $(grep -Ec '^Benchmark[^ ]*\s+[0-9]+\s' "$log") ))
failed=$(grep -Ec '^\s*--- FAIL' "$log")
skipped=$(grep -Ec '^\s*--- SKIP' "$log")
if [ "$skipped" -gt 0 ]; then
	echo "skipped:"; grep -E '^\s*--- SKIP' "$log" | sed 's/^\s*/  /'
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
# TEST_TALLY: a file to add this run's counts to, for a total over runs.
if [ -n "${TEST_TALLY:-}" ]; then echo "$passed $failed $skipped" >>"$TEST_TALLY"; fi
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
	echo "go test exited $rc (build failure or panic): see above" >&2
fi
exit "$rc"
