package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// expireWait is how close to its expiry a session may be for ExpireSession
// to wait for it (holding the row) instead of answering "not yet". It
// covers the gap between the server's receipt of a request and the
// database's now() in the transaction that set expires_at, so that the
// server's silence close, which comes due at receipt + TTL, ends the
// session itself rather than leaving it to the reaper.
const expireWait = 50 * time.Millisecond

// errNotYet rolls back an ExpireSession whose delete found the session
// still alive.
var errNotYet = errors.New("pgstore: session not expired yet")

// ExpireSession implements store.SessionRegistry: it deletes the session
// only if its expires_at has passed on the database clock (C2
// #ct2-replicas). A session another instance keeps heartbeating is left
// alone however long this instance's client has been silent. An expiry due
// within expireWait is waited for with the row locked (FOR UPDATE): a
// heartbeat or grant of the session waits for us and then finds it gone,
// and the reaper (SKIP LOCKED) leaves it to us.
//
// Telemetry: the locks that went with the session are logged and counted
// as released (session_lost) and the session leaves the active gauge; the
// loss itself (session_lost client_silent) is the caller's to record, as it
// decided the client was silent. A session already gone is ErrSessionDead
// and counted by whoever ended it (the reaper: lease_expired), so a loss
// is never counted twice.
func (s *Store) ExpireSession(ctx context.Context, id store.SessionID) (store.Expiry, error) {
	if err := store.ValidateSessionID(id); err != nil {
		return store.Expiry{}, fmt.Errorf("pgstore: expire session: %w", err)
	}
	if err := s.begin(ctx, "expire session"); err != nil {
		return store.Expiry{}, err
	}
	found, rem, grants, err := s.expireSession(ctx, id)
	switch {
	case err != nil:
		return store.Expiry{}, err
	case !found:
		return store.Expiry{}, fmt.Errorf("pgstore: expire session: %w", store.ErrSessionDead)
	case rem > 0:
		return store.Expiry{Remaining: rem}, nil
	}
	if len(grants) > 0 {
		// Committed: stamp the lock-delays the delete started (delay.go);
		// a failure leaves them to the reaper.
		_ = s.stampDelays(ctx)
	}
	s.logReleased(grants, telemetry.ReleaseSessionLost)
	s.metrics.Released(telemetry.ReleaseSessionLost, len(grants))
	s.metrics.SessionEnded("")
	return store.Expiry{Ended: true, Released: len(grants)}, nil
}

// expireSession runs ExpireSession's transaction. found: the row exists;
// rem > 0: it is alive for at least rem (nothing written); else it was
// deleted with grants. It is observed as a close_session request.
func (s *Store) expireSession(ctx context.Context, id store.SessionID) (found bool, rem time.Duration, grants []store.Grant, err error) {
	defer s.metrics.Observe(telemetry.OpCloseSession)(&err)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		found, rem, grants = false, 0, nil
		var remUS int64
		err := tx.QueryRow(ctx, s.q.expireLock, string(id)).Scan(&remUS)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		found, rem = true, time.Duration(remUS)*time.Microsecond
		if rem > expireWait {
			return nil
		}
		if rem > 0 {
			t := time.NewTimer(rem + time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			rem = 0
		}
		if _, err := tx.Exec(ctx, s.q.notifiedSelf); err != nil {
			return err
		}
		// The locks go first (expireLocks returns them; an involuntary
		// end, so their lock-delays start), then the row, only if it has
		// expired now; FOR UPDATE above kept out every grant.
		rows, err := tx.Query(ctx, s.q.expireLocks, string(id))
		if err != nil {
			return err
		}
		var key string
		var tok int64
		if _, err := pgx.ForEachRow(rows, []any{&key, &tok}, func() error {
			grants = append(grants, store.Grant{Key: key, Session: id, Token: uint64(tok)})
			return nil
		}); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.q.expireDelete, string(id))
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			// The wait above fell short of the database's clock.
			rem = time.Millisecond
			return errNotYet
		}
		return s.notifyExpired(ctx, tx, grants)
	})
	if errors.Is(err, errNotYet) {
		return found, rem, nil, nil // rolled back: nothing written
	}
	return found, rem, grants, classify(ctx, "expire session", err)
}
