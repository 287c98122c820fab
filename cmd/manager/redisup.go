package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// redisWatch pings Redis every interval, on every replica, leader or not,
// and shows the answer as the gauge lockwarden_redis_up and, on each change,
// one log line. It is how a Redis outage is seen from outside the locks.
//
// It also holds the manager's readiness at start-up (readiness): a manager
// is ready once Redis has answered it once, and stays ready whatever Redis
// does after that. A wrong address or password thus fails the rollout
// (`helm install --wait`, `kubectl rollout status`) and shows in the pod's
// readiness, with the manager's log saying why, instead of a manager that
// looks ready and grants nothing. A later outage leaves readiness alone,
// deliberately: readiness decides the PodDisruptionBudget's count of
// healthy replicas, and were it to follow Redis, every replica would be
// unready at once, the budget would refuse every eviction, and a Redis
// outage would stall the drain of every node that runs a manager, when
// restarting or moving the managers would not bring Redis back. An outage
// is shown where it is acted on instead: the gauge (and the
// LockwardenRedisDown alert), each lock's Ready condition and a Warning
// Event on it, and the manager's log.
type redisWatch struct {
	rdb      redis.UniversalClient
	log      logr.Logger
	interval time.Duration
	up       prometheus.Gauge
	lastErr  error

	mu       sync.Mutex
	answered bool  // Redis has answered once since the start
	startErr error // why not yet, the last ping's error until then
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
		startErr: errors.New("Redis has not been asked yet"),
	}
	return w, reg.Register(w.up)
}

// Start runs until ctx ends; it implements manager.Runnable.
func (w *redisWatch) Start(ctx context.Context) error {
	was := -1
	for {
		up := w.ping(ctx)
		w.up.Set(float64(up))
		w.record(up)
		switch {
		case ctx.Err() != nil:
			return nil
		case up == was:
		case up == 1:
			w.log.Info("Redis answers")
		case refusedCredentials(w.lastErr):
			// The one failure that waiting will not cure: say what to fix.
			w.log.Error(w.lastErr, "Redis refuses the manager's credentials: check the username and password in the Redis Secret (keys username and password) against Redis's ACL or requirepass; locks cannot be granted, released or renewed until Redis accepts them")
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

// record keeps the start-up state readiness reports.
func (w *redisWatch) record(up int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.answered {
		return
	}
	if up == 1 {
		w.answered, w.startErr = true, nil
		return
	}
	w.startErr = w.lastErr
}

// readiness is the manager's readiness check (see redisWatch): an error
// until Redis has answered once, naming why not (credentials refused, or
// no answer); nil from then on.
func (w *redisWatch) readiness(*http.Request) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.answered:
		return nil
	case refusedCredentials(w.startErr):
		return fmt.Errorf("Redis refuses the manager's credentials: %w", w.startErr)
	default:
		return fmt.Errorf("Redis has not answered since the manager started: %w", w.startErr)
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

// refusedCredentials tells whether Redis refused the client's credentials
// (or their lack), from the error Redis replied with: WRONGPASS (a wrong
// username or password, or a disabled user), NOAUTH (a password is
// required and none was given), or an AUTH with a password that the user
// does not have. These replies are Redis's own, so the prefixes are stable
// across versions 6 and 7.
func refusedCredentials(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH") ||
		(strings.HasPrefix(msg, "ERR") && strings.Contains(msg, "AUTH") && strings.Contains(msg, "without any password configured"))
}
