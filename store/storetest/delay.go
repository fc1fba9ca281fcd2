package storetest

// Lock-delay and maximum hold (C2 #ct2-delay).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// lockDelay is the lock-delay of the subtests that check it is honoured: long
// enough that a grant right after the end (the behaviour without lock-delay)
// is told apart from one after the delay, whatever the machine's load.
const lockDelay = 3 * time.Second

// delayTTL is the holder's TTL in the expiry subtest: short, because a
// backend may let a delay that lockd did not start itself run up to a TTL
// longer (C2 #ct2-delay), and long enough that the holder does not expire on
// its own during the set-up.
const delayTTL = 5 * time.Second

// timedAcquire runs Acquire in a goroutine owned by the test and records
// when it returned.
type timedResult struct {
	acquireResult
	at time.Time
}

func timedAcquire(ctx context.Context, st store.LockStore, id store.SessionID, key string) <-chan timedResult {
	ch := make(chan timedResult, 1)
	go func() {
		g, err := st.Acquire(ctx, id, key)
		ch <- timedResult{acquireResult{g, err}, time.Now()}
	}()
	return ch
}

func recvTimed(t *testing.T, ch <-chan timedResult, within time.Duration, what string) timedResult {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: Acquire: %v", what, r.err)
		}
		return r
	case <-time.After(within):
		t.Fatalf("%s: Acquire did not return within %v", what, within)
		return timedResult{}
	}
}

func setPolicy(t *testing.T, st store.LockStore, g store.Grant, p store.GrantPolicy) {
	t.Helper()
	if err := st.SetGrantPolicy(ctxT(t), g.Session, g.Key, g.Token, p); err != nil {
		t.Fatalf("SetGrantPolicy(%q, token %d, %+v): %v", g.Key, g.Token, p, err)
	}
}

// delayedGrant sets up key held by a session of a with lockDelay, a waiter
// of another session queued for it through b, and returns the grant, the
// waiter's channel and the holder.
func (s *suite) delayedGrant(t *testing.T, a, b store.LockStore, key string, ttl time.Duration) (store.Grant, <-chan timedResult) {
	t.Helper()
	h := openSessionTTL(t, a, ttl)
	g := mustTry(t, a, h, key)
	setPolicy(t, a, g, store.GrantPolicy{LockDelay: lockDelay})
	if info, found := inspect(t, b, key); !found || info.Token != g.Token || info.LockDelay != lockDelay {
		t.Fatalf("Inspect(%q) after SetGrantPolicy = %+v (found %v); want held with token %d and LockDelay %v", key, info, found, g.Token, lockDelay)
	}
	w := openSession(t, b)
	ch := timedAcquire(ctxT(t), b, w, key)
	waitersAre(t, b, key, []store.SessionID{w})
	return g, ch
}

// grantGone polls until g is no longer key's grant and returns the last
// moment it was seen held (the grant ended after it). The first look at the
// free key must show the lock-delay running.
func grantGone(t *testing.T, st store.LockStore, g store.Grant, lastHeld time.Time, within time.Duration) time.Time {
	t.Helper()
	testkit.Eventually(t, within, fmt.Sprintf("the grant of %q (token %d) goes", g.Key, g.Token), func() error {
		before := time.Now()
		info, found := inspect(t, st, g.Key)
		switch {
		case found && info.Token == g.Token:
			lastHeld = before
			return fmt.Errorf("still held")
		case found:
			return nil // granted again already: the caller checks when
		case info.DelayRemaining <= 0 || info.DelayRemaining > 2*lockDelay+time.Minute:
			t.Errorf("Inspect(%q) of the free key while its lock-delay runs: DelayRemaining %v; want in (0, the delay plus its documented slack]", g.Key, info.DelayRemaining)
		}
		return nil
	})
	return lastHeld
}

// testLockDelayAfterExpiry: after the holder's session expires, its
// lock-delay keeps the key from the waiter until the delay has passed;
// then the waiter gets it with a higher token.
func (s *suite) testLockDelayAfterExpiry(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	g, ch := s.delayedGrant(t, a, b, "delay/expiry", delayTTL)
	heartbeat(t, a, g.Session)
	lastHeld := time.Now()
	if info, found := inspect(t, b, g.Key); !found || info.Token != g.Token {
		t.Fatalf("Inspect(%q) before the expiry = %+v (found %v); want held with token %d", g.Key, info, found, g.Token)
	}
	s.cfg.Expire(t, a, g.Session)
	lastHeld = grantGone(t, b, g, lastHeld, s.expiryBound())
	r := recvTimed(t, ch, lockDelay+delayTTL+s.expiryBound()+margin, "the waiter after the expired holder's lock-delay")
	if el := r.at.Sub(lastHeld); el < lockDelay {
		t.Fatalf("the waiter was granted %v after the expired holder was last seen holding %q; want no earlier than its lock-delay %v", el, g.Key, lockDelay)
	}
	if r.g.Token <= g.Token {
		t.Fatalf("token after the lock-delay = %d; want above the expired grant's %d", r.g.Token, g.Token)
	}
}

// testLockDelayAfterRevoke: a revoke starts the holder's lock-delay.
func (s *suite) testLockDelayAfterRevoke(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	g, ch := s.delayedGrant(t, a, b, "delay/revoke", LongTTL)
	ended := time.Now()
	if rg, found, err := b.Revoke(ctxT(t), g.Key); err != nil || !found || rg.Token != g.Token {
		t.Fatalf("Revoke(%q) = %+v, %v, %v; want the grant with token %d", g.Key, rg, found, err, g.Token)
	}
	grantGone(t, b, g, ended, 5*time.Second)
	if _, ok, err := b.TryInsert(ctxT(t), openSession(t, b), g.Key); err != nil || ok {
		t.Fatalf("TryInsert(%q) during the lock-delay = acquired %v, %v; want not acquired", g.Key, ok, err)
	}
	r := recvTimed(t, ch, lockDelay+s.cfg.ExpirySlack+margin, "the waiter after the revoked holder's lock-delay")
	if el := r.at.Sub(ended); el < lockDelay {
		t.Fatalf("the waiter was granted %v after the revoke of %q; want no earlier than its lock-delay %v", el, g.Key, lockDelay)
	}
	if r.g.Token <= g.Token {
		t.Fatalf("token after the lock-delay = %d; want above the revoked grant's %d", r.g.Token, g.Token)
	}
	// The holder's session is still live and its stale release changes nothing.
	if l := heartbeat(t, a, g.Session); !l.Live {
		t.Fatalf("the revoked holder's session is not live")
	}
	wantErr(t, "DeleteIfOwner of the revoked grant", a.DeleteIfOwner(ctxT(t), g.Session, g.Key, g.Token), store.ErrNotOwner)
}

// testLockDelaySkippedOnRelease: a release and a CloseSession hand over at
// once, however long the lock-delay.
func (s *suite) testLockDelaySkippedOnRelease(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	const long = 10 * time.Minute
	const prompt = 10 * time.Second // far below long
	for _, how := range []string{"release", "close"} {
		key := "delay/skip/" + how
		h := openSession(t, a)
		g := mustTry(t, a, h, key)
		setPolicy(t, a, g, store.GrantPolicy{LockDelay: long})
		w := openSession(t, b)
		ch := timedAcquire(ctxT(t), b, w, key)
		waitersAre(t, b, key, []store.SessionID{w})
		if how == "release" {
			mustRelease(t, a, g)
		} else if n, err := a.CloseSession(ctxT(t), h); err != nil || n != 1 {
			t.Fatalf("CloseSession = %d, %v; want 1, nil", n, err)
		}
		r := recvTimed(t, ch, prompt, "the waiter after a "+how+" of a grant with a lock-delay")
		if r.g.Token <= g.Token {
			t.Fatalf("token after the %s = %d; want above %d", how, r.g.Token, g.Token)
		}
	}
}

// testMaxHold: a grant with a maximum hold is revoked by the backend, not
// before it, with a max_hold event; the next grant's token is higher and
// the holder's session stays live.
func (s *suite) testMaxHold(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	const hold = 2 * time.Second
	key := "hold/1"
	h := openSession(t, a)
	g := mustTry(t, a, h, key)
	// Bad policies and other grants change nothing.
	for _, p := range []store.GrantPolicy{{LockDelay: -time.Second}, {MaxHold: 10 * time.Millisecond}, {MaxHold: store.MaxMaxHold + time.Second}, {LockDelay: time.Microsecond}} {
		wantErr(t, fmt.Sprintf("SetGrantPolicy(%+v)", p), a.SetGrantPolicy(ctxT(t), h, key, g.Token, p), store.ErrInvalidArgument)
	}
	wantErr(t, "SetGrantPolicy of a token that is not the grant's", a.SetGrantPolicy(ctxT(t), h, key, g.Token+1, store.GrantPolicy{MaxHold: hold}), store.ErrNotOwner)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	events := watchNow(t, ctx, b, "hold/")
	w := openSession(t, b)
	ch := timedAcquire(ctxT(t), b, w, key)
	waitersAre(t, b, key, []store.SessionID{w})
	set := time.Now()
	setPolicy(t, a, g, store.GrantPolicy{MaxHold: hold})
	r := recvTimed(t, ch, hold+s.cfg.ExpirySlack+margin, "the waiter after the holder's maximum hold")
	if el := r.at.Sub(set); el < hold {
		t.Fatalf("the waiter was granted %v after SetGrantPolicy; want no earlier than the maximum hold %v", el, hold)
	}
	if r.g.Token <= g.Token {
		t.Fatalf("token after the maximum hold = %d; want above %d", r.g.Token, g.Token)
	}
	testkit.Eventually(t, 5*time.Second, "a max_hold event for the grant", func() error {
		for {
			select {
			case ev := <-events:
				if ev.Err != nil {
					t.Fatalf("watch broke: %v", ev.Err)
				}
				if ev.Token == g.Token {
					if ev.Kind != store.EventMaxHold || ev.Session != h || ev.Key != key {
						t.Fatalf("event for the held-too-long grant = %+v; want kind max_hold, session %q, key %q", ev, h, key)
					}
					return nil
				}
			default:
				return fmt.Errorf("not yet")
			}
		}
	})
	if l := heartbeat(t, a, h); !l.Live {
		t.Fatalf("the holder's session is not live after its maximum hold")
	}
	wantErr(t, "DeleteIfOwner of the grant held too long", a.DeleteIfOwner(ctxT(t), h, key, g.Token), store.ErrNotOwner)
}

// testLockDelayOutlivesOpener: a grant's lock-delay set through one instance
// still holds after that instance is gone and another keeps the session
// (C2 #ct2-delay, #ct2-replicas): the other instance keeps whatever the
// delay needs (etcd: the companion lease) alive for as long as the session,
// so a revoke long after the opener went starts the full delay.
func (s *suite) testLockDelayOutlivesOpener(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	h := openSessionTTL(t, a, delayTTL)
	g := mustTry(t, a, h, "delay/opener")
	setPolicy(t, a, g, store.GrantPolicy{LockDelay: lockDelay})
	if l := heartbeat(t, b, h); !l.Live {
		t.Fatalf("Heartbeat via the other instance = %+v; want live", l)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close the opener: %v", err)
	}
	// Longer than anything the opener kept alive could last without it
	// (etcd: a companion's TTL is the session's TTL + the delay + a
	// keepalive interval).
	closed := time.Now()
	tick := time.NewTicker(delayTTL / 5)
	defer tick.Stop()
	for time.Since(closed) < 3*delayTTL+lockDelay {
		if l := heartbeat(t, b, h); !l.Live {
			t.Fatalf("Heartbeat via the other instance %v after the opener closed = %+v; want live", time.Since(closed), l)
		}
		<-tick.C
	}
	if info, found := inspect(t, b, g.Key); !found || info.Token != g.Token || info.LockDelay != lockDelay {
		t.Fatalf("Inspect(%q) %v after the opener closed = %+v (found %v); want held with token %d and LockDelay %v",
			g.Key, time.Since(closed), info, found, g.Token, lockDelay)
	}
	ended := time.Now()
	if rg, found, err := b.Revoke(ctxT(t), g.Key); err != nil || !found || rg.Token != g.Token {
		t.Fatalf("Revoke(%q) = %+v, %v, %v; want the grant with token %d", g.Key, rg, found, err, g.Token)
	}
	grantGone(t, b, g, ended, 5*time.Second)
	w := openSession(t, b)
	if _, ok, err := b.TryInsert(ctxT(t), w, g.Key); err != nil || ok {
		t.Fatalf("TryInsert(%q) right after the revoke = acquired %v, %v; want not acquired (the lock-delay runs)", g.Key, ok, err)
	}
	r := recvTimed(t, timedAcquire(ctxT(t), b, w, g.Key), lockDelay+s.cfg.ExpirySlack+margin, "a waiter after the lock-delay")
	if el := r.at.Sub(ended); el < lockDelay {
		t.Fatalf("granted %v after the revoke of %q; want no earlier than its lock-delay %v", el, g.Key, lockDelay)
	}
}
