package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// testExpireLiveElsewhere: ExpireSession never ends a session that another
// instance keeps alive (C2 #ct2-replicas), however long ago the instance
// that opened it last extended it; once nobody keeps it, ExpireSession
// ends it (on etcd once the other instance, which no call used for a TTL,
// stopped keeping it and withdrew its keeper record).
func (s *suite) testExpireLiveElsewhere(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	id := openSessionTTL(t, a, TTL)
	g := mustTry(t, a, id, "exp/live")
	opened := time.Now()
	if l := heartbeat(t, b, id); !l.Live {
		t.Fatalf("Heartbeat via the other instance = %+v; want live (every instance can use every session, C2 #ct2-replicas)", l)
	}
	// Keep the session alive through b only, well past the TTL that a's
	// open gave it, asking a to expire it all along.
	tick := time.NewTicker(TTL / 5)
	defer tick.Stop()
	for time.Since(opened) < 2*TTL {
		if l := heartbeat(t, b, id); !l.Live {
			t.Fatalf("Heartbeat via the other instance %v after the open: not live; want live", time.Since(opened))
		}
		ex, err := a.ExpireSession(ctxT(t), id)
		if err != nil || ex.Ended || ex.Remaining <= 0 {
			t.Fatalf("ExpireSession of a session the other instance keeps alive (%v after the open) = %+v, %v; want not ended, Remaining > 0, nil",
				time.Since(opened), ex, err)
		}
		if info, found := inspect(t, b, g.Key); !found || info.Session != id || info.Token != g.Token {
			t.Fatalf("%q after ExpireSession of a live session = %+v (found %v); want still held by %q, token %d", g.Key, info, found, id, g.Token)
		}
		<-tick.C
	}
	// Nobody extends it any more: it expires and ExpireSession ends it
	// (unless the backend's own expiry machinery got there first).
	testkit.Eventually(t, s.expiryBound(), "ExpireSession ends the session once nobody keeps it", func() error {
		ex, err := a.ExpireSession(ctxT(t), id)
		switch {
		case errors.Is(err, store.ErrSessionDead):
			return nil
		case err != nil:
			return err
		case !ex.Ended:
			return fmt.Errorf("not ended, Remaining %v", ex.Remaining)
		case ex.Released != 1:
			t.Errorf("ExpireSession ended the session with Released %d; want 1", ex.Released)
		}
		return nil
	})
	if _, found := inspect(t, b, g.Key); found {
		t.Fatalf("%q still held after its session ended", g.Key)
	}
}

// testExpireExpired: ExpireSession ends a session whose backend expiry has
// passed, with its locks, at once; then, and for an unknown session, it is
// ErrSessionDead.
func (s *suite) testExpireExpired(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	id := openSession(t, a)
	g := mustTry(t, a, id, "exp/dead")
	s.cfg.Expire(t, a, id)
	ex, err := a.ExpireSession(ctxT(t), id)
	switch {
	case errors.Is(err, store.ErrSessionDead):
		// The backend's own expiry machinery was quicker.
		testkit.Eventually(t, s.expiryBound(), "the expired session's lock is freed", func() bool {
			_, found := inspect(t, b, g.Key)
			return !found
		})
	case err != nil || !ex.Ended || ex.Released > 1:
		// Released is 0 where the backend had dropped the locks with the
		// session before the call (an etcd lease revoked out of band).
		t.Fatalf("ExpireSession of an expired session = %+v, %v; want ended with Released <= 1", ex, err)
	default:
		if _, found := inspect(t, b, g.Key); found {
			t.Fatalf("%q still held after ExpireSession ended its session", g.Key)
		}
	}
	if l := heartbeat(t, a, id); l.Live {
		t.Fatalf("Heartbeat after ExpireSession = %+v; want not live", l)
	}
	_, err = a.ExpireSession(ctxT(t), id)
	wantErr(t, "second ExpireSession", err, store.ErrSessionDead)
	_, err = a.ExpireSession(ctxT(t), store.NewSessionID())
	wantErr(t, "ExpireSession(unknown)", err, store.ErrSessionDead)
	// The key is free for others.
	other := openSession(t, b)
	if g2 := mustTry(t, b, other, g.Key); g2.Token <= g.Token {
		t.Fatalf("token after the expired holder = %d; want > %d", g2.Token, g.Token)
	}
}
