package redislock_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func TestMetrics(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	metrics := redislock.NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(metrics); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv.Client(t), redislock.Options{WatchdogLease: 1500 * time.Millisecond, Metrics: metrics})
	m := newMutex(t, c, lockName(t), nil)
	held := mustLock(t, ctx, m)
	// gather gives the registry's observations and counter values by name.
	gather := func() map[string]int {
		counts := map[string]int{}
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			for _, metric := range f.GetMetric() {
				if h := metric.GetHistogram(); h != nil {
					counts[f.GetName()] = int(h.GetSampleCount())
				} else {
					counts[f.GetName()] = int(metric.GetCounter().GetValue())
				}
			}
		}
		return counts
	}
	waitFor(t, func() bool { return gather()["redislock_renewals_total"] >= 2 }, "two renewals")
	mustUnlock(t, ctx, held)
	short := newMutex(t, c, lockName(t)+"-short", &redislock.MutexOptions{Lease: 50 * time.Millisecond})
	waitDone(t, mustLock(t, ctx, short).Done(), 10*time.Second, "the short lease's end")

	counts := gather()
	if counts["redislock_acquire_latency_seconds"] != 2 || counts["redislock_wait_seconds"] != 2 || counts["redislock_hold_seconds"] != 1 {
		t.Errorf("acquire, wait and hold observations = %v", counts)
	}
	if counts["redislock_renewals_total"] < 2 || counts["redislock_renewal_failures_total"] != 0 || counts["redislock_lost_leases_total"] != 1 {
		t.Errorf("renewal and loss counts = %v", counts)
	}
	if n := testutil.CollectAndCount(metrics); n != 6 {
		t.Errorf("%d metrics collected, want 6", n)
	}
}

// TestOneRenewalLoop holds many watchdog locks and checks that the client
// runs one renewal goroutine for all of them, and nothing after Close.
func TestOneRenewalLoop(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testContext(t)
	rdb := srv.Client(t)
	rdb.Ping(ctx) // open the pool's connection before counting
	before := settledGoroutines()
	baseline := goleak.IgnoreCurrent()
	// A lease long enough that a loaded machine's scheduling delays do not
	// end it, but shorter than the wait below, so every lock still held
	// after the wait was renewed.
	c, err := redislock.New(rdb, redislock.Options{WatchdogLease: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var holds []*redislock.Hold
	for i := range 500 {
		m := newMutex(t, c, fmt.Sprintf("%s-%d", lockName(t), i), nil)
		holds = append(holds, mustLock(t, ctx, m))
	}
	time.Sleep(2 * time.Second) // past the lease: only renewals keep the locks
	if extra := settledGoroutines() - before; extra != 1 {
		t.Errorf("%d goroutines for 500 held locks; want 1, the renewal loop", extra)
	}
	for _, l := range holds {
		if inspect(t, c, l.Name()).TTL <= 0 {
			t.Fatalf("%s not renewed", l.Name())
		}
		mustUnlock(t, ctx, l)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, baseline)
}

// settledGoroutines counts the goroutines once the count holds still for a
// while, so that goroutines still winding down from the set-up (a server
// start's readiness probe, say) are not counted.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}
