package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Only a slow call that Redis answered is a stall: one that timed out or
// found no connection is Redis unavailable. A stall shows for stallShown
// after its last slow call, with its slowest call.
func TestStallWatch(t *testing.T) {
	now := time.Unix(1000, 0)
	w := newStallWatch()
	w.now = func() time.Time { return now }
	for _, err := range []error{context.DeadlineExceeded, errors.New("dial tcp: connection refused")} {
		w.observe(3*time.Second, err)
	}
	if _, _, left := w.latest(); left > 0 {
		t.Fatal("a call Redis did not answer shows as a stall")
	}
	w.observe(time.Second, nil)
	if _, _, left := w.latest(); left > 0 {
		t.Fatal("a call under slowRedisCall shows as a stall")
	}
	w.observe(3*time.Second, redis.Nil)
	now = now.Add(time.Second)
	w.observe(5*time.Second, nil)
	now = now.Add(time.Second)
	w.observe(2*time.Second, errors.Join(redis.Nil)) // an error reply, still an answer
	took, at, left := w.latest()
	if took != 5*time.Second || !at.Equal(now) || left != stallShown {
		t.Fatalf("latest = %v at %v, shown for %v; want the stall's slowest call, 5s, ending now, shown for %v", took, at, left, stallShown)
	}
	now = now.Add(stallShown)
	if _, _, left := w.latest(); left > 0 {
		t.Fatalf("a stall still shows %v after it ended", stallShown)
	}
	// A slow call after more than a slow call's time is a new stall.
	w.observe(2*time.Second, nil)
	if took, _, _ := w.latest(); took != 2*time.Second {
		t.Fatalf("a new stall shows the old one's slowest call: %v", took)
	}
}
