package pgstore

import (
	"context"
	"fmt"

	"lock.dev/lockd/store"
)

// AcquireAll implements store.LockStore (C2 #ct2-acquire-all): the keys in
// ascending order, each by this Store's own Acquire or TryInsert (one
// transaction per key), released again unless every key was granted
// (store.AcquireAllInOrder, the one algorithm of every backend).
func (s *Store) AcquireAll(ctx context.Context, id store.SessionID, keys []string, wait bool, opts ...store.AcquireOption) ([]store.Grant, bool, error) {
	gs, ok, err := store.AcquireAllInOrder(ctx, s, id, keys, wait, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("pgstore: acquire all: %w", err)
	}
	return gs, ok, nil
}
