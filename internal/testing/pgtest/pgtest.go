package pgtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgserver"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable that points the tests at an existing
// server instead of starting one.
const EnvDSN = "LOCKD_TEST_PG_DSN"

// installHint is the alternative to installing PostgreSQL, added to
// pgserver.ErrNoBinaries.
const installHint = "set " + EnvDSN + " to the DSN of a server on which the tests may create databases"

// shared is the one server of this test binary, started on first use.
var shared struct {
	once sync.Once
	srv  *Server // nil when EnvDSN is used
	dsn  string
	err  error
}

// sharedDSN starts the shared server once and returns its DSN.
func sharedDSN() (string, error) {
	shared.once.Do(func() {
		if dsn := os.Getenv(EnvDSN); dsn != "" {
			shared.dsn = dsn
			return
		}
		srv, err := start(pgserver.Options{})
		if err != nil {
			shared.err = err
			return
		}
		shared.srv = srv
		shared.dsn = srv.DSN("postgres")
	})
	return shared.dsn, shared.err
}

// M wraps a *testing.M: its Run runs the tests and then stops the shared
// server. Use it where TestMain hands m to another runner, for example
// testkit.Main(pgtest.M{M: m}, nil); otherwise use Main.
type M struct{ M *testing.M }

// Run runs the tests, stops the shared server if one was started, and
// returns the exit code (non-zero also when the server did not stop
// cleanly).
func (m M) Run() int {
	code := m.M.Run()
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop server: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Main runs the tests and stops the shared server afterwards. Call it from
// TestMain of every package that uses DSN or NewDatabase.
func Main(m *testing.M) { os.Exit(M{M: m}.Run()) }

// DSN returns the DSN of the maintenance database ("postgres") of the
// server shared by this test binary, starting the server if needed: a
// superuser DSN on 127.0.0.1 (or the value of LOCKD_TEST_PG_DSN). Tests use
// it to reach the server from outside a database, for example from a child
// process. It fails the test if no server can be started.
func DSN(t testing.TB) string {
	t.Helper()
	dsn, err := sharedDSN()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

var dbSeq atomic.Uint64

// NewDatabase creates a database with a unique name on the shared server
// and returns its DSN. The database is dropped (WITH (FORCE), so open
// connections do not keep it) when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	base := DSN(t)
	name := fmt.Sprintf("lockd_test_%d_%d_%s", os.Getpid(), dbSeq.Add(1), strings.ToLower(rand.Text()[:8]))
	ident := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := execOn(ctx, base, "CREATE DATABASE "+ident); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := execOn(ctx, base, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := withDatabase(base, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsn
}

// execOn runs one statement on a fresh connection to dsn.
func execOn(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// withDatabase returns dsn with its database replaced by db. It accepts
// both DSN forms pgx does: a postgres:// URL and keyword=value pairs (where
// a repeated keyword overrides the earlier one).
func withDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse dsn: %w", err)
		}
		u.Path = "/" + db
		u.RawPath = ""
		return u.String(), nil
	}
	if strings.ContainsAny(db, ` '\`) {
		return "", errors.New("database name needs quoting")
	}
	return dsn + " dbname=" + db, nil
}
