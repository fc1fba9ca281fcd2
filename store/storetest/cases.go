package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testkit"
	"lock.dev/lockd/store"
)

func (s *suite) testLifecycle(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	if l := heartbeat(t, st, id); !l.Live || l.Remaining <= 0 || l.Remaining > LongTTL+time.Second {
		t.Fatalf("Heartbeat after open = %+v; want live with 0 < Remaining <= ~TTL", l)
	}
	g := mustTry(t, st, id, "life/a")
	if g.Remaining <= 0 {
		t.Fatalf("grant Remaining = %v, want > 0", g.Remaining)
	}
	mustTry(t, st, id, "life/b")
	locks, err := st.LocksOf(ctxT(t), id)
	if err != nil || len(locks) != 2 || locks[0].Key != "life/a" || locks[1].Key != "life/b" {
		t.Fatalf("LocksOf = %+v, %v; want life/a, life/b", locks, err)
	}
	mustRelease(t, st, g)
	n, err := st.CloseSession(ctxT(t), id)
	if err != nil || n != 1 {
		t.Fatalf("CloseSession = %d, %v; want 1, nil", n, err)
	}
	if _, found := inspect(t, st, "life/b"); found {
		t.Fatal("life/b still held after CloseSession")
	}
}

func (s *suite) testCloseIdempotent(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	for _, k := range []string{"c/1", "c/2", "c/3"} {
		mustTry(t, st, id, k)
	}
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 3 {
		t.Fatalf("first CloseSession = %d, %v; want 3, nil", n, err)
	}
	if n, err := st.CloseSession(ctxT(t), id); err != nil || n != 0 {
		t.Fatalf("second CloseSession = %d, %v; want 0, nil", n, err)
	}
	if n, err := st.CloseSession(ctxT(t), store.NewSessionID()); err != nil || n != 0 {
		t.Fatalf("CloseSession(unknown) = %d, %v; want 0, nil", n, err)
	}
}

func (s *suite) testHeartbeatTerminalAfterClose(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	if _, err := st.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	for i := range 3 {
		if l := heartbeat(t, st, id); l.Live || l.Remaining != 0 {
			t.Fatalf("Heartbeat #%d after close = %+v; want not live, Remaining 0", i+1, l)
		}
	}
	if l := heartbeat(t, st, store.NewSessionID()); l.Live {
		t.Fatalf("Heartbeat(unknown) = %+v; want not live", l)
	}
}

func (s *suite) testHeartbeatTerminalAfterExpiry(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	mustTry(t, st, id, "hb/x")
	s.cfg.Expire(t, st, id)
	testkit.Eventually(t, s.expiryBound(), "heartbeat reports not live after expiry", func() error {
		l, err := st.Heartbeat(ctxT(t), id)
		if err != nil {
			return err
		}
		if l.Live {
			return fmt.Errorf("still live: %+v", l)
		}
		return nil
	})
	for i := range 3 {
		if l := heartbeat(t, st, id); l.Live {
			t.Fatalf("Heartbeat #%d after expiry = %+v; not-live must be terminal", i+1, l)
		}
	}
	if _, _, err := st.TryInsert(ctxT(t), id, "hb/y"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert on expired session: err = %v, want ErrSessionDead", err)
	}
	testkit.Eventually(t, s.expiryBound(), "expired session's lock is gone", func() error {
		if _, found := inspect(t, st, "hb/x"); found {
			return errors.New("hb/x still held")
		}
		return nil
	})
}

func (s *suite) testExclusivity(t *testing.T) {
	insts := s.instances(t, 2)
	const n = 32
	ids := make([]store.SessionID, n)
	for i := range ids {
		ids[i] = openSession(t, insts[i%2])
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []store.Grant
		errs    []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			g, ok, err := insts[i%2].TryInsert(ctxT(t), ids[i], "excl/key")
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !store.IsRetryable(err) {
				errs = append(errs, err)
			}
			if ok {
				winners = append(winners, g)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("TryInsert errors: %v", errs)
	}
	if len(winners) != 1 {
		t.Fatalf("%d sessions were granted excl/key, want exactly 1: %+v", len(winners), winners)
	}
	for _, st := range insts {
		info, found := inspect(t, st, "excl/key")
		if !found || info.Session != winners[0].Session || info.Token != winners[0].Token {
			t.Fatalf("Inspect = %+v, %v; want the winner %+v", info, found, winners[0])
		}
	}
}

func (s *suite) testTryInsertIdempotent(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	g1 := mustTry(t, st, id, "idem/k")
	g2 := mustTry(t, st, id, "idem/k")
	if g1.Token != g2.Token {
		t.Fatalf("second TryInsert by the holder: token %d, want the existing %d", g2.Token, g1.Token)
	}
	other := openSession(t, st)
	if _, ok, err := st.TryInsert(ctxT(t), other, "idem/k"); err != nil || ok {
		t.Fatalf("TryInsert by another session = %v, %v; want not acquired, nil", ok, err)
	}
}

func (s *suite) testUnknownSessionWritesNothing(t *testing.T) {
	insts := s.instances(t, 2)
	unknown := store.NewSessionID()
	if _, _, err := insts[0].TryInsert(ctxT(t), unknown, "unk/k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert(unknown session): err = %v, want ErrSessionDead", err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	if _, err := insts[0].Acquire(ctx, unknown, "unk/k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("Acquire(unknown session): err = %v, want ErrSessionDead", err)
	}
	if _, err := insts[0].LocksOf(ctxT(t), unknown); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("LocksOf(unknown session): err = %v, want ErrSessionDead", err)
	}
	for i, st := range insts {
		if info, found := inspect(t, st, "unk/k"); found {
			t.Fatalf("instance %d: unk/k is held by %+v after attempts by an unknown session", i, info)
		}
		if l, err := st.List(ctxT(t), "", "", 0); err != nil || len(l) != 0 {
			t.Fatalf("instance %d: List = %+v, %v; want nothing written", i, l, err)
		}
	}
}

func (s *suite) testDeadSessionWritesNothing(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	if _, err := insts[0].CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if _, _, err := insts[0].TryInsert(ctxT(t), id, "dead/k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert(closed session): err = %v, want ErrSessionDead", err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	if _, err := insts[0].Acquire(ctx, id, "dead/k"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("Acquire(closed session): err = %v, want ErrSessionDead", err)
	}
	if _, found := inspect(t, insts[1], "dead/k"); found {
		t.Fatal("dead/k is held after attempts by a closed session (seen from the other instance)")
	}
	// A session expired out of band writes nothing either.
	id2 := openSession(t, insts[0])
	s.cfg.Expire(t, insts[0], id2)
	testkit.Eventually(t, s.expiryBound(), "expired session reported dead", func() error {
		l, err := insts[0].Heartbeat(ctxT(t), id2)
		if err != nil {
			return err
		}
		if l.Live {
			return errors.New("still live")
		}
		return nil
	})
	if _, _, err := insts[0].TryInsert(ctxT(t), id2, "dead/k2"); !errors.Is(err, store.ErrSessionDead) {
		t.Fatalf("TryInsert(expired session): err = %v, want ErrSessionDead", err)
	}
	if _, found := inspect(t, insts[1], "dead/k2"); found {
		t.Fatal("dead/k2 is held after an attempt by an expired session")
	}
}

func (s *suite) testSessionDeathReleasesLocks(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	opened := time.Now()
	id := openSessionTTL(t, a, TTL)
	keys := []string{"death/1", "death/2", "death/3"}
	for _, k := range keys {
		mustTry(t, a, id, k)
	}
	waiter := openSession(t, b)
	ctx, cancel := context.WithTimeout(ctxT(t), s.expiryBound()+5*time.Second)
	defer cancel()
	ch := startAcquire(t, ctx, b, waiter, "death/1")
	waitersAre(t, b, "death/1", []store.SessionID{waiter})
	// The instance that keeps the session alive stops, as when lockd dies:
	// nobody heartbeats or keeps the session alive any more.
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	testkit.Eventually(t, s.expiryBound(), "locks of a session whose instance stopped are freed", func() error {
		for _, k := range keys[1:] {
			if _, found := inspect(t, b, k); found {
				return fmt.Errorf("%s still held", k)
			}
		}
		return nil
	})
	r := recvResult(t, ch, s.expiryBound(), "waiter after holder death")
	if r.err != nil || r.g.Session != waiter {
		t.Fatalf("waiter's Acquire = %+v, %v; want the grant", r.g, r.err)
	}
	if took := time.Since(opened); took < TTL-50*time.Millisecond {
		t.Fatalf("locks freed %v after the session was opened; a session must live at least its TTL (%v)", took, TTL)
	}
}

func (s *suite) testExpiredSessionReleasesLocks(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	for _, k := range []string{"exp/1", "exp/2"} {
		mustTry(t, insts[0], id, k)
	}
	s.cfg.Expire(t, insts[0], id)
	testkit.Eventually(t, s.expiryBound(), "expired session's locks are freed", func() error {
		l, err := insts[1].List(ctxT(t), "exp/", "", 0)
		if err != nil {
			return err
		}
		if len(l) != 0 {
			return fmt.Errorf("still held: %+v", l)
		}
		return nil
	})
}

func (s *suite) testFencingTokensIncrease(t *testing.T) {
	insts := s.instances(t, 2)
	var last uint64
	check := func(g store.Grant, i int) {
		t.Helper()
		if g.Token <= last {
			t.Fatalf("grant %d: token %d not greater than previous %d", i, g.Token, last)
		}
		last = g.Token
	}
	ids := []store.SessionID{openSession(t, insts[0]), openSession(t, insts[1])}
	for i := range 100 {
		st := insts[i%2]
		g := mustTry(t, st, ids[i%2], "fence/k")
		check(g, i)
		mustRelease(t, st, g)
	}
	// A new instance on the same backend, replacing one that stopped (as
	// after a lockd restart), continues the order.
	if err := insts[0].Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c := s.reopen(t)
	id := openSession(t, c)
	for i := 100; i < 110; i++ {
		g := mustTry(t, c, id, "fence/k")
		check(g, i)
		mustRelease(t, c, g)
	}
}

func (s *suite) testFencingAcrossReap(t *testing.T) {
	a := s.instances(t, 1)[0]
	id := openSession(t, a)
	g1 := mustTry(t, a, id, "reap/k")
	s.cfg.Expire(t, a, id)
	testkit.Eventually(t, s.expiryBound(), "reap/k freed by expiry", func() error {
		if _, found := inspect(t, a, "reap/k"); found {
			return errors.New("still held")
		}
		return nil
	})
	// A new store instance (as after a lockd restart) grants the key again.
	b := s.reopen(t)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	id2 := openSession(t, b)
	g2 := mustTry(t, b, id2, "reap/k")
	if g2.Token <= g1.Token {
		t.Fatalf("token after reap and a new instance = %d, want > %d", g2.Token, g1.Token)
	}
}

func (s *suite) testDeleteIfOwner(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	owner := openSession(t, a)
	other := openSession(t, b)
	g := mustTry(t, a, owner, "del/k")
	wantErr(t, "DeleteIfOwner(wrong session)", b.DeleteIfOwner(ctxT(t), other, "del/k", g.Token), store.ErrNotOwner)
	wantErr(t, "DeleteIfOwner(stale token)", a.DeleteIfOwner(ctxT(t), owner, "del/k", g.Token-1), store.ErrNotOwner)
	wantErr(t, "DeleteIfOwner(future token)", a.DeleteIfOwner(ctxT(t), owner, "del/k", g.Token+1000), store.ErrNotOwner)
	wantErr(t, "DeleteIfOwner(free key)", a.DeleteIfOwner(ctxT(t), owner, "del/free", g.Token), store.ErrNotOwner)
	if info, found := inspect(t, b, "del/k"); !found || info.Token != g.Token {
		t.Fatalf("after refused releases Inspect = %+v, %v; want the grant intact", info, found)
	}
	mustRelease(t, a, g)
	// A retried release must never delete a newer grant (etcd issue 22082).
	g2 := mustTry(t, b, other, "del/k")
	wantErr(t, "retried DeleteIfOwner of the old grant", a.DeleteIfOwner(ctxT(t), owner, "del/k", g.Token), store.ErrNotOwner)
	if info, found := inspect(t, a, "del/k"); !found || info.Token != g2.Token {
		t.Fatalf("after the retried release Inspect = %+v, %v; want the newer grant %d", info, found, g2.Token)
	}
}

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

func (s *suite) testAcquireHeldBySelf(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	g := mustTry(t, st, id, "self/k")
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	g2, err := st.Acquire(ctx, id, "self/k")
	if err != nil || g2.Token != g.Token {
		t.Fatalf("Acquire by the holder = %+v, %v; want the existing grant %d at once", g2, err, g.Token)
	}
}

func (s *suite) testRevoke(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	g := mustTry(t, insts[0], id, "rev/k")
	rg, found, err := insts[1].Revoke(ctxT(t), "rev/k")
	if err != nil || !found || rg.Token != g.Token || rg.Session != id {
		t.Fatalf("Revoke = %+v, %v, %v; want the grant %+v", rg, found, err, g)
	}
	if _, found := inspect(t, insts[0], "rev/k"); found {
		t.Fatal("rev/k still held after Revoke")
	}
	wantErr(t, "holder's release after revoke", insts[0].DeleteIfOwner(ctxT(t), id, "rev/k", g.Token), store.ErrNotOwner)
	if l := heartbeat(t, insts[0], id); !l.Live {
		t.Fatalf("holder's session after Revoke: %+v; a revoke takes the lock, not the session", l)
	}
	if _, found, err := insts[1].Revoke(ctxT(t), "rev/free"); err != nil || found {
		t.Fatalf("Revoke(free key) = %v, %v; want not found, nil", found, err)
	}
	g2 := mustTry(t, insts[0], id, "rev/k")
	if g2.Token <= g.Token {
		t.Fatalf("token after revoke = %d, want > %d", g2.Token, g.Token)
	}
}

func (s *suite) testInspectAndList(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	id := openSession(t, a)
	keys := []string{"ls/a", "ls/b", "ls/c/1", "ls/c/2", "other/x", "ls", "lsz"}
	grants := map[string]store.Grant{}
	for _, k := range keys {
		grants[k] = mustTry(t, a, id, k)
	}
	w := openSession(t, b)
	ch := startAcquire(t, ctxT(t), b, w, "ls/b")
	waitersAre(t, a, "ls/b", []store.SessionID{w})
	info, found := inspect(t, b, "ls/b")
	if !found || info.Key != "ls/b" || info.Session != id || info.Token != grants["ls/b"].Token || info.AcquiredAt.IsZero() {
		t.Fatalf("Inspect(ls/b) = %+v, %v; want holder %s token %d with an acquired-at", info, found, id, grants["ls/b"].Token)
	}
	if _, found := inspect(t, b, "ls/none"); found {
		t.Fatal("Inspect(ls/none) found a holder")
	}
	l, err := b.List(ctxT(t), "ls/", "", 0)
	var got []string
	for _, i := range l {
		got = append(got, i.Key)
	}
	if err != nil || !slices.Equal(got, []string{"ls/a", "ls/b", "ls/c/1", "ls/c/2"}) {
		t.Fatalf("List(ls/) = %v, %v; want ls/a ls/b ls/c/1 ls/c/2", got, err)
	}
	if len(l[1].Waiters) != 1 || l[1].Waiters[0] != w {
		t.Fatalf("List(ls/) ls/b waiters = %v, want [%s]", l[1].Waiters, w)
	}
	// Paging.
	var paged []string
	after := ""
	for range 10 {
		page, err := a.List(ctxT(t), "ls", after, 2)
		if err != nil {
			t.Fatalf("List(ls, after %q, 2): %v", after, err)
		}
		if len(page) > 2 {
			t.Fatalf("List limit 2 returned %d", len(page))
		}
		if len(page) == 0 {
			break
		}
		for _, i := range page {
			paged = append(paged, i.Key)
		}
		after = page[len(page)-1].Key
	}
	if want := []string{"ls", "ls/a", "ls/b", "ls/c/1", "ls/c/2", "lsz"}; !slices.Equal(paged, want) {
		t.Fatalf("paged List(ls) = %v, want %v", paged, want)
	}
	all, err := a.List(ctxT(t), "", "", 0)
	if err != nil || len(all) != len(keys) {
		t.Fatalf("List(\"\") = %d entries, %v; want %d", len(all), err, len(keys))
	}
	if _, err := a.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if r := recvResult(t, ch, 10*time.Second, "waiter"); r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
}

func (s *suite) testLocksOf(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	other := openSession(t, insts[1])
	mustTry(t, insts[0], id, "lo/b")
	ga := mustTry(t, insts[0], id, "lo/a")
	mustTry(t, insts[1], other, "lo/c")
	got, err := insts[0].LocksOf(ctxT(t), id)
	if err != nil || len(got) != 2 || got[0].Key != "lo/a" || got[0].Token != ga.Token || got[1].Key != "lo/b" {
		t.Fatalf("LocksOf = %+v, %v; want lo/a (token %d), lo/b", got, err, ga.Token)
	}
	// A revoke from elsewhere shows up: LocksOf reads the backend.
	if _, _, err := insts[1].Revoke(ctxT(t), "lo/b"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	got, err = insts[0].LocksOf(ctxT(t), id)
	if err != nil || len(got) != 1 || got[0].Key != "lo/a" {
		t.Fatalf("LocksOf after revoke = %+v, %v; want only lo/a", got, err)
	}
}

func (s *suite) testWatchOrder(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ch, err := b.Watch(ctx, "w/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	id := openSession(t, a)
	g1 := mustTry(t, a, id, "w/1")
	mustTry(t, a, id, "x/outside")
	mustRelease(t, a, g1)
	g2 := mustTry(t, a, id, "w/1")
	if _, _, err := b.Revoke(ctxT(t), "w/1"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	g3 := mustTry(t, a, id, "w/2")
	if _, err := a.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	id2 := openSession(t, a)
	g4 := mustTry(t, a, id2, "w/3")
	s.cfg.Expire(t, a, id2)
	want := []store.Event{
		{Kind: store.EventAcquired, Key: "w/1", Session: id, Token: g1.Token},
		{Kind: store.EventReleased, Key: "w/1", Session: id, Token: g1.Token},
		{Kind: store.EventAcquired, Key: "w/1", Session: id, Token: g2.Token},
		{Kind: store.EventRevoked, Key: "w/1", Session: id, Token: g2.Token},
		{Kind: store.EventAcquired, Key: "w/2", Session: id, Token: g3.Token},
		{Kind: store.EventExpired, Key: "w/2", Session: id, Token: g3.Token},
		{Kind: store.EventAcquired, Key: "w/3", Session: id2, Token: g4.Token},
		{Kind: store.EventExpired, Key: "w/3", Session: id2, Token: g4.Token},
	}
	timeout := time.After(s.expiryBound() + 5*time.Second)
	for i, w := range want {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed after %d events", i)
			}
			if ev.Err != nil {
				t.Fatalf("event %d: watch broke: %v", i, ev.Err)
			}
			if ev != w {
				t.Fatalf("event %d = %+v (%v), want %+v (%v)", i, ev, ev.Kind, w, w.Kind)
			}
		case <-timeout:
			t.Fatalf("event %d (%v %s) not delivered", i, w.Kind, w.Key)
		}
	}
	cancel()
	testkit.Eventually(t, 5*time.Second, "watch channel closes after cancel", func() error {
		select {
		case ev, ok := <-ch:
			if ok {
				return fmt.Errorf("unexpected event %+v", ev)
			}
			return nil
		default:
			return errors.New("still open")
		}
	})
}

func (s *suite) testBadInput(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	badKeys := map[string]string{
		"empty":   "",
		"513B":    strings.Repeat("k", store.MaxKeyLen+1),
		"badUTF8": "bad\xff\xfekey",
		"NUL":     "nul\x00key",
	}
	for name, k := range badKeys {
		t.Run(name, func(t *testing.T) {
			_, _, err := st.TryInsert(ctxT(t), id, k)
			wantErr(t, "TryInsert", err, store.ErrInvalidArgument)
			_, err = st.Acquire(ctxT(t), id, k)
			wantErr(t, "Acquire", err, store.ErrInvalidArgument)
			wantErr(t, "DeleteIfOwner", st.DeleteIfOwner(ctxT(t), id, k, 1), store.ErrInvalidArgument)
			_, _, err = st.Revoke(ctxT(t), k)
			wantErr(t, "Revoke", err, store.ErrInvalidArgument)
			_, _, err = st.Inspect(ctxT(t), k)
			wantErr(t, "Inspect", err, store.ErrInvalidArgument)
			if k != "" {
				_, err = st.List(ctxT(t), k, "", 0)
				wantErr(t, "List prefix", err, store.ErrInvalidArgument)
				_, err = st.Watch(ctxT(t), k)
				wantErr(t, "Watch prefix", err, store.ErrInvalidArgument)
			}
		})
	}
	okKey := strings.Repeat("k", store.MaxKeyLen)
	mustTry(t, st, id, okKey)
	for _, ttl := range []time.Duration{0, -time.Second, store.MinTTL - time.Millisecond, store.MaxTTL + time.Second, 2500 * time.Microsecond} {
		_, err := st.OpenSession(ctxT(t), ttl)
		wantErr(t, fmt.Sprintf("OpenSession(%v)", ttl), err, store.ErrInvalidArgument)
	}
	for _, lim := range []int{-1, store.MaxListLimit + 1} {
		_, err := st.List(ctxT(t), "", "", lim)
		wantErr(t, fmt.Sprintf("List(limit %d)", lim), err, store.ErrInvalidArgument)
	}
	_, _, err := st.TryInsert(ctxT(t), "", "k")
	wantErr(t, "TryInsert(empty session id)", err, store.ErrInvalidArgument)
	l, err := st.List(ctxT(t), "", "", 0)
	if err != nil || len(l) != 1 || l[0].Key != okKey {
		t.Fatalf("List after bad input = %+v, %v; want only the 512-byte key", l, err)
	}
}

func (s *suite) testCancellation(t *testing.T) {
	insts := s.instances(t, 2)
	st := insts[0]
	id := openSession(t, st)
	g := mustTry(t, st, id, "cx/held")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a cancelled context: err = %v, want errors.Is(err, context.Canceled)", what, err)
		}
	}
	_, err := st.OpenSession(cancelled, TTL)
	check("OpenSession", err)
	_, err = st.Heartbeat(cancelled, id)
	check("Heartbeat", err)
	_, _, err = st.TryInsert(cancelled, id, "cx/new")
	check("TryInsert", err)
	_, err = st.Acquire(cancelled, id, "cx/new2")
	check("Acquire", err)
	check("DeleteIfOwner", st.DeleteIfOwner(cancelled, id, "cx/held", g.Token))
	_, _, err = st.Revoke(cancelled, "cx/held")
	check("Revoke", err)
	_, _, err = st.Inspect(cancelled, "cx/held")
	check("Inspect", err)
	_, err = st.List(cancelled, "", "", 0)
	check("List", err)
	_, err = st.LocksOf(cancelled, id)
	check("LocksOf", err)
	_, err = st.CloseSession(cancelled, id)
	check("CloseSession", err)
	_, err = st.Watch(cancelled, "")
	check("Watch", err)
	// Nothing changed.
	if info, found := inspect(t, insts[1], "cx/held"); !found || info.Token != g.Token {
		t.Fatalf("cx/held after cancelled calls = %+v, %v; want intact", info, found)
	}
	for _, k := range []string{"cx/new", "cx/new2"} {
		if _, found := inspect(t, insts[1], k); found {
			t.Fatalf("%s was written by a cancelled call", k)
		}
	}
	if l := heartbeat(t, st, id); !l.Live {
		t.Fatal("session closed by a cancelled CloseSession")
	}
	// A waiter whose deadline passes leaves the queue and reports it.
	other := openSession(t, insts[1])
	ctx, cancel2 := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel2()
	_, err = insts[1].Acquire(ctx, other, "cx/held")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: err = %v, want errors.Is(err, context.DeadlineExceeded)", err)
	}
	waitersAre(t, st, "cx/held", nil)
}

func (s *suite) testDeadline(t *testing.T) {
	st := s.instances(t, 1)[0]
	id := openSession(t, st)
	// Remaining is a lower bound measured from receipt: never more than the
	// TTL the backend applies, and positive while live.
	for i := range 5 {
		l := heartbeat(t, st, id)
		if !l.Live || l.Remaining <= 0 {
			t.Fatalf("Heartbeat #%d = %+v; want live with Remaining > 0", i, l)
		}
		if l.Remaining > LongTTL+999*time.Millisecond {
			t.Fatalf("Heartbeat #%d Remaining %v exceeds the TTL %v (rounded up to whole seconds at most)", i, l.Remaining, LongTTL)
		}
	}
	g := mustTry(t, st, id, "dl/k")
	if g.Remaining <= 0 || g.Remaining > LongTTL+999*time.Millisecond {
		t.Fatalf("grant Remaining = %v; want in (0, ~TTL]", g.Remaining)
	}
	// A short, odd TTL: the backend may round it up, never down, and never
	// promises more than it applies.
	short := openSessionTTL(t, st, 2500*time.Millisecond)
	if l := heartbeat(t, st, short); !l.Live || l.Remaining <= 0 || l.Remaining > 3*time.Second {
		t.Fatalf("Heartbeat(2.5s session) = %+v; want live with Remaining in (0, 3s]", l)
	}
}
