package etcdstore

import (
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store"
)

// TestPlainReleaseUnderContention (issue 21): a plain lock's release whose
// hand-over fails on every try still releases, and the first waiter still
// gets the key. a holds the key; handOverTries waiters (raw waiter keys on
// a lease of the test) are queued ahead of the waiter w of another Store.
// Before each hand-over try the hook removes the head of the queue, the
// waiter that try names (or would read), so no try hands over, as under
// waiters coming and going. On the code before the fallback the release
// itself failed: "store: contention: etcdstore: release "contended/plain":
// its queue kept changing".
//
// After the fallback (the owner-compared delete), w takes the key by its
// own attempt, woken by the delete. "lock-delay": a's grant has a
// lock-delay of a minute, which a release does not keep (C2 #ct2-delay): the
// fallback deletes its record too, or w would wait past the test's bound.
func TestPlainReleaseUnderContention(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{{"plain", 0}, {"lock-delay", time.Minute}} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.NewClient(t)
			st := newStore(t, cli, etcdtest.Prefix(t), nil)
			other := newStore(t, etcdtest.NewClient(t), st.prefix, nil)
			const key = "contended/plain"
			a := openSession(t, st, 10*time.Second)
			w := openSession(t, other, 10*time.Second)
			ga, ok, err := st.TryInsert(ctxT(t), a, key)
			if err != nil || !ok {
				t.Fatalf("TryInsert(%s) by a = %v, %v; want the key", key, ok, err)
			}
			if tc.delay > 0 {
				if err := st.SetGrantPolicy(ctxT(t), a, key, ga.Token, store.GrantPolicy{LockDelay: tc.delay}); err != nil {
					t.Fatalf("SetGrantPolicy(lock-delay %v): %v", tc.delay, err)
				}
				if r, err := cli.Get(ctxT(t), st.delayKey(key)); err != nil || len(r.Kvs) != 1 {
					t.Fatalf("delay record after SetGrantPolicy: %v, %v; want one", r, err)
				}
			}
			ahead, _ := rawWaiters(t, cli, handOverTries,
				func(id store.SessionID) string { return st.waiterKey(key, id) },
				func(id store.SessionID) string { return waiterValue(id, true) })
			done := acquireQueued(t, other, w, key, store.NoDeadlockCheck())

			calls, left := 0, 0
			hook := func(k string) {
				if k != key || calls >= len(ahead) {
					return
				}
				calls++
				if resp, err := cli.Delete(ctxT(t), ahead[calls-1]); err == nil && resp.Deleted == 1 {
					left++
				}
			}
			unset := hookAt(t, st, hookReleaseTry, hook)
			err = st.DeleteIfOwner(ctxT(t), a, key, ga.Token)
			unset()
			if err != nil {
				t.Fatalf("DeleteIfOwner of a's grant with every hand-over try failing (%d waiters left before a try): %v; want released", left, err)
			}
			if left != handOverTries {
				t.Fatalf("%d waiters left before a hand-over try, want %d", left, handOverTries)
			}
			info, found, err := st.Inspect(ctxT(t), key)
			if err != nil || (found && info.Session == a) {
				t.Fatalf("right after the release returned: %+v, %v; want a (%s) not holding", info, err, a)
			}
			if r, err := cli.Get(ctxT(t), st.markerKey(key)); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != markReleased {
				t.Fatalf("release marker right after the release: %v, %v; want %q", r, err, markReleased)
			}
			if r, err := cli.Get(ctxT(t), st.delayKey(key)); err != nil || len(r.Kvs) != 0 {
				t.Fatalf("delay record right after the release: %v, %v; want none (a release hands over at once)", r, err)
			}
			select {
			case r := <-done:
				if r.err != nil || r.g.Session != w || r.g.Token <= ga.Token {
					t.Fatalf("w's Acquire = %+v, %v; want the key with a token above %d", r.g, r.err, ga.Token)
				}
			case <-time.After(30 * time.Second):
				info, _, err := st.Inspect(ctxT(t), key)
				t.Fatalf("w, first in line, has not got the key 30 s after the release: %+v, %v", info, err)
			}
		})
	}
}
