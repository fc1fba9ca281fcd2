package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// The contention tests' shared setup (issue 21): the test hook at one
// point, raw waiters on a lease of the test, and a real waiter queued
// behind them.

// hookAt sets f as st's test hook at point p (the other points pass) until
// the returned function is called or the test ends.
func hookAt(t testing.TB, st *Store, p hookPoint, f func(key string)) (unset func()) {
	h := func(at hookPoint, key string) {
		if at == p {
			f(key)
		}
	}
	st.hook.Store(&h)
	unset = func() { st.hook.CompareAndSwap(&h, nil) }
	t.Cleanup(unset)
	return unset
}

// rawWaiters queues n waiters of made-up sessions (ahead00, ahead01, …),
// in that order, as keys keyOf(id) with values valueOf(id) on a lease of
// the test (revoked at the test's end; its TTL of a minute ends it too).
// It returns their keys in queue order, and the lease.
func rawWaiters(t testing.TB, cli *clientv3.Client, n int, keyOf, valueOf func(store.SessionID) string) ([]string, clientv3.LeaseID) {
	t.Helper()
	lease, err := cli.Grant(ctxT(t), 60)
	if err != nil {
		t.Fatalf("lease of the queued waiters: %v", err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) }) //nolint:errcheck // its TTL ends it too
	ahead := make([]string, n)
	for i := range ahead {
		id := store.SessionID(fmt.Sprintf("ahead%02d", i))
		ahead[i] = keyOf(id)
		if _, err := cli.Put(ctxT(t), ahead[i], valueOf(id), clientv3.WithLease(lease.ID)); err != nil {
			t.Fatalf("queueing waiter %d: %v", i, err)
		}
	}
	return ahead, lease.ID
}

// acquired is the outcome of an Acquire run by acquireQueued.
type acquired struct {
	g   store.Grant
	err error
}

// acquireQueued starts session w's Acquire of key through st (with opts)
// and returns once st's Inspect shows w queued; the channel gets the
// Acquire's outcome (granted, or the end of the test's context).
func acquireQueued(t testing.TB, st *Store, w store.SessionID, key string, opts ...store.AcquireOption) <-chan acquired {
	t.Helper()
	done := make(chan acquired, 1)
	go func() { // exits when Acquire returns (granted, or ctxT's end)
		g, err := st.Acquire(ctxT(t), w, key, opts...)
		done <- acquired{g, err}
	}()
	testkit.Eventually(t, 30*time.Second, "w queued", func() error {
		info, _, err := st.Inspect(ctxT(t), key)
		if err == nil && !slices.Contains(info.Waiters, w) {
			err = errors.New("not queued yet")
		}
		return err
	})
	return done
}
