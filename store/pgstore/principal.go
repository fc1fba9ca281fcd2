package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// SessionPrincipal implements store.SessionRegistry: the principal is a
// column of the session's row (migration 0005), so every replica can check
// the caller of a session it adopts (C2 #ct2-ownership). Like
// SessionSecretHash, an expired row that is not reaped yet still answers.
func (s *Store) SessionPrincipal(ctx context.Context, id store.SessionID) (_ string, err error) {
	if err := store.ValidateSessionID(id); err != nil {
		return "", fmt.Errorf("pgstore: session principal: %w", err)
	}
	if err := s.begin(ctx, "session principal"); err != nil {
		return "", err
	}
	// The ownership lookup: counted under the same op as the secret hash.
	defer s.metrics.Observe(telemetry.OpSecretHash)(&err)
	var p string
	err = s.pool.QueryRow(ctx, s.q.principal, string(id)).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("pgstore: session principal: %w", store.ErrSessionDead)
	}
	if err = classify(ctx, "session principal", err); err != nil {
		return "", err
	}
	return p, nil
}
