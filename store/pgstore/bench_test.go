package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

// BenchmarkGrantRelease measures TryInsert + DeleteIfOwner pairs on
// distinct keys at several concurrencies, next to the raw PostgreSQL pair
// (INSERT ... ON CONFLICT DO NOTHING, DELETE, each its own commit, a pool
// of c connections) on the same server:
//
//	go test -run '^$' -bench GrantRelease -benchtime 3s ./store/pgstore/
//
// With LOCKD_TEST_PG_DSN set it runs against that server (its figures
// then include what else runs there).
func BenchmarkGrantRelease(b *testing.B) {
	for _, c := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("store/c=%d", c), func(b *testing.B) {
			st := newStore(b, pgtest.NewDatabase(b))
			ids := make([]store.SessionID, c)
			for i := range ids {
				ids[i] = openSession(b, st)
			}
			runPairs(b, c, func(ctx context.Context, w, i int) error {
				key := fmt.Sprintf("w%d/%d", w, i)
				g, ok, err := st.TryInsert(ctx, ids[w], key)
				if err != nil || !ok {
					return fmt.Errorf("TryInsert(%s) = %v, %v", key, ok, err)
				}
				return st.DeleteIfOwner(ctx, ids[w], key, g.Token)
			})
		})
		b.Run(fmt.Sprintf("raw/c=%d", c), func(b *testing.B) {
			cfg, err := pgxpool.ParseConfig(pgtest.NewDatabase(b))
			if err != nil {
				b.Fatal(err)
			}
			cfg.MaxConns = int32(c)
			pool, err := pgxpool.NewWithConfig(testCtx(b), cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(pool.Close)
			if _, err := pool.Exec(testCtx(b), `CREATE TABLE locks (key text PRIMARY KEY, token bigint NOT NULL);
				CREATE SEQUENCE tokens`); err != nil {
				b.Fatal(err)
			}
			runPairs(b, c, func(ctx context.Context, w, i int) error {
				key := fmt.Sprintf("w%d/%d", w, i)
				var tok int64
				if err := pool.QueryRow(ctx, `INSERT INTO locks (key, token) VALUES ($1, nextval('tokens'))
					ON CONFLICT DO NOTHING RETURNING token`, key).Scan(&tok); err != nil {
					return fmt.Errorf("insert %s: %w", key, err)
				}
				_, err := pool.Exec(ctx, `DELETE FROM locks WHERE key = $1 AND token = $2`, key, tok)
				return err
			})
		})
	}
}

// runPairs runs b.N calls of pair spread over c workers.
func runPairs(b *testing.B, c int, pair func(ctx context.Context, worker, i int) error) {
	b.Helper()
	ctx := testCtx(b)
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make([]error, c)
	)
	b.ResetTimer()
	for w := range c {
		wg.Add(1)
		go func() { // exits after the last pair
			defer wg.Done()
			for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
				if err := pair(ctx, w, i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}
