package server

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// limits enforces the server's bounds (C2 #ct2-limits, C5 #ct5-limits).
// Every refusal is RESOURCE_EXHAUSTED with reason LIMIT and the bound's
// name, counted in lockd_limit_rejections_total{limit}, and happens before
// anything is written. Nothing here is on the heartbeat path: KeepAlive
// requests of existing sessions are never refused or delayed by a bound, so
// load from new clients is turned away before it can cost the sessions that
// exist.
//
// Counters that must agree with the session table (sessions, opens,
// acquiring) are guarded by Server.mu; the waiter counts by mu; the rest are
// atomic.
type limits struct {
	cfg Config
	met *telemetry.LimitMetrics

	conns   atomic.Int64 // client connections open (stats handler)
	streams atomic.Int64 // KeepAlive and Watch streams open
	watches atomic.Int64 // Watch streams open

	// Guarded by Server.mu.
	opens     int                     // OpenSession calls past admission and not yet registered
	acquiring map[store.SessionID]int // Acquire calls in progress, per session

	mu      sync.Mutex
	waiters int            // Acquire calls with wait in progress
	perKey  map[string]int // the same, per key
}

func newLimits(cfg Config, met *telemetry.LimitMetrics) *limits {
	return &limits{cfg: cfg, met: met, acquiring: map[store.SessionID]int{}, perKey: map[string]int{}}
}

// refuse counts a refusal by limit and returns the status error the RPC
// returns; the format says what was reached.
func (l *limits) refuse(limit, format string, args ...any) error {
	l.met.Rejected(limit)
	return wireerr.LimitStatus(limit, "limit reached: "+fmt.Sprintf(format, args...)).Err()
}

// checkMaxTTL refuses a session TTL above lock.session.max-ttl (field
// ttl_ms): invalid input on this server, not a limit to wait out.
func (s *Server) checkMaxTTL(ttl time.Duration) error {
	if ttl > s.cfg.MaxTTL {
		return invalidf("ttl_ms", "%v exceeds lock.session.max-ttl (%v)", ttl, s.cfg.MaxTTL)
	}
	return nil
}

// admitOpen admits one OpenSession call, or refuses it when
// max-session-opens calls are in progress or max-sessions sessions are kept
// (counting those being opened). The returned release must be called once
// the call has registered its session or failed.
func (s *Server) admitOpen() (release func(), err error) {
	l := s.lim
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case l.opens >= l.cfg.MaxSessionOpens:
		return nil, l.refuse(wireerr.LimitSessionOpens, "%d sessions are being opened (lock.server.max-session-opens)", l.opens)
	case len(s.sessions)+l.opens >= l.cfg.MaxSessions:
		return nil, l.refuse(wireerr.LimitSessions, "%d sessions (lock.server.max-sessions)", l.cfg.MaxSessions)
	}
	l.opens++
	return func() {
		s.mu.Lock()
		l.opens--
		s.mu.Unlock()
	}, nil
}

// acquireSlot is one admitted Acquire call's place in the counts of
// admitAcquire.
type acquireSlot struct {
	s         *Server
	id        store.SessionID
	key       string
	wait      bool
	acquiring bool // still counted in limits.acquiring (Server.mu)
}

// heldLocked ends the call's in-progress count (Server.mu held): the
// Acquire calls it in the critical section that records its grant in the
// session's locks, so a grant counts once — as held — from that instant,
// not also as in progress until the call returns (C2 #ct2-limits, LIM-1).
func (a *acquireSlot) heldLocked() {
	if !a.acquiring {
		return
	}
	a.acquiring = false
	l := a.s.lim
	if l.acquiring[a.id]--; l.acquiring[a.id] <= 0 {
		delete(l.acquiring, a.id)
	}
}

// release ends what admitAcquire counted and heldLocked did not: called
// once, when the call returns.
func (a *acquireSlot) release() {
	a.s.mu.Lock()
	a.heldLocked()
	a.s.mu.Unlock()
	if !a.wait {
		return
	}
	l := a.s.lim
	l.mu.Lock()
	l.waiters--
	if l.perKey[a.key]--; l.perKey[a.key] <= 0 {
		delete(l.perKey, a.key)
	}
	l.mu.Unlock()
}

// admitAcquire admits one Acquire call of the session ss (pinned), or
// refuses it when it would take the session past max-locks-per-session or,
// for a waiting acquire, the server past max-waiters or the key past
// max-waiters-per-key. Asking again for a key the session holds is always
// admitted. The call counts as in progress until its grant is recorded
// (acquireSlot.heldLocked) or it returns; the slot's release must be
// called when the call returns.
func (s *Server) admitAcquire(ss *session, key string, wait bool) (*acquireSlot, error) {
	l := s.lim
	s.mu.Lock()
	_, holds := ss.locks[key]
	if n := len(ss.locks) + l.acquiring[ss.id]; !holds && n >= l.cfg.MaxLocksPerSession {
		s.mu.Unlock()
		return nil, l.refuse(wireerr.LimitLocksPerSession, "the session holds or is acquiring %d keys (lock.server.max-locks-per-session)", n)
	}
	l.acquiring[ss.id]++
	s.mu.Unlock()
	a := &acquireSlot{s: s, id: ss.id, key: key, acquiring: true}
	if !wait {
		return a, nil
	}
	var err error
	l.mu.Lock()
	switch {
	case l.waiters >= l.cfg.MaxWaiters:
		err = l.refuse(wireerr.LimitWaiters, "%d acquires are waiting (lock.server.max-waiters)", l.waiters)
	case l.perKey[key] >= l.cfg.MaxWaitersPerKey:
		err = l.refuse(wireerr.LimitWaitersPerKey, "%d acquires are waiting for the key (lock.server.max-waiters-per-key)", l.perKey[key])
	default:
		l.waiters++
		l.perKey[key]++
		a.wait = true
	}
	l.mu.Unlock()
	if err != nil {
		a.release()
		return nil, err
	}
	return a, nil
}

// lockdMethod reports whether a full gRPC method name is one of
// lockd.v1.LockService's (the health and reflection services are not
// limited).
func lockdMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+lockdv1.LockService_ServiceDesc.ServiceName+"/")
}

// connState is what the stats handler knows of one connection.
type connState struct{ admitted atomic.Bool }

type connStateKey struct{}

// TagConn, HandleConn, TagRPC and HandleRPC make limits the gRPC stats
// handler that counts connections: a connection accepted while
// max-connections others are open is not admitted, and every lockd RPC on
// it is refused.
func (l *limits) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connStateKey{}, &connState{})
}

func (l *limits) HandleConn(ctx context.Context, cs stats.ConnStats) {
	st, _ := ctx.Value(connStateKey{}).(*connState)
	if st == nil {
		return
	}
	switch cs.(type) {
	case *stats.ConnBegin:
		st.admitted.Store(l.conns.Add(1) <= int64(l.cfg.MaxConnections))
	case *stats.ConnEnd:
		l.conns.Add(-1)
	}
}

func (l *limits) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (l *limits) HandleRPC(context.Context, stats.RPCStats)                       {}

// admitConn refuses an RPC on a connection that was not admitted.
func (l *limits) admitConn(ctx context.Context) error {
	if st, _ := ctx.Value(connStateKey{}).(*connState); st != nil && !st.admitted.Load() {
		return l.refuse(wireerr.LimitConnections, "over %d connections (lock.server.max-connections)", l.cfg.MaxConnections)
	}
	return nil
}

// unaryLimits refuses unary lockd RPCs on connections that were not
// admitted.
func (s *Server) unaryLimits(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if lockdMethod(info.FullMethod) {
		if err := s.lim.admitConn(ctx); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// streamLimits refuses streaming lockd RPCs on connections that were not
// admitted, and KeepAlive and Watch streams beyond max-streams (Watch also
// beyond max-watches). It counts a stream for as long as its handler runs.
func (s *Server) streamLimits(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !lockdMethod(info.FullMethod) {
		return handler(srv, ss)
	}
	l := s.lim
	if err := l.admitConn(ss.Context()); err != nil {
		return err
	}
	if n := l.streams.Add(1); n > int64(l.cfg.MaxStreams) {
		l.streams.Add(-1)
		return l.refuse(wireerr.LimitStreams, "%d streams are open (lock.server.max-streams)", l.cfg.MaxStreams)
	}
	defer l.streams.Add(-1)
	if info.FullMethod == lockdv1.LockService_Watch_FullMethodName {
		if n := l.watches.Add(1); n > int64(l.cfg.MaxWatches) {
			l.watches.Add(-1)
			return l.refuse(wireerr.LimitWatches, "%d watches are open (lock.server.max-watches)", l.cfg.MaxWatches)
		}
		defer l.watches.Add(-1)
	}
	return handler(srv, ss)
}
