package server

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"

	"lock.dev/lockd/internal/auth"
	"lock.dev/lockd/internal/telemetry"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// Per-principal shares of the global bounds (C5 #ct5-principal-limits,
// issue 23 F2, F4): while an access policy is in force, one principal may
// hold at most a share of the KeepAlive and Watch streams and of the
// watches, so that it cannot take every slot of max-streams or max-watches
// from the others. Streams and watches sit after the global bounds
// (limits.go); sessions are counted by the session table (admitOpen).

// principalCounts counts what each principal holds of one bounded
// resource. It is safe for concurrent use.
type principalCounts struct {
	mu sync.Mutex
	n  map[string]int // principal → held; no entry for 0
}

func newPrincipalCounts() *principalCounts {
	return &principalCounts{n: map[string]int{}}
}

// take counts one more for p, or reports false when p holds max already.
func (c *principalCounts) take(p string, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[p] >= max {
		return false
	}
	c.n[p]++
	return true
}

// give gives back one that take counted for p.
func (c *principalCounts) give(p string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[p]--; c.n[p] <= 0 {
		delete(c.n, p)
	}
}

// share is a principal's share of the global bound global: v, or 25 % of
// global (at least 1) when v is 0.
func share(v, global int) int {
	if v > 0 {
		return v
	}
	return max(1, global/4)
}

// ShareSource says where a principal's share comes from.
type ShareSource string

// The sources of a share (C5 #ct5-principal-limits).
const (
	SharePolicy  ShareSource = "policy"  // the policy's limits: entry (Line)
	ShareKey     ShareSource = "key"     // the lock.server.principal.* key (Key)
	ShareDefault ShareSource = "default" // 25 % of the global bound (Global, GlobalValue)
	ShareNoRule  ShareSource = "no-rule" // no rule names the principal: no connection
)

// PrincipalShare is one of a principal's shares under a policy.
type PrincipalShare struct {
	Limit  auth.LimitKey // the policy's name of the share, e.g. max-sessions
	N      int
	Source ShareSource
	Line   int    // SharePolicy: the limits: entry's line
	Key    string // the server's key of the share, lock.server.principal.<Limit>
	// Global and GlobalValue: the global bound a default share is a
	// quarter of (max-inflight: lock.server.max-connections × 16).
	Global      string
	GlobalValue int
}

// defaultShares are the server's shares by key under cfg: the
// lock.server.principal.* keys, or 25 % of the global bounds.
func defaultShares(cfg Config) map[auth.LimitKey]PrincipalShare {
	d := map[auth.LimitKey]PrincipalShare{}
	for _, x := range []struct {
		k          auth.LimitKey
		v, global  int
		globalName string
	}{
		{auth.LimitStreams, cfg.PrincipalMaxStreams, cfg.MaxStreams, "lock.server.max-streams"},
		{auth.LimitWatches, cfg.PrincipalMaxWatches, cfg.MaxWatches, "lock.server.max-watches"},
		{auth.LimitSessions, cfg.PrincipalMaxSessions, cfg.MaxSessions, "lock.server.max-sessions"},
		{auth.LimitConnections, cfg.PrincipalMaxConnections, cfg.MaxConnections, "lock.server.max-connections"},
		{auth.LimitWaiters, cfg.PrincipalMaxWaiters, cfg.MaxWaiters, "lock.server.max-waiters"},
		{auth.LimitInflight, cfg.PrincipalMaxInflight, cfg.MaxConnections * inflightPerConnection,
			fmt.Sprintf("lock.server.max-connections × %d", inflightPerConnection)},
		{auth.LimitSessionOpens, cfg.PrincipalMaxSessionOpens, cfg.MaxSessionOpens, "lock.server.max-session-opens"},
	} {
		ps := PrincipalShare{Limit: x.k, N: share(x.v, x.global), Source: ShareKey, Key: "lock.server.principal." + string(x.k)}
		if x.v == 0 {
			ps.Source, ps.Global, ps.GlobalValue = ShareDefault, x.globalName, x.global
		}
		d[x.k] = ps
	}
	return d
}

// shareOf is principal's share of key under pol (non-nil): none of
// connections when no rule names it, else the policy's override, else the
// server's (defaults).
func shareOf(defaults map[auth.LimitKey]PrincipalShare, pol *auth.Policy, principal string, key auth.LimitKey) PrincipalShare {
	ps := defaults[key]
	if key == auth.LimitConnections && !pol.Names(principal) {
		ps.N, ps.Source = 0, ShareNoRule
		return ps
	}
	if n, line, ok := pol.Limit(principal, key); ok {
		ps.N, ps.Source, ps.Line = n, SharePolicy, line
	}
	return ps
}

// PrincipalShares are principal's seven shares under pol as a server with
// cfg applies them, in the order of C5 #ct5-principal-limits (`lockd auth
// check` prints them); nil without a policy (no share applies).
func PrincipalShares(cfg Config, pol *auth.Policy, principal string) []PrincipalShare {
	if pol == nil {
		return nil
	}
	defaults := defaultShares(cfg)
	var out []PrincipalShare
	for _, k := range auth.LimitKeys() {
		out = append(out, shareOf(defaults, pol, principal, k))
	}
	return out
}

// principalLimits are the per-principal shares of one server.
type principalLimits struct {
	streams, watches, conns, waiters, inflight *principalCounts
	opens                                      *openRates // session opens per second (principal_conns.go)
	// defaults are the server's shares by key (C5 keys, or 25 % of the
	// global bounds); the policy's limits: override them per principal.
	defaults map[auth.LimitKey]PrincipalShare
	// az tells whether a policy is in force, and holds its overrides.
	az      *auth.Authorizer
	lim     *limits
	log     *slog.Logger
	logRate *rate.Limiter // principal_limit_reached lines (C4)
}

func newPrincipalLimits(cfg Config, lim *limits, az *auth.Authorizer, log *slog.Logger) *principalLimits {
	return &principalLimits{
		defaults: defaultShares(cfg),
		az:       az,
		streams:  newPrincipalCounts(),
		watches:  newPrincipalCounts(),
		conns:    newPrincipalCounts(),
		waiters:  newPrincipalCounts(),
		inflight: newPrincipalCounts(),
		opens:    newOpenRates(),
		lim:      lim,
		log:      log,
		logRate:  rate.NewLimiter(transportLogRate, transportLogBurst),
	}
}

// inflightPerConnection: the global bound of unary calls in progress that
// the default in-flight share is a quarter of is max-connections × it (C5
// #ct5-principal-limits).
const inflightPerConnection = 16

// share is principal's share of key under pol (non-nil), as
// PrincipalShares shows it.
func (pl *principalLimits) share(pol *auth.Policy, principal string, key auth.LimitKey) int {
	return shareOf(pl.defaults, pol, principal, key).N
}

// refuse answers a call of principal by over its share limit (counted and
// logged, the log rate-limited).
func (pl *principalLimits) refuse(limit, by, method, format string, args ...any) error {
	if pl.logRate.Allow() {
		telemetry.PrincipalLimitReached(pl.log, limit, by, method)
	}
	return pl.lim.refuse(limit, "%s", fmt.Sprintf(format, args...))
}

// principalStreams is the stream interceptor of the shares: it runs after
// the global bounds (streamLimits) and counts a KeepAlive or Watch stream
// against its caller's principal for as long as its handler runs. The
// principal is resolved as access control resolves it (a Watch is
// authorised only when its request arrives); a caller whose credentials are
// refused is left to access control.
func (s *Server) principalStreams(az *auth.Authorizer) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !lockdMethod(info.FullMethod) || az.Policy() == nil {
			return handler(srv, ss)
		}
		by, err := az.Identify(ss.Context())
		if err != nil {
			return handler(srv, ss)
		}
		pl := s.plim
		pol := az.Policy()
		method := strings.TrimPrefix(info.FullMethod, lockServicePrefix)
		if n := pl.share(pol, by, auth.LimitStreams); !pl.streams.take(by, n) {
			return pl.refuse(wireerr.LimitPrincipalStreams, by, method,
				"this principal holds %d streams (lock.server.principal.max-streams)", n)
		}
		defer pl.streams.give(by)
		if info.FullMethod == lockdv1.LockService_Watch_FullMethodName {
			if n := pl.share(pol, by, auth.LimitWatches); !pl.watches.take(by, n) {
				return pl.refuse(wireerr.LimitPrincipalWatches, by, method,
					"this principal holds %d watches (lock.server.principal.max-watches)", n)
			}
			defer pl.watches.give(by)
		}
		return handler(srv, ss)
	}
}
