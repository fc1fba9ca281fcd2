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

// Lock-delay and maximum hold (C2 #ct2-delay, migration 0007).
//
// A grant's policy is two columns of its lock row, set by SetGrantPolicy
// right after the grant. A statement trigger on lock deletes starts the
// lock-delay of every deleted row that has one — in the deleting
// transaction, so no grant can slip in between — unless the delete is
// voluntary (a release, CloseSession). A deferred trigger stamps its end
// at the transaction's COMMIT, after every statement (migration 0012):
// other sessions see the grant end only then. Every grant path checks the delays
// table; a waiter that a delay keeps out wakes at its end by a local timer
// (nothing notifies it). The reaper of every instance revokes grants past
// their hold_until (reason max_hold; the trigger starts their delays) and
// deletes delays that have run out.

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
	grants, err := s.reapHoldsOnce(ctx)
	if err != nil {
		return // counted in lockd_backend_errors_total{op="reap"}; the next tick retries
	}
	for _, g := range grants {
		s.log.LockReleased(g, telemetry.ReleaseMaxHold)
	}
	s.metrics.Released(telemetry.ReleaseMaxHold, len(grants))
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
	return grants, classify(ctx, "reap", err)
}
