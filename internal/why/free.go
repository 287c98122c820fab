package why

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Free lifts lockwarden's scheduling gates from every pod of the namespace
// (every namespace if it is ""), as Lift does, and returns the pods it
// freed as "namespace/name".
func Free(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	lifted, err := Lift(ctx, c, namespace)
	names := make([]string, len(lifted))
	for i, l := range lifted {
		names[i] = l.Pod.Namespace + "/" + l.Pod.Name
	}
	return names, err
}

// Lifted is a pod Lift freed: the pod as the API server returned it after
// the patch, and the gates lifted.
type Lifted struct {
	Pod   *corev1.Pod
	Gates []string
}

// Lift lifts lockwarden's scheduling gates from every pod of the namespace
// (every namespace if it is ""), on purpose: when lockwarden is uninstalled,
// its gated pods would otherwise wait for ever. They then start without
// holding any lock. Other controllers' gates are kept. It returns the pods
// it freed, and the errors of those it could not free: one pod's failure
// does not keep the others gated. opts go with each patch:
// client.DryRunAll has the API server check and answer each patch without
// storing it.
func Lift(ctx context.Context, c client.Client, namespace string, opts ...client.PatchOption) ([]Lifted, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	var lifted []Lifted
	var errs []error
	for i := range pods.Items {
		p := &pods.Items[i]
		ours, kept := []string{}, []corev1.PodSchedulingGate{}
		for _, g := range p.Spec.SchedulingGates {
			if strings.HasPrefix(g.Name, locksv1.GatePrefix) {
				ours = append(ours, g.Name)
			} else {
				kept = append(kept, g)
			}
		}
		if len(ours) == 0 {
			continue
		}
		// A merge patch replaces the list, preconditioned on the pod's
		// version, so a gate added or lifted meanwhile fails the patch
		// rather than being overwritten.
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": p.ResourceVersion},
			"spec":     map[string]any{"schedulingGates": kept},
		})
		if err != nil {
			return lifted, err
		}
		if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch), opts...); err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		lifted = append(lifted, Lifted{Pod: p, Gates: ours})
	}
	return lifted, errors.Join(errs...)
}
