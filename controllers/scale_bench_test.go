package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// BenchmarkControllerAtScale runs 200 locks with 3 candidate pods each
// against envtest and real Redis, once per iteration (use -benchtime=1x),
// and reports:
//   - grant-all-s: from creating the 200 locks to all of them held;
//   - handover-p50-ms, handover-p99-ms: from a holder pod's phase change to
//     Redis holding the lock for the next candidate;
//   - api-writes/min/lock: the controller's API writes per minute per lock
//     while all locks are held steadily, over three renewal intervals;
//     client-go leader election renews a Lease about every 2s, about 30
//     writes a minute per lock.
func BenchmarkControllerAtScale(b *testing.B) {
	const locks, podsPerLock = 200, 3
	const lease = 6 * time.Second // renewed every 2s, as client-go's default
	for range b.N {
		h := startManager(b)
		ns := newNamespace(b)
		ctx := context.Background()
		for i := range locks {
			for j := range podsPerLock {
				createPod(b, ns, fmt.Sprintf("l%03d-p%d", i, j), fmt.Sprintf("app%03d", i))
			}
		}

		start := time.Now()
		var created []*locksv1.DistributedLock
		for i := range locks {
			created = append(created, createLock(b, ns, fmt.Sprintf("lock%03d", i), fmt.Sprintf("app%03d", i), func(l *locksv1.DistributedLock) {
				l.Spec.LeaseDuration = &metav1.Duration{Duration: lease}
			}))
		}
		eventually(b, "every lock to be held", func() bool {
			var list locksv1.DistributedLockList
			if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
				b.Fatal(err)
			}
			held := 0
			for _, l := range list.Items {
				if l.Status.Holder != nil {
					held++
				}
			}
			return held == locks
		})
		grantAll := time.Since(start)

		time.Sleep(time.Second) // let the grants' own writes settle
		writesBefore := h.writes.Load()
		window := lease // three renewal intervals of lease/3
		time.Sleep(window)
		steadyWrites := h.writes.Load() - writesBefore
		perLockPerMin := float64(steadyWrites) / float64(locks) / window.Minutes()

		var handovers []time.Duration
		for _, lock := range created {
			st := getLock(b, lock).Status
			if st.Holder == nil {
				b.Fatalf("%s lost its holder", lock.Name)
			}
			pod := &corev1.Pod{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: st.Holder.PodName}, pod); err != nil {
				b.Fatal(err)
			}
			pod.Status.Phase = corev1.PodSucceeded
			changed := time.Now()
			if err := k8s.Status().Update(ctx, pod); err != nil {
				b.Fatal(err)
			}
			for {
				info := inspect(b, st.Key)
				if len(info.Holders) == 1 && string(info.Holders[0].Owner) != st.Holder.OwnerID {
					break
				}
				if time.Since(changed) > 20*time.Second {
					b.Fatalf("%s was not handed over", lock.Name)
				}
				time.Sleep(200 * time.Microsecond)
			}
			handovers = append(handovers, time.Since(changed))
		}
		slices.Sort(handovers)
		p50 := handovers[len(handovers)/2]
		p99 := handovers[len(handovers)*99/100]

		b.ReportMetric(grantAll.Seconds(), "grant-all-s")
		b.ReportMetric(float64(p50.Microseconds())/1000, "handover-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "handover-p99-ms")
		b.ReportMetric(perLockPerMin, "api-writes/min/lock")
		b.Logf("\n| %d locks x %d pods | lockwarden | client-go leader election |\n|---|---|---|\n"+
			"| grant all | %v | - |\n| handover p50 / p99 | %v / %v | - |\n"+
			"| API writes per minute per lock, steady | %.2f | ~30 (Lease renewed every 2s) |",
			locks, podsPerLock, grantAll.Round(time.Millisecond), p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond), perLockPerMin)
		h.stop()
	}
}
