package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// TestReleaseAfterLossIsNotOwner: a Release of a lock that was already
// lost, whose first attempt is ambiguous (Unavailable) and whose retry finds
// the grant gone, reports ErrNotOwner: the grant went with the loss, not
// with this release. Before, the retry's "gone" was taken as proof that the
// first attempt had released it and Release returned nil, claiming a
// release after another holder had the key (chaos partition-replica-pg's
// linearizability violation).
func TestReleaseAfterLossIsNotOwner(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testkit.Context(t, 60*time.Second)
		s, err := srv.Client.NewSession(ctx)
		if err != nil {
			t.Fatalf("NewSession: %v", err)
		}
		defer s.Close(context.Background())
		l, err := s.Acquire(ctx, "lost/k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if _, err := srv.Client.Revoke(ctx, "lost/k"); err != nil {
			t.Fatalf("Revoke: %v", err)
		}
		testkit.Eventually(t, 30*time.Second, "the holder to learn of the revoke", func() bool {
			select {
			case <-l.Done():
				return true
			default:
				return false
			}
		})
		faulty.FailOnce("release", store.ErrUnavailable, false) // the first attempt is ambiguous
		err = l.Release(ctx)
		if !errors.Is(err, client.ErrNotOwner) {
			t.Fatalf("Release of a revoked lock after an ambiguous attempt = %v; want ErrNotOwner", err)
		}
	})
}
