package controllers

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/redistest"
)

// A Client whose terms no lock uses any more is closed once it has held
// nothing for idleClientTTL; one with a live hold never is.
func TestLockClientsReclaimIdleClients(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Start(t).Addr})
	defer rdb.Close()
	var mu sync.Mutex
	clock := time.Now()
	advance := func(d time.Duration) {
		mu.Lock()
		clock = clock.Add(d)
		mu.Unlock()
	}
	l := NewLockClients(rdb, logr.Discard(), nil)
	l.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	defer l.Close()
	short := leaseTerms{lease: 3 * time.Second, renew: time.Second}
	other := leaseTerms{lease: 30 * time.Second, renew: 10 * time.Second}
	ctx := context.Background()

	c, err := l.For(short)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := acquire(ctx, c, "reclaim-test", "pod:0")
	if err != nil {
		t.Fatal(err)
	}
	l.track(short, hold)
	advance(2 * idleClientTTL)
	if _, err := l.For(other); err != nil {
		t.Fatal(err)
	}
	if got := l.count(); got != 2 {
		t.Fatalf("%d clients after the idle TTL with a live hold, want 2: the holding one closed", got)
	}
	if hold.Err() != nil {
		t.Fatalf("the hold ended: %v", hold.Err())
	}

	if err := hold.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-hold.Done()
	waitUntil := time.Now().Add(5 * time.Second)
	for l.holdsOf(short) != 0 && time.Now().Before(waitUntil) {
		time.Sleep(10 * time.Millisecond)
	}
	advance(idleClientTTL / 2)
	if _, err := l.For(other); err != nil {
		t.Fatal(err)
	}
	if got := l.count(); got != 2 {
		t.Fatalf("%d clients half an idle TTL after the last hold ended, want 2", got)
	}
	advance(idleClientTTL)
	if _, err := l.For(other); err != nil {
		t.Fatal(err)
	}
	if got := l.count(); got != 1 {
		t.Fatalf("%d clients an idle TTL after the last hold ended, want 1", got)
	}
	if _, err := c.Inspect(ctx, "reclaim-test"); err == nil {
		t.Fatal("the reclaimed client still answers: not closed")
	}
}

func (l *LockClients) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.clients)
}

func (l *LockClients) holdsOf(terms leaseTerms) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc := l.clients[terms]; lc != nil {
		return lc.holds
	}
	return -1
}

// The controller renews a lock at most once a second, or three times a
// lease for leases under 3 s, whatever shorter interval the spec asks for.
func TestRenewRateIsBounded(t *testing.T) {
	d := func(s string) *metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Duration{Duration: v}
	}
	for _, tc := range []struct {
		lease, renew *metav1.Duration
		want         leaseTerms
	}{
		{nil, nil, leaseTerms{30 * time.Second, 10 * time.Second}},
		{d("30s"), d("100ms"), leaseTerms{30 * time.Second, time.Second}},
		{d("1s"), d("100ms"), leaseTerms{time.Second, time.Second / 3}},
		{d("3s"), d("2500ms"), leaseTerms{3 * time.Second, 2500 * time.Millisecond}},
		{d("6s"), nil, leaseTerms{6 * time.Second, 2 * time.Second}},
	} {
		lock := &locksv1.DistributedLock{Spec: locksv1.DistributedLockSpec{LeaseDuration: tc.lease, RenewInterval: tc.renew}}
		if got := termsOf(lock); got != tc.want {
			t.Errorf("lease %v, renew %v: terms %+v, want %+v", tc.lease, tc.renew, got, tc.want)
		}
	}
}
