package why

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Free lifts lockwarden's scheduling gates from every pod of the namespace
// (every namespace if it is ""), on purpose: when lockwarden is uninstalled,
// its gated pods would otherwise wait for ever. They then start without
// holding any lock. Other controllers' gates are kept. It returns the pods
// it freed, as "namespace/name", and the errors of those it could not free:
// one pod's failure does not keep the others gated.
func Free(ctx context.Context, c client.Client, namespace string) ([]string, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	var freed []string
	var errs []error
	for i := range pods.Items {
		p := &pods.Items[i]
		kept := slices.DeleteFunc(slices.Clone(p.Spec.SchedulingGates), func(g corev1.PodSchedulingGate) bool {
			return strings.HasPrefix(g.Name, locksv1.GatePrefix)
		})
		if len(kept) == len(p.Spec.SchedulingGates) {
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
			return freed, err
		}
		if err := c.Patch(ctx, p, client.RawPatch(types.MergePatchType, patch)); err != nil {
			errs = append(errs, fmt.Errorf("%s/%s: %w", p.Namespace, p.Name, err))
			continue
		}
		freed = append(freed, p.Namespace+"/"+p.Name)
	}
	return freed, errors.Join(errs...)
}
