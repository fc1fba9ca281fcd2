package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// ListSessions implements store.LockStore (C2 #ct2-list-sessions):
// every live session of the schema, read in one statement. It extends
// nothing: Remaining is expires_at − now() on the database clock.
func (s *Store) ListSessions(ctx context.Context, q store.SessionQuery) (_ []store.SessionInfo, err error) {
	limit, err := store.CheckSessionQuery(q)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list sessions: %w", err)
	}
	if err := s.begin(ctx, "list sessions"); err != nil {
		return nil, err
	}
	defer s.metrics.Observe(telemetry.OpListSessions)(&err)
	var principal *string
	if q.ByPrincipal {
		principal = &q.Principal
	}
	out := []store.SessionInfo{}
	rows, err := s.pool.Query(ctx, s.q.listSessions, string(q.After), principal, limit)
	if err == nil {
		var (
			info         store.SessionInfo
			id           string
			labels       []byte
			ttlMS, remMS int64
			locks        int64
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &info.Principal, &info.Owner, &labels, &ttlMS, &remMS, &locks}, func() error {
			info.ID, info.Labels = store.SessionID(id), decodeLabels(labels)
			info.TTL, info.Remaining = time.Duration(ttlMS)*time.Millisecond, time.Duration(max(remMS, 0))*time.Millisecond
			info.Locks = int(locks)
			out = append(out, info)
			return nil
		})
	}
	if err = classify(ctx, "list sessions", err); err != nil {
		return nil, err
	}
	return out, nil
}
