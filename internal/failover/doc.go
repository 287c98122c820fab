// Package failover holds a benchmark, in its tests, that compares leader
// election with pkg/redislock against client-go's Lease-based election:
// takeover after a graceful stop, takeover after SIGKILL, and requests per
// minute while leading. Run it with `make bench`.
package failover
