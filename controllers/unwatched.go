package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockwarden/lockwarden/controllers/decide"
)

// Known holders past the cache. The pod cache can lack a pod that runs:
// --pod-label-selector filters it out once its label is taken away (the
// filtered watch reports it deleted), and just after a start the UID map
// (podNames) can lag the cache. A holder must never be released, or lose
// its sticky grant, on the cache's word alone, so a pod the controller
// knows as a holder is read from the API server when the cache lacks it.

// knownHolder is a pod the controller knows has held the key.
type knownHolder struct {
	types.NamespacedName
	uid types.UID
}

// knownHolders are the pods the controller knows have held the key, or
// were granted it: the one it granted the key to, and those the statuses of
// the locks naming it name (a status only ever names a pod of its lock's
// namespace).
func (r *DistributedLockReconciler) knownHolders(s *scope) []knownHolder {
	var out []knownHolder
	if g := r.grants.get(s.Key); g != nil {
		out = append(out, knownHolder{g.Pod, g.PodUID})
	}
	for _, l := range s.All() {
		if st := l.Status.Holder; st != nil && st.PodName != "" {
			out = append(out, knownHolder{types.NamespacedName{Namespace: l.Namespace, Name: st.PodName}, types.UID(st.PodUID)})
		}
		if g := l.Status.Grant; g != nil {
			out = append(out, knownHolder{types.NamespacedName{Namespace: l.Namespace, Name: g.PodName}, types.UID(g.PodUID)})
		}
	}
	return out
}

// addKnownHolders adds to the scope the known holders of its namespaces
// that the cache did not yield, read from the API server: such a pod is
// then unwatched (it keeps what it holds and was granted, is never a
// candidate, and since no event will say when it stops, the key is polled
// for it). One the API server says is gone is recorded as such, the only
// evidence on which a holder missing from the scope is released.
func (r *DistributedLockReconciler) addKnownHolders(ctx context.Context, s *scope) error {
	looked := map[types.UID]bool{}
	for _, known := range r.knownHolders(s) {
		if s.ByUID[known.uid] != nil || !s.namespaces[known.Namespace] || looked[known.uid] {
			continue
		}
		looked[known.uid] = true
		pod, watched, err := r.podPastCache(ctx, known.NamespacedName, known.uid)
		if err != nil {
			return err
		}
		if pod == nil {
			s.gone[known.uid] = known.NamespacedName
			continue
		}
		s.addPod(pod)
		if !watched {
			s.unwatched[pod.UID] = true
		}
	}
	return nil
}

// podPastCache is the pod with the name and UID from the cache, or else
// from the API server (watched is then false), or nil if the API server
// says it is gone. A cached pod of that name with another UID proves
// nothing: the cache may lag, and the other may be the older one.
func (r *DistributedLockReconciler) podPastCache(ctx context.Context, name types.NamespacedName, uid types.UID) (pod *corev1.Pod, watched bool, err error) {
	pod = &corev1.Pod{}
	switch err := r.Get(ctx, name, pod, client.UnsafeDisableDeepCopy); {
	case err == nil && pod.UID == uid:
		return pod, true, nil
	case err != nil && !apierrors.IsNotFound(err):
		return nil, false, err
	}
	pod = &corev1.Pod{}
	if err := r.APIReader.Get(ctx, name, pod); apierrors.IsNotFound(err) || (err == nil && pod.UID != uid) {
		return nil, false, nil
	} else if err != nil {
		return nil, false, err
	}
	return pod, false, nil
}

// pollUnwatched asks for another look at the key while an unwatched pod of
// the scope runs, since no event will say when it stops, and tells once
// that it runs outside the pod cache.
func (r *DistributedLockReconciler) pollUnwatched(ctx context.Context, s *scope) {
	// Only this key's reconcile, one at a time, reads or writes its entry.
	before, _ := r.unwatchedWarned.Load(s.Key)
	warned, _ := before.(map[types.UID]bool)
	now := map[types.UID]bool{}
	for _, p := range s.pods {
		if s.unwatched[p.UID] && !decide.Stopped(p) {
			s.requeue(pollAfter(s.info.TTL))
			now[p.UID] = true
			if !warned[p.UID] {
				r.warnUnwatched(ctx, s, p)
			}
		}
	}
	if len(now) > 0 {
		r.unwatchedWarned.Store(s.Key, now)
	} else if warned != nil {
		r.unwatchedWarned.Delete(s.Key)
	}
}

func (r *DistributedLockReconciler) warnUnwatched(ctx context.Context, s *scope, pod *corev1.Pod) {
	log.FromContext(ctx).Info("a holder's pod is not in the pod cache; polling the key for its stop", "key", s.Key, "pod", pod.Name)
	r.eventf(s, pod.Namespace, corev1.EventTypeWarning, "HolderNotWatched",
		"Pod %s holds %s, or was granted it, but the manager does not watch it (does it lack the --pod-label-selector labels?): it keeps the lock until it stops, which is looked for once a lease rather than seen at once", pod.Name, s.Key)
}
