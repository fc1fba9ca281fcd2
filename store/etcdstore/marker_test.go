package etcdstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// countKeys returns how many etcd keys exist under prefix besides its
// epoch key.
func countKeys(t testing.TB, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(ctxT(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count keys under %q: %v", prefix, err)
	}
	epoch, err := cli.Get(ctxT(t), prefix+epochName, clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count the epoch key: %v", err)
	}
	records, err := cli.Get(ctxT(t), prefix+"s/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("count the session records: %v", err)
	}
	// The prefix's epoch key (C2 #ct2-fencing) is one per prefix, and the
	// session and keeper records (C2 #ct2-replicas) are per live session
	// on its lease: neither is a residue of any lock key.
	return resp.Count - epoch.Count - records.Count
}

// markerWait bounds how long a test waits for markers to go: the test
// lifetime, plus etcd's expiry check and slack.
const markerWait = 20 * time.Second

// TestNoResidueAfterRelease: 100 distinct keys acquired and released (and
// 10 revoked) leave no key at all in etcd once their sessions are closed
// and the markers' lifetime has passed (issue 11 §5). Before markers had a
// lease, each key left its marker forever.
func TestNoResidueAfterRelease(t *testing.T) {
	cli := etcdtest.NewClient(t)
	prefix := etcdtest.Prefix(t)
	st := newShortMarkerStore(t, cli, prefix)
	id := openSession(t, st, 5*time.Second)
	for i := range 100 {
		key := fmt.Sprintf("entity-%03d", i)
		g := mustTry(t, st, id, key)
		if err := st.DeleteIfOwner(ctxT(t), id, key, g.Token); err != nil {
			t.Fatalf("DeleteIfOwner(%q): %v", key, err)
		}
	}
	for i := range 10 {
		key := fmt.Sprintf("revoked-%03d", i)
		mustTry(t, st, id, key)
		if _, found, err := st.Revoke(ctxT(t), key); err != nil || !found {
			t.Fatalf("Revoke(%q) = %v, %v", key, found, err)
		}
	}
	if n := countKeys(t, cli, prefix); n == 0 {
		t.Fatalf("no marker written at all: the test sees nothing")
	}
	if _, err := st.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	testkit.Eventually(t, markerWait, "no key left under the prefix", func() error {
		if n := countKeys(t, cli, prefix); n != 0 {
			return fmt.Errorf("%d etcd keys left under %s", n, prefix)
		}
		return nil
	})
}

// countingKV counts the keys that range reads return.
type countingKV struct {
	clientv3.KV
	gets, keys atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := c.KV.Get(ctx, key, opts...)
	if err == nil {
		c.gets.Add(1)
		c.keys.Add(int64(len(resp.Kvs)))
	}
	return resp, err
}

// TestListLimitOneScansO1: after 100 distinct keys were released, List
// with limit 1 reads O(1) keys, not the released keys' markers (issue 11
// §5). Before, every marker stayed and List read through all of them.
func TestListLimitOneScansO1(t *testing.T) {
	cli := etcdtest.NewClient(t)
	prefix := etcdtest.Prefix(t)
	kv := &countingKV{KV: cli.KV}
	cli.KV = kv
	st := newShortMarkerStore(t, cli, prefix)
	id := openSession(t, st, 5*time.Second)
	for i := range 100 {
		key := fmt.Sprintf("a-%03d", i)
		g := mustTry(t, st, id, key)
		if err := st.DeleteIfOwner(ctxT(t), id, key, g.Token); err != nil {
			t.Fatalf("DeleteIfOwner(%q): %v", key, err)
		}
	}
	mustTry(t, st, id, "z-held") // sorts after every released key
	testkit.Eventually(t, markerWait, "only the held key left", func() error {
		if n := countKeys(t, cli, prefix); n != 1 {
			return fmt.Errorf("%d etcd keys under %s, want 1", n, prefix)
		}
		return nil
	})
	kv.gets.Store(0)
	kv.keys.Store(0)
	infos, err := st.List(ctxT(t), "", "", 1)
	if err != nil || len(infos) != 1 || infos[0].Key != "z-held" {
		t.Fatalf("List(limit 1) = %+v, %v; want z-held", infos, err)
	}
	// At most two reads of the plain keys (the released markers are
	// skipped by the range, not paged through) and one of the semaphore
	// and read/write keys (listMulti), which has nothing here.
	if gets, keys := kv.gets.Load(), kv.keys.Load(); gets > 3 || keys > 3 {
		t.Fatalf("List(limit 1) made %d range reads returning %d keys, want at most 3 and 3", gets, keys)
	}
}

// testMarkerTTL is the marker lease TTL of the tests: markers are gone
// within about 3.5 s.
const testMarkerTTL = 2 * time.Second

// newShortMarkerStore is newStore with markers that live testMarkerTTL.
func newShortMarkerStore(t testing.TB, cli *clientv3.Client, prefix string) *Store {
	t.Helper()
	st, err := New(ctxT(t), cli, Options{Prefix: prefix, MarkerTTL: testMarkerTTL})
	if err != nil {
		t.Fatalf("New(prefix %q): %v", prefix, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestMarkerLeaseRevokedOutOfBand: when the marker lease ends early, a
// release and a revoke still succeed (with a new marker lease) and the
// watch still tells released and revoked apart.
func TestMarkerLeaseRevokedOutOfBand(t *testing.T) {
	cli := etcdtest.NewClient(t)
	st := newShortMarkerStore(t, cli, etcdtest.Prefix(t))
	st.marks.rotate = time.Hour // keep one lease, then revoke it behind the Store's back
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	_, ch, err := st.WatchFrom(ctx, "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, st, 5*time.Second)
	g := mustTry(t, st, id, "a")
	if err := st.DeleteIfOwner(ctxT(t), id, "a", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	st.marks.mu.Lock()
	old := st.marks.id
	st.marks.mu.Unlock()
	if _, err := cli.Revoke(ctxT(t), old); err != nil {
		t.Fatalf("revoke the marker lease: %v", err)
	}
	g = mustTry(t, st, id, "b")
	if err := st.DeleteIfOwner(ctxT(t), id, "b", g.Token); err != nil {
		t.Fatalf("DeleteIfOwner after the marker lease ended: %v", err)
	}
	st.marks.mu.Lock()
	old = st.marks.id
	st.marks.mu.Unlock()
	if _, err := cli.Revoke(ctxT(t), old); err != nil {
		t.Fatalf("revoke the second marker lease: %v", err)
	}
	g = mustTry(t, st, id, "c")
	if _, found, err := st.Revoke(ctxT(t), "c"); err != nil || !found {
		t.Fatalf("Revoke after the marker lease ended = %v, %v", found, err)
	}
	want := []store.EventKind{store.EventAcquired, store.EventReleased, store.EventAcquired, store.EventReleased,
		store.EventAcquired, store.EventRevoked}
	for i, w := range want {
		select {
		case ev := <-ch:
			if ev.Kind != w {
				t.Fatalf("event %d = %+v, want kind %v", i, ev, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d (%v) not delivered", i, w)
		}
	}
}
