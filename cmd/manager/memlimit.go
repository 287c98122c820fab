package main

import (
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// cgroupMemoryFiles are where a container's memory limit is read: cgroup v2,
// then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryReserve is how much of the container's memory limit the Go
// runtime leaves to what the container is charged and Go does not count:
// above all the binary's own pages, about 43 MiB resident, and room for the
// collector to finish a cycle while the heap grows. Go's collector
// otherwise lets the heap grow to twice its live size before collecting
// (GOGC=100), so a manager whose live heap is under half its limit could
// still be killed for running out of memory; with a soft limit it collects
// harder instead. The reserve is at most a quarter of the limit. At issue
// 15's scale, in a 256 MiB container, a soft limit of 90% of it left the
// process at 262 MiB at its peak, 80% at 256, and 75% (this reserve) at
// 251 (test/scale, README "Manager at scale").
const memoryReserve = 64 << 20

// setMemoryLimit sets the Go runtime's soft memory limit to the
// container's less memoryReserve, unless GOMEMLIMIT is set (the runtime has
// then applied it) or no limit is found. It returns the limit set.
func setMemoryLimit(getenv func(string) string, files []string) (int64, bool) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		limit, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		// "max" (v2), or v1's page-rounded maximum of int64 when unlimited.
		if err != nil || limit <= 0 || limit >= 1<<62 {
			return 0, false
		}
		soft := max(limit-memoryReserve, limit/4*3)
		debug.SetMemoryLimit(soft)
		return soft, true
	}
	return 0, false
}
