package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// A Redis outage must not make the managers unready: with every replica
// unready, the PodDisruptionBudget would refuse every eviction and stall
// node drains. It shows in lockwarden_redis_up instead, within a ping.
func TestReadinessIgnoresRedisWhichTheGaugeShows(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	watch, err := newRedisWatch(rdb, logr.Discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	watch.interval = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- watch.Start(ctx) }()
	defer func() { cancel(); <-done }()

	waitGauge := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(watch.up) != want {
			if time.Now().After(deadline) {
				t.Fatalf("lockwarden_redis_up = %v, want %v", testutil.ToFloat64(watch.up), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ready := func() error { return readiness(httptest.NewRequest("GET", "/readyz", nil)) }

	waitGauge(1)
	if err := ready(); err != nil {
		t.Fatalf("not ready with Redis up: %v", err)
	}
	srv.Stop()
	waitGauge(0)
	if err := ready(); err != nil {
		t.Fatalf("unready with Redis down (drains would stall behind the PodDisruptionBudget): %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitGauge(1)
}
