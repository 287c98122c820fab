package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// manager --uninstall deletes every lock. A leading manager releases them
// (here a stand-in that removes the finalizer of each lock being deleted);
// with no manager leading, or past the deadline, the uninstaller removes the
// finalizers itself, and says so for each lock.
func TestUninstallDeletesEveryLock(t *testing.T) {
	ctx := context.Background()
	_, c := apiServer(t)
	for _, tc := range []struct {
		name string
		// lease: "none", "released", "expired" or "fresh"
		lease string
		// a manager releases the locks being deleted
		managerRuns bool
		timeout     time.Duration
		// how many locks the uninstaller itself let go
		wantForced int
	}{
		{"manager leads", "fresh", true, time.Minute, 0},
		{"no lease: no manager ever ran", "none", false, time.Minute, 3},
		{"lease released: manager stopped", "released", false, time.Minute, 3},
		{"lease expired: manager died", "expired", false, time.Minute, 3},
		{"manager leads but does not release", "fresh", false, 2 * time.Second, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			purgeLocks(t, c) // other tests' locks: the uninstaller deletes every lock
			system := newNamespace(t, c, "uninstall-system-")
			var locks []*locksv1.DistributedLock
			for i := range 3 {
				ns := newNamespace(t, c, "uninstall-tenant-")
				l := &locksv1.DistributedLock{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("lock-%d", i), Finalizers: []string{locksv1.Finalizer}},
					Spec:       locksv1.DistributedLockSpec{Candidates: &locksv1.PodSelector{MatchLabels: map[string]locksv1.LabelValue{"app": "x"}}},
				}
				if err := c.Create(ctx, l); err != nil {
					t.Fatal(err)
				}
				locks = append(locks, l)
			}
			leaseKey := types.NamespacedName{Namespace: system, Name: leaderElectionID}
			if tc.lease != "none" {
				holder, renewed := "manager-0", time.Now()
				switch tc.lease {
				case "released":
					holder = ""
				case "expired":
					renewed = renewed.Add(-time.Minute)
				}
				lease := &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Namespace: system, Name: leaderElectionID},
					Spec: coordinationv1.LeaseSpec{
						HolderIdentity: &holder, LeaseDurationSeconds: new(int32(15)),
						RenewTime: &metav1.MicroTime{Time: renewed},
					},
				}
				if err := c.Create(ctx, lease); err != nil {
					t.Fatal(err)
				}
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if tc.managerRuns {
				wg.Go(func() { releaseDeleted(t, c, locks, stop) })
			}
			defer func() { close(stop); wg.Wait() }()

			var forced []string
			var mu sync.Mutex
			log := funcr.New(func(prefix, args string) {
				mu.Lock()
				defer mu.Unlock()
				if strings.Contains(args, "removed the finalizer") {
					forced = append(forced, args)
				}
			}, funcr.Options{})
			u := &uninstaller{client: c, log: log, lease: leaseKey, timeout: tc.timeout, poll: 100 * time.Millisecond, now: time.Now}
			runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := u.run(runCtx); err != nil {
				t.Fatal(err)
			}
			for _, l := range locks {
				if err := c.Get(ctx, client.ObjectKeyFromObject(l), &locksv1.DistributedLock{}); err == nil {
					t.Errorf("%s/%s is still there", l.Namespace, l.Name)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(forced) != tc.wantForced {
				t.Errorf("the uninstaller removed %d finalizers itself, want %d: %v", len(forced), tc.wantForced, forced)
			}
		})
	}
}

// releaseDeleted plays the leading manager: it removes the finalizer of
// each of the locks once it is being deleted.
func releaseDeleted(t *testing.T, c client.Client, locks []*locksv1.DistributedLock, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
		for _, l := range locks {
			var cur locksv1.DistributedLock
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(l), &cur); err != nil || cur.DeletionTimestamp == nil {
				continue
			}
			patch := client.MergeFrom(cur.DeepCopy())
			controllerutil.RemoveFinalizer(&cur, locksv1.Finalizer)
			_ = c.Patch(context.Background(), &cur, patch)
		}
	}
}

// purgeLocks removes every lock, finalizers and all.
func purgeLocks(t *testing.T, c client.Client) {
	t.Helper()
	var locks locksv1.DistributedLockList
	if err := c.List(context.Background(), &locks); err != nil {
		t.Fatal(err)
	}
	for i := range locks.Items {
		l := &locks.Items[i]
		patch := client.MergeFrom(l.DeepCopy())
		l.Finalizers = nil
		if err := c.Patch(context.Background(), l, patch); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		if err := c.Delete(context.Background(), l); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
}

func newNamespace(t *testing.T, c client.Client, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}
