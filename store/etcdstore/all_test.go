package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/etcdtest"
)

// TestGrantFreeTooManyOps (C2 #ct2-acquire-all): on an etcd run with a
// lower --max-txn-ops than the default the one-commit grant assumes, a
// free set whose Txn etcd refuses as too many operations is not an error:
// GrantFree answers "not granted here" and AcquireAll takes the keys by
// the ordered per-key path. A set within the limit is still one commit.
func TestGrantFreeTooManyOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: t.TempDir(), TickMs: etcdtest.TickMs,
		ElectionMs: etcdtest.ElectionMs, MaxTxnOps: 16})
	if err != nil {
		t.Fatalf("embedetcd.Start: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	st := newStore(t, etcdtest.NewClient(t, srv.Endpoints()...), DefaultPrefix, nil)
	id := openSession(t, st, time.Minute)
	keys := func(prefix string, n int) []string {
		var ks []string
		for i := range n {
			ks = append(ks, fmt.Sprintf("%s/%d", prefix, i))
		}
		return ks
	}

	// 4 keys: 16 compares, at etcd's limit of 16: one commit.
	four := keys("fits", 4)
	gs, ok, err := st.GrantFree(ctx, id, four)
	if err != nil || !ok || len(gs) != 4 {
		t.Fatalf("GrantFree(4 keys, limit 16) = %d grants, %v, %v; want 4, true, nil", len(gs), ok, err)
	}
	for _, g := range gs[1:] {
		if g.Token != gs[0].Token {
			t.Errorf("grants of one commit carry tokens %d and %d; want one revision", gs[0].Token, g.Token)
		}
	}

	// 5 keys: 20 compares, refused by etcd as too many operations.
	five := keys("over", 5)
	if gs, ok, err := st.GrantFree(ctx, id, five); err != nil || ok {
		t.Fatalf("GrantFree(5 keys, limit 16) = %d grants, %v, %v; want not granted and no error (etcd's too-many-ops refusal is the fallback's signal)", len(gs), ok, err)
	}
	gs, ok, err = st.AcquireAll(ctx, id, five, false)
	if err != nil || !ok || len(gs) != 5 {
		t.Fatalf("AcquireAll(5 free keys, limit 16) = %d grants, %v, %v; want the per-key path to grant all 5", len(gs), ok, err)
	}
	held, err := st.LocksOf(ctx, id)
	if err != nil {
		t.Fatalf("LocksOf: %v", err)
	}
	if len(held) != 9 {
		t.Errorf("session holds %d keys; want 9 (4 + 5)", len(held))
	}
}
