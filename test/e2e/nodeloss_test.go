// A holder whose node is lost: nothing reports that its containers
// stopped, so the lock stays with it until the pod object says it has
// stopped or is gone.

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// lostNode is the test's own fake node; its taint keeps every other pod
// off it.
const lostNode = "kwok-lost-node"

var lostNodeTaint = corev1.Taint{Key: "e2e.lockwarden.dev/lost-node", Effect: corev1.TaintEffectNoSchedule}

// The holder's node stops heartbeating. The controller manager marks it
// Unknown and taints it unreachable, and the taint evicts the holder (a 2s
// toleration instead of the default 300s): the pod gets a deletion
// timestamp, and its grace period runs out, but no kubelet reports its
// containers stopped, so it keeps the lock and the next candidates stay
// gated. Once an administrator, having made sure the machine is down,
// taints the node node.kubernetes.io/out-of-service, the pod garbage
// collector marks the pod Failed and removes it, and the lock moves on.
func TestLostNodeKeepsTheLock(t *testing.T) {
	ctx := context.Background()
	if err := pl.AddNode(ctx, lostNode, lostNodeTaint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := clientset.CoreV1().Nodes().Delete(context.Background(), lostNode, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	ns := newLock(t, guarded)
	tpl := guardedTemplate(guarded, 0, 5)
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "holder", Namespace: ns, Labels: tpl.Labels}, Spec: tpl.Spec}
	holder.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": lostNode}
	holder.Spec.Tolerations = []corev1.Toleration{
		{Key: lostNodeTaint.Key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](2)},
	}
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, ns, guarded)
	createJob(t, ns, "next", jobSpec(guarded, time.Second))
	eventually(t, 10*time.Second, "Job next's pod gated", func() (bool, error) {
		n, err := gatedPods(ns, guarded)
		return n == 1, err
	})

	if err := pl.Partition(ctx, lostNode); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the node Unknown, and the holder evicted by the unreachable taint", func() (bool, error) {
		node, err := clientset.CoreV1().Nodes().Get(ctx, lostNode, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if !slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown
		}) {
			return false, nil
		}
		pod, err := clientset.CoreV1().Pods(ns).Get(ctx, holder.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		holder = pod
		return pod.DeletionTimestamp != nil, nil
	})
	t.Logf("holder evicted at %s, deletion timestamp %s", time.Now().Format(time.RFC3339Nano), holder.DeletionTimestamp.Format(time.RFC3339))
	// A kubelet would have killed the containers by the deletion
	// timestamp; here nothing can.
	eventually(t, 30*time.Second, "the holder's grace period over", func() (bool, error) {
		return time.Now().After(holder.DeletionTimestamp.Add(time.Second)), nil
	})
	// A candidate created now is a barrier: once the lock's status lists it,
	// the controller has reconciled the key after the grace period ran out,
	// with the eviction and the node controller's status changes in its
	// cache (the pod watch delivers them in order).
	createJob(t, ns, "barrier", jobSpec(guarded, time.Second))
	lock := &locksv1.DistributedLock{}
	eventually(t, 30*time.Second, "the lock's status listing both waiting pods", func() (bool, error) {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: lockName}, lock); err != nil {
			return false, err
		}
		return len(lock.Status.Waiting) == 2, fmt.Errorf("status: waiting %v, holder %+v", lock.Status.Waiting, lock.Status.Holder)
	})
	if h := lock.Status.Holder; h == nil || h.PodName != holder.Name {
		t.Fatalf("holder in status %+v, want the pod on the lost node, %s", h, holder.Name)
	}
	if n, err := gatedPods(ns, guarded); err != nil || n != 2 {
		t.Fatalf("%d gated pods (err %v), want 2: next and barrier, behind the holder on the lost node", n, err)
	}
	pod, err := clientset.CoreV1().Pods(ns).Get(ctx, holder.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the holder on the lost node should still exist: %v", err)
	}
	if pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("the holder on the lost node is %s, want Running: nothing can report it stopped", pod.Status.Phase)
	}

	// The administrator's word that the node is down.
	declared := time.Now()
	outOfService := corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := clientset.CoreV1().Nodes().Get(ctx, lostNode, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, outOfService)
		_, err = clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"next", "barrier"} {
		// The pod garbage collector looks every 20s.
		eventually(t, 90*time.Second, "Job "+name+" complete", func() (bool, error) {
			return jobCondition(ns, name, batchv1.JobComplete)
		})
	}
	// The holder has no stop stamp: kwok played nothing on the lost node.
	// The recorder saw it Failed a watch event late, later than the next
	// pod may rightly start, so its end is the administrator's word, which
	// no pod but the holder may run before: the shared check then judges
	// the hand-over against it, and the pods after it by their stamps.
	pods.declareStopped(holder.UID, declared)
	runs := checkKey(t, keyOf(ns))
	if len(runs) != 3 || runs[0].uid != holder.UID {
		t.Fatalf("%d runs, want 3: the holder, then next and barrier", len(runs))
	}
	t.Logf("%s started %v after the node was declared out of service",
		runs[1].pod, runs[1].start().Sub(declared).Round(time.Millisecond))
}
