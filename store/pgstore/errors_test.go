package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	pgErr := func(code string) error { return fmt.Errorf("query: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error // nil: unclassified
	}{
		{"serialization", live, pgErr("40001"), store.ErrContention},
		{"deadlock", live, pgErr("40P01"), store.ErrContention},
		{"lock not available", live, pgErr("55P03"), store.ErrContention},
		{"read only", live, pgErr("25006"), store.ErrNotLeader},
		{"admin shutdown", live, pgErr("57P01"), store.ErrUnavailable},
		{"cannot connect now", live, pgErr("57P03"), store.ErrUnavailable},
		{"connection failure", live, pgErr("08006"), store.ErrUnavailable},
		{"too many connections", live, pgErr("53300"), store.ErrUnavailable},
		{"statement timeout", live, pgErr("57014"), store.ErrUnavailable},
		{"foreign key", live, pgErr("23503"), store.ErrSessionDead},
		{"eof", live, fmt.Errorf("read: %w", io.ErrUnexpectedEOF), store.ErrUnavailable},
		{"refused", live, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, store.ErrUnavailable},
		{"internal timeout", live, fmt.Errorf("commit: %w", context.DeadlineExceeded), store.ErrUnavailable},
		{"caller cancelled", cancelled, pgErr("57P01"), context.Canceled},
		{"caller cancelled, driver says so", cancelled, context.Canceled, context.Canceled},
		{"syntax", live, pgErr("42601"), nil},
	} {
		got := classify(tc.ctx, "op", tc.err)
		if tc.want == nil {
			if store.IsRetryable(got) || errors.Is(got, store.ErrSessionDead) {
				t.Errorf("%s: classify = %v, want unclassified", tc.name, got)
			}
			continue
		}
		if !errors.Is(got, tc.want) {
			t.Errorf("%s: classify = %v, want errors.Is(err, %v)", tc.name, got, tc.want)
		}
		if tc.ctx.Err() != nil && store.IsRetryable(got) {
			t.Errorf("%s: classify = %v is retryable, but the caller's context is done", tc.name, got)
		}
		if tc.ctx.Err() == nil && errors.Is(got, context.DeadlineExceeded) {
			t.Errorf("%s: classify = %v matches context.DeadlineExceeded while the caller's context is live", tc.name, got)
		}
	}
	if got := classify(live, "op", nil); got != nil {
		t.Errorf("classify(nil) = %v", got)
	}
}

func TestUnavailableServer(t *testing.T) {
	t.Parallel()
	// Nothing listens: New fails as unavailable.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	_, err = New(ctx, Options{DSN: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port)})
	if !errors.Is(err, store.ErrUnavailable) || !store.IsRetryable(err) {
		t.Fatalf("New against a closed port: %v, want ErrUnavailable", err)
	}

	// A server that stops under a running store.
	srv := pgtest.NewServer(t)
	s := newStore(t, srv.DSN("postgres"))
	id := openSession(t, s)
	g := mustTry(t, s, id, "k")
	_, ch, err := s.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("stop server: %v", err)
	}
	select {
	case ev, ok := <-ch:
		if !ok || !errors.Is(ev.Err, store.ErrUnavailable) {
			t.Fatalf("watch after server stop: %+v, %v; want a final ErrUnavailable", ev, ok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch not broken by the server stop")
	}
	ctx, cancel = context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	checks := map[string]error{}
	_, checks["Heartbeat"] = s.Heartbeat(ctx, id)
	_, _, checks["TryInsert"] = s.TryInsert(ctx, id, "k2")
	_, checks["Acquire"] = s.Acquire(ctx, id, "k2")
	checks["DeleteIfOwner"] = s.DeleteIfOwner(ctx, id, "k", g.Token)
	_, _, checks["Inspect"] = s.Inspect(ctx, "k")
	_, checks["OpenSession"] = s.OpenSession(ctx, ttl)
	_, _, checks["Watch"] = s.WatchFrom(ctx, "", "")
	for op, err := range checks {
		if !errors.Is(err, store.ErrUnavailable) || !store.IsRetryable(err) || errors.Is(err, store.ErrSessionDead) {
			t.Errorf("%s with the server down: %v, want ErrUnavailable (retryable, not session dead)", op, err)
		}
	}
}

func TestReadOnlyIsNotLeader(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	id := openSession(t, s)
	// New connections to the database start read-only, as on a standby.
	var db string
	if err := s.pool.QueryRow(testCtx(t), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(testCtx(t), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_read_only = on"); err != nil {
		t.Fatalf("alter database: %v", err)
	}
	ro := newStoreNoMigrate(t, dsn)
	if _, err := ro.OpenSession(testCtx(t), ttl); !errors.Is(err, store.ErrNotLeader) || !store.IsRetryable(err) {
		t.Fatalf("OpenSession on a read-only database: %v, want ErrNotLeader", err)
	}
	if _, err := ro.Heartbeat(testCtx(t), id); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("Heartbeat on a read-only database: %v, want ErrNotLeader (not 'not live')", err)
	}
	if _, _, err := ro.TryInsert(testCtx(t), id, "k"); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("TryInsert on a read-only database: %v, want ErrNotLeader", err)
	}
}

// newStoreNoMigrate opens a Store whose pool starts after the schema exists
// (migrations are a no-op then) on a database that may be read-only: the
// migration transaction only reads when there is nothing to do.
func newStoreNoMigrate(t testing.TB, dsn string) *Store {
	t.Helper()
	s, err := New(testCtx(t), Options{DSN: dsn, ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
