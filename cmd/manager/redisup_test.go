package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

// redisWithUser starts a redis-server with an ACL user "lockwarden" whose
// password is right (the default user keeps no password, as the other
// tests' servers have).
func redisWithUser(t *testing.T, password string) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t)
	addUser(t, srv, password)
	return srv
}

// addUser adds the ACL user "lockwarden", which a restarted server has
// lost (ACL SETUSER is not saved).
func addUser(t *testing.T, srv *redistest.Server, password string) {
	t.Helper()
	if err := srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "lockwarden", "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
}

// The manager is unready until Redis has answered it once, and its
// readiness says why: credentials refused, or no answer. From then on a
// Redis outage leaves it ready: with every replica unready, the
// PodDisruptionBudget would refuse every eviction and stall node drains.
// The outage shows in lockwarden_redis_up instead, within a ping.
func TestReadinessWaitsForRedisOnlyAtStart(t *testing.T) {
	srv := redisWithUser(t, "right")
	start := func(password string) (*redisWatch, func()) {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "lockwarden", Password: password, MaxRetries: -1})
		watch, err := newRedisWatch(rdb, logr.Discard(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		watch.interval = 50 * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = watch.Start(ctx); close(done) }()
		return watch, func() { cancel(); <-done; _ = rdb.Close() }
	}
	waitGauge := func(w *redisWatch, want float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(w.up) != want {
			if time.Now().After(deadline) {
				t.Fatalf("lockwarden_redis_up = %v, want %v", testutil.ToFloat64(w.up), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ready := func(w *redisWatch) error { return w.readiness(httptest.NewRequest(http.MethodGet, "/readyz", nil)) }

	// A wrong password: unready, saying so, for as long as it is wrong.
	wrong, stop := start("wrong")
	if err := ready(wrong); err == nil {
		t.Fatal("ready before Redis was asked")
	}
	time.Sleep(300 * time.Millisecond) // several pings
	if err := ready(wrong); err == nil || !strings.Contains(err.Error(), "refuses the manager's credentials") || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("readiness with a wrong password: %v", err)
	}
	stop()

	// The right one: ready, and still ready through an outage.
	right, stop := start("right")
	defer stop()
	waitGauge(right, 1)
	if err := ready(right); err != nil {
		t.Fatalf("not ready with Redis up: %v", err)
	}
	srv.Stop()
	waitGauge(right, 0)
	if err := ready(right); err != nil {
		t.Fatalf("unready with Redis down after it had answered (drains would stall behind the PodDisruptionBudget): %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	addUser(t, srv, "right")
	waitGauge(right, 1)

	// A manager that starts while Redis is down is unready, saying Redis
	// does not answer, not that it refuses anything.
	srv.Stop()
	down, stopDown := start("right")
	defer stopDown()
	time.Sleep(300 * time.Millisecond)
	if err := ready(down); err == nil || !strings.Contains(err.Error(), "has not answered") {
		t.Fatalf("readiness with Redis down from the start: %v", err)
	}
}

func TestRefusedCredentials(t *testing.T) {
	for msg, want := range map[string]bool{
		"WRONGPASS invalid username-password pair or user is disabled.": true,
		"NOAUTH Authentication required.":                               true,
		"ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?": true,
		"dial tcp 127.0.0.1:1: connect: connection refused":                                                                            false,
		"NOPERM this user has no permissions to run the 'ping' command":                                                                false,
		"ERR unknown command": false,
	} {
		if got := refusedCredentials(errors.New(msg)); got != want {
			t.Errorf("refusedCredentials(%q) = %v, want %v", msg, got, want)
		}
	}
	if refusedCredentials(nil) {
		t.Error("refusedCredentials(nil)")
	}
}
