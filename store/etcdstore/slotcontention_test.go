package etcdstore

import (
	"context"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store"
)

// TestSlotReleaseUnderContention (issues 21, 24): a slot's release whose
// hand-over compare fails on every try still releases, and the waiter its
// release admits still gets the slot. A semaphore of 2 is held by a and b;
// handOverTries waiters (raw keys on a lease of the test) are queued ahead
// of the waiter w. Before each hand-over transaction the hook removes the
// waiter that transaction grants (the head of the queue leaves), so every
// try's compare fails, as under a stream of concurrent releases and
// waiters. On the code before the fallback the release itself failed:
// "store: contention: etcdstore: release "contended/sem": its slots kept
// changing".
//
// "handed over": after the fallback delete, the hand-over grants w before
// the release returns. "own attempt": the hook cancels the release's
// context at the first hand-over after the fallback delete (no hand-over
// at all), so w takes the slot itself, woken by that delete alone.
func TestSlotReleaseUnderContention(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noHandOut bool
	}{{"handed over", false}, {"own attempt", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.NewClient(t)
			st := newStore(t, cli, etcdtest.Prefix(t), nil)
			other := newStore(t, etcdtest.NewClient(t), st.prefix, nil)
			const key = "contended/sem"
			o := store.AcquireOptions{Limit: 2}
			lim := store.WithLimit(2)
			a, b := openSession(t, st, 10*time.Second), openSession(t, st, 10*time.Second)
			w := openSession(t, other, 10*time.Second)
			var ga store.Grant
			for _, id := range []store.SessionID{a, b} {
				g, ok, err := st.TryInsert(ctxT(t), id, key, lim)
				if err != nil || !ok {
					t.Fatalf("TryInsert(%s) by %s = %v, %v; want a slot", key, id, ok, err)
				}
				if id == a {
					ga = g
				}
			}
			ahead, _ := rawWaiters(t, cli, handOverTries,
				func(id store.SessionID) string { return st.mwaiterKey(key, id) },
				func(id store.SessionID) string { return entryValue(id, o) })
			done := acquireQueued(t, other, w, key, lim)

			rctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			calls, left := 0, 0
			hook := func(k string) {
				calls++
				if k != key {
					return
				}
				if calls > handOverTries {
					if tc.noHandOut {
						cancel()
					}
					return
				}
				if resp, err := cli.Delete(ctxT(t), ahead[calls-1]); err == nil && resp.Deleted == 1 {
					left++
				}
			}
			unset := hookAt(t, st, hookSlotReleaseTry, hook)
			err := st.DeleteIfOwner(rctx, a, key, ga.Token)
			unset()
			if err != nil {
				t.Fatalf("DeleteIfOwner of a's slot with every hand-over compare failing (%d waiters left before a try): %v; want released", left, err)
			}
			if left != handOverTries {
				t.Fatalf("%d waiters left before a hand-over try, want %d", left, handOverTries)
			}
			holders := func() ([]store.SessionID, []store.SessionID, error) {
				info, _, err := st.Inspect(ctxT(t), key)
				var hs []store.SessionID
				for _, h := range info.Holders {
					hs = append(hs, h.Session)
				}
				return hs, info.Waiters, err
			}
			// Handed over: b and w hold, nobody waits. Own attempt: a's slot
			// is gone; w may hold already.
			if hs, ws, err := holders(); err != nil || !slices.Contains(hs, b) || slices.Contains(hs, a) ||
				(!tc.noHandOut && (len(hs) != 2 || !slices.Contains(hs, w) || len(ws) != 0)) {
				t.Fatalf("right after the release returned: holders %v, waiters %v, %v; want b (%s) holding and a (%s) not (handed over: w (%s) holding too, nobody waiting)",
					hs, ws, err, b, a, w)
			}
			select {
			case r := <-done:
				if r.err != nil || r.g.Session != w || r.g.Token <= ga.Token {
					t.Fatalf("w's Acquire = %+v, %v; want its slot with a token above %d", r.g, r.err, ga.Token)
				}
			case <-time.After(30 * time.Second):
				hs, ws, err := holders()
				t.Fatalf("w, admitted by the release, has no slot 30 s after it: holders %v, waiters %v, %v", hs, ws, err)
			}
		})
	}
}
