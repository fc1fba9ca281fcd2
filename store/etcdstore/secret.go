package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// SessionSecretHash implements store.SessionRegistry. The hash is in the
// session's record in etcd (C2 #ct2-ownership, #ct2-replicas), which every
// Store reads: from this Store's copy when it keeps the session, else with
// one read (that does not adopt it). An unknown or dead session is
// ErrSessionDead.
func (s *Store) SessionSecretHash(ctx context.Context, id store.SessionID) ([]byte, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", err)
	}
	h, _, err := s.recordOf(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: session secret hash: %w", err)
	}
	return h, nil
}
