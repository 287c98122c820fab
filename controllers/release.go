package controllers

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockwarden/lockwarden/controllers/decide"
)

// releaseStopped force-releases the holders whose pod has stopped or is
// gone, whether the controller granted them the key or they took it with
// an in-pod client. Nothing is released without evidence from the API
// server (releasable). Holders that are no pod of the scope's namespaces
// (another namespace's, another cluster's, a plain client's) are left alone.
func (r *DistributedLockReconciler) releaseStopped(ctx context.Context, s *scope) error {
	var remaining []holder
	for _, h := range s.Holders {
		name, namespace, why := s.releasable(h)
		if why == "" {
			remaining = append(remaining, h)
			continue
		}
		if _, err := s.client.ForceReleaseClient(ctx, s.Key, string(h.PodUID)); err != nil {
			return err
		}
		r.grants.drop(s.Key, h.PodUID)
		if h.Pod != nil {
			r.Metrics.observeRelease(time.Since(decide.StopTime(h.Pod)))
		}
		log.FromContext(ctx).Info("released the lock of a stopped pod", "key", s.Key, "pod", name, "owner", h.Owner)
		r.eventf(s, namespace, corev1.EventTypeNormal, "HolderTerminated", "Released %s: holder pod %s %s", s.Key, name, why)
		for _, l := range s.LocksIn(namespace) {
			r.Metrics.transition(l, "holder_terminated")
		}
	}
	s.Holders = remaining
	return nil
}

// forgetEndedGrants clears the locks' records of grants that are over: their
// pod has stopped (the cache may say so, as a stop is final), or the API
// server said, while the scope was loaded, that it is gone. Nothing else
// ends a record; a lock's record of another manager's later grant is kept
// from being cleared by a stale one by the resourceVersion every status
// write is preconditioned on.
func (r *DistributedLockReconciler) forgetEndedGrants(_ context.Context, s *scope) error {
	for _, l := range s.All() {
		g := l.Status.Grant
		if g == nil {
			continue
		}
		_, gone := s.gone[types.UID(g.PodUID)]
		if p := s.ByUID[types.UID(g.PodUID)]; gone || (p != nil && decide.Stopped(p)) {
			l.Status.Grant = nil
		}
	}
	return nil
}

// releasable says why the holder's hold may be released, or "" if not.
// Either its pod is in the scope and has stopped: the cache may say so, as
// a stop is final (see stopped). Or its pod is one the controller knows
// as a holder and the API server said, while the scope was loaded, that it
// is gone (addKnownHolders). A pod the cache merely lacks is never taken
// for gone: a filtered or lagging cache lacks running pods too.
func (s *scope) releasable(h holder) (name, namespace, why string) {
	if h.Pod != nil {
		if !decide.Stopped(h.Pod) {
			return "", "", ""
		}
		why = "has stopped: its deletion has terminated every container"
		if h.Pod.Status.Phase == corev1.PodSucceeded || h.Pod.Status.Phase == corev1.PodFailed {
			why = "reached phase " + string(h.Pod.Status.Phase)
		}
		return h.Pod.Name, h.Pod.Namespace, why
	}
	if gone, ok := s.gone[h.PodUID]; ok {
		return gone.Name, gone.Namespace, "was deleted"
	}
	return "", "", ""
}
