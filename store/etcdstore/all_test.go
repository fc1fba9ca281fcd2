package etcdstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/telemetry"
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
	reg := prometheus.NewRegistry()
	met, err := telemetry.NewMetrics(reg, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	st, err := New(ctx, etcdtest.NewClient(t, srv.Endpoints()...), Options{Prefix: DefaultPrefix, Metrics: met})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { st.Close() })
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

	// The one-commit grant is C4's op grant_free, not try_insert.
	if g, ti := opCount(t, reg, telemetry.OpGrantFree), opCount(t, reg, telemetry.OpTryInsert); g != 1 || ti != 0 {
		t.Errorf("lockd_backend_request_seconds counted grant_free %d, try_insert %d after one GrantFree; want 1 and 0", g, ti)
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

// opCount is how many requests lockd_backend_request_seconds counted for op.
func opCount(t *testing.T, reg *prometheus.Registry, op string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != "lockd_backend_request_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}
