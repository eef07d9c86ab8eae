// SPDX-License-Identifier: Apache-2.0

package kernel

import "golang.org/x/sys/unix"

// mapTypeArena is BPF_MAP_TYPE_ARENA (include/uapi/linux/bpf.h, since
// 6.9), which x/sys/unix v0.48 lacks.
const mapTypeArena = 33

// mapTypeNames are the names libbpf gives the map types
// (libbpf_bpf_map_type_str, tools/lib/bpf/libbpf.c map_type_name), as
// libbpf 1.4 prints them.
var mapTypeNames = [...]string{
	unix.BPF_MAP_TYPE_UNSPEC:                "unspec",
	unix.BPF_MAP_TYPE_HASH:                  "hash",
	unix.BPF_MAP_TYPE_ARRAY:                 "array",
	unix.BPF_MAP_TYPE_PROG_ARRAY:            "prog_array",
	unix.BPF_MAP_TYPE_PERF_EVENT_ARRAY:      "perf_event_array",
	unix.BPF_MAP_TYPE_PERCPU_HASH:           "percpu_hash",
	unix.BPF_MAP_TYPE_PERCPU_ARRAY:          "percpu_array",
	unix.BPF_MAP_TYPE_STACK_TRACE:           "stack_trace",
	unix.BPF_MAP_TYPE_CGROUP_ARRAY:          "cgroup_array",
	unix.BPF_MAP_TYPE_LRU_HASH:              "lru_hash",
	unix.BPF_MAP_TYPE_LRU_PERCPU_HASH:       "lru_percpu_hash",
	unix.BPF_MAP_TYPE_LPM_TRIE:              "lpm_trie",
	unix.BPF_MAP_TYPE_ARRAY_OF_MAPS:         "array_of_maps",
	unix.BPF_MAP_TYPE_HASH_OF_MAPS:          "hash_of_maps",
	unix.BPF_MAP_TYPE_DEVMAP:                "devmap",
	unix.BPF_MAP_TYPE_SOCKMAP:               "sockmap",
	unix.BPF_MAP_TYPE_CPUMAP:                "cpumap",
	unix.BPF_MAP_TYPE_XSKMAP:                "xskmap",
	unix.BPF_MAP_TYPE_SOCKHASH:              "sockhash",
	unix.BPF_MAP_TYPE_CGROUP_STORAGE:        "cgroup_storage",
	unix.BPF_MAP_TYPE_REUSEPORT_SOCKARRAY:   "reuseport_sockarray",
	unix.BPF_MAP_TYPE_PERCPU_CGROUP_STORAGE: "percpu_cgroup_storage",
	unix.BPF_MAP_TYPE_QUEUE:                 "queue",
	unix.BPF_MAP_TYPE_STACK:                 "stack",
	unix.BPF_MAP_TYPE_SK_STORAGE:            "sk_storage",
	unix.BPF_MAP_TYPE_DEVMAP_HASH:           "devmap_hash",
	unix.BPF_MAP_TYPE_STRUCT_OPS:            "struct_ops",
	unix.BPF_MAP_TYPE_RINGBUF:               "ringbuf",
	unix.BPF_MAP_TYPE_INODE_STORAGE:         "inode_storage",
	unix.BPF_MAP_TYPE_TASK_STORAGE:          "task_storage",
	unix.BPF_MAP_TYPE_BLOOM_FILTER:          "bloom_filter",
	unix.BPF_MAP_TYPE_USER_RINGBUF:          "user_ringbuf",
	unix.BPF_MAP_TYPE_CGRP_STORAGE:          "cgrp_storage",
	mapTypeArena:                            "arena",
}

// MapTypeName names the map type t as libbpf does ("hash",
// "perf_event_array", "ringbuf"), or "unknown" for a type it does not know.
func MapTypeName(t uint32) string {
	if t < uint32(len(mapTypeNames)) && mapTypeNames[t] != "" {
		return mapTypeNames[t]
	}
	return "unknown"
}
