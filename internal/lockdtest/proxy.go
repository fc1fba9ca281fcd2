package lockdtest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is an in-process TCP proxy in front of a lockd server: the network
// between clients and the server in outage tests. Cut drops every
// connection and refuses new ones; Pause holds every byte in flight (a
// partition: connections stay open but nothing arrives); Restore ends
// either.
type Proxy struct {
	lis    net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	cut     bool
	paused  bool
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	closeMu sync.Once
}

// NewProxy starts a proxy to target (host:port) on 127.0.0.1, closed when
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("lockdtest: proxy listen: %v", err)
	}
	p := &Proxy{lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept() // exits when the listener is closed (Close)
	t.Cleanup(func() { p.Close() })
	return p
}

// Addr is the address clients dial instead of the server's.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.dropLocked()
}

// Pause stops forwarding until Restore: connections stay open and bytes
// wait.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Restore ends a Cut or a Pause.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.paused = false, false
	p.cond.Broadcast()
}

// Close stops the proxy, drops every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.closeMu.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.dropLocked()
		p.cond.Broadcast()
		p.mu.Unlock()
		p.lis.Close()
		p.wg.Wait()
	})
	return nil
}

func (p *Proxy) dropLocked() {
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
	p.cond.Broadcast()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			in.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(out, in) // each exits when either side is closed
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, holding bytes while paused.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.paused && !p.cut && !p.closed {
				p.cond.Wait()
			}
			drop := p.cut || p.closed
			p.mu.Unlock()
			if drop {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a closed connection
			return
		}
	}
}
