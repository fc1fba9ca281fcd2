package parity

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/testing/testkit"
)

// checkTokenRow (issue 26 §1, C2 #ct2-check-token): a resource's view of
// a fencing token, in both modes. A's grant is current in the
// linearizable mode and in the cached mode, where a repeated check of an
// unchanged key is answered by the index; a token above it is not. Once A
// released and B holds the key, A's token is stale in both modes (the
// cached mode within its staleness bound, one watch delivery: polled) and
// B's is current; after an admin's revoke no token is current and none is
// listed. Every holder of a semaphore is current. A key nobody ever held
// answers not current with no tokens, and token 0 is refused.
func checkTokenRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	admin := newClient(t, e.shared.addr)
	a := newSession(t, ctx, newClient(t, e.shared.addr))
	b := newSession(t, ctx, newClient(t, e.shared.addr))
	const key = "check-token/k"
	var out []string

	check := func(token uint64, cached bool) client.TokenCheck {
		t.Helper()
		tc, err := admin.CheckToken(ctx, key, token, client.CheckOptions{Cached: cached})
		if err != nil {
			t.Fatalf("CheckToken(%s, %d, cached=%v): %v", key, token, cached, err)
		}
		return tc
	}
	// verdict names an answer: current, or stale with how many tokens
	// the key's grants carry now.
	verdict := func(tc client.TokenCheck) string {
		if tc.Current {
			return "current"
		}
		return fmt.Sprintf("stale(tokens=%d)", len(tc.Tokens))
	}
	// cachedUntil polls the cached mode until it gives want: a cached answer
	// may be one watch delivery behind (C2's staleness bound).
	cachedUntil := func(token uint64, want string) string {
		t.Helper()
		var got string
		testkit.Eventually(t, 10*time.Second, "cached check of "+key+" = "+want, func() error {
			if got = verdict(check(token, true)); got != want {
				return fmt.Errorf("got %s", got)
			}
			return nil
		})
		return got
	}

	la := acquire(t, ctx, a, key)
	ta := la.Token()
	out = append(out, "A:lin="+verdict(check(ta, false)), "A:cached="+verdict(check(ta, true)))
	// The first cached check of a key reads through the backend (a key
	// enters the index by a read); a later one of the unchanged key is the
	// index's answer.
	testkit.Eventually(t, 10*time.Second, "a cached check answered by the index", func() error {
		if tc := check(ta, true); !tc.Cached || !tc.Current {
			return fmt.Errorf("answer %+v", tc)
		}
		return nil
	})
	out = append(out, "A:index=current", "above-A="+verdict(check(ta+1000, false)))

	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release(%s): %v", key, err)
	}
	lb := acquire(t, ctx, b, key)
	tb := lb.Token()
	if tb <= ta {
		t.Fatalf("B's token %d not above A's %d", tb, ta)
	}
	out = append(out, "after-B:A:lin="+verdict(check(ta, false)), "A:cached="+cachedUntil(ta, "stale(tokens=1)"),
		"B:lin="+verdict(check(tb, false)), "B:cached="+cachedUntil(tb, "current"))

	if _, err := admin.Revoke(ctx, key); err != nil {
		t.Fatalf("Revoke(%s): %v", key, err)
	}
	out = append(out, "after-revoke:B:lin="+verdict(check(tb, false)), "B:cached="+cachedUntil(tb, "stale(tokens=0)"))

	const sem = "check-token/sem"
	s1 := acquire(t, ctx, a, sem, client.WithLimit(2))
	s2 := acquire(t, ctx, b, sem, client.WithLimit(2))
	var slots []string
	for _, l := range []*client.Lock{s1, s2} {
		tc, err := admin.CheckToken(ctx, sem, l.Token(), client.CheckOptions{})
		if err != nil {
			t.Fatalf("CheckToken(%s, %d): %v", sem, l.Token(), err)
		}
		slots = append(slots, fmt.Sprintf("%s(tokens=%d)", verdict(tc), len(tc.Tokens)))
	}
	out = append(out, "semaphore="+strings.Join(slots, ","))

	tc, err := admin.CheckToken(ctx, "check-token/never", 1, client.CheckOptions{})
	if err != nil {
		t.Fatalf("CheckToken(never held): %v", err)
	}
	_, zero := admin.CheckToken(ctx, key, 0, client.CheckOptions{})
	out = append(out, "never-held="+verdict(tc), "token0="+sdkErr(zero))
	return strings.Join(out, " ")
}
