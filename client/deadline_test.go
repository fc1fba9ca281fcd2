package client_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// fakeClock is a manual client.Clock. Advance fires due timers
// synchronously, so that when it returns every effect of reaching the new
// time (a closed Done) has happened.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers []*fakeTimer
}

type fakeTimer struct {
	c       *fakeClock
	at      time.Time
	seq     int
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) client.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// pending reports whether a timer that has not fired is due in (from, to].
func (c *fakeClock) pending(from, to time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.timers {
		if !t.stopped && t.at.After(from) && !t.at.After(to) {
			return true
		}
	}
	return false
}

// Advance moves the clock forward by d at once, then fires the timers that
// are due, in order: like a real clock whose goroutines ran late, every
// callback sees the new time.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.Slice(c.timers, func(i, j int) bool {
			if !c.timers[i].at.Equal(c.timers[j].at) {
				return c.timers[i].at.Before(c.timers[j].at)
			}
			return c.timers[i].seq < c.timers[j].seq
		})
		var due *fakeTimer
		for len(c.timers) > 0 && due == nil {
			t := c.timers[0]
			if !t.stopped && t.at.After(c.now) {
				break
			}
			c.timers = c.timers[1:]
			if !t.stopped {
				t.stopped = true
				due = t
			}
		}
		c.mu.Unlock()
		if due == nil {
			return
		}
		due.f()
	}
}

// startFakeClock starts lockd over backend with its store wrapped in a
// Faulty and a client on a fake clock heartbeating every interval.
// Heartbeats follow the fake clock, so the session gets a long real TTL;
// the Remaining values are set through the Faulty.
func startFakeClock(t *testing.T, backend string, interval time.Duration) (*lockdtest.Server, *fakeClock, *lockdtest.Faulty) {
	t.Helper()
	var faulty *lockdtest.Faulty
	clock := newFakeClock()
	srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
		ClientOptions: []client.Option{client.WithClock(clock), client.WithHeartbeatInterval(interval),
			client.WithTTL(time.Minute)},
		Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
	return srv, clock, faulty
}

// TestDeadlineMath checks C2 #ct2-deadline with an injected clock: the
// deadline is exactly send + Remaining − margin, only ever moves later,
// grants extend it like heartbeats, and Done, Lock.Done and Lock.Context
// end exactly at it when nothing extends it.
func TestDeadlineMath(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const interval = time.Second
		srv, clock, faulty := startFakeClock(t, backend, interval)
		ctx := testCtx(t, 60*time.Second)
		margin := lockdtest.SafetyMargin
		faulty.SetRemaining(2500 * time.Millisecond)
		t0 := clock.Now()
		s := newSession(t, ctx, srv.Client)
		if got, want := s.Deadline(), t0.Add(2500*time.Millisecond-margin); !got.Equal(want) {
			t.Fatalf("deadline after OpenSession = t0%+v; want t0%+v (send + Remaining − margin)", got.Sub(t0), want.Sub(t0))
		}
		// The first heartbeat (sent at once on the new stream) reports the
		// same Remaining; after it, a longer Remaining on the next one.
		testkit.Eventually(t, 10*time.Second, "first heartbeat answered by the store", func() bool {
			return len(faulty.Reported()) >= 2
		})
		faulty.SetRemaining(2800 * time.Millisecond)
		// The keepaliver has scheduled the next heartbeat (jittered, within
		// one interval).
		testkit.Eventually(t, 10*time.Second, "next heartbeat scheduled", func() bool {
			return clock.pending(t0, t0.Add(interval))
		})
		clock.Advance(interval)
		t1 := clock.Now()
		want := t1.Add(2800*time.Millisecond - margin)
		if testkit.Poll(10*time.Second, func() bool { return s.Deadline().Equal(want) }) != nil {
			t.Fatalf("deadline after the heartbeat sent at t0+1s = t0%+v; want t0%+v (reported %v)",
				s.Deadline().Sub(t0), want.Sub(t0), faulty.Reported())
		}

		// A grant extends it too, from the Acquire's send time.
		faulty.Fail("heartbeat", store.ErrUnavailable) // no more extensions
		faulty.SetRemaining(5 * time.Second)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		want = t1.Add(5*time.Second - margin)
		if got := s.Deadline(); !got.Equal(want) {
			t.Fatalf("deadline after a grant = t0%+v; want t0%+v", got.Sub(t0), want.Sub(t0))
		}
		// A shorter Remaining never moves it earlier.
		faulty.SetRemaining(time.Second)
		if _, err := s.Acquire(ctx, "k2"); err != nil {
			t.Fatalf("Acquire(k2): %v", err)
		}
		if got := s.Deadline(); !got.Equal(want) {
			t.Fatalf("deadline after a shorter grant = t0%+v; want unchanged t0%+v", got.Sub(t0), want.Sub(t0))
		}

		// Heartbeats now fail: nothing extends the deadline. One
		// nanosecond before it everything is still trusted...
		clock.Advance(want.Sub(clock.Now()) - 1)
		if closed(s.Done()) || closed(l.Done()) || l.Context().Err() != nil {
			t.Fatalf("session or lock ended 1ns before the deadline: %v / %v", s.Err(), l.Err())
		}
		if got := s.Deadline(); !got.Equal(want) {
			t.Fatalf("deadline moved during failing heartbeats: t0%+v; want t0%+v", got.Sub(t0), want.Sub(t0))
		}
		// ...and at it, nothing is.
		clock.Advance(1)
		if !closed(s.Done()) || !closed(l.Done()) || l.Context().Err() == nil {
			t.Fatalf("at the deadline: session done=%v, lock done=%v, lock ctx %v; want all ended",
				closed(s.Done()), closed(l.Done()), l.Context().Err())
		}
		if !errors.Is(s.Err(), client.ErrSessionExpired) || !errors.Is(s.Err(), client.ErrSessionDead) ||
			!errors.Is(context.Cause(l.Context()), client.ErrSessionExpired) {
			t.Errorf("errors at the deadline: session %v, lock cause %v; want ErrSessionExpired", s.Err(), context.Cause(l.Context()))
		}
	})
}

// TestDoneWhileServerUnreachable: lockd dies (its store with it); the
// client stops trusting its lock at its local deadline, before the backend
// frees the key for anyone else.
func TestDoneWhileServerUnreachable(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		ns := lockdtest.NewNamespace(t, backend)
		observer := ns.OpenStore(t, lockdtest.StoreOptions{})
		srv := lockdtest.StartOn(t, ns, lockdtest.Options{})
		ctx := testCtx(t, 60*time.Second)
		s := newSession(t, ctx, srv.Client)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		// Let a few heartbeats pass, then kill lockd: server and store.
		testkit.Eventually(t, 10*time.Second, "deadline extended by heartbeats", func() bool {
			return s.Deadline().After(time.Now().Add(lockdtest.TTL / 2))
		})
		doneAt := make(chan time.Time, 1)
		go func() {
			<-l.Done()
			doneAt <- time.Now()
		}()
		stoppedAt := time.Now()
		if err := srv.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if err := srv.Store.Close(); err != nil {
			t.Fatalf("store Close: %v", err)
		}
		deadline := l.Deadline() // the session's, or earlier if the last answer did not confirm the lock
		var freeAt time.Time
		testkit.Eventually(t, lockdtest.TTL+15*time.Second, "key freed by the backend", func() bool {
			_, held, err := observer.Inspect(ctx, "k")
			if err == nil && !held {
				freeAt = time.Now()
				return true
			}
			return false
		})
		var done time.Time
		select {
		case done = <-doneAt:
		default:
			t.Fatalf("Lock.Done still open when the backend freed the key %v after the stop", freeAt.Sub(stoppedAt))
		}
		if !done.Before(freeAt) {
			t.Errorf("client trusted its lock until %v after the stop, the backend freed it at %v", done.Sub(stoppedAt), freeAt.Sub(stoppedAt))
		}
		if done.Before(deadline) {
			t.Errorf("Lock.Done closed %v before the lock's deadline", deadline.Sub(done))
		}
		if !errors.Is(s.Err(), client.ErrSessionExpired) {
			t.Errorf("session error %v; want ErrSessionExpired (the local deadline)", s.Err())
		}
		t.Logf("stop → client stopped trusting: %v; stop → backend freed the key: %v",
			done.Sub(stoppedAt).Round(time.Millisecond), freeAt.Sub(stoppedAt).Round(time.Millisecond))
	})
}

// TestHeartbeatBeforeShortDeadline checks the heartbeat schedule of C2
// #ct2-deadline: an answer whose Remaining leaves less than an interval
// brings the next heartbeat forward to halfway to the earliest deadline,
// so a lock outlives many such windows. Before the rule the next heartbeat
// went a jittered interval later (0.8–1 s) and the lock's deadline (0.7 s
// after each send) passed first — how parity rolling-restart on a
// three-member etcd lost a lock.
func TestHeartbeatBeforeShortDeadline(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		const interval = time.Second
		srv, clock, faulty := startFakeClock(t, backend, interval)
		ctx := testCtx(t, 60*time.Second)
		const rem = 1200 * time.Millisecond
		window := rem - lockdtest.SafetyMargin // 700 ms of trust per answer
		faulty.SetRemaining(rem)
		s := newSession(t, ctx, srv.Client)
		l, err := s.Acquire(ctx, "k")
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		for i := range 8 { // 8 × 350 ms: four windows
			now := clock.Now()
			if testkit.Poll(10*time.Second, func() bool { return clock.pending(now, now.Add(window/2)) }) != nil {
				t.Fatalf("step %d: no heartbeat due within %v of an answer that left a %v window (deadline now%+v)",
					i, window/2, window, l.Deadline().Sub(now))
			}
			clock.Advance(window / 2)
			sent := clock.Now()
			if testkit.Poll(10*time.Second, func() bool { return l.Deadline().Equal(sent.Add(window)) }) != nil {
				t.Fatalf("step %d: lock deadline sent%+v; want sent+%v (the heartbeat sent at the step's end answered)",
					i, l.Deadline().Sub(sent), window)
			}
			if closed(l.Done()) {
				t.Fatalf("step %d: lock lost: %v", i, l.Err())
			}
		}
	})
}
