package redislock_test

import (
	"context"
	"testing"

	"github.com/lockwarden/lockwarden/internal/redistest"
	"github.com/lockwarden/lockwarden/pkg/redislock"
)

func BenchmarkZZPair(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	c := newClient(b, srv.Client(b), redislock.Options{})
	m := newMutex(b, c, "cost", nil)
	b.ReportAllocs()
	for b.Loop() {
		h, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
