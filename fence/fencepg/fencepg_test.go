package fencepg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/fence"
	"lock.dev/lockd/fence/fencepg"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, nil) }

// newPool returns a pool on a fresh database with the fence applied
// (twice: Apply is idempotent).
func newPool(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx := testkit.Context(t, time.Minute)
	pool, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	for range 2 {
		if err := fencepg.Apply(ctx, pool); err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}
	return ctx, pool
}

// TestCheck: in a transaction, a token at or above the mark is accepted
// and the write commits; a lower one is a *fence.StaleError naming the
// mark, counted, and the transaction's write never commits.
func TestCheck(t *testing.T) {
	ctx, pool := newPool(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE acct (id int PRIMARY KEY, balance int)"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f := fencepg.Fence{Metrics: m}
	write := func(token uint64, balance int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO acct VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET balance = $1", balance); err != nil {
				return err
			}
			return f.Check(ctx, tx, "jobs/acct", token)
		})
	}
	for i, tok := range []uint64{100, 100, 200} {
		if err := write(tok, i); err != nil {
			t.Fatalf("write with token %d: %v", tok, err)
		}
	}
	err = write(150, 99)
	var se *fence.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) || se.HighWater != 200 || se.Token != 150 || se.Key != "jobs/acct" {
		t.Fatalf("write with the stale token 150 = %v; want a StaleError with high water 200", err)
	}
	var balance int
	if err := pool.QueryRow(ctx, "SELECT balance FROM acct WHERE id = 1").Scan(&balance); err != nil || balance != 2 {
		t.Fatalf("balance = %d, %v; want 2 (the stale write rolled back)", balance, err)
	}
	if err := write(0, 1); !errors.Is(err, fence.ErrInvalid) {
		t.Fatalf("write with token 0 = %v; want ErrInvalid", err)
	}
	if _, err := pool.Exec(ctx, "SELECT lockd_fence_check('k', 0)"); err == nil {
		t.Fatal("lockd_fence_check(k, 0) in SQL succeeded; want SQLSTATE 22023")
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if s.GetLabel()[0].GetValue() == fence.ResourcePostgres && s.GetCounter().GetValue() != 1 {
				t.Errorf("lockd_fence_stale_refused_total{postgres} = %v; want 1", s.GetCounter().GetValue())
			}
		}
	}
}

// TestTrigger: lockd_fence_row on the user's own table refuses an insert
// or update whose row carries a stale token; IsStale recognises the error.
func TestTrigger(t *testing.T) {
	ctx, pool := newPool(t)
	for _, q := range []string{
		"CREATE TABLE doc (id int PRIMARY KEY, body text, lock_key text, lock_token bigint)",
		"CREATE TRIGGER doc_fence BEFORE INSERT OR UPDATE ON doc FOR EACH ROW EXECUTE FUNCTION lockd_fence_row('lock_key', 'lock_token')",
		"INSERT INTO doc VALUES (1, 'v1', 'docs/1', 10)",
		"UPDATE doc SET body = 'v2', lock_token = 11 WHERE id = 1",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	_, err := pool.Exec(ctx, "UPDATE doc SET body = 'stale', lock_token = 10 WHERE id = 1")
	se, ok := fencepg.IsStale(err)
	if !ok || se.Key != "docs/1" || se.Token != 10 || se.HighWater != 11 {
		t.Fatalf("stale UPDATE = %v (%+v); want LF409 for docs/1 token 10 below 11", err, se)
	}
	var body string
	if err := pool.QueryRow(ctx, "SELECT body FROM doc WHERE id = 1").Scan(&body); err != nil || body != "v2" {
		t.Fatalf("body = %q, %v; want v2", body, err)
	}
}

// TestStore: fencepg.Store is a fence.Store: marks survive a new Store on
// the same database, a lower token is refused.
func TestStore(t *testing.T) {
	ctx, pool := newPool(t)
	if err := fencepg.NewStore(pool).Advance(ctx, "k", 5); err != nil {
		t.Fatalf("Advance(k, 5): %v", err)
	}
	err := fencepg.NewStore(pool).Advance(ctx, "k", 4)
	var se *fence.StaleError
	if !errors.As(err, &se) || se.HighWater != 5 {
		t.Fatalf("Advance(k, 4) on a new Store = %v; want a StaleError with high water 5", err)
	}
}

// TestConcurrentWriters: while a writer with the newer token holds its
// transaction open, a stale writer waits for it and is then refused; a
// writer whose check came first commits before the newer one's check.
func TestConcurrentWriters(t *testing.T) {
	ctx, pool := newPool(t)
	newer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Rollback(ctx)
	if err := fencepg.Check(ctx, newer, "k", 20); err != nil {
		t.Fatalf("Check(k, 20): %v", err)
	}
	stale := make(chan error, 1)
	go func() { stale <- fencepg.NewStore(pool).Advance(ctx, "k", 19) }() // ends when newer commits
	testkit.Eventually(t, 10*time.Second, "the stale writer to wait on the mark's row lock", func() bool {
		var waiting int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%lockd_fence_check%'").Scan(&waiting)
		return err == nil && waiting == 1
	})
	if err := newer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-stale; !errors.Is(err, fence.ErrStale) {
		t.Fatalf("the waiting stale writer = %v; want ErrStale", err)
	}
}
