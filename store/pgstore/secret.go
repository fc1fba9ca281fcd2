package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// SessionSecretHash implements store.SessionRegistry: the hash is a column
// of the session's row (migration 0003), so every replica can check the
// secret of a session it adopts (C2 #ct2-ownership). A row that has expired
// but is not reaped yet still answers; no row is ErrSessionDead.
func (s *Store) SessionSecretHash(ctx context.Context, id store.SessionID) (_ []byte, err error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, fmt.Errorf("pgstore: session secret hash: %w", err)
	}
	if err := s.begin(ctx, "session secret hash"); err != nil {
		return nil, err
	}
	defer s.metrics.Observe(telemetry.OpSecretHash)(&err)
	var h []byte
	err = s.pool.QueryRow(ctx, s.q.secretHash, string(id)).Scan(&h)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgstore: session secret hash: %w", store.ErrSessionDead)
	}
	if err = classify(ctx, "session secret hash", err); err != nil {
		return nil, err
	}
	return h, nil
}
