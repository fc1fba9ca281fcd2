package parity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// Rows of issue #15 §5: lock-delay and maximum hold (C2 #ct2-delay).

// parityDelay is the lock-delay of the rows: long enough that a grant
// without it (at once) is told apart from one after it on a loaded machine.
const parityDelay = 2 * time.Second

// lockDelayRow: Inspect shows a grant's lock-delay; a release hands over at
// once; a revoke keeps the key from everyone (Inspect shows the delay
// left) until the delay has passed; the next grant's token is higher.
func lockDelayRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "delay/k"
	admin := newClient(t, e.shared.addr)
	a := newSession(t, ctx, newClient(t, e.shared.addr))
	b := newSession(t, ctx, newClient(t, e.shared.addr))
	c := newSession(t, ctx, newClient(t, e.shared.addr))
	var out []string
	la, err := a.Acquire(ctx, key, client.WithLockDelay(parityDelay))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	info, err := admin.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	out = append(out, "inspect="+info.LockDelay.String())
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	lb, err := b.TryAcquire(ctx, key, client.WithLockDelay(parityDelay))
	out = append(out, "after-release="+outcome(err))
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	revoked := time.Now()
	if _, err := admin.Revoke(ctx, key); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	select {
	case <-lb.Done():
	case <-ctx.Done():
		t.Fatal("the revoked lock's Done did not close")
	}
	_, err = c.TryAcquire(ctx, key)
	out = append(out, "after-revoke="+outcome(err))
	info, err = admin.Inspect(ctx, key)
	delayed := err == nil && !info.Held && info.DelayRemaining > 0
	out = append(out, fmt.Sprintf("inspect-free=delay-left:%v", delayed))
	lc, err := c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire after the lock-delay: %v", err)
	}
	waited := "waited-delay"
	if el := time.Since(revoked); el < parityDelay {
		waited = fmt.Sprintf("early(%v)", el)
	}
	out = append(out, "wait="+waited)
	if lc.Token() > lb.Token() && lb.Token() > la.Token() {
		out = append(out, "tokens=increasing")
	} else {
		out = append(out, fmt.Sprintf("tokens=%d,%d,%d", la.Token(), lb.Token(), lc.Token()))
	}
	return strings.Join(out, " ")
}

// maxHoldRow: a lock past its maximum hold is revoked by the server: its
// Done closes with ErrMaxHold, a watcher sees max_hold, the session stays
// usable, and the next grant's token is higher.
func maxHoldRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "maxhold/k"
	const hold = time.Second
	watcher := newClient(t, e.shared.addr)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := watcher.Watch(wctx, "maxhold/")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	s := newSession(t, ctx, newClient(t, e.shared.addr))
	start := time.Now()
	l, err := s.Acquire(ctx, key, client.WithMaxHold(hold))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("the lock was not lost to its maximum hold")
	}
	var out []string
	switch err := l.Err(); {
	case errors.Is(err, client.ErrMaxHold) && time.Since(start) >= hold:
		out = append(out, "lost=max_hold")
	default:
		out = append(out, fmt.Sprintf("lost=%v(after %v)", err, time.Since(start)))
	}
	for ev := range events {
		if ev.Err != nil {
			t.Fatalf("watch broke: %v", ev.Err)
		}
		if ev.Token == l.Token() && ev.Kind != client.EventAcquired {
			out = append(out, "watch="+ev.Kind.String())
			break
		}
	}
	l2, err := s.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire by the same session after the maximum hold: %v", err)
	}
	out = append(out, fmt.Sprintf("same-session-again=granted token-higher=%v", l2.Token() > l.Token()))
	return strings.Join(out, " ")
}

// outcome names an acquire's result for a row.
func outcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, client.ErrLocked):
		return "locked"
	}
	return "error(" + err.Error() + ")"
}
