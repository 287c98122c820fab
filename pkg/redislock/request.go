package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Requests. A mutating script call whose reply is lost may have run or not:
// the connection broke, a timeout struck, or the caller's context ended while
// the reply was on its way. go-redis then sends the command again on its own,
// and a client that guessed the outcome (say, by undoing an acquisition it
// assumed) could undo someone else's. So acquire and release carry a request
// ID, and their scripts latch each request's result under
// lockwarden_lock_request:{<name>}:<request ID> (see scripts/lib.lua): a
// second run answers as the first did and changes nothing. When the outcome
// is unknown, the client sends the same request again until Redis answers,
// and acts on that answer.

// newRequestID returns a random request ID.
func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// latchTTL is how long a request's result is kept in Redis: longer than
// go-redis may go on resending the command by itself (its MaxRetries, each
// bounded by the read and write timeouts and the retry backoff), plus the
// client's own resolve window. A resend after the latch expired would run
// the request afresh.
func latchTTL(rdb redis.UniversalClient, resolve time.Duration) time.Duration {
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
	horizon := time.Duration(max(retries, 0)+1) * (read + write + backoff)
	return max(horizon+resolve, 10*time.Second)
}

// outcomeUnknown reports whether a failed call may have run in Redis: it
// reached the server, or may have, and no reply says what happened. An error
// reply from Redis is an answer; a dial that failed sent nothing.
func outcomeUnknown(err error) bool {
	var replyErr redis.Error
	return err != nil && !errors.As(err, &replyErr) && !neverSent(err) && !errors.Is(err, redis.ErrClosed)
}

// resolved runs call, a mutating request that is safe to send twice. If its
// outcome is unknown, it sends the same request again, on a context free of
// the caller's cancellation, until Redis answers or the resolve window (QueueTTL)
// passes; then it returns the first error.
func resolved[T any](ctx context.Context, c *Client, call func(context.Context) (T, error)) (T, error) {
	// Close waits for the calls in progress: once it has begun, a request
	// not yet sent is not sent, and one whose reply was lost is not resent.
	// (go-redis does not interrupt a read in flight for a cancelled ctx.)
	ctx, stop := c.untilClosed(ctx)
	defer stop()
	reply, err := call(ctx)
	if !outcomeUnknown(err) {
		return reply, err
	}
	rctx, cancel := c.untilClosed(context.WithoutCancel(ctx))
	defer cancel()
	rctx, cancelWindow := context.WithTimeout(rctx, c.resolveWindow)
	defer cancelWindow()
	pause := 10 * time.Millisecond
	for {
		select {
		case <-rctx.Done():
			return reply, err
		case <-c.done:
			return reply, err
		case <-time.After(pause):
		}
		pause = min(2*pause, c.opts.RetryFallback/2)
		again, againErr := call(rctx)
		if againErr == nil || !outcomeUnknown(againErr) && !neverSent(againErr) {
			return again, againErr
		}
	}
}
