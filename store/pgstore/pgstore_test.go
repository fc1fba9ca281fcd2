package pgstore

import (
	"context"
	"os"
	"testing"
	"time"

	"lock.dev/lockd/internal/pgtest"
	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

// testReaperInterval is the reaper interval of the stores under test.
const testReaperInterval = 250 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(runChild())
	}
	testkit.Main(pgtest.M{M: m}, nil)
}

// newStore opens a Store on dsn, closed when the test ends.
func newStore(t testing.TB, dsn string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := New(ctx, Options{DSN: dsn, ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// expire moves the session's expires_at into the past, as if nobody had
// heartbeated it for its TTL; the reaper then takes it.
func expire(t testing.TB, s *Store, id store.SessionID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tag, err := s.pool.Exec(ctx, "UPDATE "+s.schemaIdent()+".sessions SET expires_at = now() - interval '1 second' WHERE id = $1", string(id))
	if err != nil {
		t.Fatalf("expire %s: %v", id, err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("expire %s: %d rows updated, want 1", id, tag.RowsAffected())
	}
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Config{
		Namespace: func(t *testing.T) func(t *testing.T) store.LockStore {
			dsn := pgtest.NewDatabase(t)
			return func(t *testing.T) store.LockStore { return newStore(t, dsn) }
		},
		ExpirySlack: testReaperInterval,
		Expire: func(t *testing.T, s store.LockStore, id store.SessionID) {
			expire(t, s.(*Store), id)
		},
	})
}
