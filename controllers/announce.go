package controllers

import (
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// announcement is an Event that tells what the statuses of some of the
// key's locks show (a conflict, a holder that has not started, Redis
// unavailable, a failed write, a pod's place in the order). It is sent only
// once the status of every lock it is about is written, or was already as
// computed: a manager deciding on a stale view (deposed while it was
// paused, or behind its cache) has its status writes refused by their
// resourceVersion precondition, and tells nothing they would have shown.
// Events that report what the manager did (a release, a grant, an
// eviction) are sent when it is done.
type announcement struct {
	about                      []*locksv1.DistributedLock
	object                     client.Object
	eventType, reason, message string
	// sent, if set, is called once the Event is sent.
	sent func()
}

// announce queues the Event about the locks, for announceWritten.
func (s *scope) announce(a announcement) { s.announcements = append(s.announcements, a) }

// announceWritten sends each announcement whose locks' statuses were all
// written (written), and drops the others: the next reconcile that writes
// those statuses announces them again, as each is announced on a change
// from what the lock's status showed before.
func (r *DistributedLockReconciler) announceWritten(s *scope, written map[*locksv1.DistributedLock]bool) {
	for _, a := range s.announcements {
		if !slices.ContainsFunc(a.about, func(l *locksv1.DistributedLock) bool { return !written[l] }) {
			r.Recorder.Event(a.object, a.eventType, a.reason, a.message)
			if a.sent != nil {
				a.sent()
			}
		}
	}
	s.announcements = nil
}
