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
// its waiters that the lock was handed to them or that they head its queue;
// and the lock's members channel, which only counts lockwarden's listeners
// (see lockKeys.members). All carry the lock's hash tag, so a script reaches
// them within the lock's own slot.
//
// On a Redis Cluster with sharded pub/sub (Redis 7 and later), the scripts
// publish with SPUBLISH and the client listens with SSUBSCRIBE, as Redisson
// does there: a message goes to the lock's shard only, never over the cluster
// bus, and Redisson's waiters and ours hear each other. The client keeps one
// connection per master it listens on, and subscribes each lock's channels
// there with an SSUBSCRIBE of their own (one command may not name two
// slots), so connections grow with shards, not with locks. When a failover
// or a resharding moves a slot, its old node drops the slot's subscriptions
// (it sends SUNSUBSCRIBE); when a node's connection breaks, the client drops
// it. Either way the locks it carried are subscribed again on their slots'
// masters as the cluster now has them, and their waiters retry, since they
// may have missed a message. Elsewhere (standalone, Sentinel, a Cluster
// without sharded pub/sub) one connection with SUBSCRIBE serves every lock,
// and go-redis reconnects and resubscribes it.
//
// A lock's subscription stays for subscriptionLinger after its last waiter
// leaves, so a busy lock costs no SUBSCRIBE per acquisition.

const (
	subscriptionLinger = 10 * time.Second
	// receiveTimeout is how long a receiver blocks before it pings its
	// connection and sweeps idle subscriptions; a connection that brings
	// nothing, not even the PING's answer, for another receiveTimeout is
	// dead (a node that hangs sends no reset), and its locks are
	// subscribed again (see connDead).
	receiveTimeout = time.Second
)

// subscription is one lock's channels and the waiters that listen on them.
type subscription struct {
	lock             string
	release, notice  string
	members          string        // see lockKeys.members
	conn             *pubsubConn   // nil while it is being subscribed again
	confirmed        chan struct{} // closed once Redis confirmed both channels
	pending          int           // confirmations still awaited
	waiters          []*waiter     // the lock's waiters
	idleSince        time.Time
	confirmedRelease bool // for telling a reconnection's confirmations apart
	confirmedNotice  bool
	// subscribing is set while a subscription of it is under way: a
	// waiter's, for as long as its call lasts, or rehomeLocked's, until it
	// succeeds. Others then leave it alone.
	subscribing bool
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

func (s *subscription) channels() []string { return []string{s.release, s.notice, s.members} }

// pubsubConn is one pub/sub connection and its receiving goroutine.
type pubsubConn struct {
	ps *redis.PubSub
	// On a sharded Cluster: the master's address, and the locks whose
	// channels it carries.
	addr   string
	subs   map[*subscription]struct{}
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
	}
	if w.sub == nil {
		sub.add(w)
	}
	if sub.conn == nil && !sub.subscribing {
		sub.subscribing = true
		err := ws.subscribeLocked(ctx, sub)
		sub.subscribing = false
		switch {
		case errors.Is(err, ErrClosed):
			return nil, err
		case errors.Is(err, errConnLost):
			// The connection was found dead meanwhile: the client
			// subscribes the lock again as it does its other locks.
			ws.rehomeLocked([]*subscription{sub})
		case err != nil:
			return nil, unavailable(err)
		}
	}
	return sub.confirmed, nil
}

// errConnLost is a subscription's connection closed, because it was found
// dead, while the subscription was being sent on it.
var errConnLost = errors.New("redislock: the pub/sub connection was lost while subscribing")

// subscribeLocked sends the subscription's SUBSCRIBE, or on a sharded
// Cluster its SSUBSCRIBE on the connection to its slot's master, opening it
// if there is none yet. The caller holds ws.mu and has set sub.subscribing.
// subscribeLocked lets go of ws.mu while it waits on Redis, so that a node
// that does not answer (a hung master whose connection is opened again)
// holds up no other lock's messages; the caller must look again at what it
// read before. If the subscription was dropped meanwhile, it is left
// unsubscribed, with a nil error.
func (ws *waiting) subscribeLocked(ctx context.Context, sub *subscription) error {
	if !ws.sharded {
		if ws.shared == nil {
			ws.shared = ws.listen(&pubsubConn{ps: ws.c.rdb.Subscribe(ctx)})
		}
		return ws.attachLocked(ctx, sub, ws.shared)
	}
	node, err := ws.c.rdb.(*redis.ClusterClient).MasterForKey(ctx, sub.release)
	if err != nil {
		return err
	}
	addr := node.Options().Addr
	if conn := ws.shards[addr]; conn != nil {
		return ws.attachLocked(ctx, sub, conn)
	}
	// A sharded connection's receiving goroutine starts only once the
	// connection is open: a receive before any channel is named would open
	// it on its own.
	ws.mu.Unlock()
	ps := node.SSubscribe(ctx)
	err = ps.SSubscribe(ctx, sub.channels()...)
	ws.mu.Lock()
	switch {
	case ws.closed:
		_ = ps.Close()
		return ErrClosed
	case err != nil:
		_ = ps.Close()
		return err
	case ws.subs[sub.lock] != sub:
		_ = ps.Close()
		return nil
	}
	if conn := ws.shards[addr]; conn != nil {
		// Another lock opened one meanwhile: one connection a master.
		_ = ps.Close()
		return ws.attachLocked(ctx, sub, conn)
	}
	conn := ws.listen(&pubsubConn{ps: ps, addr: addr, subs: make(map[*subscription]struct{})})
	ws.shards[addr] = conn
	conn.subs[sub] = struct{}{}
	sub.conn = conn
	return nil
}

// attachLocked subscribes sub's channels on conn, an open connection,
// letting go of ws.mu while it waits on Redis, and attaches sub to it if
// both are still in use then (see subscribeLocked).
func (ws *waiting) attachLocked(ctx context.Context, sub *subscription, conn *pubsubConn) error {
	ws.mu.Unlock()
	var err error
	if ws.sharded {
		err = conn.ps.SSubscribe(ctx, sub.channels()...)
	} else {
		err = conn.ps.Subscribe(ctx, sub.channels()...)
	}
	ws.mu.Lock()
	switch {
	case ws.closed:
		return ErrClosed
	case conn.closed:
		return errConnLost
	case err != nil:
		return err
	case ws.subs[sub.lock] != sub:
		// Dropped meanwhile. A newer subscription of the lock, if any,
		// sends the same channels: they stay for it.
		if ws.subs[sub.lock] == nil {
			ws.unsubscribeLocked(conn, sub)
		}
		return nil
	}
	if conn.subs != nil {
		conn.subs[sub] = struct{}{}
	}
	sub.conn = conn
	return nil
}

// unsubscribeLocked stops listening on sub's channels on conn.
func (ws *waiting) unsubscribeLocked(conn *pubsubConn, sub *subscription) {
	if ws.sharded {
		_ = conn.ps.SUnsubscribe(context.Background(), sub.channels()...)
	} else {
		_ = conn.ps.Unsubscribe(context.Background(), sub.channels()...)
	}
}

// listen starts the receiving goroutine of a new connection.
func (ws *waiting) listen(conn *pubsubConn) *pubsubConn {
	ws.c.loops.Add(1)
	go ws.receive(conn)
	return conn
}

// dropLocked forgets a subscription and stops listening on its channels. A
// sharded connection is closed with its last lock.
func (ws *waiting) dropLocked(sub *subscription) {
	delete(ws.subs, sub.lock)
	delete(ws.channels, sub.release)
	delete(ws.channels, sub.notice)
	conn := sub.conn
	sub.conn = nil
	switch {
	case conn == nil:
	case ws.sharded:
		delete(conn.subs, sub)
		if len(conn.subs) == 0 {
			ws.closeConnLocked(conn)
		} else {
			ws.unsubscribeLocked(conn, sub)
		}
	default:
		ws.unsubscribeLocked(conn, sub)
	}
}

// closeConnLocked closes a sharded connection; its receiver then exits.
func (ws *waiting) closeConnLocked(conn *pubsubConn) {
	conn.closed = true
	if ws.shards[conn.addr] == conn {
		delete(ws.shards, conn.addr)
	}
	_ = conn.ps.Close()
}

// close ends every subscription and wakes every waiter, which then sees the
// client closed.
func (ws *waiting) close() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.closed = true
	for _, sub := range ws.subs {
		for _, w := range sub.waiters {
			w.signal()
		}
	}
	conns := []*pubsubConn{}
	if ws.shared != nil {
		conns = append(conns, ws.shared)
	}
	for _, conn := range ws.shards {
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.closed = true
		_ = conn.ps.Close()
	}
}

// receive is a connection's goroutine: it routes release messages and
// notices to waiters. A confirmation of a channel already confirmed means a
// resubscription, after which messages may have been missed, so every
// waiter on it retries. When the connection has been quiet for
// receiveTimeout, it sends a PING; if nothing comes back within another
// receiveTimeout, the connection is dead, whatever TCP says (a hung node),
// and its locks are subscribed again on a new one (see connDead). A broken
// shared connection is reconnected and resubscribed by go-redis; a sharded
// one is dropped, and its locks subscribed again (see rehomeLocked).
func (ws *waiting) receive(conn *pubsubConn) {
	defer ws.c.loops.Done()
	lastSweep := time.Now()
	var pinged time.Time // when the PING not yet answered was sent
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
				switch {
				case pinged.IsZero():
					pinged = time.Now()
					_ = conn.ps.Ping(context.Background())
				case time.Since(pinged) >= receiveTimeout:
					ws.connDead(conn)
					return
				}
				continue
			}
			if ws.sharded {
				ws.connFailed(conn)
				return
			}
			// A broken connection: go-redis reconnects on the next receive.
			select {
			case <-ws.c.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		pinged = time.Time{} // anything that arrives shows the connection lives
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				ws.confirm(m.Channel)
			case "sunsubscribe":
				ws.dropped(conn, m.Channel)
			}
		case *redis.Message:
			ws.route(m)
		}
	}
}

// dropped handles an SUNSUBSCRIBE on a sharded connection: for a channel the
// client still listens on there, it comes from the node, which no longer
// serves the channel's slot.
func (ws *waiting) dropped(conn *pubsubConn, channel string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	sub := ws.channels[channel]
	if sub == nil || sub.conn != conn {
		return // one the client dropped itself, or already moved
	}
	delete(conn.subs, sub)
	sub.conn = nil
	ws.rehomeLocked([]*subscription{sub})
}

// connFailed drops a sharded connection that failed, and subscribes its
// locks again.
func (ws *waiting) connFailed(conn *pubsubConn) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if conn.closed {
		return
	}
	var moved []*subscription
	for sub := range conn.subs {
		sub.conn = nil
		moved = append(moved, sub)
	}
	ws.closeConnLocked(conn)
	ws.rehomeLocked(moved)
}

// connDead closes a connection that stopped answering, and subscribes its
// locks again: on a sharded Cluster, on their slots' masters as the cluster
// now has them (a hung master may have been failed over); elsewhere on a
// new shared connection, which go-redis opens to the master it now knows.
func (ws *waiting) connDead(conn *pubsubConn) {
	if ws.sharded {
		ws.connFailed(conn)
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if conn.closed {
		return
	}
	conn.closed = true
	_ = conn.ps.Close()
	if ws.shared == conn {
		ws.shared = nil
	}
	var moved []*subscription
	for _, sub := range ws.subs {
		if sub.conn == conn {
			sub.conn = nil
			moved = append(moved, sub)
		}
	}
	ws.rehomeLocked(moved)
}

// rehomeLocked subscribes locks that lost their connection again, on their
// slots' masters as the cluster has them once it reloaded its state (or on
// the shared connection, unless sharded), trying until it succeeds, the
// lock is no longer subscribed, or the client closes. Their waiters retry
// once the new subscription confirms (see confirm), since they may have
// missed a message; until then they only poll. They neither subscribe nor
// retry at once themselves: until the client has reloaded the cluster's
// state, both would go to the node that was lost, and a hung node holds a
// call for its timeouts, while the waiter could not hear the hand-over.
func (ws *waiting) rehomeLocked(subs []*subscription) {
	if len(subs) == 0 || ws.closed {
		return
	}
	for _, sub := range subs {
		sub.subscribing = true
	}
	cc, _ := ws.c.rdb.(*redis.ClusterClient)
	ws.c.loops.Add(1)
	go func() {
		defer ws.c.loops.Done()
		pause := 50 * time.Millisecond
		for len(subs) > 0 {
			if cc != nil {
				cc.ReloadState(context.Background())
			}
			select {
			case <-ws.c.done:
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
			ws.mu.Lock()
			var left []*subscription
			for _, sub := range subs {
				if ws.closed || ws.subs[sub.lock] != sub || sub.conn != nil {
					sub.subscribing = false
					continue // closed, dropped, or subscribed already
				}
				if err := ws.subscribeLocked(ctx, sub); err != nil {
					left = append(left, sub)
					continue
				}
				sub.subscribing = false
			}
			ws.mu.Unlock()
			cancel()
			subs = left
		}
	}()
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
		// Subscribed again after a reconnection or a move: anything may
		// have been missed.
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
