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

// Lock-delay and maximum hold (C2 #ct2-delay, migrations 0007, 0012, 0013).
//
// A grant's policy is two columns of its lock row, set by SetGrantPolicy
// right after the grant. A statement trigger on lock deletes starts the
// lock-delay of every deleted row that has one — in the deleting
// transaction, so no grant can slip in between — unless the delete is
// voluntary (a release, CloseSession). It writes the delays row *pending*
// (pending_ms = d): every grant path treats a pending row as busy. Its end
// is stamped (stampDelays) only by a statement that sees it, and so only
// after the deleting commit is visible to every session: the ending call
// right after its COMMIT returned (Revoke, ExpireSession, the reaper's
// expiries and maximum-hold revokes), or, if that stamp never came (lockd
// died, the connection broke), the reaper of any instance on its next run.
// A session that saw the holder saw it before that commit was visible, so
// before the stamp: no grant comes less than d after it. Never stamp in the
// deleting transaction itself (it sees its own pending rows).
//
// A waiter that a delay keeps out wakes at its end by a local timer
// (nothing notifies it; a pending row counts as d left). The reaper of
// every instance revokes grants past their hold_until (reason max_hold;
// the trigger starts their delays) and deletes delays that have run out.

// SetGrantPolicy implements store.GrantPolicySetter: one UPDATE of the
// grant's row, iff (session, key, token) is the current grant of a live
// session.
func (s *Store) SetGrantPolicy(ctx context.Context, id store.SessionID, key string, token uint64, p store.GrantPolicy) (err error) {
	if err := validateGrantArgs("set grant policy", id, key); err != nil {
		return err
	}
	if err := store.ValidateGrantPolicy(p); err != nil {
		return fmt.Errorf("pgstore: set grant policy: %w", err)
	}
	if err := s.begin(ctx, "set grant policy"); err != nil {
		return err
	}
	if token == 0 || token > 1<<63-1 {
		return fmt.Errorf("pgstore: set grant policy: token %d was never issued: %w", token, store.ErrNotOwner)
	}
	tag, err := s.pool.Exec(ctx, s.q.setPolicy, key, string(id), int64(token), p.LockDelay.Milliseconds(), p.MaxHold.Milliseconds())
	if err = classify(ctx, "set grant policy", err); err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("pgstore: set grant policy: %w", store.ErrNotOwner)
	}
	return nil
}

// inspectFree is Inspect of a key nobody holds: how long a lock-delay
// still keeps it, if one does.
func (s *Store) inspectFree(ctx context.Context, key string) (store.LockInfo, bool, error) {
	var ms int64
	err := s.pool.QueryRow(ctx, s.q.delayLeft, key).Scan(&ms)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.LockInfo{}, false, nil
	}
	if err = classify(ctx, "inspect", err); err != nil {
		return store.LockInfo{}, false, err
	}
	return store.LockInfo{Key: key, DelayRemaining: time.Duration(max(ms, 1)) * time.Millisecond}, false, nil
}

// reapHolds revokes the grants held past their maximum hold and forgets
// lock-delays that have run out: one transaction, observed as a reap.
func (s *Store) reapHolds(ctx context.Context) {
	// Failures are counted in lockd_backend_errors_total{op="reap"}; the
	// next tick retries. grants are the revokes committed, also when the
	// stamp after them failed.
	grants, _ := s.reapHoldsOnce(ctx)
	for _, g := range grants {
		s.log.LockReleased(g, telemetry.ReleaseMaxHold)
	}
	s.metrics.Released(telemetry.ReleaseMaxHold, len(grants))
}

// stampDelays stamps the end of every pending lock-delay: until =
// greatest(until, clock_timestamp() + d). Only after the COMMIT of the
// transaction that deleted the grants has returned (see above). Its own
// context: a caller whose context ended after that commit still stamps. A
// failure leaves the rows pending, which keeps the keys until the reaper of
// any instance stamps them.
func (s *Store) stampDelays(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, err := s.pool.Exec(ctx, s.q.stampDelays)
	return err
}

func (s *Store) reapHoldsOnce(ctx context.Context) (grants []store.Grant, err error) {
	defer s.metrics.Observe(telemetry.OpReap)(&err)
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.q.reapHolds)
		if err != nil {
			return err
		}
		grants, err = pgx.CollectRows(rows, grantRow)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, s.q.reapDelays)
		return err
	})
	if err != nil {
		return nil, classify(ctx, "reap", err)
	}
	// After the commit (the revokes above start delays), and on every run
	// for delays whose ending call could not stamp them.
	return grants, classify(ctx, "reap", s.stampDelays(ctx))
}
