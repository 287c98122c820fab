package redislock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// The uncontended Lock+Unlock pair stays lean (issue 21): at most 9 Redis
// commands, those its two scripts call included, and at most 30 Go heap
// allocations. `make bench` measures the time, beside the peers.
func TestUncontendedPairCost(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := newClient(t, srv.Client(t), redislock.Options{})
	m := newMutex(t, c, lockName(t), nil)
	pair := func() {
		h, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		pair() // scripts loaded, connections open
	}
	admin := srv.Client(t)
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const pairs = 1000
	allocs := testing.AllocsPerRun(pairs, pair)
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls int64
	var mix []string
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_config|resetstat" || name == "cmdstat_info" {
			continue
		}
		field, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		n, _ := strconv.ParseInt(field, 10, 64)
		calls += n
		mix = append(mix, strings.TrimPrefix(name, "cmdstat_")+" "+field)
	}
	// AllocsPerRun runs the function once more to warm up.
	perPair := float64(calls) / (pairs + 1)
	t.Logf("per pair: %.2f Redis commands (%s over %d pairs), %.0f allocations", perPair, strings.Join(mix, ", "), pairs+1, allocs)
	if perPair > 9 {
		t.Errorf("%.2f Redis commands per pair, want at most 9", perPair)
	}
	if allocs > 30 {
		t.Errorf("%.0f allocations per pair, want at most 30", allocs)
	}
}
