package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// renewLoop is the client's one renewal goroutine. Every RenewInterval it
// renews all watchdog leases, RenewBatchSize per pipelined round trip.
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

// renewBatch renews leases in one pipelined round trip. A lease whose owner
// no longer holds the lock is lost at once; one whose renewal failed keeps
// its deadline, and is lost when that passes.
func (c *Client) renewBatch(leases []*Lease) {
	// Exclusive with Unlock: no renewal overlaps a release.
	c.renewing.Lock()
	defer c.renewing.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RenewInterval)
	defer cancel()
	lease := c.opts.WatchdogLease
	send := func() (time.Time, []*redis.Cmd) {
		sent := time.Now()
		pipe := c.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(leases))
		for i, l := range leases {
			cmds[i] = renewScript.EvalSha(ctx, pipe, []string{l.key.name}, lease.Milliseconds(), string(l.key.owner))
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
		case renewed == 1:
			c.opts.Metrics.renewed()
			c.extend(l, sent, lease)
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

func (c *Client) extendLocked(l *Lease, sent time.Time, lease time.Duration) {
	if !sent.After(l.deadlineSet) {
		return
	}
	l.deadlineSet = sent
	l.deadline = sent.Add(lease - c.opts.margin(lease))
	l.timer.Reset(time.Until(l.deadline))
}

// checkDeadline runs when l's timer fires. The timer may be stale, since
// resetting an AfterFunc timer races with its firing: re-arm if the
// deadline moved, otherwise the lease is lost.
func (c *Client) checkDeadline(l *Lease) {
	c.mu.Lock()
	if c.held[l.key] != l {
		c.mu.Unlock()
		return
	}
	if left := time.Until(l.deadline); left > 0 {
		l.timer.Reset(left)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.end(l, ErrLeaseLost)
}
