package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// SessionSecretHash implements store.SessionRegistry. The hash is in this
// instance's session record (C2 #ct2-ownership); a session that is unknown
// here, or known dead, is ErrSessionDead. It asks etcd nothing.
func (s *Store) SessionSecretHash(ctx context.Context, id store.SessionID) ([]byte, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	ss := s.sessions[id]
	if ss == nil || ss.dead {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", store.ErrSessionDead)
	}
	return ss.secretHash, nil
}
