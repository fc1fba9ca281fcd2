package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// answer is what one Acquire call returned.
type answer struct {
	g   store.Grant
	err error
}

// handOverStore opens a Store on dsn with logs and opts' hooks, whose
// waiters never re-check on their own (recheckInterval an hour): every
// grant of a waiter comes from a hand-over's tell or a notification.
func handOverStore(t *testing.T, dsn string, opts Options) (*Store, *testkit.LogBuffer) {
	t.Helper()
	logger, logs := testkit.NewLogger()
	opts.DSN, opts.ReaperInterval, opts.Logger, opts.recheckInterval = dsn, testReaperInterval, logger, time.Hour
	s, err := New(testCtx(t), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, logs
}

// queuedAcquire starts an Acquire of key by id on s and returns the channel
// its answer arrives on, once the call is queued (its waiters row
// committed) on the database of probe.
func queuedAcquire(t *testing.T, ctx context.Context, s, probe *Store, id store.SessionID, key string) <-chan answer {
	t.Helper()
	res := make(chan answer, 1)
	go func() { // exits when Acquire returns (bounded by ctx)
		g, err := s.Acquire(ctx, id, key)
		res <- answer{g, err}
	}()
	testkit.Eventually(t, 30*time.Second, "the waiter is queued", func() error {
		if n := count(t, probe, "waiters"); n != 1 {
			return fmt.Errorf("%d waiter rows", n)
		}
		return nil
	})
	return res
}

// acquiredOnce checks that logs hold exactly one lock_acquired of grant g.
func acquiredOnce(t *testing.T, logs *testkit.LogBuffer, g store.Grant) {
	t.Helper()
	n := 0
	for _, rec := range logs.Events("lock_acquired") {
		if rec["session"] == string(g.Session) && rec["key"] == g.Key && rec["token"] == float64(g.Token) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("lock_acquired logged %d times for %s's grant of %q token %d; want once", n, g.Session, g.Key, g.Token)
	}
}

// checkAnswer checks that a is the waiter's grant of key as the database
// has it, after the holder's token, and that it releases.
func checkAnswer(t *testing.T, ctx context.Context, s *Store, logs *testkit.LogBuffer, a answer, waiter store.SessionID, key string, after uint64) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("Acquire: %v", a.err)
	}
	info, found := inspectT(t, s, key)
	if !found || a.g.Session != waiter || a.g.Key != key || info.Session != waiter || a.g.Token != info.Token || a.g.Token <= after {
		t.Fatalf("answer %+v, Inspect %+v (found %v); want the waiter's grant as committed, token above %d", a.g, info, found, after)
	}
	if !a.g.AcquiredAt.Equal(info.AcquiredAt) {
		t.Fatalf("answer acquired at %v, Inspect %v; want the time the commit wrote", a.g.AcquiredAt, info.AcquiredAt)
	}
	if a.g.Remaining <= 0 || a.g.Remaining > longTTL {
		t.Fatalf("answer Remaining %v; want in (0, TTL]", a.g.Remaining)
	}
	acquiredOnce(t, logs, a.g)
	if n := count(t, s, "waiters"); n != 0 {
		t.Fatalf("%d waiter rows after the hand-over; want 0", n)
	}
	held, err := s.LocksOf(ctx, waiter)
	if err != nil || len(held) != 1 || held[0].Token != a.g.Token {
		t.Fatalf("LocksOf(waiter) = %+v, %v; want the one grant, token %d", held, err, a.g.Token)
	}
	if err := s.DeleteIfOwner(ctx, waiter, key, a.g.Token); err != nil {
		t.Fatalf("the waiter's release of its answered grant: %v", err)
	}
}

// TestLocalWaiterAnsweredFromRelease: a release hands the key to the first
// waiter in its own commit, and a waiter of the same Store is answered from
// that commit's result with every notification held back (C2
// #ct2-release-handover). Before issue 24 the release only freed the key
// and the waiter took it by an attempt of its own once NOTIFY woke it: on
// that code this test fails with "not answered within 20 s".
func TestLocalWaiterAnsweredFromRelease(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	s, logs := handOverStore(t, pgtest.NewDatabase(t), Options{noticeGate: gate})
	t.Cleanup(func() { close(gate) }) // before the Store's Close (cleanups run last-in first)
	ctx := testCtx(t)
	holder, waiter := openSession(t, s), openSession(t, s)
	g0 := mustTry(t, s, holder, "k")
	res := queuedAcquire(t, ctx, s, s, waiter, "k")
	if err := s.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	var a answer
	select {
	case a = <-res:
	case <-time.After(20 * time.Second):
		t.Fatalf("the waiter was not answered within 20 s of the release with notifications held back: it waits for NOTIFY and an attempt of its own, not the release's commit")
	}
	checkAnswer(t, ctx, s, logs, a, waiter, "k", g0.Token)
}

// TestReleaseHandsOverToRemoteWaiter: a waiter on another Store holds the
// key once the release returns (the release's commit granted it), and its
// call answers once, from its notification's attempt, as a new grant.
func TestReleaseHandsOverToRemoteWaiter(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	a, _ := handOverStore(t, dsn, Options{})
	b, logsB := handOverStore(t, dsn, Options{})
	ctx := testCtx(t)
	holder, waiter := openSession(t, a), openSession(t, b)
	g0 := mustTry(t, a, holder, "k")
	res := queuedAcquire(t, ctx, b, a, waiter, "k")
	if err := a.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
		t.Fatalf("DeleteIfOwner: %v", err)
	}
	if info, found := inspectT(t, a, "k"); !found || info.Session != waiter || info.Token <= g0.Token {
		t.Fatalf("Inspect after the release = %+v (found %v); want the waiter holding it, handed over in the release", info, found)
	}
	checkAnswer(t, ctx, b, logsB, <-res, waiter, "k", g0.Token)
}

// TestLocalHandOverAnsweredOnce: the tell and the notification both reach
// the waiter, in either order; the call answers once (one grant, one
// lock_acquired), and the session holds the key once.
func TestLocalHandOverAnsweredOnce(t *testing.T) {
	t.Parallel()
	t.Run("tell-then-notice", func(t *testing.T) {
		gate := make(chan struct{})
		s, logs := handOverStore(t, pgtest.NewDatabase(t), Options{noticeGate: gate})
		ctx := testCtx(t)
		holder, waiter := openSession(t, s), openSession(t, s)
		g0 := mustTry(t, s, holder, "k")
		res := queuedAcquire(t, ctx, s, s, waiter, "k")
		if err := s.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
		a := <-res
		close(gate) // the notifications, late
		checkAnswer(t, ctx, s, logs, a, waiter, "k", g0.Token)
	})
	t.Run("notice-then-tell", func(t *testing.T) {
		answered := make(chan answer, 1)
		var res <-chan answer
		var mu sync.Mutex
		s, logs := handOverStore(t, pgtest.NewDatabase(t), Options{onHandOver: func(string) {
			mu.Lock()
			r := res
			mu.Unlock()
			answered <- <-r // the tell waits for the notification's answer
		}})
		ctx := testCtx(t)
		holder, waiter := openSession(t, s), openSession(t, s)
		g0 := mustTry(t, s, holder, "k")
		r := queuedAcquire(t, ctx, s, s, waiter, "k")
		mu.Lock()
		res = r
		mu.Unlock()
		if err := s.DeleteIfOwner(ctx, holder, "k", g0.Token); err != nil {
			t.Fatalf("DeleteIfOwner: %v", err)
		}
		checkAnswer(t, ctx, s, logs, <-answered, waiter, "k", g0.Token)
	})
	t.Run("contended", func(t *testing.T) {
		// Both paths race on every hand-over; no hook.
		s, logs := handOverStore(t, pgtest.NewDatabase(t), Options{})
		var (
			mu     sync.Mutex
			grants []store.Grant
			wg     sync.WaitGroup
			errs   = make(chan error, 3)
		)
		ctx := testCtx(t)
		for range 3 {
			id := openSession(t, s)
			wg.Add(1)
			go func() { // exits after 10 turns or an error
				defer wg.Done()
				for range 10 {
					g, err := s.Acquire(ctx, id, "hot")
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					grants = append(grants, g)
					mu.Unlock()
					if err := s.DeleteIfOwner(ctx, id, "hot", g.Token); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("contender: %v", err)
		}
		slices.SortFunc(grants, func(a, b store.Grant) int { return cmp.Compare(a.Token, b.Token) })
		for i, g := range grants {
			acquiredOnce(t, logs, g)
			if i > 0 && g.Token == grants[i-1].Token {
				t.Fatalf("token %d answered twice", g.Token)
			}
		}
		if n := len(logs.Events("lock_acquired")); n != len(grants) || n != 30 {
			t.Fatalf("%d lock_acquired for %d grants answered; want 30 each", n, len(grants))
		}
	})
}
