package client

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
)

// TestDeadlockNotRetried: a DEADLOCK status (code ABORTED) maps to a
// *DeadlockError with the keys and is not retried; an ABORTED without a
// lockd reason still is (C2 #ct2-deadlock).
func TestDeadlockNotRetried(t *testing.T) {
	ctx := context.Background()
	err := fromStatus(ctx, wireerr.DeadlockStatus([]string{"a", "b"}, "deadlock over a, b").Err())
	var de *DeadlockError
	if !errors.Is(err, ErrDeadlock) || !errors.As(err, &de) || !slices.Equal(de.Keys, []string{"a", "b"}) {
		t.Fatalf("DEADLOCK maps to %v (%T); want a *DeadlockError with keys [a b]", err, err)
	}
	if retryable(err) {
		t.Fatalf("DEADLOCK (%v) is retried", err)
	}
	if plain := fromStatus(ctx, status.Error(codes.Aborted, "aborted")); !retryable(plain) {
		t.Fatalf("a reason-less ABORTED (%v) is not retried", plain)
	}
}
