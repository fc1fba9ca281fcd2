package parity

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// acquireAllRow (issue 26 §2, C2 #ct2-acquire-all): A holds b. B's try of
// {c, a, b} is refused and holds nothing; a wait with a 300 ms timeout
// times out and holds nothing; a wait without one takes a (the keys below
// the busy one, in ascending order) and queues for b; A's release hands
// B every key, one Lock per key in the order asked, each with its own key's
// token. Then C and D ask for overlapping sets in opposite orders, over and
// over at once: neither deadlocks, each gets its whole set every round.
func acquireAllRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	admin := newClient(t, e.shared.addr)
	a := newSession(t, ctx, newClient(t, e.shared.addr))
	b := newSession(t, ctx, newClient(t, e.shared.addr))
	names := map[string]string{a.ID(): "A", b.ID(): "B"}
	const ka, kb, kc = "acquire-all/a", "acquire-all/b", "acquire-all/c"
	keys := []string{kc, ka, kb}
	var out []string
	held := func() string { // which of keys are held, by whom
		var hs []string
		for _, k := range []string{ka, kb, kc} {
			info, err := admin.Inspect(ctx, k)
			if err != nil || info.Held {
				hs = append(hs, strings.TrimPrefix(k, "acquire-all/")+"="+holder(info, err, names))
			}
		}
		if len(hs) == 0 {
			return "none"
		}
		return strings.Join(hs, ",")
	}

	lb := acquire(t, ctx, a, kb)
	_, err := b.TryAcquireAll(ctx, keys)
	out = append(out, "try="+sdkErr(err), "held="+held())
	_, err = b.AcquireAll(ctx, keys, client.WithWaitTimeout(300*time.Millisecond))
	out = append(out, "wait(300ms)="+sdkErr(err), "held="+held())

	type result struct {
		ls  []*client.Lock
		err error
	}
	bw := make(chan result, 1)
	go func() { ls, err := b.AcquireAll(ctx, keys); bw <- result{ls, err} }() // ends: granted, or ctx
	waitQueued(t, ctx, admin, kb, 1)
	out = append(out, "while-waiting="+held())
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("Release(%s): %v", kb, err)
	}
	r := await(t, bw, 15*time.Second, "B's AcquireAll after A's release")
	if r.err != nil {
		t.Fatalf("B's AcquireAll: %v", r.err)
	}
	order, tokens := "asked", "own"
	for i, l := range r.ls {
		if l.Key() != keys[i] {
			order = "other"
		}
		info, err := admin.Inspect(ctx, l.Key())
		if err != nil || info.Session != b.ID() || info.Token != l.Token() {
			tokens = fmt.Sprintf("mismatch(%s: %+v, %v)", l.Key(), info, err)
		}
	}
	if r.ls[2].Token() <= lb.Token() {
		tokens = "b-not-greater"
	}
	out = append(out, fmt.Sprintf("grants=%d order=%s tokens=%s", len(r.ls), order, tokens))
	if err := client.ReleaseAll(ctx, r.ls); err != nil {
		t.Fatalf("ReleaseAll: %v", err)
	}
	out = append(out, "after-release="+held())
	out = append(out, "opposite-orders="+oppositeOrders(t, ctx, e))
	return strings.Join(out, " ")
}

// oppositeOrders runs two sessions that each take {x, y, z} (in opposite
// orders) and release it, 5 rounds each, at once; "no-deadlock" when both
// finish every round within the bound.
func oppositeOrders(t *testing.T, ctx context.Context, e *env) string {
	sets := [][]string{{"acquire-all/x", "acquire-all/y", "acquire-all/z"}, {"acquire-all/z", "acquire-all/y", "acquire-all/x"}}
	done := make(chan error, len(sets))
	for _, set := range sets {
		s := newSession(t, ctx, newClient(t, e.shared.addr))
		go func() { // ends after its rounds, or on an error or ctx
			for range 5 {
				ls, err := s.AcquireAll(ctx, set)
				if err != nil {
					done <- err
					return
				}
				if err := client.ReleaseAll(ctx, ls); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	var errs []string
	for range sets {
		if err := await(t, done, 30*time.Second, "both sessions' rounds"); err != nil {
			errs = append(errs, sdkErr(err))
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return "failed(" + strings.Join(errs, ",") + ")"
	}
	return "no-deadlock"
}
