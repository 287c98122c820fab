package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Term is one period of leadership.
type Term struct {
	// Token is the fencing token of the term's ownership: every term has a
	// higher token than all terms before it, as long as Redis keeps the
	// counter, or, if it loses it, the candidates' clocks are closer than
	// the time since the last term began (see the package doc, Fencing tokens).
	Token int64
	// Started is when the term began.
	Started time.Time
}

// Election campaigns for a lock and runs a callback while holding it.
type Election struct {
	// Name is the lock to campaign for, such as LockName(namespace, name)
	// for a DistributedLock's default key. The term's lease is the client's
	// Options.WatchdogLease, renewed by its watchdog for as long as the term
	// lasts.
	Name string
	// OnStartedLeading runs for each term, in its own goroutine. Its context
	// is cancelled when the term ends: the lease was lost or can no longer
	// be vouched for (context.Cause tells which), or Run's context ended.
	// It must return soon after; the next campaign waits for it. If it
	// returns while still leading, the lock is released and Run returns.
	OnStartedLeading func(ctx context.Context, term Term)
	// OnStoppedLeading, if set, is called after each term, with why it
	// ended: ErrReleased after a graceful stop, or the cause of the loss.
	OnStoppedLeading func(term Term, cause error)
}

// RunElection campaigns for e.Name until ctx ends, leading whenever it holds
// the lock. After losing a term it campaigns again. When ctx ends it cancels
// the running term, waits for the callback, and releases the lock, so a
// standby takes over at once. It never exits the process. It returns nil
// when ctx ended or the callback chose to stop, and an error only for a
// configuration it cannot run with.
func (c *Client) RunElection(ctx context.Context, e Election) error {
	if e.OnStartedLeading == nil {
		return errors.New("redislock: Election.OnStartedLeading is required")
	}
	if err := validateName(e.Name); err != nil {
		return err
	}
	for ctx.Err() == nil {
		// Every Lock acts for a new owner: after a lost term, a stale hold
		// of the old owner may linger in Redis until its lease runs out,
		// and must not be re-entered as if it were still ours.
		m, err := c.NewMutex(e.Name, nil)
		if err != nil {
			return err
		}
		hold, err := m.Lock(ctx)
		switch {
		case ctx.Err() != nil:
			if hold != nil { // taken as ctx ended: a standby must not wait out its lease
				releaseCtx, done := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
				_ = hold.Unlock(releaseCtx)
				done()
			}
			return nil
		case errors.Is(err, ErrClosed):
			return err
		case err != nil: // Redis unavailable: campaign again after a pause
			c.opts.Logger.Info("campaign failed; retrying", "lock", e.Name, "error", err.Error())
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(c.fallback(0)):
			}
			continue
		}
		if stop := c.lead(ctx, hold, e); stop {
			return nil
		}
	}
	return nil
}

// lead runs one term and reports whether the election should stop because
// the callback returned on its own.
func (c *Client) lead(ctx context.Context, hold *Hold, e Election) (stop bool) {
	term := Term{Token: hold.Token(), Started: time.Now()}
	termCtx, cancel := context.WithCancelCause(hold.Context())
	defer cancel(nil)
	stopOnShutdown := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stopOnShutdown()

	returned := make(chan struct{})
	go func() {
		defer close(returned)
		e.OnStartedLeading(termCtx, term)
	}()
	select {
	case <-returned:
		stop = hold.Err() == nil && ctx.Err() == nil
	case <-termCtx.Done():
		<-returned
	}

	cause := hold.Err()
	if cause == nil { // still held: release it for the standby
		releaseCtx, done := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RetryFallback)
		if err := hold.Unlock(releaseCtx); err != nil {
			c.opts.Logger.Info("releasing the leadership lock failed; its lease will run out", "lock", e.Name, "error", err.Error())
		}
		done()
		cause = ErrReleased
	}
	if e.OnStoppedLeading != nil {
		e.OnStoppedLeading(term, cause)
	}
	return stop
}

// String describes the term for logs.
func (t Term) String() string {
	return fmt.Sprintf("term with fencing token %d since %s", t.Token, t.Started.Format(time.RFC3339))
}
