package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// recordFence records the fencing token of the controller's hold on every
// lock naming the key (status.highestToken) before markPods may lift a
// gate with it. The API server keeps the record from decreasing (the
// status's validation rule), and the admission policy in config/admission
// refuses a gate's lift whose token is below the lock's record.
//
// Timing alone cannot keep a manager that lost its grant from lifting a
// gate: it may be paused between any check and its write, for longer than
// its leader Lease and the lock's lease, while another manager grants the
// key again with a higher token and records it. When the paused one wakes,
// its record of a lower token is refused, and so is its lift: the API
// server refuses the stale write, whatever the timing.
func (r *DistributedLockReconciler) recordFence(ctx context.Context, s *scope) error {
	if len(s.holders) == 0 || !s.holders[0].byController() {
		return nil
	}
	token := s.info.Token
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"status":{"highestToken":%d}}`, token))
	for _, l := range s.all() {
		if l.Status.HighestToken >= token {
			continue
		}
		err := r.Status().Patch(ctx, l.DeepCopy(), patch)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case apierrors.IsInvalid(err):
			return fmt.Errorf("lock %s/%s records a higher fencing token than %d, this manager's grant of %s: it lifts no gate with it: %w",
				l.Namespace, l.Name, token, s.key, err)
		case err != nil:
			return err
		}
		l.Status.HighestToken = token
		if before := s.before[client.ObjectKeyFromObject(l)]; before != nil {
			before.Status.HighestToken = token
		}
	}
	return nil
}
