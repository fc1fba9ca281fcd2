package storetest

// Watch: the order of lock events.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func (s *suite) testWatchOrder(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ch := watchNow(t, ctx, b, "w/")
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
			wantEvent(t, i, ev, w)
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

// testWatchValue checks C2 #ct2-watch for SetValue: a value event of the
// grant, in commit order between its acquired and released events, seen by
// another instance; a refused SetValue and one outside the prefix send
// nothing.
func (s *suite) testWatchValue(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	ch := watchNow(t, ctx, b, "wv/")
	id := openSession(t, a)
	g := mustTry(t, a, id, "wv/1")
	out := mustTry(t, a, id, "xv/outside")
	if err := a.SetValue(ctxT(t), id, out.Key, out.Token, []byte("o")); err != nil {
		t.Fatalf("SetValue(outside): %v", err)
	}
	if err := a.SetValue(ctxT(t), id, g.Key, g.Token, []byte("v1")); err != nil {
		t.Fatalf("SetValue: %v", err)
	}
	wantErr(t, "SetValue(stale token)", a.SetValue(ctxT(t), id, g.Key, g.Token+1, []byte("x")), store.ErrNotOwner)
	if err := a.SetValue(ctxT(t), id, g.Key, g.Token, []byte("v2")); err != nil {
		t.Fatalf("SetValue again: %v", err)
	}
	mustRelease(t, a, g)
	want := []store.Event{
		{Kind: store.EventAcquired, Key: "wv/1", Session: id, Token: g.Token},
		{Kind: store.EventValue, Key: "wv/1", Session: id, Token: g.Token},
		{Kind: store.EventValue, Key: "wv/1", Session: id, Token: g.Token},
		{Kind: store.EventReleased, Key: "wv/1", Session: id, Token: g.Token},
	}
	timeout := time.After(10 * time.Second)
	for i, w := range want {
		select {
		case ev, ok := <-ch:
			if !ok || ev.Err != nil {
				t.Fatalf("event %d: watch ended (%v)", i, ev.Err)
			}
			wantEvent(t, i, ev, w)
		case <-timeout:
			t.Fatalf("event %d (%v %s) not delivered", i, w.Kind, w.Key)
		}
	}
	if info, found := inspect(t, b, "wv/1"); found {
		t.Fatalf("wv/1 still held after release: %+v", info)
	}
}

// watchNow watches prefix of st from now (WatchFrom after ""), until ctx
// ends.
func watchNow(t *testing.T, ctx context.Context, st store.LockStore, prefix string) <-chan store.Event {
	t.Helper()
	_, ch, err := st.WatchFrom(ctx, prefix, "")
	if err != nil {
		t.Fatalf("WatchFrom(%q, now): %v", prefix, err)
	}
	return ch
}

// wantEvent checks that ev, a watch's event number i, is w and carries a
// cursor (C2 #ct2-watch-resume: every event does).
func wantEvent(t *testing.T, i int, ev, w store.Event) {
	t.Helper()
	if ev.Cursor == "" {
		t.Fatalf("event %d = %+v carries no cursor (C2 #ct2-watch-resume)", i, ev)
	}
	if ev.Cursor = ""; ev != w {
		t.Fatalf("event %d = %+v (%v), want %+v (%v)", i, ev, ev.Kind, w, w.Kind)
	}
}
