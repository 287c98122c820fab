package main

import (
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/redistest"
)

func TestReadinessFollowsRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer rdb.Close()
	ready := redisReachable(rdb)
	if err := ready(httptest.NewRequest("GET", "/readyz", nil)); err != nil {
		t.Fatalf("not ready with Redis up: %v", err)
	}
	srv.Stop()
	if err := ready(httptest.NewRequest("GET", "/readyz", nil)); err == nil {
		t.Fatal("ready with Redis down")
	}
}
