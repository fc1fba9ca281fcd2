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
	max int

	mu sync.Mutex
	n  map[string]int // principal → held; no entry for 0
}

func newPrincipalCounts(max int) *principalCounts {
	return &principalCounts{max: max, n: map[string]int{}}
}

// take counts one more for p, or reports false when p holds max already.
func (c *principalCounts) take(p string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[p] >= c.max {
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

// principalLimits are the per-principal shares of one server.
type principalLimits struct {
	streams, watches *principalCounts
	// sessions is the share of sessions, counted by the session table
	// (admitOpen); az tells whether a policy is in force.
	sessions int
	az       *auth.Authorizer
	lim      *limits
	log      *slog.Logger
	logRate  *rate.Limiter // principal_limit_reached lines (C4)
}

func newPrincipalLimits(cfg Config, lim *limits, az *auth.Authorizer, log *slog.Logger) *principalLimits {
	return &principalLimits{
		sessions: share(cfg.PrincipalMaxSessions, cfg.MaxSessions),
		az:       az,
		streams:  newPrincipalCounts(share(cfg.PrincipalMaxStreams, cfg.MaxStreams)),
		watches:  newPrincipalCounts(share(cfg.PrincipalMaxWatches, cfg.MaxWatches)),
		lim:      lim,
		log:      log,
		logRate:  rate.NewLimiter(transportLogRate, transportLogBurst),
	}
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
		method := strings.TrimPrefix(info.FullMethod, lockServicePrefix)
		if !pl.streams.take(by) {
			return pl.refuse(wireerr.LimitPrincipalStreams, by, method,
				"this principal holds %d streams (lock.server.principal.max-streams)", pl.streams.max)
		}
		defer pl.streams.give(by)
		if info.FullMethod == lockdv1.LockService_Watch_FullMethodName {
			if !pl.watches.take(by) {
				return pl.refuse(wireerr.LimitPrincipalWatches, by, method,
					"this principal holds %d watches (lock.server.principal.max-watches)", pl.watches.max)
			}
			defer pl.watches.give(by)
		}
		return handler(srv, ss)
	}
}
