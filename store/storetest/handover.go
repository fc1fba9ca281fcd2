package storetest

// Hand-over of freed slots in the release (C2 #ct2-multi, "Hand-over in the
// release"; issue 24): when DeleteIfOwner of a slot returns, every waiter
// the release admits already holds, so no slot sits empty while an
// admissible waiter waits for its own retry.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// testSlotHandOver: every slot used while anyone waits. A semaphore of 4
// with 12 queued waiters: right after each release returns, the very next
// Inspect shows 4 holders and one waiter fewer (no polling window). A
// read/write key: a released exclusive holder's readers queued up to the
// next writer hold when its release returns, the writer once the last of
// them released, the reader behind it once the writer released. Then 16
// sessions loop acquire/release on a semaphore of 4; after every release a
// waiter may be queued only while all 4 slots are held.
func (s *suite) testSlotHandOver(t *testing.T) {
	insts := s.instances(t, 2)
	t.Run("semaphore", func(t *testing.T) { s.handOverSemaphore(t, insts) })
	t.Run("readwrite", func(t *testing.T) { s.handOverRW(t, insts) })
	t.Run("loop", func(t *testing.T) { s.handOverLoop(t, insts) })
}

// holdersNow is one Inspect of key (no polling): its holders and waiters.
func holdersNow(t *testing.T, st store.LockStore, key string) ([]store.SessionID, []store.SessionID) {
	t.Helper()
	info, _ := inspect(t, st, key)
	var hs []store.SessionID
	for _, h := range info.Holders {
		hs = append(hs, h.Session)
	}
	return hs, info.Waiters
}

func (s *suite) handOverSemaphore(t *testing.T, insts []store.LockStore) {
	const limit, queued, key = 4, 12, "handover/sem"
	lim := store.WithLimit(limit)
	inst := map[store.SessionID]store.LockStore{}
	var holding []store.Grant
	for i := range limit {
		id := openSession(t, insts[i%2])
		inst[id] = insts[i%2]
		holding = append(holding, mustTryOpts(t, insts[i%2], id, key, lim))
	}
	ids := make([]store.SessionID, queued)
	chans := make([]<-chan acquireResult, queued)
	for i := range queued {
		ids[i] = openSession(t, insts[i%2])
		inst[ids[i]] = insts[i%2]
		chans[i] = startAcquireOpts(ctxT(t), insts[i%2], ids[i], key, lim)
		waitersAre(t, insts[0], key, ids[:i+1])
	}
	for i := range queued {
		g := holding[0]
		holding = holding[1:]
		mustRelease(t, inst[g.Session], g)
		hs, ws := holdersNow(t, insts[(i+1)%2], key)
		if len(hs) != limit || len(ws) != queued-i-1 || !sameSet(hs, append(sessionsOf(holding), ids[i])) {
			t.Fatalf("right after release %d returned: holders %v, waiters %v; want %d holders (%v and the waiter %s) and %d waiters",
				i+1, hs, ws, limit, sessionsOf(holding), ids[i], queued-i-1)
		}
		r := recvResult(t, chans[i], 15*time.Second, fmt.Sprintf("waiter %d", i))
		if r.err != nil || r.g.Session != ids[i] || r.g.Token <= g.Token {
			t.Fatalf("waiter %d: %+v, %v; want the grant for %s with a token above %d", i, r.g, r.err, ids[i], g.Token)
		}
		holding = append(holding, r.g)
	}
}

func sessionsOf(gs []store.Grant) []store.SessionID {
	out := make([]store.SessionID, len(gs))
	for i, g := range gs {
		out[i] = g.Session
	}
	return out
}

func (s *suite) handOverRW(t *testing.T, insts []store.LockStore) {
	const key = "handover/rw"
	shared, excl := store.WithMode(store.ModeShared), store.WithMode(store.ModeExclusive)
	x := openSession(t, insts[0])
	gx := mustTryOpts(t, insts[0], x, key, excl)
	// Queued: three readers, a writer, a reader.
	modes := []store.AcquireOption{shared, shared, shared, excl, shared}
	ids := make([]store.SessionID, len(modes))
	chans := make([]<-chan acquireResult, len(modes))
	for i, m := range modes {
		ids[i] = openSession(t, insts[i%2])
		chans[i] = startAcquireOpts(ctxT(t), insts[i%2], ids[i], key, m)
		waitersAre(t, insts[0], key, ids[:i+1])
	}
	step := func(what string, want, wantWaiters []store.SessionID) {
		t.Helper()
		hs, ws := holdersNow(t, insts[1], key)
		if !sameSet(hs, want) || !sameSet(ws, wantWaiters) || len(ws) != len(wantWaiters) {
			t.Fatalf("right after %s returned: holders %v, waiters %v; want holders %v, waiters %v", what, hs, ws, want, wantWaiters)
		}
	}
	recv := func(i int) store.Grant {
		t.Helper()
		r := recvResult(t, chans[i], 15*time.Second, fmt.Sprintf("waiter %d", i))
		if r.err != nil || r.g.Session != ids[i] {
			t.Fatalf("waiter %d: %+v, %v; want the grant for %s", i, r.g, r.err, ids[i])
		}
		return r.g
	}
	mustRelease(t, insts[0], gx)
	step("the exclusive holder's release", ids[:3], ids[3:])
	readers := []store.Grant{recv(0), recv(1), recv(2)}
	tokens := map[uint64]bool{}
	for _, g := range readers {
		if tokens[g.Token] || g.Token <= gx.Token {
			t.Fatalf("readers %+v: want distinct tokens above the writer's %d", readers, gx.Token)
		}
		tokens[g.Token] = true
	}
	mustRelease(t, insts[0], readers[0])
	mustRelease(t, insts[1], readers[1])
	step("two readers' releases", ids[2:3], ids[3:])
	mustRelease(t, insts[0], readers[2])
	step("the last reader's release", ids[3:4], ids[4:])
	gw := recv(3)
	mustRelease(t, insts[1], gw)
	step("the second writer's release", ids[4:], nil)
	mustRelease(t, insts[0], recv(4))
}

func (s *suite) handOverLoop(t *testing.T, insts []store.LockStore) {
	const n, limit, rounds, key = 16, 4, 8, "handover/loop"
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var (
		mu         sync.Mutex
		violations []string
		wg         sync.WaitGroup
	)
	for i := range n {
		st := insts[i%2]
		id := openSession(t, st)
		wg.Go(func() {
			for r := range rounds {
				g, err := st.Acquire(ctx, id, key, store.WithLimit(limit))
				if err == nil {
					err = st.DeleteIfOwner(ctx, id, key, g.Token)
				}
				var info store.LockInfo
				if err == nil {
					info, _, err = insts[(i+r)%2].Inspect(ctx, key)
				}
				mu.Lock()
				switch {
				case err != nil:
					violations = append(violations, fmt.Sprintf("session %d round %d: %v", i, r, err))
					cancel()
				case len(info.Waiters) > 0 && len(info.Holders) < limit:
					violations = append(violations, fmt.Sprintf("after a release: %d of %d slots held while %d wait", len(info.Holders), limit, len(info.Waiters)))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(violations) > 0 {
		t.Fatalf("%d violations, first: %v", len(violations), violations[:min(len(violations), 5)])
	}
}
