package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// OpenSession implements store.SessionRegistry.
func (s *Store) OpenSession(ctx context.Context, ttl time.Duration, opts ...store.SessionOption) (_ store.Session, err error) {
	if err := store.ValidateTTL(ttl); err != nil {
		return store.Session{}, fmt.Errorf("pgstore: open session: %w", err)
	}
	o, err := store.NewSessionOptions(opts...)
	if err != nil {
		return store.Session{}, fmt.Errorf("pgstore: open session: %w", err)
	}
	if err := s.begin(ctx, "open session"); err != nil {
		return store.Session{}, err
	}
	defer s.metrics.Observe(telemetry.OpOpenSession)(&err)
	id := store.NewSessionID()
	labels, err := json.Marshal(o.Labels)
	if err != nil || o.Labels == nil {
		labels = []byte("{}")
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.q.openSession, string(id), ttl.Milliseconds(), o.SecretHash, o.Owner, string(labels), o.Principal)
		return err
	})
	if err = classify(ctx, "open session", err); err != nil {
		return store.Session{}, err
	}
	s.log.SessionOpened(id, ttl)
	s.metrics.SessionOpened()
	// expires_at = now() + ttl, and the database's now() is later than our
	// receipt of the call: the full TTL is a lower bound from receipt.
	return store.Session{ID: id, TTL: ttl, Remaining: ttl}, nil
}

// Heartbeat implements store.SessionRegistry. It extends a live session by
// its TTL from the database's now(); an expired session (even one the reaper
// has not deleted yet) is never extended and is reported not live.
// Concurrent heartbeats share one UPDATE (group commit).
func (s *Store) Heartbeat(ctx context.Context, id store.SessionID) (_ store.Liveness, err error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Liveness{}, fmt.Errorf("pgstore: heartbeat: %w", err)
	}
	if err := s.begin(ctx, "heartbeat"); err != nil {
		return store.Liveness{}, err
	}
	defer s.metrics.Observe(telemetry.OpHeartbeat)(&err)
	r := &hbReq{id: id}
	j, err := s.hbQ.Submit(ctx, "", r)
	if err == nil {
		if _, err = s.hbQ.Wait(ctx, j); err == nil {
			err = r.err
		}
	}
	return hbResult(ctx, r, err)
}

// HeartbeatMany implements store.HeartbeatBatcher (C2 #ct2-heartbeat-many):
// Heartbeat of every id, their renewals submitted to the heartbeat group
// commit at once, so that they share one UPDATE (unless the batch cap
// splits them).
func (s *Store) HeartbeatMany(ctx context.Context, ids []store.SessionID) ([]store.Liveness, []error) {
	lvs := make([]store.Liveness, len(ids))
	errs := make([]error, len(ids))
	var (
		at   []int // the index in ids of each request submitted
		reqs []*hbReq
		obs  []func(*error)
	)
	for i, id := range ids {
		if err := store.ValidateSessionID(id); err != nil {
			errs[i] = fmt.Errorf("pgstore: heartbeat: %w", err)
			continue
		}
		if err := s.begin(ctx, "heartbeat"); err != nil {
			errs[i] = err
			continue
		}
		at = append(at, i)
		reqs = append(reqs, &hbReq{id: id})
		obs = append(obs, s.metrics.Observe(telemetry.OpHeartbeat))
	}
	if len(reqs) == 0 {
		return lvs, errs
	}
	jobs, err := s.hbQ.SubmitAll(ctx, "", reqs)
	for k, i := range at {
		r := reqs[k]
		err := err
		if err == nil {
			if _, err = s.hbQ.Wait(ctx, jobs[k]); err == nil {
				err = r.err
			}
		}
		lvs[i], errs[i] = hbResult(ctx, r, err)
		obs[k](&errs[i])
	}
	return lvs, errs
}

// hbResult is the answer of the heartbeat r whose group commit ended with
// err.
func hbResult(ctx context.Context, r *hbReq, err error) (store.Liveness, error) {
	if err = result(ctx, "heartbeat", err); err != nil || !r.live {
		return store.Liveness{}, err
	}
	// The new expires_at is now() + TTL with the database's now() later
	// than our receipt of the call (C2 #ct2-deadline).
	return store.Liveness{Live: true, Remaining: time.Duration(r.ttlMS) * time.Millisecond}, nil
}

// CloseSession implements store.SessionRegistry. Deleting the session row
// deletes its locks and queue entries by cascade; the watch reports those
// locks as EventExpired. A session that had already expired (but was not yet
// reaped) is deleted as the reaper would and counts as 0 released: its
// locks were already forfeit.
func (s *Store) CloseSession(ctx context.Context, id store.SessionID) (int, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return 0, fmt.Errorf("pgstore: close session: %w", err)
	}
	if err := s.begin(ctx, "close session"); err != nil {
		return 0, err
	}
	found, live, grants, err := s.closeSession(ctx, id)
	if err != nil || !found {
		return 0, err
	}
	if !live {
		s.sessionExpired(id, grants)
		return 0, nil
	}
	s.logReleased(grants, telemetry.ReleaseSessionClosed)
	s.metrics.Released(telemetry.ReleaseSessionClosed, len(grants))
	s.metrics.SessionEnded("")
	s.log.SessionClosed(ctx, id, len(grants))
	return len(grants), nil
}

// closeSession deletes session id and its locks, and returns whether it
// existed, whether it was live, and the grants deleted with it.
func (s *Store) closeSession(ctx context.Context, id store.SessionID) (found, live bool, grants []store.Grant, err error) {
	defer s.metrics.Observe(telemetry.OpCloseSession)(&err)
	// FOR UPDATE waits for and then excludes concurrent grants, so the
	// locks deleted are all the session had. The transaction sends their
	// events itself (notifyExpired) rather than through the trigger. It runs
	// detached from ctx (bounded by commitTimeout), like a COMMIT in inTx,
	// so the outcome is always known; three round trips.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(s.q.closeLock, string(id)).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&live)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		found = err == nil
		return err
	})
	b.Queue(s.q.notifiedSelf)
	b.Queue(s.q.closeLocks, string(id)).Query(func(rows pgx.Rows) error {
		var key string
		var tok int64
		_, err := pgx.ForEachRow(rows, []any{&key, &tok}, func() error {
			grants = append(grants, store.Grant{Key: key, Session: id, Token: uint64(tok)})
			return nil
		})
		return err
	})
	b.Queue(s.q.closeDelete, string(id))
	br := s.pool.SendBatch(bctx, &b)
	tx := br.Tx()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after a commit
	}()
	err = br.Close()
	if err == nil {
		err = s.notifyExpired(bctx, tx, grants)
	}
	if err == nil {
		err = tx.Commit(bctx)
	}
	return found, live, grants, classify(ctx, "close session", err)
}

// logReleased logs lock_released for each of grants, in key order; nothing
// at all (not even the sort) when the logger discards info events, which
// matters for a session with many locks.
func (s *Store) logReleased(grants []store.Grant, reason string) {
	if !telemetry.OrDiscard(s.log.L).Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	slices.SortFunc(grants, func(a, b store.Grant) int { return strings.Compare(a.Key, b.Key) })
	for _, g := range grants {
		s.log.LockReleased(g, reason)
	}
}

// sessionExpired records the C4 telemetry of a session that ended by expiry,
// with the grants that went with it.
func (s *Store) sessionExpired(id store.SessionID, grants []store.Grant) {
	s.logReleased(grants, telemetry.ReleaseSessionLost)
	s.metrics.Released(telemetry.ReleaseSessionLost, len(grants))
	s.log.LeaseExpired(id)
	s.log.SessionLost(id, telemetry.LostLeaseExpired)
	s.metrics.LeaseExpired()
	s.metrics.SessionEnded(telemetry.LostLeaseExpired)
}

// LocksOf implements store.SessionRegistry.
func (s *Store) LocksOf(ctx context.Context, id store.SessionID) (_ []store.Grant, err error) {
	if err := store.ValidateSessionID(id); err != nil {
		return nil, fmt.Errorf("pgstore: locks of: %w", err)
	}
	if err := s.begin(ctx, "locks of"); err != nil {
		return nil, err
	}
	defer s.metrics.Observe(telemetry.OpLocksOf)(&err)
	// Concurrent calls share one SELECT (runLocksOfBatch): a server over
	// PostgreSQL reads every session's grants after its heartbeat.
	r := &locksReq{id: id}
	j, err := s.locksQ.Submit(ctx, "", r)
	if err == nil {
		if _, err = s.locksQ.Wait(ctx, j); err == nil {
			err = r.err
		}
	}
	if err = result(ctx, "locks of", err); err != nil {
		return nil, err
	}
	found, live, grants := r.found, r.live, r.grants
	if !found || !live {
		return nil, fmt.Errorf("pgstore: locks of: %w", store.ErrSessionDead)
	}
	return grants, nil
}

// SharesSessions reports that every Store on a schema can use every
// session (store.LockStore).
func (s *Store) SharesSessions() bool { return true }
