package parity

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/testing/pgserver"
	"lock.dev/lockd/internal/testing/testkit"
)

// tlsFiles are the PEM files of a TLS row: a CA made for the test, a
// server certificate for 127.0.0.1 and localhost, and a client
// certificate (CN lockd) for lockd.
type tlsFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	ca := testkit.NewCA(t, "parity-ca")
	f := tlsFiles{ca: ca.WriteCA(t, dir, "ca.crt")}
	f.serverCert, f.serverKey = ca.Issue(t, testkit.CertOptions{}).Write(t, dir, "server")
	f.clientCert, f.clientKey = ca.Issue(t, testkit.CertOptions{CommonName: "lockd"}).Write(t, dir, "client")
	return f
}

// startSSLPostgres starts a PostgreSQL server of the row's own with SSL on,
// checks that a verify-full connection to it does use SSL, and stops it
// when t ends.
func startSSLPostgres(t *testing.T, f tlsFiles) *pgserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{Name: "parity-tls",
		SSL: &pgserver.SSLFiles{CertFile: f.serverCert, KeyFile: f.serverKey}})
	if err != nil {
		t.Fatalf("start PostgreSQL with SSL: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	conn, err := pgx.Connect(ctx, srv.VerifyFullDSN("postgres", f.ca))
	if err != nil {
		t.Fatalf("connect with sslmode=verify-full: %v", err)
	}
	defer conn.Close(context.Background())
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil || !ssl {
		t.Fatalf("verify-full connection: pg_stat_ssl.ssl = %v, %v; want true", ssl, err)
	}
	return srv
}

// sslDatabases numbers the databases of the pg-tls row.
var sslDatabases atomic.Int64

// sslDatabase creates a fresh database on srv and returns the path of a
// file (lock.pg.dsn-file) holding its sslmode=verify-full DSN.
func sslDatabase(t *testing.T, srv *pgserver.Server, f tlsFiles) string {
	t.Helper()
	name := fmt.Sprintf("parity_%d", sslDatabases.Add(1))
	if err := srv.CreateDatabase(testCtx(t), name); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pg-dsn")
	if err := os.WriteFile(path, []byte(srv.VerifyFullDSN(name, f.ca)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
