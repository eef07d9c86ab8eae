// SPDX-License-Identifier: Apache-2.0

// Package cpus reads the kernel's CPU lists (/sys/devices/system/cpu/online
// and possible). perfbuf uses them to know which CPU each of libbpf's rings
// belongs to; the selftests, to emit on every CPU that has a ring. Both must
// agree with libbpf, which reads the same files.
package cpus

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

const sysfs = "/sys/devices/system/cpu/"

// Online returns the CPUs that are online now, in increasing order.
func Online() ([]int, error) { return read(sysfs + "online") }

// Possible returns the CPUs that may ever be online, in increasing order.
func Possible() ([]int, error) { return read(sysfs + "possible") }

func read(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cpu list: %w", err)
	}
	cpus, err := Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return cpus, nil
}

// Parse parses the kernel's cpu list format: "0-3,5,7-8\n".
func Parse(s string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		first, last, isRange := strings.Cut(part, "-")
		lo, err1 := strconv.Atoi(first)
		hi, err2 := lo, error(nil)
		if isRange {
			hi, err2 = strconv.Atoi(last)
		}
		if err1 != nil || err2 != nil || lo < 0 || hi < lo {
			return nil, fmt.Errorf("bad cpu range %q", part)
		}
		for c := lo; c <= hi; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
