package etcdstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/store"
)

// LeaveQueue implements store.LockStore: it deletes the session's waiter
// key for key, if any (C2 #ct2-keep-place). It never touches a grant; the
// waiter behind is woken by the deletion (it watches this key). It first
// settles the key's group commit: a transaction of a cut Acquire still in
// its batch (its caller gone, its put of the waiter key not yet committed)
// would otherwise put the place back after this delete, and keep it until
// the session ends.
func (s *Store) LeaveQueue(ctx context.Context, id store.SessionID, key string) (err error) {
	defer s.met.Observe(telemetry.OpLeaveQueue)(&err)
	if err := store.ValidateKey(key); err != nil {
		return fmt.Errorf("etcdstore: leave queue: %w", err)
	}
	if err := store.ValidateSessionID(id); err != nil {
		return fmt.Errorf("etcdstore: leave queue: %w", err)
	}
	if err := s.batch.Settle(ctx, key); err != nil {
		return fmt.Errorf("etcdstore: leave queue: %w", classify(ctx, err))
	}
	if _, err := s.cli.Delete(ctx, s.waiterKey(key, id)); err != nil {
		return fmt.Errorf("etcdstore: leave queue: %w", classify(ctx, err))
	}
	return nil
}
