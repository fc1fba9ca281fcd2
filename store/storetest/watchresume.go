package storetest

// WatchFrom: resuming a watch after a cursor (C2 #ct2-watch-resume).

import (
	"context"
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

// testWatchResume: a watch resumed on another instance after the cursor of
// an event delivers either exactly the events that followed it (a backend
// with history) or a resync first and then the events after it was
// established — never a gap without a resync, never an event twice. A
// cursor that is not one gives a resync.
func (s *suite) testWatchResume(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	ctx1, cancel1 := context.WithCancel(ctxT(t))
	defer cancel1()
	start, ch1, err := a.WatchFrom(ctx1, "wr/", "")
	if err != nil {
		t.Fatalf("WatchFrom(\"\"): %v", err)
	}
	if start == "" {
		t.Fatalf("WatchFrom(\"\") returned no start cursor")
	}
	id := openSession(t, a)
	g1 := mustTry(t, a, id, "wr/1")
	mustRelease(t, a, g1)
	got := recvEvents(t, ch1, 2)
	want := []store.Event{
		{Kind: store.EventAcquired, Key: "wr/1", Session: id, Token: g1.Token},
		{Kind: store.EventReleased, Key: "wr/1", Session: id, Token: g1.Token},
	}
	checkEvents(t, "first watch", got, want)
	cancel1()

	// Missed while no watch runs: the release above and this grant.
	g2 := mustTry(t, a, id, "wr/2")
	ctx2, cancel2 := context.WithCancel(ctxT(t))
	defer cancel2()
	if _, ch2, err := b.WatchFrom(ctx2, "wr/", got[0].Cursor); err != nil {
		t.Fatalf("WatchFrom(cursor of the first event) on the other instance: %v", err)
	} else {
		g3 := mustTry(t, a, id, "wr/3")
		acquired3 := store.Event{Kind: store.EventAcquired, Key: "wr/3", Session: id, Token: g3.Token}
		first := recvEvents(t, ch2, 1)
		if first[0].Kind == store.EventResync {
			checkEvents(t, "resumed watch after its resync", recvEvents(t, ch2, 1), []store.Event{acquired3})
		} else {
			rest := recvEvents(t, ch2, 2)
			checkEvents(t, "resumed watch", append(first, rest...), []store.Event{want[1],
				{Kind: store.EventAcquired, Key: "wr/2", Session: id, Token: g2.Token}, acquired3})
		}
	}
	cancel2()

	for _, bad := range []string{"not a cursor", "etcd:1:2", "pg:x", "etcd:0:99999999999999:0"} {
		ctx3, cancel3 := context.WithCancel(ctxT(t))
		_, ch3, err := b.WatchFrom(ctx3, "wr/", bad)
		if err != nil {
			cancel3()
			t.Fatalf("WatchFrom(%q): %v; want a watch that starts with a resync", bad, err)
		}
		if ev := recvEvents(t, ch3, 1)[0]; ev.Kind != store.EventResync || ev.Key != "" || ev.Cursor == "" {
			cancel3()
			t.Fatalf("WatchFrom(%q): first event %+v; want a resync with a cursor", bad, ev)
		}
		cancel3()
	}
}

// recvEvents receives n events from ch, failing on a broken or closed
// watch or when they do not come within 10 s.
func recvEvents(t *testing.T, ch <-chan store.Event, n int) []store.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	out := make([]store.Event, 0, n)
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed after %d of %d events: %+v", len(out), n, out)
			}
			if ev.Err != nil {
				t.Fatalf("watch broke after %d of %d events: %v", len(out), n, ev.Err)
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("%d of %d events within 10 s: %+v", len(out), n, out)
		}
	}
	return out
}

// checkEvents compares events without their cursors, which must all be
// set.
func checkEvents(t *testing.T, what string, got, want []store.Event) {
	t.Helper()
	bare := make([]store.Event, len(got))
	for i, ev := range got {
		if ev.Cursor == "" {
			t.Errorf("%s: event %d (%+v) has no cursor", what, i, ev)
		}
		ev.Cursor = ""
		bare[i] = ev
	}
	if !slices.Equal(bare, want) {
		t.Fatalf("%s: events\n%+v\nwant\n%+v", what, bare, want)
	}
}
