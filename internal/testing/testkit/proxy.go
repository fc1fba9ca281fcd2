package testkit

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is an in-process TCP proxy between clients and a server (etcd,
// PostgreSQL, lockd). It stands in for the network in outage tests: Cut
// drops every connection and refuses new ones, Pause holds every byte in
// flight (a partition: connections stay open but nothing arrives), Restore
// ends either. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*proxyConn]struct{}
	cut    bool
	paused chan struct{} // non-nil while paused; closed by Restore
	closed bool

	wg sync.WaitGroup
}

type proxyConn struct {
	client, server net.Conn
	done           chan struct{}
	once           sync.Once
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		c.client.Close()
		c.server.Close()
	})
}

// NewProxy starts a proxy on 127.0.0.1 to target (host:port), closed when
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[*proxyConn]struct{})}
	p.wg.Add(1)
	go p.accept() // exits when Close closes the listener
	t.Cleanup(func() { p.Close() })
	return p
}

// Addr is the address (host:port) clients dial instead of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.close()
	}
}

// Pause stops forwarding: connections stay open, and bytes sent either way
// are held until Restore (or dropped by Cut/Close).
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
}

// Restore ends a Cut or a Pause.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// Close stops the proxy, drops every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.ln.Close()
		for c := range p.conns {
			c.close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.cut || p.closed
		p.mu.Unlock()
		if refuse {
			cc.Close()
			continue
		}
		sc, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			cc.Close()
			continue
		}
		c := &proxyConn{client: cc, server: sc, done: make(chan struct{})}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			c.close()
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		// Each copy ends when either side closes; the first to end closes
		// both, so the other follows.
		go p.pipe(c, cc, sc)
		go p.pipe(c, sc, cc)
	}
}

func (p *Proxy) pipe(c *proxyConn, from, to net.Conn) {
	defer p.wg.Done()
	defer func() {
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if !p.gate(c) {
				return
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or closed: either way this direction is done
		}
	}
}

// gate waits while the proxy is paused; false if the connection was closed
// meanwhile.
func (p *Proxy) gate(c *proxyConn) bool {
	for {
		p.mu.Lock()
		paused := p.paused
		p.mu.Unlock()
		if paused == nil {
			select {
			case <-c.done:
				return false
			default:
				return true
			}
		}
		select {
		case <-paused:
		case <-c.done:
			return false
		}
	}
}
