package main

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The pub/sub notice trip.
//
// The contended scenario's limit row is the throughput a lock could reach if
// its holders changed hands through one pub/sub notice and nothing else:
// 1 / (hold + one notice trip). One notice trip is the time from one client
// sending a PUBLISH until another client, subscribed to that channel on its
// own connection, has read the message off that connection.
//
// It is measured as a ping-pong between two clients A and B, each its own
// go-redis client (as each contending worker is), each subscribed to its own
// channel on its client's pub/sub connection: A sends PUBLISH to B's
// channel; B, reading its pub/sub connection in a loop, sends PUBLISH back
// to A's channel as soon as it has the message; the sample ends when A has
// read B's message off its pub/sub connection. One ping-pong is two notice
// trips; the trip is half the median ping-pong.

const (
	noticeChanA = "lockbench:notice:a"
	noticeChanB = "lockbench:notice:b"
	noticeWarm  = 20 // unmeasured ping-pongs at the start of each chunk
)

// noticeResult accumulates the ping-pong samples of all chunks.
type noticeResult struct {
	pingPongs durations
}

// trip is one notice trip: half the median ping-pong.
func (n *noticeResult) trip() time.Duration {
	return n.pingPongs.sorted().pct(50) / 2
}

// runNotices takes count ping-pong samples (after noticeWarm unmeasured ones)
// on a new pair of clients and adds them to res. The clients are created and
// closed here, so nothing of them is left on the server while a contended
// measurement window is open.
func runNotices(ctx context.Context, addr string, count int, res *noticeResult) (err error) {
	if count <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	rdbA, rdbB := newRedisClient(addr, nil), newRedisClient(addr, nil)
	defer rdbA.Close()
	defer rdbB.Close()
	psA, psB := rdbA.Subscribe(ctx, noticeChanA), rdbB.Subscribe(ctx, noticeChanB)
	defer psA.Close()
	// Wait for both SUBSCRIBE confirmations, and dial the PUBLISH connections.
	for _, c := range []struct {
		ps  *redis.PubSub
		rdb *redis.Client
	}{{psA, rdbA}, {psB, rdbB}} {
		msg, err := c.ps.Receive(ctx)
		if err != nil {
			_ = psB.Close()
			return err
		}
		if _, ok := msg.(*redis.Subscription); !ok {
			_ = psB.Close()
			return fmt.Errorf("pub/sub: got %T, want the subscription confirmation", msg)
		}
		if err := c.rdb.Ping(ctx).Err(); err != nil {
			_ = psB.Close()
			return err
		}
	}

	// B: send each message it reads straight back to A.
	bErr := make(chan error, 1)
	go func() {
		for {
			msg, err := psB.ReceiveMessage(ctx)
			if err != nil {
				bErr <- nil // psB closed (or ctx done, which A sees too)
				return
			}
			if err := rdbB.Publish(ctx, noticeChanA, msg.Payload).Err(); err != nil {
				bErr <- fmt.Errorf("B's PUBLISH: %w", err)
				return
			}
		}
	}()
	defer func() {
		_ = psB.Close()
		if e := <-bErr; err == nil {
			err = e
		}
	}()

	pingPong := func() (time.Duration, error) {
		start := time.Now()
		n, err := rdbA.Publish(ctx, noticeChanB, "n").Result()
		if err != nil {
			return 0, fmt.Errorf("A's PUBLISH: %w", err)
		}
		if n != 1 {
			return 0, fmt.Errorf("A's PUBLISH reached %d subscribers, want 1", n)
		}
		if _, err := psA.ReceiveMessage(ctx); err != nil {
			return 0, fmt.Errorf("A's receive: %w", err)
		}
		return time.Since(start), nil
	}
	for i := range noticeWarm + count {
		d, err := pingPong()
		if err != nil {
			return err
		}
		if i >= noticeWarm {
			res.pingPongs = append(res.pingPongs, d)
		}
	}
	return nil
}
