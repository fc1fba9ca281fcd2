package backend

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"lock.dev/lockd/store"
)

// TestOpenRetrying: opening the store at start waits out transient
// refusals (etcd's "too many requests" is ErrContention, no leader is
// ErrNotLeader) within the dial timeout, fails at once on anything else,
// and returns the last refusal when the timeout ends first.
func TestOpenRetrying(t *testing.T) {
	busy := fmt.Errorf("etcdstore: epoch: %w: etcdserver: too many requests", store.ErrContention)
	calls := 0
	got, err := openRetrying(context.Background(), func(context.Context) (int, error) {
		if calls++; calls < 3 {
			return 0, busy
		}
		return 42, nil
	})
	if got != 42 || err != nil || calls != 3 {
		t.Errorf("two refusals then success: got %d, %v after %d calls; want 42, nil after 3", got, err, calls)
	}

	bad := fmt.Errorf("etcdstore: epoch: %w", store.ErrInvalidArgument)
	calls = 0
	if _, err := openRetrying(context.Background(), func(context.Context) (int, error) { calls++; return 0, bad }); !errors.Is(err, bad) || calls != 1 {
		t.Errorf("a final error: %v after %d calls; want it at once", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	_, err = openRetrying(ctx, func(context.Context) (int, error) {
		if calls++; calls == 2 {
			cancel() // the dial timeout ends while etcd still refuses
		}
		return 0, busy
	})
	if !errors.Is(err, store.ErrContention) || calls != 2 {
		t.Errorf("refused until the timeout: %v after %d calls; want the last refusal after 2", err, calls)
	}
}
