package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/server/internal/sessions"
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
// acquiring) are the table's (server/internal/sessions); the waiter counts
// are guarded by mu; the rest are atomic.
type limits struct {
	cfg Config
	met *telemetry.LimitMetrics

	conns   atomic.Int64 // client connections open (stats handler)
	streams atomic.Int64 // KeepAlive and Watch streams open
	watches atomic.Int64 // Watch streams open

	mu      sync.Mutex
	waiters int            // Acquire calls with wait in progress
	perKey  map[string]int // the same, per key
}

func newLimits(cfg Config, met *telemetry.LimitMetrics) *limits {
	return &limits{cfg: cfg, met: met, perKey: map[string]int{}}
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

// admitOpen admits one OpenSession call of the caller of ctx, or refuses
// it when max-session-opens calls are in progress, max-sessions sessions
// are kept (counting those being opened) or, under a policy, the caller's
// principal keeps its share of sessions (principal_sessions, C5
// #ct5-principal-limits); the session table counts all three. The
// returned release must be called once the call has registered its
// session or failed.
func (s *Server) admitOpen(ctx context.Context) (release func(), err error) {
	principal, share := "", 0
	if pol := s.plim.az.Policy(); pol != nil {
		principal = callerPrincipal(ctx)
		share = s.plim.share(pol, cmp.Or(principal, auth.Anonymous), auth.LimitSessions)
	}
	release, err = s.sess.AdmitOpen(principal, share)
	var le *sessions.LimitError
	switch {
	case err == nil:
		return release, nil
	case errors.As(err, &le) && le.Limit == wireerr.LimitPrincipalSessions:
		by, _, _ := telemetry.CallerOf(ctx)
		return nil, s.plim.refuse(le.Limit, by, "OpenSession",
			"this principal keeps %d sessions (lock.server.principal.max-sessions)", le.N)
	}
	return nil, s.lim.refuseTable(err)
}

// refuseTable turns a refusal of the session table (*sessions.LimitError)
// into the limit's status error.
func (l *limits) refuseTable(err error) error {
	var le *sessions.LimitError
	if !errors.As(err, &le) {
		return err
	}
	switch le.Limit {
	case wireerr.LimitSessionOpens:
		return l.refuse(le.Limit, "%d sessions are being opened (lock.server.max-session-opens)", le.N)
	case wireerr.LimitSessions:
		return l.refuse(le.Limit, "%d sessions (lock.server.max-sessions)", le.N)
	default: // wireerr.LimitLocksPerSession
		return l.refuse(le.Limit, "the session holds or is acquiring %d keys (lock.server.max-locks-per-session)", le.N)
	}
}

// acquireSlot is one admitted Acquire call's place in the counts of
// admitAcquire: the session table's in-progress count (which its Grant
// ends when it tracks the grant, LIM-1) and the waiter counts.
type acquireSlot struct {
	s    *Server
	slot *sessions.Slot
	key  string
	wait bool
}

// release ends what admitAcquire counted and the grant did not: called
// once, when the call returns.
func (a *acquireSlot) release() {
	a.slot.Done()
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

// admitAcquire admits one Acquire call of the session r (pinned), or
// refuses it when it would take the session past max-locks-per-session or,
// for a waiting acquire, the server past max-waiters or the key past
// max-waiters-per-key. Asking again for a key the session holds is always
// admitted. The call counts as in progress until its grant is tracked
// (sessions.Table.Grant) or it returns; the slot's release must be called
// when the call returns.
func (s *Server) admitAcquire(r *sessions.Record, key string, wait bool) (*acquireSlot, error) {
	l := s.lim
	slot, err := s.sess.AdmitAcquire(r, key)
	if err != nil {
		return nil, l.refuseTable(err)
	}
	a := &acquireSlot{s: s, slot: slot, key: key}
	if !wait {
		return a, nil
	}
	queued := 0 // this lockd's acquires already waiting for key
	l.mu.Lock()
	switch {
	case l.waiters >= l.cfg.MaxWaiters:
		err = l.refuse(wireerr.LimitWaiters, "%d acquires are waiting (lock.server.max-waiters)", l.waiters)
	case l.perKey[key] >= l.cfg.MaxWaitersPerKey:
		err = l.refuse(wireerr.LimitWaitersPerKey, "%d acquires are waiting for the key (lock.server.max-waiters-per-key)", l.perKey[key])
	default:
		queued = l.perKey[key]
		l.waiters++
		l.perKey[key]++
		a.wait = true
	}
	l.mu.Unlock()
	if err != nil {
		a.release()
		return nil, err
	}
	s.stats.Queued(s.stats.Template(key), queued)
	s.hot.Contended(key)
	return a, nil
}

// lockdMethod reports whether a full gRPC method name is one of
// lockd.v1.LockService's (the health and reflection services are not
// limited).
func lockdMethod(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+lockdv1.LockService_ServiceDesc.ServiceName+"/")
}

// connState is what the stats handler knows of one connection.
type connState struct {
	admitted atomic.Bool
	counted  atomic.Bool // holds a slot of max-connections
}

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
		if pc := pconnOf(ctx); pc != nil && pc.over.Load() {
			return // over its principal's share: no slot (principal_conns.go)
		}
		st.counted.Store(true)
		st.admitted.Store(l.conns.Add(1) <= int64(l.cfg.MaxConnections))
	case *stats.ConnEnd:
		l.uncount(ctx)
	}
}

// uncount gives back the slot of max-connections of the connection of ctx,
// once.
func (l *limits) uncount(ctx context.Context) {
	if st, _ := ctx.Value(connStateKey{}).(*connState); st != nil && st.counted.CompareAndSwap(true, false) {
		l.conns.Add(-1)
	}
}

func (l *limits) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (l *limits) HandleRPC(context.Context, stats.RPCStats)                       {}

// admitConn refuses an RPC on a connection that was not admitted, or
// that is over its principal's share (principal_conns.go).
func (l *limits) admitConn(ctx context.Context) error {
	if pc := pconnOf(ctx); pc != nil && pc.over.Load() {
		return l.refuse(wireerr.LimitPrincipalConnections, "this principal holds its share of connections (lock.server.principal.max-connections)")
	}
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
