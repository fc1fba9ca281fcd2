package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// Deadlocks through semaphores and read/write locks (C2 #ct2-deadlock, the
// AND-OR model, 2026-12-07): a read/write exclusive wait waits for every
// holder, a semaphore wait for any one holder of a full semaphore.

// wantDeadlock checks that r is the refusal of a deadlocked set over keys.
func wantDeadlock(t *testing.T, what string, r acquireResult, keys ...string) {
	t.Helper()
	var de *store.DeadlockError
	if !errors.Is(r.err, store.ErrDeadlock) || !errors.As(r.err, &de) {
		t.Fatalf("%s: Acquire = %+v, %v; want ErrDeadlock", what, r.g, r.err)
	}
	if want := slices.Sorted(slices.Values(keys)); !slices.Equal(de.Keys, want) {
		t.Fatalf("%s: keys %v; want %v", what, de.Keys, want)
	}
}

// wantGrant checks that r is the grant of key to id.
func wantGrant(t *testing.T, what string, r acquireResult, id store.SessionID, key string) store.Grant {
	t.Helper()
	if r.err != nil || r.g.Session != id || r.g.Key != key {
		t.Fatalf("%s: Acquire = %+v, %v; want the grant of %q", what, r.g, r.err, key)
	}
	return r.g
}

// testDeadlockRW: A holds rw shared (instance 0) and waits for the plain
// key x; B holds x (instance 1) and waits for rw exclusive, which waits
// for every reader: a 2-cycle. B's wait closed it and is refused with both
// keys; A is granted x once B releases it.
func (s *suite) testDeadlockRW(t *testing.T) {
	insts := s.instances(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	rw, x := "dlrw/rw", "dlrw/x"
	a, b := openSession(t, insts[0]), openSession(t, insts[1])
	ha := mustTryOpts(t, insts[0], a, rw, store.WithMode(store.ModeShared))
	hb := mustTry(t, insts[1], b, x)
	aw := startAcquire(t, ctx, insts[0], a, x)
	waitersAre(t, insts[1], x, []store.SessionID{a})
	closed := time.Now()
	bw := startAcquire(t, ctx, insts[1], b, rw, store.WithMode(store.ModeExclusive))
	waitersAre(t, insts[0], rw, []store.SessionID{b})
	wantDeadlock(t, "B, the writer waiting for A's read", recvResult(t, bw, DeadlockBound+margin, "B (rw exclusive)"), rw, x)
	t.Logf("read/write 2-cycle refused %v after the closing wait was queued (bound %v)", time.Since(closed).Round(time.Millisecond), DeadlockBound)
	notReturned(t, aw, "A beside the victim")
	waitersAre(t, insts[0], rw, nil)
	mustRelease(t, insts[1], hb)
	g := wantGrant(t, "A after B released x", recvResult(t, aw, 15*time.Second, "A after B released x"), a, x)
	mustRelease(t, insts[0], g)
	mustRelease(t, insts[0], ha)
}

// testDeadlockSemaphoreKnot: T1 (instance 0) and T2 (instance 1) hold both
// slots of the semaphore s of 2 and each waits for the plain key x, which
// W (instance 1) holds; W waits for a slot of s. Every holder is blocked:
// a knot. W's wait, the youngest, is refused naming s and x; with
// opt-out W queued with NoDeadlockCheck and T2's wait, the youngest
// checking one, is refused instead. Then the knot unwinds.
func (s *suite) testDeadlockSemaphoreKnot(t *testing.T) {
	for _, mode := range []string{"checking", "opt-out"} {
		t.Run(mode, func(t *testing.T) { s.deadlockSemaphoreKnot(t, mode == "opt-out") })
	}
}

func (s *suite) deadlockSemaphoreKnot(t *testing.T, optOut bool) {
	insts := s.instances(t, 2)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	p := "dlsk/check/"
	if optOut {
		p = "dlsk/optout/"
	}
	sem, x := p+"s", p+"x"
	limit := store.WithLimit(2)
	t1, t2, w := openSession(t, insts[0]), openSession(t, insts[1]), openSession(t, insts[1])
	h1 := mustTryOpts(t, insts[0], t1, sem, limit)
	h2 := mustTryOpts(t, insts[1], t2, sem, limit)
	hw := mustTry(t, insts[1], w, x)
	c1 := startAcquire(t, ctx, insts[0], t1, x)
	waitersAre(t, insts[1], x, []store.SessionID{t1})
	c2 := startAcquire(t, ctx, insts[1], t2, x)
	waitersAre(t, insts[0], x, []store.SessionID{t1, t2})
	opts := []store.AcquireOption{limit}
	if optOut {
		opts = append(opts, store.NoDeadlockCheck())
	}
	closed := time.Now()
	cw := startAcquire(t, ctx, insts[1], w, sem, opts...)
	waitersAre(t, insts[0], sem, []store.SessionID{w})
	if !optOut {
		wantDeadlock(t, "W, waiting for a full semaphore whose holders wait for W", recvResult(t, cw, DeadlockBound+margin, "W (semaphore)"), sem, x)
		t.Logf("semaphore knot refused %v after the closing wait was queued (bound %v)", time.Since(closed).Round(time.Millisecond), DeadlockBound)
		notReturned(t, c1, "T1 beside the victim")
		notReturned(t, c2, "T2 beside the victim")
		waitersAre(t, insts[0], sem, nil)
		// W gives x up: T1, then T2, get it.
		mustRelease(t, insts[1], hw)
		g := wantGrant(t, "T1 after W released x", recvResult(t, c1, 15*time.Second, "T1"), t1, x)
		notReturned(t, c2, "T2 while T1 holds x")
		mustRelease(t, insts[0], g)
		g = wantGrant(t, "T2 after T1 released x", recvResult(t, c2, 15*time.Second, "T2"), t2, x)
		mustRelease(t, insts[1], g)
		mustRelease(t, insts[0], h1)
		mustRelease(t, insts[1], h2)
		return
	}
	wantDeadlock(t, "T2, the youngest checking wait of the knot", recvResult(t, c2, DeadlockBound+margin, "T2 (x)"), sem, x)
	notReturned(t, c1, "T1 beside the victim")
	notReturned(t, cw, "W (opted out) beside the victim")
	waitersAre(t, insts[0], x, []store.SessionID{t1})
	// T2 gives its slot up: W gets it, then gives x up to T1.
	mustRelease(t, insts[1], h2)
	g := wantGrant(t, "W after T2 released its slot", recvResult(t, cw, 15*time.Second, "W"), w, sem)
	mustRelease(t, insts[1], g)
	mustRelease(t, insts[1], hw)
	g = wantGrant(t, "T1 after W released x", recvResult(t, c1, 15*time.Second, "T1"), t1, x)
	mustRelease(t, insts[0], g)
	mustRelease(t, insts[0], h1)
}

// testDeadlockSemaphoreFreeHolder: the knot of testDeadlockSemaphoreKnot
// but T2 waits for nothing: W's semaphore wait is an OR-wait, and T2's
// release will admit it. The instance of W (the wait the plain graph would
// refuse) is let through three scans (two consecutive sightings would
// refuse): W is still waiting. Then T2 releases its slot and W is granted.
func (s *suite) testDeadlockSemaphoreFreeHolder(t *testing.T) {
	insts := s.instances(t, 2)
	gate := newScanGate(t, insts[1])
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	sem, x := "dlsf/s", "dlsf/x"
	limit := store.WithLimit(2)
	t1, t2, w := openSession(t, insts[0]), openSession(t, insts[0]), openSession(t, insts[1])
	h1 := mustTryOpts(t, insts[0], t1, sem, limit)
	h2 := mustTryOpts(t, insts[0], t2, sem, limit)
	hw := mustTry(t, insts[1], w, x)
	c1 := startAcquire(t, ctx, insts[0], t1, x)
	waitersAre(t, insts[1], x, []store.SessionID{t1})
	cw := startAcquire(t, ctx, insts[1], w, sem, limit)
	waitersAre(t, insts[0], sem, []store.SessionID{w})
	// W's instance scans only while W waits: each scan reads the graph
	// with W queued.
	gate.scan(t, "scan 1")
	gate.scan(t, "scan 2")
	select {
	case <-gate.entered: // scan 3: scans 1 and 2 are over
	case r := <-cw:
		t.Fatalf("W's Acquire returned while T2, a holder of the semaphore, waits for nothing: %+v, %v; "+
			"want it waiting (an OR-wait with a free holder is no deadlock)", r.g, r.err)
	case <-time.After(15 * time.Second):
		t.Fatal("scan 3: no deadlock scan reached the gate within 15 s")
	}
	notReturned(t, cw, "W after two scans of the cycle through a free holder")
	notReturned(t, c1, "T1")
	gate.release()
	mustRelease(t, insts[0], h2)
	g := wantGrant(t, "W after T2 released its slot", recvResult(t, cw, 15*time.Second, "W"), w, sem)
	mustRelease(t, insts[1], g)
	mustRelease(t, insts[1], hw)
	g = wantGrant(t, "T1 after W released x", recvResult(t, c1, 15*time.Second, "T1"), t1, x)
	mustRelease(t, insts[0], g)
	mustRelease(t, insts[0], h1)
}
