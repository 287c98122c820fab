package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/controllers/decide"
)

// releaseStopped decides to force-release the holders whose pod has
// stopped or is gone, whether the controller granted them the key or they
// took it with an in-pod client. Nothing is released without evidence from
// the API server (releasable). Holders that are no pod of the scope's
// namespaces (another namespace's, another cluster's, a plain client's) are
// left alone.
func (r *DistributedLockReconciler) releaseStopped(_ context.Context, s *scope) ([]action, error) {
	var out []action
	for _, h := range s.Holders {
		if name, namespace, why := s.releasable(h); why != "" {
			out = append(out, release{holder: h, name: name, namespace: namespace, why: why})
		}
	}
	return out, nil
}

// forgetEndedGrants clears the locks' records of grants that are over: their
// pod has stopped (the cache may say so, as a stop is final), or the API
// server said, while the scope was loaded, that it is gone. Nothing else
// ends a record; a lock's record of another manager's later grant is kept
// from being cleared by a stale one by the resourceVersion every status
// write is preconditioned on. The records are cleared in the statuses
// patchStatuses writes: it decides no write of its own.
func (r *DistributedLockReconciler) forgetEndedGrants(_ context.Context, s *scope) ([]action, error) {
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
	return nil, nil
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
