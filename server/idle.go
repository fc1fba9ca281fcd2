package server

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/stats"

	"lock.dev/lockd/internal/telemetry"
)

// Unauthorised connections (C5 #ct5-idle, issue 23 F1). A connection holds
// a slot of lock.server.max-connections for as long as it is open, so one
// that makes no authorised call — refused every call, only health checks,
// or not even a TLS handshake — is closed ConnAuthTimeout after it was
// accepted. connGuard wraps the gRPC and HTTP listeners (before TLS) and
// arms a timer per accepted connection; the access-control interceptors
// (auth.go) mark the connection of every call they allow, which stops its
// timer for good. A call finds its connection through the gRPC stats
// handler: TagConn looks the connection up by its two addresses (for the
// HTTP/JSON API's in-process hop, the pipe carries the HTTP connection's
// addresses, http_pipe.go) and puts it in the connection's context, which
// every call's context inherits. Idle connections (no call in progress) are
// closed by gRPC's MaxConnectionIdle and net/http's IdleTimeout, not here.
type connGuard struct {
	timeout time.Duration
	met     *telemetry.TransportMetrics

	mu     sync.Mutex
	conns  map[connAddrs]*guardedConn // open accepted connections
	closed bool                       // close began: connections are closed as accepted
}

// connAddrs identifies a TCP connection of this process.
type connAddrs struct{ remote, local string }

func addrsOf(remote, local net.Addr) connAddrs {
	if remote == nil || local == nil {
		return connAddrs{}
	}
	return connAddrs{remote.Network() + "/" + remote.String(), local.Network() + "/" + local.String()}
}

func newConnGuard(timeout time.Duration, met *telemetry.TransportMetrics) *connGuard {
	return &connGuard{timeout: timeout, met: met, conns: map[connAddrs]*guardedConn{}}
}

// listener wraps lis: each connection it accepts is closed timeout after
// its accept unless a call on it was authorised by then. name is the C4
// listener label.
func (g *connGuard) listener(lis net.Listener, name string) net.Listener {
	return &guardedListener{Listener: lis, g: g, name: name}
}

type guardedListener struct {
	net.Listener
	g    *connGuard
	name string
}

func (l *guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &guardedConn{Conn: c, g: l.g, listener: l.name, addrs: addrsOf(c.RemoteAddr(), c.LocalAddr())}
	l.g.mu.Lock()
	if l.g.closed {
		l.g.mu.Unlock()
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.g.conns[gc.addrs] = gc
	// The timer's function only closes the connection (and exits); Close
	// stops it.
	gc.timer = time.AfterFunc(l.g.timeout, gc.expire)
	l.g.mu.Unlock()
	return gc, nil
}

// close stops every timer (Shutdown closes the connections themselves) and
// makes later accepts close their connection at once.
func (g *connGuard) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for _, gc := range g.conns {
		gc.timer.Stop()
	}
}

// authorised marks the connection of a call that access control allowed:
// it is never closed for want of one (a no-op for a connection not from a
// guarded listener, and for one whose every lockd call is refused: over
// max-connections or its principal's share, principal_conns.go).
func (g *connGuard) authorised(ctx context.Context) {
	if connRefused(ctx) {
		return
	}
	if gc, ok := ctx.Value(guardedConnKey{}).(*guardedConn); ok && !gc.authed.Load() {
		gc.authed.Store(true)
		gc.timer.Stop()
	}
}

// guardedConn is an accepted connection under the guard.
type guardedConn struct {
	net.Conn
	g        *connGuard
	listener string
	addrs    connAddrs
	timer    *time.Timer
	authed   atomic.Bool
	once     sync.Once
}

// expire closes the connection unless a call on it was authorised.
func (gc *guardedConn) expire() {
	if gc.authed.Load() {
		return
	}
	gc.g.met.ConnClosed(gc.listener, telemetry.ClosedUnauthorised)
	_ = gc.Close()
}

func (gc *guardedConn) Close() error {
	gc.once.Do(func() {
		gc.g.mu.Lock() // Accept set the timer under it
		gc.timer.Stop()
		if gc.g.conns[gc.addrs] == gc {
			delete(gc.g.conns, gc.addrs)
		}
		gc.g.mu.Unlock()
	})
	return gc.Conn.Close()
}

type guardedConnKey struct{}

// TagConn, HandleConn, TagRPC and HandleRPC make connGuard a gRPC stats
// handler: TagConn puts the guarded connection into the context of the
// gRPC connection, and so of each of its calls.
func (g *connGuard) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	g.mu.Lock()
	gc := g.conns[addrsOf(info.RemoteAddr, info.LocalAddr)]
	g.mu.Unlock()
	if gc == nil {
		return ctx
	}
	return context.WithValue(ctx, guardedConnKey{}, gc)
}

func (g *connGuard) HandleConn(context.Context, stats.ConnStats)                     {}
func (g *connGuard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (g *connGuard) HandleRPC(context.Context, stats.RPCStats)                       {}
