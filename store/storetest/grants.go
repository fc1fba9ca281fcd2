package storetest

// Granting and releasing: exclusivity, who may write, fencing tokens,
// owner-checked delete and revoke.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

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
