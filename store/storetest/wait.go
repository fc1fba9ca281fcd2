package storetest

// Waiting: FIFO hand-over and waiters that leave the queue.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

func (s *suite) testFIFO(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "fifo/k")
	const n = 8
	ids := make([]store.SessionID, n)
	chans := make([]<-chan acquireResult, n)
	ctx, cancel := context.WithTimeout(ctxT(t), 60*time.Second)
	defer cancel()
	for i := range n {
		st := insts[i%2]
		ids[i] = openSession(t, st)
		chans[i] = startAcquire(t, ctx, st, ids[i], "fifo/k")
		waitersAre(t, insts[(i+1)%2], "fifo/k", ids[:i+1])
	}
	mustRelease(t, insts[0], hg)
	last := hg.Token
	for i := range n {
		r := recvResult(t, chans[i], 15*time.Second, fmt.Sprintf("waiter %d", i))
		if r.err != nil || r.g.Session != ids[i] {
			t.Fatalf("waiter %d: Acquire = %+v, %v; want the grant for %s", i, r.g, r.err, ids[i])
		}
		if r.g.Token <= last {
			t.Fatalf("waiter %d: token %d, want > %d", i, r.g.Token, last)
		}
		last = r.g.Token
		for j := i + 1; j < n; j++ {
			notReturned(t, chans[j], fmt.Sprintf("waiter %d while %d holds", j, i))
		}
		mustRelease(t, insts[i%2], r.g)
	}
}

func (s *suite) testFIFOCancelledWaiterLeaves(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "fc/k")
	w1, w2 := openSession(t, insts[1]), openSession(t, insts[0])
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	defer cancel1()
	ch1 := startAcquire(t, ctx1, insts[1], w1, "fc/k")
	waitersAre(t, insts[0], "fc/k", []store.SessionID{w1})
	ch2 := startAcquire(t, ctxT(t), insts[0], w2, "fc/k")
	waitersAre(t, insts[0], "fc/k", []store.SessionID{w1, w2})
	cancel1()
	r1 := recvResult(t, ch1, 5*time.Second, "cancelled waiter")
	if !errors.Is(r1.err, context.Canceled) {
		t.Fatalf("cancelled waiter: err = %v, want errors.Is(err, context.Canceled)", r1.err)
	}
	waitersAre(t, insts[0], "fc/k", []store.SessionID{w2})
	mustRelease(t, insts[0], hg)
	r2 := recvResult(t, ch2, 10*time.Second, "next waiter")
	if r2.err != nil || r2.g.Session != w2 {
		t.Fatalf("next waiter: %+v, %v; want the grant", r2.g, r2.err)
	}
}

func (s *suite) testFIFODeadWaiterLeaves(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "fd/k")
	w1, w2, w3 := openSession(t, insts[1]), openSession(t, insts[0]), openSession(t, insts[1])
	ch1 := startAcquire(t, ctxT(t), insts[1], w1, "fd/k")
	waitersAre(t, insts[0], "fd/k", []store.SessionID{w1})
	ch2 := startAcquire(t, ctxT(t), insts[0], w2, "fd/k")
	waitersAre(t, insts[0], "fd/k", []store.SessionID{w1, w2})
	ch3 := startAcquire(t, ctxT(t), insts[1], w3, "fd/k")
	waitersAre(t, insts[0], "fd/k", []store.SessionID{w1, w2, w3})
	// w1's session is closed, w2's expires: both leave the queue.
	if _, err := insts[1].CloseSession(ctxT(t), w1); err != nil {
		t.Fatalf("CloseSession(w1): %v", err)
	}
	r1 := recvResult(t, ch1, 10*time.Second, "closed waiter")
	wantErr(t, "waiter whose session was closed", r1.err, store.ErrSessionDead)
	s.cfg.Expire(t, insts[0], w2)
	r2 := recvResult(t, ch2, s.expiryBound(), "expired waiter")
	wantErr(t, "waiter whose session expired", r2.err, store.ErrSessionDead)
	waitersAre(t, insts[0], "fd/k", []store.SessionID{w3})
	mustRelease(t, insts[0], hg)
	r3 := recvResult(t, ch3, 10*time.Second, "last waiter")
	if r3.err != nil || r3.g.Session != w3 {
		t.Fatalf("last waiter: %+v, %v; want the grant", r3.g, r3.err)
	}
}

func (s *suite) testTryInsertDoesNotJumpQueue(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "q/k")
	w := openSession(t, insts[1])
	ch := startAcquire(t, ctxT(t), insts[1], w, "q/k")
	waitersAre(t, insts[0], "q/k", []store.SessionID{w})
	barger := openSession(t, insts[0])
	if _, ok, err := insts[0].TryInsert(ctxT(t), barger, "q/k"); err != nil || ok {
		t.Fatalf("TryInsert while held with a waiter = %v, %v; want not acquired", ok, err)
	}
	mustRelease(t, insts[0], hg)
	r := recvResult(t, ch, 10*time.Second, "waiter")
	if r.err != nil || r.g.Session != w {
		t.Fatalf("waiter: %+v, %v; want the grant (not the barger)", r.g, r.err)
	}
}

// testFIFOKeptPlace: with KeepPlace, a waiter whose call ends keeps its
// place; its next call resumes it and is granted before a waiter queued
// after it (C2 #ct2-keep-place).
func (s *suite) testFIFOKeptPlace(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "kp/k")
	w1, w2 := openSession(t, insts[1]), openSession(t, insts[0])
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	defer cancel1()
	ch1 := startAcquire(t, ctx1, insts[1], w1, "kp/k", store.KeepPlace())
	waitersAre(t, insts[0], "kp/k", []store.SessionID{w1})
	ch2 := startAcquire(t, ctxT(t), insts[0], w2, "kp/k")
	waitersAre(t, insts[0], "kp/k", []store.SessionID{w1, w2})
	cancel1()
	r1 := recvResult(t, ch1, 5*time.Second, "cut waiter")
	if !errors.Is(r1.err, context.Canceled) {
		t.Fatalf("cut waiter: err = %v, want errors.Is(err, context.Canceled)", r1.err)
	}
	if info, _ := inspect(t, insts[0], "kp/k"); !slices.Equal(info.Waiters, []store.SessionID{w1, w2}) {
		t.Fatalf("waiters after w1's KeepPlace call ended = %v; want [w1 w2] (w1 keeps its place)", info.Waiters)
	}
	mustRelease(t, insts[0], hg)
	// w1 comes back after the release: it is still first.
	r1 = recvResult(t, startAcquire(t, ctxT(t), insts[1], w1, "kp/k", store.KeepPlace()), 15*time.Second, "resumed waiter")
	if r1.err != nil || r1.g.Session != w1 {
		t.Fatalf("resumed waiter: Acquire = %+v, %v; want the grant for w1 (queued first)", r1.g, r1.err)
	}
	notReturned(t, ch2, "w2 while w1 holds")
	if r1.g.Token <= hg.Token {
		t.Fatalf("resumed waiter: token %d, want > %d", r1.g.Token, hg.Token)
	}
	mustRelease(t, insts[1], r1.g)
	r2 := recvResult(t, ch2, 15*time.Second, "second waiter")
	if r2.err != nil || r2.g.Session != w2 || r2.g.Token <= r1.g.Token {
		t.Fatalf("second waiter: Acquire = %+v, %v; want the grant for w2 with a token > %d", r2.g, r2.err, r1.g.Token)
	}
}

// testLeaveQueueAfterCutAttempt: a LeaveQueue that comes while an Acquire
// with KeepPlace, cut, still waits for its attempt in flight (sent in a
// commit, not yet at the backend: the API's handler of a cut RPC has not
// returned, and the client already leaves) leaves no place: the attempt's
// queue entry is committed first, then deleted (C2 #ct2-leave-after-cut).
// Before issue 21's fix the delete went first and the attempt put the place
// back, kept until the session ended, and a release could hand the key to
// a caller that had given up (the TypeScript SDK's "b left the queue"
// failure).
func (s *suite) testLeaveQueueAfterCutAttempt(t *testing.T) {
	inst := s.instances(t, 1)[0]
	const key = "lqc/k"
	c := s.cutAttempt(t, inst, key, store.KeepPlace())
	w, ch, open, settling := c.w, c.ch, c.open, c.settling
	left := make(chan error, 1)
	go func() { left <- inst.LeaveQueue(ctxT(t), w, key) }() // returns once its delete is done (bounded by ctxT)
	select {
	case <-settling:
		open()
	case err := <-left:
		open()
		waitersAre(t, inst, key, []store.SessionID{w})
		t.Fatalf("LeaveQueue returned (%v) while the cut Acquire's attempt was in flight, and the attempt put the place back: waiters [%s]", err, w)
	case <-time.After(30 * time.Second):
		t.Fatal("LeaveQueue neither returned nor waited for the attempt in flight within 30s")
	}
	select {
	case err := <-left:
		if err != nil {
			t.Fatalf("LeaveQueue: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("LeaveQueue did not return within 30s of the attempt's commit")
	}
	if r := recvResult(t, ch, 30*time.Second, "cut waiter"); r.err == nil {
		t.Fatalf("cut waiter: Acquire = %+v; want its ctx error", r.g)
	}
	// The attempt committed before LeaveQueue's delete: one look suffices.
	if info, _, err := inst.Inspect(ctxT(t), key); err != nil || len(info.Waiters) != 0 {
		t.Fatalf("Inspect after LeaveQueue = waiters %v, %v; want none", info.Waiters, err)
	}
}

// testCutWaitLeavesQueue: an Acquire without KeepPlace cut while its
// attempt is in flight returns only after that attempt's commit, and then
// the session has no place in the key's queue (C2 #ct2-leave-after-cut).
// Before issue 21's CUTWAIT-1 fix the call returned at once; the attempt
// then queued the session, and its undo removed the place a moment later —
// TestParityTypeScript/pg/acquire-all saw waiters=[B] right after B's
// ErrWaitTimeout.
func (s *suite) testCutWaitLeavesQueue(t *testing.T) {
	inst := s.instances(t, 1)[0]
	const key = "cutw/k"
	c := s.cutAttempt(t, inst, key)
	ch, open := c.ch, c.open
	open()
	if r := recvResult(t, ch, 30*time.Second, "cut waiter"); r.err == nil {
		t.Fatalf("cut waiter: Acquire = %+v; want its ctx error", r.g)
	}
	// The call returned after its attempt's commit and its own cleanup: one
	// look suffices.
	if info, _, err := inst.Inspect(ctxT(t), key); err != nil || len(info.Waiters) != 0 {
		t.Fatalf("Inspect right after the cut Acquire returned = waiters %v, %v; want none", info.Waiters, err)
	}
}

// cutCall is an Acquire cut while its attempt is held in its commit
// (cutAttempt): the waiting session, the call's result, the hold's open,
// and the settling reports of the key (Config.HoldCommit).
type cutCall struct {
	w        store.SessionID
	ch       <-chan acquireResult
	open     func()
	settling <-chan struct{}
}

// cutAttempt starts an Acquire of a new session w on key, which another
// session holds, holds its attempt in the commit, cuts the call, and waits
// until the call reports that it waits for that attempt (settling). It
// fails the test if the call returns first, which would let the attempt
// write after the call (C2 #ct2-leave-after-cut).
func (s *suite) cutAttempt(t *testing.T, inst store.LockStore, key string, opts ...store.AcquireOption) cutCall {
	t.Helper()
	holder, w := openSession(t, inst), openSession(t, inst)
	mustTry(t, inst, holder, key)
	held, open, settling := s.cfg.HoldCommit(t, inst, key)
	ctx, cancel := context.WithCancel(ctxT(t))
	ch := startAcquire(t, ctx, inst, w, key, opts...)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter's attempt was not committed within 30s")
	}
	cancel()
	select {
	case <-settling:
	case r := <-ch:
		open()
		t.Fatalf("the cut Acquire returned (%+v, %v) while its attempt was in flight; want it to wait for the attempt's commit", r.g, r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the cut Acquire neither returned nor waited for its attempt within 30s")
	}
	return cutCall{w: w, ch: ch, open: open, settling: settling}
}

// testLeaveQueue: LeaveQueue gives up a kept place (the next waiter moves
// up), is idempotent, and never touches a grant.
func (s *suite) testLeaveQueue(t *testing.T) {
	insts := s.instances(t, 2)
	holder := openSession(t, insts[0])
	hg := mustTry(t, insts[0], holder, "lq/k")
	w1, w2 := openSession(t, insts[1]), openSession(t, insts[0])
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	ch1 := startAcquire(t, ctx1, insts[1], w1, "lq/k", store.KeepPlace())
	waitersAre(t, insts[0], "lq/k", []store.SessionID{w1})
	ch2 := startAcquire(t, ctxT(t), insts[0], w2, "lq/k")
	waitersAre(t, insts[0], "lq/k", []store.SessionID{w1, w2})
	cancel1()
	recvResult(t, ch1, 5*time.Second, "cut waiter")
	for i := range 2 {
		if err := insts[1].LeaveQueue(ctxT(t), w1, "lq/k"); err != nil {
			t.Fatalf("LeaveQueue(w1) #%d: %v", i+1, err)
		}
	}
	waitersAre(t, insts[0], "lq/k", []store.SessionID{w2})
	// Neither the holder's grant nor an unknown session is touched.
	for _, id := range []store.SessionID{holder, "no-such-session"} {
		if err := insts[0].LeaveQueue(ctxT(t), id, "lq/k"); err != nil {
			t.Fatalf("LeaveQueue(%s) of a session not queued: %v; want nil", id, err)
		}
	}
	if info, found := inspect(t, insts[0], "lq/k"); !found || info.Session != holder || info.Token != hg.Token {
		t.Fatalf("Inspect after LeaveQueue of the holder = %+v, %v; want the holder's grant untouched", info, found)
	}
	mustRelease(t, insts[0], hg)
	r2 := recvResult(t, ch2, 15*time.Second, "next waiter")
	if r2.err != nil || r2.g.Session != w2 {
		t.Fatalf("next waiter: %+v, %v; want the grant", r2.g, r2.err)
	}
	if err := insts[0].LeaveQueue(ctxT(t), w2, "lq/k"); err != nil {
		t.Fatalf("LeaveQueue of the new holder: %v", err)
	}
	if info, found := inspect(t, insts[0], "lq/k"); !found || info.Session != w2 {
		t.Fatalf("Inspect after LeaveQueue of the new holder = %+v, %v; want its grant untouched", info, found)
	}
}
