package pgstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

func TestWatchSlowConsumerBreaks(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	_, ch, err := s.WatchFrom(testCtx(t), "slow/", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	id := openSession(t, s)
	// Each grant and release is two events; nobody reads the channel.
	for i := 0; i < watchBuffer/2+2; i++ {
		g := mustTry(t, s, id, "slow/k")
		if err := s.DeleteIfOwner(testCtx(t), id, "slow/k", g.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
	}
	// The dispatcher delivers NOTIFYs behind the writes, later still on a
	// loaded machine: reading now could keep the consumer within the
	// buffer. Wait until nobody reading has filled it and the final error
	// is queued behind it (the window the test is about, made on purpose).
	testkit.Eventually(t, 30*time.Second, "watchBuffer events and the final error queued", func() bool {
		return len(ch) == watchBuffer+1
	})
	n := 0
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("channel closed after %d events without a final error", n)
			}
			if ev.Err != nil {
				if !errors.Is(ev.Err, store.ErrContention) {
					t.Fatalf("final event error %v, want ErrContention", ev.Err)
				}
				if n != watchBuffer {
					t.Fatalf("watch broke after %d buffered events, want %d", n, watchBuffer)
				}
				if _, ok := <-ch; ok {
					t.Fatal("channel not closed after the final event")
				}
				return
			}
			n++
		case <-timeout:
			t.Fatalf("no final error event after %d events", n)
		}
	}
}

func TestWatchSeesNothingBeforeIt(t *testing.T) {
	t.Parallel()
	s := newStore(t, pgtest.NewDatabase(t))
	id := openSession(t, s)
	for i := range 20 {
		mustTry(t, s, id, fmt.Sprintf("before/%d", i))
	}
	_, ch, err := s.WatchFrom(testCtx(t), "", "")
	if err != nil {
		t.Fatalf("WatchFrom: %v", err)
	}
	g := mustTry(t, s, id, "after")
	select {
	case ev := <-ch:
		if ev.Key != "after" || ev.Kind != store.EventAcquired || ev.Token != g.Token {
			t.Fatalf("first event %+v, want the grant of after (nothing committed before Watch)", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
}
