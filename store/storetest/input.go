package storetest

// Bad input, cancellation and deadlines.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

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
				_, _, err = st.WatchFrom(ctxT(t), k, "")
				wantErr(t, "WatchFrom prefix", err, store.ErrInvalidArgument)
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
	_, _, err = st.WatchFrom(cancelled, "", "")
	check("WatchFrom", err)
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
