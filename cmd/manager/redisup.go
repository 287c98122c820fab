package main

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// redisWatch pings Redis every interval, on every replica, leader or not,
// and shows the answer as the gauge lockwarden_redis_up and, on each change,
// one log line. It is how a Redis outage is seen from outside the locks:
// readiness deliberately does not follow Redis (see readiness in main.go).
type redisWatch struct {
	rdb      redis.UniversalClient
	log      logr.Logger
	interval time.Duration
	up       prometheus.Gauge
	lastErr  error
}

// redisPingTimeout bounds one PING; a Redis slower than this is as good as
// down for renewing locks.
const redisPingTimeout = 2 * time.Second

func newRedisWatch(rdb redis.UniversalClient, log logr.Logger, reg prometheus.Registerer) (*redisWatch, error) {
	w := &redisWatch{
		rdb: rdb, log: log, interval: 5 * time.Second,
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "lockwarden_redis_up",
			Help: "1 if Redis answered this manager's last PING (every 5s), 0 if not.",
		}),
	}
	return w, reg.Register(w.up)
}

// Start runs until ctx ends; it implements manager.Runnable.
func (w *redisWatch) Start(ctx context.Context) error {
	was := -1
	for {
		up := w.ping(ctx)
		w.up.Set(float64(up))
		switch {
		case ctx.Err() != nil:
			return nil
		case up == was:
		case up == 1:
			w.log.Info("Redis answers")
		default:
			// Redis's own words: only the manager's log has them.
			w.log.Error(w.lastErr, "Redis does not answer; locks cannot be granted, released or renewed until it does")
		}
		was = up
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.interval):
		}
	}
}

// NeedLeaderElection is false: every replica shows whether it reaches Redis.
func (w *redisWatch) NeedLeaderElection() bool { return false }

func (w *redisWatch) ping(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	if w.lastErr = w.rdb.Ping(ctx).Err(); w.lastErr != nil {
		return 0
	}
	return 1
}
