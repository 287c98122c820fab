package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewLoop is the client's one renewal goroutine. Every RenewInterval it
// renews all watchdog leases, RenewBatchSize per pipelined round trip. In
// between, it extends the leases that hand-overs granted short as soon as
// they are due (see confirmBy).
func (c *Client) renewLoop() {
	defer c.loops.Done()
	ticker := time.NewTicker(c.opts.RenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-ticker.C:
			c.renewAll()
		case <-c.confirmNow:
			c.mu.Lock()
			var due []*Lease
			for _, l := range c.confirms {
				if c.held[l.key] == l {
					due = append(due, l)
				}
			}
			c.confirms = nil
			c.mu.Unlock()
			c.renewLeases(due)
		}
	}
}

func (c *Client) renewAll() {
	c.mu.Lock()
	due := make([]*Lease, 0, len(c.held))
	for _, l := range c.held {
		if l.watchdog {
			due = append(due, l)
		}
	}
	c.mu.Unlock()
	c.renewLeases(due)
}

func (c *Client) renewLeases(due []*Lease) {
	for len(due) > 0 {
		n := min(len(due), c.opts.RenewBatchSize)
		c.renewBatch(due[:n])
		due = due[n:]
		select {
		case <-c.done:
			return
		default:
		}
	}
}

// renewBatch renews leases in one pipelined round trip, each to its full
// lease. A lease whose owner no longer holds the lock is lost at once; one
// whose renewal failed keeps its deadline, and is lost when that passes.
func (c *Client) renewBatch(leases []*Lease) {
	// Exclusive with Unlock: no renewal overlaps a release.
	c.renewing.Lock()
	defer c.renewing.Unlock()

	terms := make([]time.Duration, len(leases))
	c.mu.Lock()
	for i, l := range leases {
		terms[i] = l.lease
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RenewInterval)
	defer cancel()
	send := func() (time.Time, []*redis.Cmd) {
		sent := time.Now()
		pipe := c.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(leases))
		for i, l := range leases {
			cmds[i] = renewScript.EvalSha(ctx, pipe, []string{l.key.name}, terms[i].Milliseconds(), string(l.key.owner))
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		return sent, cmds
	}
	sent, cmds := send()
	if len(cmds) > 0 && isNoScript(cmds[0].Err()) {
		if err := loadScript(ctx, c.rdb, renewScript); err == nil {
			sent, cmds = send()
		}
	}

	for i, cmd := range cmds {
		l := leases[i]
		renewed, err := cmd.Int()
		switch {
		case err != nil:
			c.opts.Metrics.renewalFailed()
			c.opts.Logger.Info("lock renewal failed", "lock", l.key.name, "error", err.Error())
			c.retryConfirm(l)
		case renewed == 1:
			c.opts.Metrics.renewed()
			c.extend(l, sent, terms[i])
		default:
			c.end(l, ErrNotOwner)
		}
	}
}

// extend moves l's local deadline to sent + lease - margin, unless a later
// call already set it.
func (c *Client) extend(l *Lease, sent time.Time, lease time.Duration) {
	c.mu.Lock()
	c.extendLocked(l, sent, lease)
	c.mu.Unlock()
}

// extendLocked records that Redis granted l the lease no earlier than sent.
// A lease shorter than l's own comes from a hand-over: it is extended a third
// of the way in, as a watchdog renewal would be.
func (c *Client) extendLocked(l *Lease, sent time.Time, lease time.Duration) {
	if !sent.After(l.deadlineSet) {
		return
	}
	l.deadlineSet = sent
	l.deadline = sent.Add(lease - c.opts.margin(lease))
	l.confirmBy, l.confirming = time.Time{}, false
	if lease < l.lease {
		l.confirmBy = sent.Add(lease / 3)
	}
	c.armLocked(l)
}

// armLocked sets l's timer for its next check: the extension of a short
// lease, or else the deadline.
func (c *Client) armLocked(l *Lease) {
	next := l.deadline
	if !l.confirmBy.IsZero() && !l.confirming && l.confirmBy.Before(next) {
		next = l.confirmBy
	}
	l.timer.Reset(time.Until(next))
}

// retryConfirm lets a short lease whose extension failed be tried again,
// halfway to its deadline.
func (c *Client) retryConfirm(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[l.key] != l || !l.confirming {
		return
	}
	l.confirming = false
	l.confirmBy = time.Now().Add(time.Until(l.deadline) / 2)
	c.armLocked(l)
}

// checkDeadline runs when l's timer fires. It hands a short lease that is due
// to the renewal loop, and loses l once its deadline passed. The timer may be
// stale, since resetting an AfterFunc timer races with its firing, so it
// re-arms if neither is due yet.
func (c *Client) checkDeadline(l *Lease) {
	c.mu.Lock()
	if c.held[l.key] != l {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	if !l.confirmBy.IsZero() && !l.confirming && !now.Before(l.confirmBy) {
		l.confirming = true
		c.confirms = append(c.confirms, l)
		select {
		case c.confirmNow <- struct{}{}:
		default:
		}
	}
	if now.Before(l.deadline) {
		c.armLocked(l)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.end(l, ErrLeaseLost)
}
