package etcdstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store"
	"lock.dev/lockd/store/storetest"
)

// startEtcd starts a private embedded etcd in a fresh temp dir (as lockd
// serve does with its data dir) and returns a client of it; both stop when
// the test ends.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: t.TempDir(), TickMs: etcdtest.TickMs, ElectionMs: etcdtest.ElectionMs})
	if err != nil {
		t.Fatalf("embedetcd.Start: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	return etcdtest.NewClient(t, srv.Endpoints()...)
}

// TestTokensAboveAFreshDataDir: lockd started on a new (moved, lost) data
// dir hands out tokens above those of the old one (C2 #ct2-fencing).
func TestTokensAboveAFreshDataDir(t *testing.T) {
	open := func(t *testing.T) store.LockStore { return newStore(t, startEtcd(t), DefaultPrefix, nil) }
	storetest.FencingAcrossReinit(t, open, open)
}

// TestEpochTakenOnce: Stores opening a new prefix at the same time agree on
// one epoch; it is written once and never changed by later opens.
func TestEpochTakenOnce(t *testing.T) {
	cli := etcdtest.NewClient(t)
	prefix := etcdtest.Prefix(t)
	const n = 8
	stores := make([]*Store, n)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() { stores[i] = newStore(t, cli, prefix, nil) })
	}
	wg.Wait()
	resp, err := cli.Get(ctxT(t), prefix+epochName)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get(epoch key) = %v, %v; want one key", resp, err)
	}
	kv := resp.Kvs[0]
	e, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || kv.Version != 1 {
		t.Fatalf("epoch key = %q (version %d); want µs written once", kv.Value, kv.Version)
	}
	for i, st := range stores {
		if st.shift != e-kv.CreateRevision {
			t.Fatalf("store %d: shift %d, want %d (epoch %d − create revision %d)", i, st.shift, e-kv.CreateRevision, e, kv.CreateRevision)
		}
	}
	// Grants alternate between the stores: one order.
	var last uint64
	for i := range 2 * n {
		st := stores[i%n]
		id := openSession(t, st, time.Minute)
		g, ok, err := st.TryInsert(ctxT(t), id, "k")
		if err != nil || !ok || g.Token <= last {
			t.Fatalf("TryInsert #%d = %+v, %v, %v; want a grant with a token > %d", i, g, ok, err, last)
		}
		if err := st.DeleteIfOwner(ctxT(t), id, "k", g.Token); err != nil {
			t.Fatalf("DeleteIfOwner #%d: %v", i, err)
		}
		last = g.Token
	}
	// A later open reads the same epoch and writes nothing.
	again := newStore(t, cli, prefix, nil)
	if again.shift != stores[0].shift {
		t.Fatalf("reopened store: shift %d, want %d", again.shift, stores[0].shift)
	}
	if resp, err := cli.Get(ctxT(t), prefix+epochName); err != nil || resp.Kvs[0].Version != 1 {
		t.Fatalf("epoch key after a reopen = %v, %v; want it unchanged (version 1)", resp, err)
	}
}

// TestEpochUpgrade: a prefix used by a lockd without epochs (tokens were raw
// revisions) gets an epoch at the first open: the old grant is still
// readable and revocable, and new tokens are above the old ones.
func TestEpochUpgrade(t *testing.T) {
	cli := etcdtest.NewClient(t)
	prefix := etcdtest.Prefix(t)
	// A grant as the old code wrote it, its token its mod revision.
	put, err := cli.Put(ctxT(t), prefix+"l/k", grantValue("old-session", time.Now()))
	if err != nil {
		t.Fatalf("Put old grant: %v", err)
	}
	oldToken := uint64(put.Header.Revision)
	st := newStore(t, cli, prefix, nil)
	info, found, err := st.Inspect(ctxT(t), "k")
	if err != nil || !found || info.Session != "old-session" {
		t.Fatalf("Inspect(old grant) = %+v, %v, %v; want held by old-session", info, found, err)
	}
	if _, found, err := st.Revoke(ctxT(t), "k"); err != nil || !found {
		t.Fatalf("Revoke(old grant) = %v, %v", found, err)
	}
	id := openSession(t, st, time.Minute)
	g, ok, err := st.TryInsert(ctxT(t), id, "k")
	if err != nil || !ok || g.Token <= oldToken || g.Token <= info.Token {
		t.Fatalf("TryInsert after upgrade = %+v, %v, %v; want a token above the old %d (shown as %d)", g, ok, err, oldToken, info.Token)
	}
	// The old, unshifted token is no token of this epoch.
	if err := st.DeleteIfOwner(ctxT(t), id, "k", oldToken); !errors.Is(err, store.ErrNotOwner) {
		t.Fatalf("DeleteIfOwner(old token %d) = %v, want ErrNotOwner", oldToken, err)
	}
	if err := st.DeleteIfOwner(ctxT(t), id, "k", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner(%d): %v", g.Token, err)
	}
}

// TestEpochMalformed: a Store refuses a prefix whose epoch key it cannot
// read, and says how to repair it.
func TestEpochMalformed(t *testing.T) {
	cli := etcdtest.NewClient(t)
	prefix := etcdtest.Prefix(t)
	if _, err := cli.Put(ctxT(t), prefix+epochName, "yesterday"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	st, err := New(ctxT(t), cli, Options{Prefix: prefix})
	if err == nil {
		st.Close()
		t.Fatal("New on a malformed epoch key succeeded")
	}
	if !errors.Is(err, errMalformed) {
		t.Fatalf("New on a malformed epoch key = %v, want errMalformed", err)
	}
}
