package pgserver

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// query runs one single-value query on a fresh connection to dsn.
func query[T any](t *testing.T, ctx context.Context, dsn, sql string) T {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if got := query[string](t, ctx, s.DSN("postgres"), "SHOW fsync"); got != "on" {
		t.Errorf("fsync = %q, want on", got)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server directory after Stop: stat = %v, want it removed", err)
	}
	_, err = pgx.Connect(ctx, s.DSN("postgres"))
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		t.Fatalf("connect after Stop: err = %v, want a connect error", err)
	}
	if err := s.Restart(ctx, Fast); err == nil {
		t.Fatal("Restart after Stop succeeded, want an error")
	}
}

// TestTemplateRestart starts two servers from one template and restarts
// one in both modes: same address, committed data kept.
// TestSSL starts a server with SSL: a verify-full client with the right
// CA connects over SSL (across a restart too), one with another CA is refused.
func TestSSL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "pg-ca")
	caFile := ca.WriteCA(t, dir, "ca.crt")
	certFile, keyFile := ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	otherCA := testkit.NewCA(t, "other-ca").WriteCA(t, dir, "other.crt")

	s, err := Start(ctx, Options{Name: "ssl", SSL: &SSLFiles{CertFile: certFile, KeyFile: keyFile}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	const onSSL = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
	if !query[bool](t, ctx, s.VerifyFullDSN("postgres", caFile), onSSL) {
		t.Error("verify-full connection: pg_stat_ssl.ssl = false, want true")
	}
	if _, err := pgx.Connect(ctx, s.VerifyFullDSN("postgres", otherCA)); err == nil {
		t.Error("verify-full with another CA connected; want a certificate error")
	}
	if err := s.Restart(ctx, Fast); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if !query[bool](t, ctx, s.VerifyFullDSN("postgres", caFile), onSSL) {
		t.Error("verify-full connection after Restart: pg_stat_ssl.ssl = false, want true")
	}
}

func TestTemplateRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmpl, err := NewTemplate(ctx)
	if err != nil {
		t.Fatalf("NewTemplate: %v", err)
	}
	defer func() {
		if err := tmpl.Close(); err != nil {
			t.Errorf("Template.Close: %v", err)
		}
	}()
	a, err := Start(ctx, Options{Name: "a", Template: tmpl})
	if err != nil {
		t.Fatalf("Start a: %v", err)
	}
	defer a.Stop()
	b, err := Start(ctx, Options{Name: "b", Template: tmpl})
	if err != nil {
		t.Fatalf("Start b: %v", err)
	}
	defer b.Stop()
	if a.Addr() == b.Addr() {
		t.Fatalf("two servers on one address %s", a.Addr())
	}

	if err := a.CreateDatabase(ctx, "db"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	conn, err := pgx.Connect(ctx, a.DSN("db"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	_, err = conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatalf("create table: %v", err)
	}
	addr := a.Addr()
	for _, mode := range []Shutdown{Fast, Immediate} {
		if err := a.Restart(ctx, mode); err != nil {
			t.Fatalf("Restart(%s): %v", mode, err)
		}
		if a.Addr() != addr {
			t.Fatalf("address after Restart(%s) = %s, want %s", mode, a.Addr(), addr)
		}
		if got := query[int32](t, ctx, a.DSN("db"), "SELECT x FROM t"); got != 42 {
			t.Fatalf("after Restart(%s): x = %d, want 42", mode, got)
		}
	}
	if got := query[int64](t, ctx, b.DSN("postgres"), "SELECT count(*) FROM pg_database WHERE datname = 'db'"); got != 0 {
		t.Errorf("database created on a is visible on b (count %d)", got)
	}
	if err := a.Stop(); err != nil {
		t.Fatalf("Stop a: %v", err)
	}
}

// TestStopReportsDeath: a server that died on its own makes Stop fail, with
// a word on what happened.
func TestStopReportsDeath(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{Name: "doomed"})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s.mu.Lock()
	pm := s.pm
	s.mu.Unlock()
	if err := pm.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	<-pm.exited
	if err := s.Stop(); err == nil {
		t.Fatal("Stop after the postmaster was killed = nil, want an error")
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server directory after Stop: stat = %v, want it removed", err)
	}
}

func TestVersionOrder(t *testing.T) {
	dirs := []string{"/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/13/bin"}
	best := dirs[0]
	for _, d := range dirs[1:] {
		if compareVersions(versionOf(d), versionOf(best)) > 0 {
			best = d
		}
	}
	if best != "/usr/lib/postgresql/15/bin" {
		t.Errorf("highest version = %s, want /usr/lib/postgresql/15/bin", best)
	}
}
