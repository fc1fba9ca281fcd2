package server

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// Per-principal shares of connections, in-flight calls, waiters and session
// opens per second (C5 #ct5-principal-limits, issue 23 F1): the rest of
// principal_limits.go's shares, applied while a policy is in force.
//
// Connections. A connection counts for the principal of its verified client
// certificate from its handshake (ConnBegin, before the global count of
// limits.go, which skips a connection over its principal's share), else
// for the principal of its first call that access control identifies
// (authorize calls identifyConn; the global slot it took is then given
// back). A connection over its share is refused every lockd call
// (admitConn) and never authorised (connGuard.authorised), so the
// conn-auth-timeout closes it. A principal no rule names has no share.

// pconn is what the per-principal count knows of one connection.
type pconn struct {
	seen atomic.Bool // a principal was assigned (or the connection ended)
	over atomic.Bool // over its principal's share: refused, not in max-connections

	mu        sync.Mutex
	principal string
	counted   bool // holds a slot of principal's connections
	ended     bool // ConnEnd ran: nothing is counted any more
}

type pconnKey struct{}

func pconnOf(ctx context.Context) *pconn {
	pc, _ := ctx.Value(pconnKey{}).(*pconn)
	return pc
}

// principalConns is the gRPC stats handler of the per-principal connection
// count; it must be registered before limits (limits.go), whose ConnBegin
// reads what it decided.
type principalConns struct{ pl *principalLimits }

func (h principalConns) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, pconnKey{}, &pconn{})
}

func (h principalConns) HandleConn(ctx context.Context, cs stats.ConnStats) {
	pc := pconnOf(ctx)
	if pc == nil {
		return
	}
	switch cs.(type) {
	case *stats.ConnBegin:
		pol := h.pl.az.Policy()
		if pol == nil {
			return
		}
		if p := auth.CertificatePrincipal(auth.PeerCertificate(ctx)); p != "" {
			h.pl.assign(pol, pc, p, "connection")
		}
	case *stats.ConnEnd:
		pc.mu.Lock()
		defer pc.mu.Unlock()
		pc.ended = true
		pc.seen.Store(true)
		if pc.counted {
			h.pl.conns.give(pc.principal)
			pc.counted = false
		}
	}
}

func (h principalConns) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h principalConns) HandleRPC(context.Context, stats.RPCStats)                       {}

// assign counts pc for principal p (once per connection) and reports
// whether that put it over p's share.
func (pl *principalLimits) assign(pol *auth.Policy, pc *pconn, p, method string) (over bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.seen.Load() || pc.ended {
		return false
	}
	pc.seen.Store(true)
	pc.principal = p
	n := pl.share(pol, p, auth.LimitConnections) // 0 for a principal no rule names
	if pl.conns.take(p, n) {
		pc.counted = true
		return false
	}
	pc.over.Store(true)
	if pl.logRate.Allow() {
		telemetry.PrincipalLimitReached(pl.log, wireerr.LimitPrincipalConnections, p, method)
	}
	return true
}

// identifyConn counts the connection of a call that access control allowed
// for principal, unless its certificate counted it at the handshake; a
// connection that goes over its principal's share gives back its slot of
// max-connections.
func (s *Server) identifyConn(ctx context.Context, principal, method string) {
	pc := pconnOf(ctx)
	if pc == nil || pc.seen.Load() {
		return
	}
	if pol := s.plim.az.Policy(); pol != nil && s.plim.assign(pol, pc, principal, method) {
		s.lim.uncount(ctx)
	}
}

// connRefused reports whether every lockd call on the connection of ctx is
// refused (over max-connections or over its principal's share): such a
// connection is never authorised (idle.go).
func connRefused(ctx context.Context) bool {
	if pc := pconnOf(ctx); pc != nil && pc.over.Load() {
		return true
	}
	st, _ := ctx.Value(connStateKey{}).(*connState)
	return st != nil && !st.admitted.Load()
}

// openRates are the per-principal buckets of session opens per second;
// buckets of at most maxRefusalPeers principals are kept (full ones are
// forgotten first; beyond, new principals share one bucket).
type openRates struct {
	mu       sync.Mutex
	buckets  map[string]*rate.Limiter
	overflow *rate.Limiter
}

func newOpenRates() *openRates { return &openRates{buckets: map[string]*rate.Limiter{}} }

// allow takes one open of p from a bucket of n per second (burst n).
func (o *openRates) allow(p string, n int) bool {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.buckets[p]
	if l == nil {
		if len(o.buckets) >= maxRefusalPeers {
			for k, b := range o.buckets {
				if b.TokensAt(now) >= float64(b.Burst()) {
					delete(o.buckets, k)
				}
			}
		}
		if len(o.buckets) >= maxRefusalPeers {
			if o.overflow == nil {
				o.overflow = rate.NewLimiter(rate.Limit(n), n)
			}
			return o.overflow.AllowN(now, 1)
		}
		l = rate.NewLimiter(rate.Limit(n), n)
		o.buckets[p] = l
	}
	if l.Burst() != n { // the share changed (a policy reload): a new bucket
		l = rate.NewLimiter(rate.Limit(n), n)
		o.buckets[p] = l
	}
	return l.AllowN(now, 1)
}

// principalUnary is the unary interceptor of the in-flight, waiter and
// session-open shares: it runs after access control and the global bounds
// and counts a call against its caller's principal for as long as its
// handler runs.
func (s *Server) principalUnary(az *auth.Authorizer) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method, ok := strings.CutPrefix(info.FullMethod, lockServicePrefix)
		pol := az.Policy()
		if !ok || pol == nil {
			return handler(ctx, req)
		}
		by, _, known := telemetry.CallerOf(ctx)
		if !known {
			var err error
			if by, err = az.Identify(ctx); err != nil {
				return handler(ctx, req) // access control answers it
			}
		}
		pl := s.plim
		if n := pl.share(pol, by, auth.LimitInflight); !pl.inflight.take(by, n) {
			return nil, pl.refuse(wireerr.LimitPrincipalInflight, by, method,
				"this principal has %d calls in progress (lock.server.principal.max-inflight)", n)
		}
		defer pl.inflight.give(by)
		switch r := req.(type) {
		case *lockdv1.AcquireRequest:
			if r.Wait {
				if n := pl.share(pol, by, auth.LimitWaiters); !pl.waiters.take(by, n) {
					return nil, pl.refuse(wireerr.LimitPrincipalWaiters, by, method,
						"this principal has %d acquires waiting (lock.server.principal.max-waiters)", n)
				}
				defer pl.waiters.give(by)
			}
		case *lockdv1.OpenSessionRequest:
			if n := pl.share(pol, by, auth.LimitSessionOpens); !pl.opens.allow(by, n) {
				return nil, pl.refuse(wireerr.LimitPrincipalSessionOpens, by, method,
					"this principal opened %d sessions in the last second (lock.server.principal.max-session-opens)", n)
			}
		}
		return handler(ctx, req)
	}
}
