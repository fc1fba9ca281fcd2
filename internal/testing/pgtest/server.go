package pgtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"lock.dev/lockd/internal/testing/pgserver"
)

// Server is a PostgreSQL server started from the local binaries (package
// internal/testing/pgserver). Its methods are safe for concurrent use.
type Server = pgserver.Server

// NewServer starts a server of the test's own, separate from the shared
// one, and stops it when the test ends. It is for tests that need to stop or
// disturb a server; most tests want NewDatabase. It ignores
// LOCKD_TEST_PG_DSN: it always needs the local binaries.
func NewServer(t testing.TB) *Server {
	t.Helper()
	return NewServerWith(t, pgserver.Options{})
}

// NewServerWith is NewServer with options: e.g. FakeTime, to step the
// database host's wall clock (Server.SetClockOffset).
func NewServerWith(t testing.TB, opts pgserver.Options) *Server {
	t.Helper()
	s, err := start(opts)
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
func start(opts pgserver.Options) (*Server, error) {
	s, err := pgserver.Start(context.Background(), opts)
	if errors.Is(err, pgserver.ErrNoBinaries) {
		return nil, fmt.Errorf("%w; or %s", err, installHint)
	}
	return s, err
}
