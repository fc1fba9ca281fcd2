package pgstore

import (
	"fmt"
	"testing"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/store"
)

// BenchmarkWaitGraph is the cost of one deadlock scan with n plain grants
// and n waiters (one n-cycle): the read of the graph and FindDeadlocks.
//
//	go test -run '^$' -bench WaitGraph -benchtime 20x ./store/pgstore/
func BenchmarkWaitGraph(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			s := newStore(b, pgtest.NewDatabase(b))
			ctx := testCtx(b)
			sc := s.schemaIdent()
			for _, q := range []string{
				`INSERT INTO ` + sc + `.sessions (id, ttl_ms, expires_at) SELECT 's' || i, 60000, now() + interval '1 hour' FROM generate_series(0, $1 - 1) i`,
				`INSERT INTO ` + sc + `.locks (key, session_id, token) SELECT 'k' || i, 's' || i, i + 1 FROM generate_series(0, $1 - 1) i`,
				`INSERT INTO ` + sc + `.waiters (key, session_id) SELECT 'k' || ((i + 1) % $1), 's' || i FROM generate_series(0, $1 - 1) i`,
			} {
				if _, err := s.pool.Exec(ctx, q, n); err != nil {
					b.Fatalf("%s: %v", q, err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				g, err := s.waitGraph(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if d := store.FindDeadlocks(g); len(d) != 1 || len(d[0].Keys) != n {
					b.Fatalf("%d deadlocks; want one over %d keys", len(d), n)
				}
			}
		})
	}
}
