package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/store"
)

// TestErrorsRoundTrip makes a real server return every error class and
// checks the sentinel the SDK maps it to (client/errors.go) and its text.
// server.TestEveryReasonOnTheWire checks each class's wire reason.
func TestErrorsRoundTrip(t *testing.T) {
	forBackends(t, func(t *testing.T, backend string) {
		var faulty *lockdtest.Faulty
		srv := lockdtest.StartBackend(t, backend, lockdtest.Options{
			Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
		ctx := testCtx(t, 120*time.Second)
		c := srv.Client
		holder := newSession(t, ctx, c)
		if _, err := holder.Acquire(ctx, "held"); err != nil {
			t.Fatalf("Acquire(held): %v", err)
		}
		s := newSession(t, ctx, c)
		short := func() context.Context {
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}

		type check struct {
			name string
			err  error
			is   []error
			not  []error
			msg  string // substring of the error text
		}
		var checks []check
		add := func(name string, err error, msg string, is []error, not ...error) {
			checks = append(checks, check{name: name, err: err, is: is, not: not, msg: msg})
		}

		// InvalidArgument from the server (the SDK does not check this bound).
		_, err := s.Acquire(ctx, "k", client.WithWaitTimeout(11*time.Minute))
		add("wait timeout above the server maximum", err, "client: invalid argument: wait_timeout_ms: 660000 out of range", []error{client.ErrInvalidArgument})
		_, err = c.NewSession(ctx, client.WithSessionTTL(time.Second))
		add("ttl below minimum", err, "client: invalid argument: ttl_ms: ttl 1s out of range", []error{client.ErrInvalidArgument})
		_, _, err = c.List(ctx, "", client.ListOptions{PageToken: "%%%"})
		add("bad page token", err, "client: invalid argument: page_token: not a token returned by List", []error{client.ErrInvalidArgument})

		// Locked, wait timeout, the caller's deadline and cancellation.
		_, err = s.TryAcquire(ctx, "held")
		add("try on a held key", err, "", []error{client.ErrLocked})
		_, err = s.Acquire(ctx, "held", client.WithWaitTimeout(200*time.Millisecond))
		add("wait timeout", err, "", []error{client.ErrWaitTimeout}, context.DeadlineExceeded)
		dctx := short()
		_, err = s.Acquire(dctx, "held")
		add("caller deadline while waiting", err, "", []error{context.DeadlineExceeded}, client.ErrWaitTimeout, client.ErrUnavailable)
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(200*time.Millisecond, cancel)
		_, err = s.Acquire(cctx, "held")
		add("caller cancel while waiting", err, "", []error{context.Canceled})

		// Retryable classes: retried until the caller's context ends.
		for _, se := range []error{store.ErrUnavailable, store.ErrContention, store.ErrNotLeader} {
			faulty.Fail("inspect", se)
			// The caller gives up when the second attempt reaches the
			// server: the first one's retryable answer has then arrived,
			// however loaded the machine (a fixed timeout could end before
			// any answer).
			rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
			faulty.During("inspect", func() { faulty.During("inspect", rcancel) })
			_, err = c.Inspect(rctx, "k")
			rcancel()
			add("retryable "+se.Error(), err, "", []error{client.ErrUnavailable, context.Canceled})
		}
		faulty.Fail("inspect", errors.New("boom"))
		_, err = c.Inspect(ctx, "k")
		add("unclassified store error", err, "internal error", []error{client.ErrInternal}, client.ErrUnavailable)
		faulty.Fail("inspect", nil)

		// Not owner on a first release attempt: the lock was lost before.
		l, err := s.Acquire(ctx, "mine")
		if err != nil {
			t.Fatalf("Acquire(mine): %v", err)
		}
		faulty.Fail("release", store.ErrNotOwner)
		err = l.Release(ctx)
		add("not owner", err, "", []error{client.ErrNotOwner})
		faulty.Fail("release", nil)

		// A request larger than the server accepts is invalid input (C2
		// #ct2-bad-input), not a limit.
		_, _, err = c.List(ctx, strings.Repeat("p", 70<<10), client.ListOptions{})
		add("request too large", err, "", []error{client.ErrInvalidArgument})

		// Session dead: terminal, and it ends the session.
		dead := newSession(t, ctx, c)
		faulty.Fail("try_insert", store.ErrSessionDead)
		_, err = dead.TryAcquire(ctx, "k2")
		add("session dead", err, "", []error{client.ErrSessionDead}, client.ErrSessionExpired)
		faulty.Fail("try_insert", nil)
		if !closed(dead.Done()) || !errors.Is(dead.Err(), client.ErrSessionDead) {
			t.Errorf("session after SESSION_DEAD: done=%v err=%v; want ended with ErrSessionDead", closed(dead.Done()), dead.Err())
		}

		// Local validation uses the same key rules as the server.
		_, err = s.Acquire(ctx, "")
		add("empty key (local)", err, "client: invalid argument: key: key is empty", []error{client.ErrInvalidArgument})
		_, err = s.Acquire(ctx, "a\x00b")
		add("NUL key (local)", err, "client: invalid argument: key: key contains a NUL byte", []error{client.ErrInvalidArgument})

		// Shutting down: a watch on a server that stops tries to resume
		// (C2 #ct2-watch-resume); when its ctx ends first, its last event
		// says why the stream broke, ErrUnavailable (reason SHUTTING_DOWN
		// on the wire), and why it was not resumed.
		other := lockdtest.StartBackend(t, backend, lockdtest.Options{})
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		events, err := other.Client.Watch(wctx, "w/")
		if err != nil {
			t.Fatalf("Watch on the second server: %v", err)
		}
		if err := other.Stop(); err != nil {
			t.Fatalf("Stop the second server: %v", err)
		}
		time.AfterFunc(time.Second, wcancel) // a deadline, not synchronisation: the watch must end either way
		ev := <-events
		add("watch while the server shuts down", ev.Err, "server is shutting down", []error{client.ErrUnavailable, context.Canceled})
		if _, open := <-events; open {
			t.Errorf("watch channel still open after its last event")
		}

		for _, ck := range checks {
			if ck.err == nil {
				t.Errorf("%s: no error", ck.name)
				continue
			}
			for _, want := range ck.is {
				if !errors.Is(ck.err, want) {
					t.Errorf("%s: %v does not match %v", ck.name, ck.err, want)
				}
			}
			for _, not := range ck.not {
				if errors.Is(ck.err, not) {
					t.Errorf("%s: %v unexpectedly matches %v", ck.name, ck.err, not)
				}
			}
			if !strings.Contains(ck.err.Error(), ck.msg) {
				t.Errorf("%s: %q does not mention %q", ck.name, ck.err, ck.msg)
			}
		}
	})
}
