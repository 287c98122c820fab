package redistest

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a server, and can cut or slow them to
// play a network partition between one client and Redis, or lose replies
// after the server ran the command, as a connection reset does.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool          // drop everything, keeping connections open
	delay time.Duration // added before each forwarded chunk
	// lose is how many replies from the server are still to be lost;
	// loseRate, if above 0, is the chance that any reply is lost.
	lose     int
	loseRate float64
	rand     *rand.Rand
	conns    []net.Conn
	copies   sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target. It
// stops at cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, rand: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	p.copies.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Cut drops all traffic both ways from now on, without closing any
// connection: like a partition, the client hears nothing, not even a reset.
func (p *Proxy) Cut() { p.set(true, 0) }

// Delay holds every chunk of traffic for d before forwarding it.
func (p *Proxy) Delay(d time.Duration) { p.set(false, d) }

// Heal forwards traffic normally again, and loses no more replies.
func (p *Proxy) Heal() { p.set(false, 0) }

func (p *Proxy) set(cut bool, delay time.Duration) {
	p.mu.Lock()
	p.cut, p.delay, p.lose, p.loseRate = cut, delay, 0, 0
	p.mu.Unlock()
}

// LoseReplies makes the next n replies from the server go missing: the
// server has run the command, but the client's connection is reset before
// the reply reaches it, so the client cannot tell whether it ran. go-redis
// sends such a command again on a new connection.
func (p *Proxy) LoseReplies(n int) {
	p.mu.Lock()
	p.lose = n
	p.mu.Unlock()
}

// LoseRepliesAtRandom loses each reply from the server with the chance
// rate, as LoseReplies does, until Heal.
func (p *Proxy) LoseRepliesAtRandom(rate float64) {
	p.mu.Lock()
	p.loseRate = rate
	p.mu.Unlock()
}

// loseReply reports whether the reply in hand is to be lost.
func (p *Proxy) loseReply() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lose > 0 {
		p.lose--
		return true
	}
	return p.loseRate > 0 && p.rand.Float64() < p.loseRate
}

func (p *Proxy) accept() {
	defer p.copies.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.copies.Add(2)
		go p.forward(server, client, false)
		go p.forward(client, server, true)
	}
}

// forward copies src to dst until either side closes or fails, then closes
// both, so a server that dies or restarts resets its clients' connections
// through the proxy as it would without one. On the way back from the server
// (replies), a reply to be lost closes both instead of being written.
func (p *Proxy) forward(dst, src net.Conn, replies bool) {
	defer p.copies.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			cut, delay := p.cut, p.delay
			p.mu.Unlock()
			time.Sleep(delay)
			if replies && p.loseReply() {
				return
			}
			if !cut {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.copies.Wait()
}
