package redislock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Requests. A mutating script call whose reply is lost may have run or not:
// the connection broke, a timeout struck, or the caller's context ended while
// the reply was on its way. go-redis then sends the command again on its own,
// and a client that guessed the outcome (say, by undoing an acquisition it
// assumed) could undo someone else's. So every request of a Lock call, and
// of the Unlock of its Hold, carries the call's ticket, and the lock hash
// records a level per ticket (see scripts/lib.lua): a second run finds its
// level there, or gone, and changes nothing. When the outcome is unknown,
// the client sends the same request again until Redis answers, and acts on
// that answer.
//
// A copy of a request can also arrive late: stuck in the network while the
// client, its patience spent, resent it on another connection and went on.
// Such a copy of a Lock's request could take the lock again after the
// Unlock, for an owner nobody renews. So when a request took long enough
// for that, or had to be resent, its call is remembered as finished in
// Redis once its level is undone, for as long as a copy can still arrive
// (rememberFor): a request of a finished call changes nothing.

// retryHorizon is how long go-redis may go on resending a command by itself:
// its MaxRetries, each bounded by the read and write timeouts and the retry
// backoff.
func retryHorizon(rdb redis.UniversalClient) time.Duration {
	var retries int
	var read, write, backoff time.Duration
	switch r := rdb.(type) {
	case *redis.Client:
		o := r.Options()
		retries, read, write, backoff = o.MaxRetries, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := r.Options()
		retries, read, write, backoff = o.MaxRetries+o.MaxRedirects, o.ReadTimeout, o.WriteTimeout, o.MaxRetryBackoff
	default:
		return time.Minute
	}
	// A negative timeout means none: the command is resent only after the
	// connection broke, which go-redis learns at once.
	read, write = max(read, 0), max(write, 0)
	return max(time.Duration(max(retries, 0)+1)*(read+write+backoff), 10*time.Second)
}

// lateAfter is how long a request may take before a copy of it may still be
// on its way: go-redis resends a command whose reply timed out, and the
// first copy may arrive after the second. At most a second, or the read
// timeout if shorter.
func lateAfter(rdb redis.UniversalClient) time.Duration {
	late := time.Second
	var read time.Duration
	switch r := rdb.(type) {
	case *redis.Client:
		read = r.Options().ReadTimeout
	case *redis.ClusterClient:
		read = r.Options().ReadTimeout
	}
	if read > 0 && read < late {
		late = read
	}
	return late
}

// outcomeUnknown reports whether a failed call may have run in Redis: it
// reached the server, or may have, and no reply says what happened. An error
// reply from Redis is an answer; a dial that failed sent nothing.
func outcomeUnknown(err error) bool {
	if err == nil {
		return false
	}
	var replyErr redis.Error
	return !errors.As(err, &replyErr) && !neverSent(err) && !errors.Is(err, redis.ErrClosed)
}

// resolved runs call, a mutating request that is safe to send twice, unless
// first is the error of a send already made. If its outcome is unknown, it
// sends the same request again, on a context free of the caller's
// cancellation, until Redis answers or the resolve window passes; then it
// returns the first error. late reports whether a copy of the request may
// still arrive: it was resent, or took longer than lateAfter.
func resolved[T any](ctx context.Context, c *Client, first error, call func(context.Context) (T, error)) (reply T, late bool, err error) {
	err = first
	if first == nil {
		sent := time.Now()
		reply, err = call(ctx)
		if !outcomeUnknown(err) {
			return reply, time.Since(sent) >= c.lateAfter, err
		}
	}
	// Close waits for the calls in progress: once it has begun, a request
	// whose reply was lost is not resent. (go-redis does not interrupt a
	// read in flight for a cancelled ctx.)
	rctx, cancel := c.untilClosed(context.WithoutCancel(ctx))
	defer cancel()
	rctx, cancelWindow := context.WithTimeout(rctx, c.resolveWindow)
	defer cancelWindow()
	pause := 10 * time.Millisecond
	for {
		select {
		case <-rctx.Done():
			return reply, true, err
		case <-time.After(pause):
		}
		pause = min(2*pause, c.opts.RetryFallback/2)
		again, againErr := call(rctx)
		if againErr == nil || !outcomeUnknown(againErr) && !neverSent(againErr) {
			return again, true, againErr
		}
	}
}
