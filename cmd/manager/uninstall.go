package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// leaderElectionID names the managers' leader-election Lease in their
// namespace.
const leaderElectionID = "lockwarden-manager.lockwarden.dev"

// uninstaller deletes every DistributedLock before lockwarden is removed, so
// that removing the CRD never waits for ever on the locks' finalizers (the
// chart's pre-delete hook runs it as `manager --uninstall`).
//
// While a manager leads (its Lease is held and fresh), the locks go as
// deleting a lock always does: the manager's finalizer releases their
// grants in Redis. A lock whose gate a running pod was given waits for that
// pod; at the deadline, or at once when no manager leads (it is already
// gone, or was never started), the uninstaller removes the finalizer of each
// lock left itself, and says so. Nothing then releases those locks' holds in
// Redis: each expires with its lease, which nobody renews any more.
type uninstaller struct {
	client  client.Client
	log     logr.Logger
	lease   types.NamespacedName // the leader Lease; empty: no leader election, wait for the deadline
	timeout time.Duration
	poll    time.Duration
	now     func() time.Time
}

func (u *uninstaller) run(ctx context.Context) error {
	var locks locksv1.DistributedLockList
	if err := u.client.List(ctx, &locks); err != nil {
		return fmt.Errorf("list the DistributedLocks: %w", err)
	}
	u.log.Info("deleting every DistributedLock", "count", len(locks.Items))
	for i := range locks.Items {
		l := &locks.Items[i]
		if l.DeletionTimestamp != nil {
			continue
		}
		if err := u.client.Delete(ctx, l); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete DistributedLock %s/%s: %w", l.Namespace, l.Name, err)
		}
	}
	deadline := u.now().Add(u.timeout)
	for {
		if err := u.client.List(ctx, &locks); err != nil {
			return fmt.Errorf("list the DistributedLocks: %w", err)
		}
		if len(locks.Items) == 0 {
			u.log.Info("every DistributedLock is gone")
			return nil
		}
		leading, why := u.managerLeads(ctx)
		if !leading || !u.now().Before(deadline) {
			if leading {
				why = fmt.Sprintf("a manager leads, but %v have passed", u.timeout)
			}
			for i := range locks.Items {
				if err := u.dropFinalizer(ctx, &locks.Items[i], why); err != nil {
					return err
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(u.poll):
		}
	}
}

// managerLeads says whether a manager holds the leader Lease and renews it.
func (u *uninstaller) managerLeads(ctx context.Context) (bool, string) {
	if u.lease.Name == "" {
		return true, ""
	}
	var lease coordinationv1.Lease
	switch err := u.client.Get(ctx, u.lease, &lease); {
	case apierrors.IsNotFound(err):
		return false, "no manager has ever led (no Lease " + u.lease.String() + ")"
	case err != nil:
		return true, "" // cannot tell: wait for the deadline
	}
	s := lease.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" {
		return false, "no manager leads (the Lease " + u.lease.String() + " was released)"
	}
	if s.RenewTime == nil || s.LeaseDurationSeconds == nil ||
		u.now().After(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds)*time.Second)) {
		return false, "no manager leads (the Lease " + u.lease.String() + " has expired)"
	}
	return true, ""
}

// dropFinalizer removes lockwarden's finalizer from a lock, which then goes.
func (u *uninstaller) dropFinalizer(ctx context.Context, l *locksv1.DistributedLock, why string) error {
	if !controllerutil.ContainsFinalizer(l, locksv1.Finalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(l.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(l, locksv1.Finalizer)
	err := u.client.Patch(ctx, l, patch)
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone, or changed: looked at again on the next round
	case err != nil:
		return fmt.Errorf("remove the finalizer of DistributedLock %s/%s: %w", l.Namespace, l.Name, err)
	}
	kv := []any{"lock", client.ObjectKeyFromObject(l), "why", why}
	if c := meta.FindStatusCondition(l.Status.Conditions, locksv1.ConditionReady); c != nil && c.Status != "True" {
		kv = append(kv, "readyReason", c.Reason, "readyMessage", c.Message)
	}
	if h := l.Status.Holder; h != nil {
		kv = append(kv, "holderPod", h.PodName)
	}
	u.log.Info("removed the finalizer of a DistributedLock the manager did not release; its hold in Redis, if any, expires with its lease", kv...)
	return nil
}
