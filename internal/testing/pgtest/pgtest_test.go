package pgtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(M{M: m}, nil) }

func TestNewDatabaseIsolated(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("NewDatabase twice returned the same DSN %q", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatalf("connect %s: %v", a, err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatalf("connect %s: %v", b, err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 't'").Scan(&n); err != nil {
		t.Fatalf("query: %v", err)
	}
	if n != 0 {
		t.Errorf("table created in one database is visible in the other (count %d)", n)
	}
	var fsync string
	if err := cb.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		t.Fatalf("show fsync: %v", err)
	}
	if fsync != "on" {
		t.Errorf("fsync = %q, want on", fsync)
	}
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := NewDatabase(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		// Left open on purpose: DROP ... WITH (FORCE) must not wait for it.
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
			t.Fatalf("current_database: %v", err)
		}
	})
	conn, err := pgx.Connect(ctx, DSN(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatalf("query: %v", err)
	}
	if name == "" || n != 0 {
		t.Errorf("database %q still exists after its test ended (count %d)", name, n)
	}
}

func TestServerStop(t *testing.T) {
	t.Parallel()
	s := NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		t.Fatalf("connect to own server: %v", err)
	}
	_ = conn.Close(ctx)
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	_, err = pgx.Connect(ctx, s.DSN("postgres"))
	var ce *pgconn.ConnectError
	if err == nil || !errors.As(err, &ce) {
		t.Fatalf("connect after Stop: err = %v, want a connect error", err)
	}
}

func TestWithDatabase(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u@h:5/postgres?sslmode=disable", "postgres://u@h:5/x?sslmode=disable"},
		{"postgresql://u@h/", "postgresql://u@h/x"},
		{"host=h port=5 dbname=postgres", "host=h port=5 dbname=postgres dbname=x"},
	} {
		got, err := withDatabase(tc.in, "x")
		if err != nil || got != tc.want {
			t.Errorf("withDatabase(%q, x) = %q, %v; want %q", tc.in, got, err, tc.want)
			continue
		}
		cfg, err := pgconn.ParseConfig(got)
		if err != nil || cfg.Database != "x" {
			t.Errorf("pgconn.ParseConfig(%q): database %q, err %v; want database x", got, cfg.Database, err)
		}
	}
}
