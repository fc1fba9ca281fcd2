package etcdstore

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store"
)

// BenchmarkWaitGraph is the cost of one deadlock scan with n plain grants
// and n waiters (one n-cycle): the read of the graph and FindDeadlocks.
//
//	go test -run '^$' -bench WaitGraph -benchtime 20x ./store/etcdstore/
func BenchmarkWaitGraph(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			cli := etcdtest.NewClient(b)
			s := newStore(b, cli, etcdtest.Prefix(b), nil)
			ctx := ctxT(b)
			var ops []clientv3.Op
			flush := func() {
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					b.Fatal(err)
				}
				ops = ops[:0]
			}
			for i := range n {
				id := store.SessionID(fmt.Sprintf("s%06d", i))
				ops = append(ops,
					clientv3.OpPut(s.lockKey(fmt.Sprintf("k%06d", i)), fmt.Sprintf("%s %d", id, time.Now().UnixNano())),
					clientv3.OpPut(s.waiterKey(fmt.Sprintf("k%06d", (i+1)%n), id), waiterValue(id, false)))
				if len(ops) >= 100 {
					flush()
				}
			}
			if len(ops) > 0 {
				flush()
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
