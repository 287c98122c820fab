package controllers

import (
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// Retries after Redis failed: the first after redisRetryBase, each next one
// twice as late up to redisRetryCap, each moved by up to ±20%. So an outage
// costs each key one attempt per interval, not one every 2 s, and when Redis
// comes back the keys come back spread out rather than in one burst of
// grants.
const (
	redisRetryBase = 500 * time.Millisecond
	redisRetryCap  = 30 * time.Second
)

// redisBackoff counts each key's Redis failures in a row.
type redisBackoff struct {
	mu       sync.Mutex
	failures map[string]int // only keys whose last attempt failed
}

// failed records a failure of the key and returns how soon to retry it.
func (b *redisBackoff) failed(key string) time.Duration {
	b.mu.Lock()
	if b.failures == nil {
		b.failures = map[string]int{}
	}
	n := b.failures[key]
	b.failures[key] = n + 1
	b.mu.Unlock()
	d := redisRetryCap
	if n < 6 { // 500ms << 6 = 32s, past the cap
		d = min(redisRetryBase<<n, redisRetryCap)
	}
	return d*4/5 + rand.N(d*2/5+1)
}

// succeeded forgets the key's failures.
func (b *redisBackoff) succeeded(key string) {
	b.mu.Lock()
	delete(b.failures, key)
	b.mu.Unlock()
}

// The retries after any other error (the API server's, say), as
// controller-runtime's rate limiter counts them per key: the first after
// apiRetryBase, each next one twice as late up to the same cap as Redis's,
// each moved by up to ±20%. controller-runtime's default backs off to
// 1000 s: after a brownout of the API server, keys would wait for a quarter
// of an hour after it came back.
const apiRetryBase = 5 * time.Millisecond

// newAPIBackoff is the work queue's rate limiter.
func newAPIBackoff() workqueue.TypedRateLimiter[KeyRequest] {
	return jittered{workqueue.NewTypedItemExponentialFailureRateLimiter[KeyRequest](apiRetryBase, redisRetryCap)}
}

// jittered moves each delay of its rate limiter by up to ±20%, so keys that
// failed together do not retry together.
type jittered struct {
	workqueue.TypedRateLimiter[KeyRequest]
}

func (j jittered) When(key KeyRequest) time.Duration {
	d := j.TypedRateLimiter.When(key)
	return d*4/5 + rand.N(d*2/5+1)
}
