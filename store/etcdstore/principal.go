package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// SessionPrincipal implements store.SessionRegistry. The principal is in
// the session's record beside the secret hash (C2 #ct2-ownership), read as
// SessionSecretHash reads it; an unknown or dead session is
// ErrSessionDead.
func (s *Store) SessionPrincipal(ctx context.Context, id store.SessionID) (string, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return "", fmt.Errorf("etcdstore: session principal: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: session principal: %w", err)
	}
	_, p, err := s.recordOf(ctx, id)
	if err != nil {
		return "", fmt.Errorf("etcdstore: session principal: %w", err)
	}
	return p, nil
}
