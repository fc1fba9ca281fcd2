package pgstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/etcdstore"
	"lock.dev/lockd/store/storetest"
)

// newSchemaStore opens a Store on dsn with lockd's tables in schema.
func newSchemaStore(t *testing.T, dsn, schema string) *Store {
	t.Helper()
	s, err := New(testCtx(t), Options{DSN: dsn, Schema: schema, ReaperInterval: testReaperInterval})
	if err != nil {
		t.Fatalf("New(schema %s): %v", schema, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestTokensAboveANewSchema: a new lock.pg.schema on the same database
// hands out tokens above the old schema's (C2 #ct2-fencing).
func TestTokensAboveANewSchema(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	storetest.FencingAcrossReinit(t,
		func(t *testing.T) store.LockStore { return newSchemaStore(t, dsn, "s1") },
		func(t *testing.T) store.LockStore { return newSchemaStore(t, dsn, "s2") })
}

// TestTokensAboveEtcd: switching from etcd (embedded, fresh data dir) to
// PostgreSQL keeps tokens rising.
func TestTokensAboveEtcd(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	storetest.FencingAcrossReinit(t,
		func(t *testing.T) store.LockStore {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srv, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: t.TempDir(), TickMs: etcdtest.TickMs, ElectionMs: etcdtest.ElectionMs})
			if err != nil {
				t.Fatalf("embedetcd.Start: %v", err)
			}
			t.Cleanup(func() { srv.Close() })
			st, err := etcdstore.New(ctx, etcdtest.NewClient(t, srv.Endpoints()...), etcdstore.Options{})
			if err != nil {
				t.Fatalf("etcdstore.New: %v", err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		func(t *testing.T) store.LockStore { return newStore(t, dsn) })
}

// TestTokensAfterFailover: a failover to an asynchronous replica whose
// sequence is behind (simulated: the sequence restarted at 1 and every
// connection of the Store killed) still hands out tokens above the old
// primary's: the Store raises the sequence on each new connection.
func TestTokensAfterFailover(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	id := openSession(t, s)
	g1 := mustTry(t, s, id, "k")
	if err := s.DeleteIfOwner(testCtx(t), id, "k", g1.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	admin, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(testCtx(t), "ALTER SEQUENCE "+s.seqIdent()+" RESTART WITH 1"); err != nil {
		t.Fatalf("restart sequence: %v", err)
	}
	if _, err := admin.Exec(testCtx(t), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
		t.Fatalf("terminate the Store's connections: %v", err)
	}
	var g2 store.Grant
	testkit.Eventually(t, 30*time.Second, "a grant on the new connections", func() error {
		g, ok, err := s.TryInsert(testCtx(t), id, "k")
		if err == nil && !ok {
			return errors.New("not granted")
		}
		g2 = g
		return err
	})
	if g2.Token <= g1.Token {
		t.Fatalf("token after the failover = %d, want > %d (before it)", g2.Token, g1.Token)
	}
}

// TestTokensUpgrade: a schema used by a lockd without epochs (small tokens,
// a grant still held) is raised at the first open; the old grant keeps its
// token and can be released with it; new tokens are above the old ones.
// Raises while another Store grants never lower the sequence.
func TestTokensUpgrade(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	s := newStore(t, dsn)
	q := s.schemaIdent()
	// The state an older lockd left: its sequence low, a session holding
	// "old" with token 7.
	if _, err := s.pool.Exec(testCtx(t), "ALTER SEQUENCE "+s.seqIdent()+" RESTART WITH 7"); err != nil {
		t.Fatalf("restart sequence: %v", err)
	}
	if _, err := s.pool.Exec(testCtx(t), `INSERT INTO `+q+`.sessions (id, ttl_ms, expires_at) VALUES ('old-session', 600000, now() + interval '10 minutes');
		INSERT INTO `+q+`.locks (key, session_id, token) VALUES ('old', 'old-session', nextval('`+s.seqIdent()+`'))`); err != nil {
		t.Fatalf("old grant: %v", err)
	}
	s.Close()

	a := newStore(t, dsn)
	if info, found := inspectT(t, a, "old"); !found || info.Token != 7 {
		t.Fatalf("Inspect(old) = %+v, %v; want held with token 7", info, found)
	}
	if err := a.DeleteIfOwner(testCtx(t), "old-session", "old", 7); err != nil {
		t.Fatalf("DeleteIfOwner(old, 7): %v", err)
	}
	id := openSession(t, a)
	var (
		last uint64 = 7
		stop        = make(chan struct{})
		wg   sync.WaitGroup
	)
	// Grants on a, one after another, while other Stores open (and raise).
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			g, ok, err := a.TryInsert(testCtx(t), id, "k")
			if err != nil || !ok || g.Token <= last {
				t.Errorf("TryInsert #%d = %+v, %v, %v; want a token > %d", i, g, ok, err, last)
				return
			}
			last = g.Token
			if err := a.DeleteIfOwner(testCtx(t), id, "k", g.Token); err != nil {
				t.Errorf("DeleteIfOwner #%d: %v", i, err)
				return
			}
		}
	})
	for range 4 {
		newStore(t, dsn).Close()
	}
	close(stop)
	wg.Wait()
}
