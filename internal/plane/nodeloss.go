package plane

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// lostHolder is the holder identity Partition writes into a node's Lease.
const lostHolder = "plane.lockwarden.dev/partitioned"

// AddNode adds a fake node that kwok manages, with taints (e.g. a NoSchedule
// one, so that only pods tolerating it go there), and waits for it to be
// Ready. Tests that cut a node off use a node of their own, so the
// other tests keep both of NodeNames.
func (p *Plane) AddNode(ctx context.Context, name string, taints ...corev1.Taint) error {
	clientset, err := kubernetes.NewForConfig(p.Config)
	if err != nil {
		return err
	}
	node := fakeNode(name)
	node.Spec.Taints = taints
	if _, err := clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return waitNodesReady(ctx, clientset, name)
}

// Partition cuts the node off, as a network partition or a dead machine
// cuts off its kubelet: from now on nothing renews the node's Lease or
// posts its status, and nothing acts on its pods. A pod running there keeps
// its Running status, even once deleted, because no kubelet confirms that
// its containers stopped. The controller manager marks the node Unknown
// and taints it node.kubernetes.io/unreachable once its Lease is older
// than the node-monitor grace period (50s by default).
//
// kwok manages a node only while it holds the node's Lease in
// kube-node-lease (its way of sharing nodes between kwok instances), so
// Partition gives the Lease to another holder, with a renew time left as
// kwok last wrote it and a duration long enough that kwok never finds it
// expired. Delete the node when done: kwok does not take it back.
//
// kwok judges the Lease from its informer's copy, and once went on playing
// the stages of a partitioned node's pods, a minute later, while its copy
// lagged (the machine loaded): the pod's deletion stopped its containers as
// a kubelet would. So Partition also annotates the node's pods
// PartitionedAnnotation, which no pod stage matches.
func (p *Plane) Partition(ctx context.Context, node string) error {
	clientset, err := kubernetes.NewForConfig(p.Config)
	if err != nil {
		return err
	}
	leases := clientset.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := leases.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		lease.Spec.HolderIdentity = ptr.To(lostHolder)
		lease.Spec.LeaseDurationSeconds = ptr.To[int32](24 * 3600)
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	pods, err := clientset.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return err
	}
	mark := []byte(`{"metadata":{"annotations":{"` + PartitionedAnnotation + `":"true"}}}`)
	for _, pod := range pods.Items {
		if _, err := clientset.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, mark, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("mark pod %s/%s partitioned: %w", pod.Namespace, pod.Name, err)
		}
	}
	return nil
}
