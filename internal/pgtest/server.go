package pgtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"lock.dev/lockd/internal/pgserver"
)

// Server is a PostgreSQL server started from the local binaries (package
// internal/pgserver). Its methods are safe for concurrent use.
type Server = pgserver.Server

// NewServer starts a server of the test's own, separate from the shared
// one, and stops it when the test ends. It is for tests that need to stop or
// disturb a server; most tests want NewDatabase. It ignores
// LOCKD_TEST_PG_DSN: it always needs the local binaries.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s, err := start()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgtest: stop server: %v", err)
		}
	})
	return s
}

// start starts a server from the local binaries, pointing at the
// alternatives when there are none.
func start() (*Server, error) {
	s, err := pgserver.Start(context.Background(), pgserver.Options{})
	if errors.Is(err, pgserver.ErrNoBinaries) {
		return nil, fmt.Errorf("%w; or %s", err, installHint)
	}
	return s, err
}
