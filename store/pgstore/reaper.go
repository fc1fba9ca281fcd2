package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

const (
	// reapBatch is how many sessions one reaper transaction deletes.
	reapBatch = 500
	// reapTimeout bounds one reaper run, so a hung connection cannot stall
	// the reaper for longer.
	reapTimeout = 30 * time.Second
)

// reapLoop runs the reaper every reaperInterval until ctx is cancelled.
func (s *Store) reapLoop(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.reaperInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.reap(ctx)
		}
	}
}

// reap deletes the sessions whose expires_at has passed, in batches; the
// cascade deletes their locks and queue entries. Rows are claimed with FOR
// UPDATE SKIP LOCKED, so concurrent reapers (other replicas) never wait for
// or double-count each other, and a row a heartbeat is updating right now is
// left for the next run. Failures are counted in
// lockd_backend_errors_total{op="reap"} and retried on the next tick.
func (s *Store) reap(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	s.reapHolds(ctx) // maximum hold and lock-delay residue (delay.go)
	for {
		ids, grants, err := s.reapOnce(ctx)
		if err != nil {
			return
		}
		// Committed: the ends are recorded first (C4), then the
		// lock-delays the cascade started are stamped (delay.go; a
		// failure leaves them to the next run). A pending delay keeps its
		// key either way.
		bySession := make(map[store.SessionID][]store.Grant)
		for _, g := range grants {
			bySession[g.Session] = append(bySession[g.Session], g)
		}
		for _, id := range ids {
			s.sessionExpired(store.SessionID(id), bySession[store.SessionID(id)])
		}
		if len(grants) > 0 {
			_ = s.stampDelays(ctx)
		}
		if len(ids) < reapBatch {
			return
		}
	}
}

// reapOnce deletes up to reapBatch expired sessions in one transaction and
// returns their ids and the grants deleted with them. It is observed as one
// request.
func (s *Store) reapOnce(ctx context.Context) (ids []string, grants []store.Grant, err error) {
	defer s.metrics.Observe(telemetry.OpReap)(&err)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		ids, grants = nil, nil
		rows, err := tx.Query(ctx, s.q.reapSelect, reapBatch)
		if err != nil {
			return err
		}
		if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(ids) == 0 {
			return err
		}
		rows, err = tx.Query(ctx, s.q.reapLocks, ids)
		if err != nil {
			return err
		}
		grants, err = pgx.CollectRows(rows, grantRow)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.q.notifiedSelf); err != nil {
			return err
		}
		// FOR UPDATE above keeps grants out of these sessions, so the
		// cascade deletes exactly the locks read above.
		if _, err := tx.Exec(ctx, s.q.reapDelete, ids); err != nil {
			return err
		}
		return s.notifyExpired(ctx, tx, grants)
	})
	return ids, grants, classify(ctx, "reap", err)
}

// grantRow scans a (session_id, key, token, acquired_at) row into a grant.
func grantRow(r pgx.CollectableRow) (store.Grant, error) {
	var g store.Grant
	var sid string
	var tok int64
	err := r.Scan(&sid, &g.Key, &tok, &g.AcquiredAt)
	g.Session, g.Token = store.SessionID(sid), uint64(tok)
	return g, err
}
