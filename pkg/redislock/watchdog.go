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
			var due []*ownership
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
	due := make([]*ownership, 0, len(c.held))
	for _, l := range c.held {
		if l.watchdog {
			due = append(due, l)
		}
	}
	c.mu.Unlock()
	c.renewLeases(due)
}

func (c *Client) renewLeases(due []*ownership) {
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
// lease. A lease whose ownership no longer holds the lock is lost at once,
// unless a release of it is in flight; one whose renewal failed keeps its
// deadline, and is lost when that passes. A renewal sent before a release
// and run after it changes nothing (see renew.lua), so renewals and
// releases need not wait for each other.
func (c *Client) renewBatch(leases []*ownership) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.RenewInterval)
	defer cancel()
	sent := make([]time.Time, len(leases))
	cmds := make([]*redis.Cmd, len(leases))
	// send renews the leases at the indexes given, by EVALSHA, or by EVAL,
	// which also loads the script on the node that runs it.
	send := func(indexes []int, eval bool) {
		now := time.Now()
		pipe := c.rdb.Pipeline()
		for _, i := range indexes {
			args := renewArgs(leases[i])
			if eval {
				args[0], args[1] = "eval", renewScript.body
			}
			cmds[i] = pipe.Do(ctx, args...)
			sent[i] = now
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
	}
	all := make([]int, len(leases))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	// Every node that restarted or failed over since the script was last
	// run there lost its script cache: in a Cluster, that may be any shard,
	// so each renewal it refused is sent again, not just the batch's first.
	var missing []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		send(missing, true)
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
			c.extend(l, sent[i], l.lease)
		default:
			c.mu.Lock()
			releasing := l.releasing > 0
			c.mu.Unlock()
			if !releasing {
				c.end(l, ErrNotOwner)
			}
		}
	}
}

// renewArgs is the renewal of l's lease, as a script call's arguments.
func renewArgs(l *ownership) []any {
	args := scriptArgs(renewScript, l.keys.nameArgs, 3)
	return append(args, l.ownerArg, l.tokenArg, l.leaseArg)
}

// renew renews one ownership's lease, and reports whether it still held
// the lock.
func (c *Client) renew(ctx context.Context, l *ownership) (bool, error) {
	n, err := run(ctx, c.rdb, renewScript, renewArgs(l)).Int()
	return n == 1, err
}

// extend moves l's local deadline to sent + lease - margin, unless a later
// call already set it.
func (c *Client) extend(l *ownership, sent time.Time, lease time.Duration) {
	c.mu.Lock()
	c.extendLocked(l, sent, lease)
	c.mu.Unlock()
}

// extendLocked records that Redis granted l the lease no earlier than sent.
// A lease shorter than l's own comes from a hand-over: it is extended a third
// of the way in, as a watchdog renewal would be.
func (c *Client) extendLocked(l *ownership, sent time.Time, lease time.Duration) {
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
func (c *Client) armLocked(l *ownership) {
	next := l.deadline
	if !l.confirmBy.IsZero() && !l.confirming && l.confirmBy.Before(next) {
		next = l.confirmBy
	}
	l.timer.Reset(time.Until(next))
}

// retryConfirm lets a short lease whose extension failed be tried again,
// halfway to its deadline.
func (c *Client) retryConfirm(l *ownership) {
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
func (c *Client) checkDeadline(l *ownership) {
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
