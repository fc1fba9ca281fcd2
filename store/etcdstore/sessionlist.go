package etcdstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

var _ store.SessionLister = (*Store)(nil)

// ListSessions implements store.SessionLister (C2 #ct2-list-sessions): the
// live sessions of this instance, the only ones usable through it, from its
// own records. It asks etcd nothing and extends nothing: Remaining is the
// bound of the last answered keepalive (as Heartbeat reports it), Locks the
// instance's record of the session's grants.
func (s *Store) ListSessions(ctx context.Context, q store.SessionQuery) (_ []store.SessionInfo, err error) {
	defer s.met.Observe(telemetry.OpListSessions)(&err)
	limit, err := store.CheckSessionQuery(q)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list sessions: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcdstore: list sessions: %w", err)
	}
	now := time.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	var out []store.SessionInfo
	for id, ss := range s.sessions {
		if ss.dead || id <= q.After || (q.ByPrincipal && ss.principal != q.Principal) {
			continue
		}
		rem := s.keep.remaining(ss, now)
		if rem <= 0 {
			continue // no answered keepalive covers now: not provably live
		}
		out = append(out, store.SessionInfo{ID: ss.id, Principal: ss.principal, Owner: ss.owner, Labels: maps.Clone(ss.labels),
			TTL: ss.ttl, Remaining: rem, Locks: len(ss.held)})
	}
	slices.SortFunc(out, func(a, b store.SessionInfo) int { return strings.Compare(string(a.ID), string(b.ID)) })
	if len(out) > limit {
		out = out[:limit]
	}
	s.mu.Unlock()
	return out, nil
}
