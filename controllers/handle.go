package controllers

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/pkg/redislock"
)

// handle is the library's handle on a lock the controller holds. This file
// is the only place that names the library's type.
type handle = redislock.Hold

// acquire takes the key for the owner without waiting. The library's
// watchdog renews it until it is force-released or lost. Taking a key the
// owner already holds re-enters it and keeps its fencing token, which is how
// a restarted manager adopts the holds it made before.
func acquire(ctx context.Context, c *redislock.Client, key string, owner redislock.Owner) (*handle, error) {
	m, err := c.NewMutex(key, &redislock.MutexOptions{Owner: owner})
	if err != nil {
		return nil, err
	}
	return m.TryLock(ctx, 0)
}

// giveUp undoes the take of a hold. A hold that already ended, or that
// another ownership replaced, leaves nothing to undo.
func giveUp(ctx context.Context, h *handle) error {
	if err := h.Unlock(ctx); err != nil && !errors.Is(err, redislock.ErrNotHeld) && !errors.Is(err, redislock.ErrNotOwner) {
		return err
	}
	return nil
}

// released reports whether the hold ended by the controller's own release,
// rather than being lost.
func released(h *handle) bool { return errors.Is(h.Err(), redislock.ErrReleased) }

// grant is a hold the controller keeps in Redis for a pod. hold is nil
// once it was lost while the pod runs: the grant is still the pod's, and
// is taken again for it when the key is free (keepGrants).
type grant struct {
	PodUID types.UID
	Pod    types.NamespacedName
	hold   *handle
}

// grants are the controller's holds, by key: one per key at most, whatever
// the number of locks naming it.
type grants struct {
	mu    sync.Mutex
	byKey map[string]*grant
}

func (g *grants) get(key string) *grant {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byKey[key]
}

// put records the key's grant, replacing any earlier one: keepGrants has
// reported that one lost before a new grant of the key is made.
func (g *grants) put(key string, gr *grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byKey == nil {
		g.byKey = map[string]*grant{}
	}
	g.byKey[key] = gr
}

// keys are the keys with a grant.
func (g *grants) keys() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.byKey))
	for k := range g.byKey {
		out = append(out, k)
	}
	return out
}

// drop forgets the key's grant if it is the pod's.
func (g *grants) drop(key string, uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gr := g.byKey[key]; gr != nil && gr.PodUID == uid {
		delete(g.byKey, key)
	}
}
