package pgstore

import (
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestLockBatchesUseGenericPlans: the statements of a lock transaction run
// with generic plans, planned once per connection (issue 24: PostgreSQL
// planned the batches' statements again on every execution, a third of its
// CPU per pair at c=8). keyLock, the first statement of every lock
// transaction, sets plan_cache_mode for that transaction only.
func TestLockBatchesUseGenericPlans(t *testing.T) {
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	const pairs = 20
	for i := range pairs {
		key := fmt.Sprintf("k%d", i)
		g := mustTry(t, s, id, key)
		if err := s.DeleteIfOwner(testCtx(t), id, key, g.Token); err != nil {
			t.Fatalf("DeleteIfOwner(%s): %v", key, err)
		}
	}

	ctx := testCtx(t)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	const show = `SELECT current_setting('plan_cache_mode')`
	var before, in, after string
	if err := conn.QueryRow(ctx, show).Scan(&before); err != nil {
		t.Fatalf("plan_cache_mode: %v", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if _, err := tx.Exec(ctx, s.q.keyLock, []string{"x"}); err != nil {
		t.Fatalf("keyLock: %v", err)
	}
	if err := tx.QueryRow(ctx, show).Scan(&in); err != nil {
		t.Fatalf("plan_cache_mode in the transaction: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if err := conn.QueryRow(ctx, show).Scan(&after); err != nil {
		t.Fatalf("plan_cache_mode after: %v", err)
	}
	var version int
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatalf("server_version_num: %v", err)
	}
	conn.Release()
	if in != "force_generic_plan" || after != before {
		t.Errorf("plan_cache_mode %q before a lock transaction, %q after its keyLock, %q after it ended; "+
			"want force_generic_plan inside it only", before, in, after)
	}

	if version < 140000 {
		return // pg_prepared_statements counts plans from PostgreSQL 14 on
	}
	// Each connection's own counts, by backend process: AcquireAllIdle
	// returns only the connections idle at the call, and one the reaper
	// (every 250 ms here) holds at that instant would leave its plans out
	// (clean-clone run r46: "0 custom and 35 generic plans"). The counts
	// only grow, so the figures are read again until every connection that
	// ran the batches has been idle once, or 10 s have passed.
	perConn := map[uint32][2]int64{}
	var custom, generic int64
	_ = testkit.Poll(10*time.Second, func() bool {
		for _, c := range s.pool.AcquireAllIdle(ctx) {
			var cu, ge int64
			err := c.QueryRow(ctx, `SELECT coalesce(sum(custom_plans), 0)::bigint, coalesce(sum(generic_plans), 0)::bigint
			FROM pg_prepared_statements WHERE statement = ANY($1)`,
				[]string{s.q.grantBatch, s.q.releaseBatch}).Scan(&cu, &ge)
			pid := c.Conn().PgConn().PID()
			c.Release()
			if err != nil {
				t.Fatalf("pg_prepared_statements: %v", err)
			}
			perConn[pid] = [2]int64{cu, ge}
		}
		custom, generic = 0, 0
		for _, n := range perConn {
			custom, generic = custom+n[0], generic+n[1]
		}
		return custom != 0 || generic >= 2*pairs
	})
	if custom != 0 || generic < 2*pairs {
		t.Fatalf("the lock batches' statements ran with %d custom and %d generic plans over %d grants and %d releases; "+
			"want no custom plan and at least %d generic ones", custom, generic, pairs, pairs, 2*pairs)
	}
}
