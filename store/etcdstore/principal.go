package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// SessionPrincipal implements store.SessionRegistry. The principal is in
// this instance's session record beside the secret hash (C2
// #ct2-ownership); a session that is unknown here, or known dead, is
// ErrSessionDead. It asks etcd nothing.
func (s *Store) SessionPrincipal(ctx context.Context, id store.SessionID) (string, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return "", fmt.Errorf("etcdstore: session principal: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: session principal: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errClosed
	}
	ss := s.sessions[id]
	if ss == nil || ss.dead {
		return "", fmt.Errorf("etcdstore: session principal: %w", store.ErrSessionDead)
	}
	return ss.principal, nil
}
