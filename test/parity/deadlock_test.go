package parity

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
)

// deadlockRow (issue 26 §3, C2 #ct2-deadlock): A holds a and waits for b,
// B holds b and waits for a. The wait that closes the cycle (B's) fails
// with ErrDeadlock naming both keys, A's keeps waiting and is granted once
// B releases b. Then the same with B's wait opted out
// (WithoutDeadlockCheck): A's (older) wait is the one refused.
func deadlockRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	admin := newClient(t, e.shared.addr)
	var out []string
	for _, optOut := range []bool{false, true} {
		ka, kb := "deadlock/a", "deadlock/b"
		if optOut {
			ka, kb = "deadlock/opt/a", "deadlock/opt/b"
		}
		a := newSession(t, ctx, newClient(t, e.shared.addr))
		b := newSession(t, ctx, newClient(t, e.shared.addr))
		la, err := a.Acquire(ctx, ka)
		if err != nil {
			t.Fatalf("Acquire(%s): %v", ka, err)
		}
		lb, err := b.Acquire(ctx, kb)
		if err != nil {
			t.Fatalf("Acquire(%s): %v", kb, err)
		}
		type result struct {
			l   *client.Lock
			err error
		}
		aw, bw := make(chan result, 1), make(chan result, 1)
		go func() { l, err := a.Acquire(ctx, kb); aw <- result{l, err} }() // ends: granted, refused, or ctx
		testkit.Eventually(t, 10*time.Second, "A queued for "+kb, func() error {
			info, err := admin.Inspect(ctx, kb)
			if err != nil || len(info.Waiters) != 1 {
				return fmt.Errorf("waiters %v, %v", info.Waiters, err)
			}
			return nil
		})
		var opts []client.AcquireOption
		prefix := ""
		if optOut {
			opts, prefix = append(opts, client.WithoutDeadlockCheck()), "opt-out:"
		}
		go func() { l, err := b.Acquire(ctx, ka, opts...); bw <- result{l, err} }() // as A's
		victim, other, name, give, keep := bw, aw, "closing(B)", lb, la
		if optOut {
			victim, other, name, give, keep = aw, bw, "older(A)", la, lb
		}
		var r result
		select {
		case r = <-victim:
		case <-time.After(15 * time.Second):
			t.Fatal("no wait refused within 15 s")
		}
		var de *client.DeadlockError
		if !errors.As(r.err, &de) {
			t.Fatalf("victim %s: %v, %v; want a *client.DeadlockError", name, r.l, r.err)
		}
		keys := strings.Join(de.Keys, ",")
		keys = strings.NewReplacer(ka, "a", kb, "b").Replace(keys)
		state := "waiting"
		select {
		case o := <-other:
			state = fmt.Sprintf("returned(%v)", o.err)
		default:
		}
		if err := give.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		after := "granted"
		if state == "waiting" {
			if o := <-other; o.err != nil {
				after = fmt.Sprintf("error(%v)", o.err)
			} else if err := o.l.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		if err := keep.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		out = append(out, fmt.Sprintf("%srefused=%s keys=[%s] other=%s after-release=%s", prefix, name, keys, state, after))
	}
	return strings.Join(out, " ")
}
