package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// checkTimeout bounds each check of `manager --check`.
const checkTimeout = 10 * time.Second

// check is `manager --check`, the Helm chart's test: with the manager's own
// configuration (its Redis Secret, flags and ServiceAccount), is there
// anything the manager needs that it would not get? It checks that Redis
// accepts the credentials, and that the DistributedLock API is installed
// and the ServiceAccount may read the locks and pods, in --watch-namespaces
// or cluster-wide. Each check logs its outcome; a failure says which check
// failed and what to look at. It returns the number of failed checks.
type check struct {
	log        logr.Logger
	rdb        redis.UniversalClient
	target     string // Redis, as Config.Target names it (no credentials)
	api        client.Reader
	namespaces []string // empty: cluster-wide
}

func (c *check) run(ctx context.Context) int {
	failed := 0
	if err := c.redis(ctx); err != nil {
		failed++
		c.log.Error(err, "check failed", "check", "redis")
	} else {
		c.log.Info("check passed: Redis accepts the manager's credentials", "check", "redis", "target", c.target)
	}
	scopes := c.namespaces
	if len(scopes) == 0 {
		scopes = []string{""}
	}
	for _, ns := range scopes {
		where := "cluster-wide"
		if ns != "" {
			where = "in namespace " + ns
		}
		if err := c.list(ctx, &locksv1.DistributedLockList{}, "DistributedLocks", ns); err != nil {
			failed++
			c.log.Error(err, "check failed", "check", "distributedlocks", "namespace", ns)
		} else {
			c.log.Info("check passed: the manager can read DistributedLocks "+where, "check", "distributedlocks", "namespace", ns)
		}
		if err := c.list(ctx, &corev1.PodList{}, "pods", ns); err != nil {
			failed++
			c.log.Error(err, "check failed", "check", "pods", "namespace", ns)
		} else {
			c.log.Info("check passed: the manager can read pods "+where, "check", "pods", "namespace", ns)
		}
	}
	if failed > 0 {
		c.log.Error(nil, fmt.Sprintf("%d check(s) failed: the manager cannot work as installed (see the failures above)", failed))
	}
	return failed
}

// redis pings Redis; the connection's AUTH is what checks the credentials.
func (c *check) redis(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	err := c.rdb.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case refusedCredentials(err):
		return fmt.Errorf("Redis at %s refuses the manager's credentials (check the username and password in the Redis Secret against Redis's ACL or requirepass): %w", c.target, err)
	default:
		return fmt.Errorf("Redis at %s does not answer (check its address in the Redis Secret or the chart's redis values, and that the manager's namespace may reach it): %w", c.target, err)
	}
}

// list lists one object of the kind, as the manager's cache would list
// them all.
func (c *check) list(ctx context.Context, list client.ObjectList, what, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	opts := []client.ListOption{client.Limit(1)}
	where := "cluster-wide"
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
		where = "in namespace " + ns
	}
	err := c.api.List(ctx, list, opts...)
	var noKind *meta.NoKindMatchError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &noKind) || (apierrors.IsNotFound(err) && strings.Contains(what, "DistributedLock")):
		return fmt.Errorf("the DistributedLock CRD (distributedlocks.locks.lockwarden.dev) is not installed: install it with the chart (crd.enable=true) or make install: %w", err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("the manager's ServiceAccount may not list %s %s: its ClusterRole (or, in namespaced mode, its Roles) is missing or not bound: %w", what, where, err)
	default:
		return fmt.Errorf("cannot list %s %s: %w", what, where, err)
	}
}
