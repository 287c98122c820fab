package redislock

import (
	"context"
	"errors"
	"net"
	"strings"

	"time"

	"github.com/redis/go-redis/v9"
)

// Subscriptions. A client listens on three channels for each lock it waits
// for: the lock's release channel, where "0" is published when the lock is
// freed; the lock's notice channel for this client, where the scripts tell
// its waiters that the lock was handed to them or that they head the queue;
// and the lock's members channel, which only counts lockwarden's listeners
// (see lockKeys.members). All carry the lock's hash tag, so a script reaches
// them within the lock's own slot.
//
// On a Redis Cluster with sharded pub/sub (Redis 7 and later), the scripts
// publish with SPUBLISH and the client listens with SSUBSCRIBE, as Redisson
// does there: a message goes to the lock's shard only, never over the cluster
// bus, and Redisson's waiters and ours hear each other. go-redis binds a
// Cluster pub/sub connection to the node of one slot, so each lock waited on
// gets a connection of its own, on its slot's master. Elsewhere (standalone,
// Sentinel, a Cluster without sharded pub/sub) one connection with SUBSCRIBE
// serves every lock.
//
// A lock's subscription stays for subscriptionLinger after its last waiter
// leaves, so a busy lock costs no SUBSCRIBE per acquisition.

const (
	subscriptionLinger = 10 * time.Second
	// receiveTimeout is how long a receiver blocks before it pings its
	// connection, so a dead one is noticed, and sweeps idle subscriptions.
	receiveTimeout = time.Second
)

// subscription is one lock's two channels and the waiters that listen on
// them.
type subscription struct {
	lock             string
	release, notice  string
	members          string // see lockKeys.members
	conn             *pubsubConn
	confirmed        chan struct{} // closed once Redis confirmed both channels
	pending          int           // confirmations still awaited
	waiters          []*waiter     // the lock's waiters
	idleSince        time.Time
	confirmedRelease bool // for telling a reconnection's confirmations apart
	confirmedNotice  bool
}

func (s *subscription) isConfirmed() bool {
	select {
	case <-s.confirmed:
		return true
	default:
		return false
	}
}

func (s *subscription) add(w *waiter) {
	s.waiters = append(s.waiters, w)
	w.sub = s
}

// pubsubConn is one pub/sub connection and its receiving goroutine.
type pubsubConn struct {
	ps     *redis.PubSub
	closed bool // guarded by waiting.mu
}

// ShardedPubSub reports whether Clients on rdb publish a lock's release
// message and notices with SPUBLISH, and listen with SSUBSCRIBE: on a
// Cluster whose nodes know the commands (Redis 7 and later), as Redisson
// does there. Anyone else listening for releases must then SSUBSCRIBE to
// each lock's release channel, "redisson_lock__channel:{<name>}": a pattern
// subscription hears nothing sharded. The probe is an SPUBLISH to a channel
// nobody listens on; if Redis cannot be reached, a Cluster is taken to have
// them.
func ShardedPubSub(rdb redis.UniversalClient) bool {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := cc.SPublish(ctx, channelPrefix+"{lockwarden-probe}", "").Err()
	return err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// subscribe makes sure the client listens on the lock's channels, and
// returns a channel that closes once Redis confirms them.
func (ws *waiting) subscribe(ctx context.Context, w *waiter, keys *lockKeys) (<-chan struct{}, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return nil, ErrClosed
	}
	sub := ws.subs[keys.name]
	if sub == nil {
		sub = &subscription{
			lock:      keys.name,
			release:   keys.channel,
			notice:    keys.noticePrefix + ws.c.opts.ID,
			members:   keys.members,
			confirmed: make(chan struct{}),
			pending:   2,
		}
		ws.subs[keys.name] = sub
		ws.channels[sub.release], ws.channels[sub.notice] = sub, sub
		if err := ws.subscribeLocked(ctx, sub); err != nil {
			ws.dropLocked(sub)
			return nil, unavailable(err)
		}
	}
	if w.sub == nil {
		sub.add(w)
	}
	return sub.confirmed, nil
}

// subscribeLocked sends the subscription's SUBSCRIBE, or SSUBSCRIBE on a
// connection of its own. A sharded connection is opened by the SSUBSCRIBE
// itself, so it goes to the master of the lock's slot, and its receiving
// goroutine starts only then: a receive before any channel is named would
// open the connection on a random node, which answers MOVED and never
// confirms.
func (ws *waiting) subscribeLocked(ctx context.Context, sub *subscription) error {
	if !ws.sharded {
		if ws.shared == nil {
			ws.shared = ws.listen(ws.c.rdb.Subscribe(ctx))
		}
		sub.conn = ws.shared
		return sub.conn.ps.Subscribe(ctx, sub.release, sub.notice, sub.members)
	}
	ps := ws.c.rdb.(*redis.ClusterClient).SSubscribe(ctx)
	if err := ps.SSubscribe(ctx, sub.release, sub.notice, sub.members); err != nil {
		_ = ps.Close()
		return err
	}
	sub.conn = ws.listen(ps)
	return nil
}

// listen starts the receiving goroutine of a new connection.
func (ws *waiting) listen(ps *redis.PubSub) *pubsubConn {
	conn := &pubsubConn{ps: ps}
	ws.c.loops.Add(1)
	go ws.receive(conn)
	return conn
}

// dropLocked forgets a subscription and stops listening on its channels: a
// sharded one's connection is closed with it.
func (ws *waiting) dropLocked(sub *subscription) {
	delete(ws.subs, sub.lock)
	delete(ws.channels, sub.release)
	delete(ws.channels, sub.notice)
	switch {
	case sub.conn == nil: // its SSUBSCRIBE failed
		return
	case ws.sharded:
		sub.conn.closed = true
		_ = sub.conn.ps.Close()
	default:
		_ = sub.conn.ps.Unsubscribe(context.Background(), sub.release, sub.notice, sub.members)
	}
}

// close ends every subscription and wakes every waiter, which then sees the
// client closed.
func (ws *waiting) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	conns := map[*pubsubConn]bool{}
	for _, sub := range ws.subs {
		conns[sub.conn] = true
		for _, w := range sub.waiters {
			w.signal()
		}
	}
	if ws.shared != nil {
		conns[ws.shared] = true
	}
	for conn := range conns {
		conn.closed = true
		_ = conn.ps.Close()
	}
}

// receive is a connection's goroutine: it routes release messages and
// notices to waiters. go-redis reconnects and resubscribes by itself; a
// confirmation of a channel already confirmed means a reconnection, after
// which messages may have been missed, so every waiter on it retries.
func (ws *waiting) receive(conn *pubsubConn) {
	defer ws.c.loops.Done()
	lastSweep := time.Now()
	for {
		msg, err := conn.ps.ReceiveTimeout(context.Background(), receiveTimeout)
		ws.mu.Lock()
		closed := ws.closed || conn.closed
		ws.mu.Unlock()
		if closed {
			return
		}
		if time.Since(lastSweep) > receiveTimeout {
			ws.sweep()
			lastSweep = time.Now()
		}
		if err != nil {
			var netErr net.Error
			if errors.As(err, &netErr) && netErr.Timeout() {
				_ = conn.ps.Ping(context.Background())
				continue
			}
			// A broken connection: go-redis reconnects on the next receive.
			select {
			case <-ws.c.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				ws.confirm(m.Channel)
			}
		case *redis.Message:
			ws.route(m)
		}
	}
}

func (ws *waiting) confirm(channel string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	sub := ws.channels[channel]
	if sub == nil {
		return
	}
	seen := &sub.confirmedRelease
	if channel == sub.notice {
		seen = &sub.confirmedNotice
	}
	if *seen {
		// Resubscribed after a reconnection: anything may have been missed.
		for _, w := range sub.waiters {
			w.signal()
		}
		return
	}
	*seen = true
	if sub.pending--; sub.pending == 0 {
		close(sub.confirmed)
	}
}

// route hands a message to the lock's waiters: a notice to the waiter it
// names, a release message to the head of the queue.
func (ws *waiting) route(m *redis.Message) {
	ws.mu.Lock()
	sub := ws.channels[m.Channel]
	ws.mu.Unlock()
	switch {
	case sub == nil:
	case m.Channel == sub.notice:
		ws.notice(m.Payload)
	case m.Payload == releaseMessage:
		ws.released(sub)
	}
}

// sweep unsubscribes from locks nobody has waited on for a while.
func (ws *waiting) sweep() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, sub := range ws.subs {
		if len(sub.waiters) == 0 && time.Since(sub.idleSince) > subscriptionLinger {
			ws.dropLocked(sub)
		}
	}
}
