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

// AcquireAll implements store.LockStore (C2 #ct2-acquire-all): a set of
// free keys in one transaction (GrantFree); else the keys in ascending
// order, each by this Store's own Acquire or TryInsert (one transaction
// per key), released again unless every key was granted
// (store.AcquireAllInOrder, the one algorithm of every backend).
func (s *Store) AcquireAll(ctx context.Context, id store.SessionID, keys []string, wait bool, opts ...store.AcquireOption) ([]store.Grant, bool, error) {
	gs, ok, err := store.AcquireAllInOrder(ctx, s, id, keys, wait, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("pgstore: acquire all: %w", err)
	}
	return gs, ok, nil
}

var _ store.SetGranter = (*Store)(nil)

// errNotFree rolls back a GrantFree that found a key not free.
var errNotFree = errors.New("pgstore: grant free: a key is not free")

// GrantFree implements store.SetGranter: ONE transaction, outside the group
// commit, that takes every key's advisory lock (keyLock, in hash order as
// every batch does) and runs grantBatch for the whole set as TryInserts of
// the session: the rows of all the keys are inserted, each drawing its
// token under its key's lock (grant's token reasoning), or, if any key is
// not free for the session, the transaction rolls back and nothing is
// written.
func (s *Store) GrantFree(ctx context.Context, id store.SessionID, keys []string) (gs []store.Grant, granted bool, err error) {
	if len(keys) == 0 {
		return nil, false, nil
	}
	if err := s.begin(ctx, "grant free"); err != nil {
		return nil, false, err
	}
	defer s.metrics.Observe(telemetry.OpGrantFree)(&err)
	sids := make([]string, len(keys))
	no := make([]bool, len(keys))
	for i := range keys {
		sids[i] = string(id)
	}
	gs = make([]store.Grant, len(keys))
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.q.keyLock, keys); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.q.grantBatch, sids, keys, no, no)
		if err != nil {
			return err
		}
		var (
			i                            int
			remUS, htok, newTok, delayUS *int64
			holder                       *string
			hat, inserted                *time.Time
			eligible, multi, allInserted = false, false, true
		)
		_, err = pgx.ForEachRow(rows, []any{&i, &remUS, &holder, &htok, &hat, &newTok, &inserted, &eligible, &multi, &delayUS}, func() error {
			if i < 1 || i > len(keys) {
				return fmt.Errorf("grant batch returned row %d of %d", i, len(keys))
			}
			if remUS == nil || *remUS <= 0 {
				return fmt.Errorf("pgstore: grant free: %w", store.ErrSessionDead)
			}
			if inserted == nil || newTok == nil {
				allInserted = false
				return nil
			}
			gs[i-1] = store.Grant{Key: keys[i-1], Session: id, Token: uint64(*newTok), AcquiredAt: *inserted,
				Remaining: time.Duration(*remUS) * time.Microsecond}
			return nil
		})
		if err != nil {
			return err
		}
		if !allInserted {
			return errNotFree
		}
		return nil
	})
	if errors.Is(err, errNotFree) {
		return nil, false, nil
	}
	if errors.Is(err, store.ErrSessionDead) {
		return nil, false, err
	}
	if err = classify(ctx, "grant free", err); err != nil {
		return nil, false, err
	}
	for _, g := range gs {
		s.newGrant(g, 0)
	}
	return gs, true, nil
}
