package redistest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections to a server, and can cut or slow them to
// play a network partition between one client and Redis.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu     sync.Mutex
	cut    bool          // drop everything, keeping connections open
	delay  time.Duration // added before each forwarded chunk
	conns  []net.Conn
	copies sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards to target. It
// stops at cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
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

// Heal forwards traffic normally again.
func (p *Proxy) Heal() { p.set(false, 0) }

func (p *Proxy) set(cut bool, delay time.Duration) {
	p.mu.Lock()
	p.cut, p.delay = cut, delay
	p.mu.Unlock()
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
		go p.forward(server, client)
		go p.forward(client, server)
	}
}

// forward copies src to dst until either side closes or fails, then closes
// both, so a server that dies or restarts resets its clients' connections
// through the proxy as it would without one.
func (p *Proxy) forward(dst, src net.Conn) {
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
