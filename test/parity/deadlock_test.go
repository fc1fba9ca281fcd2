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

// deadlock3Row (issue 26 §3, C2 #ct2-deadlock): a 3-cycle on one lockd.
// Sessions S0, S1, S2 each hold k<i> and wait for k<i+1 mod 3>, queued in
// order; S2's wait closes the cycle and is refused naming the three keys,
// the other two keep waiting, and they are granted in turn (S1, then S0) as
// the cycle unwinds from the victim's release.
func deadlock3Row(t *testing.T, e *env) string {
	addr := e.shared.addr
	cs := []*client.Client{newClient(t, addr), newClient(t, addr), newClient(t, addr)}
	return deadlockCycle(t, newClient(t, addr), cs, "deadlock3")
}

// deadlockCycle builds a cycle of len(cs) sessions, session i opened on
// cs[i]: session i holds <prefix>/k<i> and waits for k<i+1 mod n>, queued
// in order, so the last wait closes the cycle. admin inspects the queues.
// It expects the last wait refused with ErrDeadlock and every other call
// still waiting; then the victim releases its key and the others are
// granted backwards from it, each releasing both its keys. The outcome
// names sessions S<i> and keys k<i>.
func deadlockCycle(t *testing.T, admin *client.Client, cs []*client.Client, prefix string) string {
	ctx := testCtx(t)
	n := len(cs)
	keys := make([]string, n)
	ss := make([]*client.Session, n)
	held := make([]*client.Lock, n)
	for i := range n {
		keys[i] = fmt.Sprintf("%s/k%d", prefix, i)
		ss[i] = newSession(t, ctx, cs[i])
		held[i] = acquire(t, ctx, ss[i], keys[i])
	}
	type result struct {
		l   *client.Lock
		err error
	}
	chans := make([]chan result, n)
	for i := range n {
		chans[i] = make(chan result, 1)
		next := keys[(i+1)%n]
		go func() { l, err := ss[i].Acquire(ctx, next); chans[i] <- result{l, err} }() // ends: granted, refused, or ctx
		if i == n-1 {
			break // the closing wait may be refused before anyone sees it queued
		}
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("S%d queued for %s", i, next), func() error {
			info, err := admin.Inspect(ctx, next)
			if err != nil || len(info.Waiters) != 1 || info.Waiters[0] != ss[i].ID() {
				return fmt.Errorf("waiters %v, %v", info.Waiters, err)
			}
			return nil
		})
	}
	victim := n - 1
	var r result
	select {
	case r = <-chans[victim]:
	case <-time.After(15 * time.Second):
		t.Fatal("no wait refused within 15 s")
	}
	var de *client.DeadlockError
	if !errors.As(r.err, &de) {
		t.Fatalf("S%d (the closing wait): %v, %v; want a *client.DeadlockError", victim, r.l, r.err)
	}
	names := strings.NewReplacer(prefix+"/", "")
	got := names.Replace(strings.Join(de.Keys, ","))
	others := "waiting"
	for i := range n - 1 {
		select {
		case o := <-chans[i]:
			others = fmt.Sprintf("S%d-returned(%v)", i, o.err)
			t.Errorf("S%d's wait returned beside the victim: %v, %v", i, o.l, o.err)
		default:
		}
	}
	if others != "waiting" {
		return fmt.Sprintf("refused=closing(S%d) keys=[%s] others=%s", victim, got, others)
	}
	if err := held[victim].Release(ctx); err != nil {
		t.Fatalf("S%d Release: %v", victim, err)
	}
	var unwound []string
	for step := 1; step < n; step++ {
		j := victim - step
		var o result
		select {
		case o = <-chans[j]:
		case <-time.After(20 * time.Second):
			t.Fatalf("S%d not granted within 20 s of its holder's release", j)
		}
		if o.err != nil {
			unwound = append(unwound, fmt.Sprintf("S%d:error(%v)", j, o.err))
			t.Errorf("S%d: %v", j, o.err)
			continue
		}
		unwound = append(unwound, fmt.Sprintf("S%d", j))
		for _, l := range []*client.Lock{o.l, held[j]} {
			if err := l.Release(ctx); err != nil {
				t.Fatalf("S%d Release: %v", j, err)
			}
		}
	}
	return fmt.Sprintf("refused=closing(S%d) keys=[%s] others=waiting unwound=%s", victim, got, strings.Join(unwound, ","))
}

// deadlockReplicas (issue 26 §3, C2 #ct2-deadlock "a cycle whose sessions
// wait through different replicas is seen by every replica"): two replicas
// on one backend; session S0 talks to one only, S1 to the other (each
// client given one address). A 2-cycle between them is refused: the
// closing wait, whichever replica runs it. Twice: closed on replica 1,
// then on replica 0.
func deadlockReplicas(t *testing.T, e *replicaEnv) string {
	rs := e.replicas(t, 2)
	var out []string
	for round, closer := range []int{1, 0} {
		cs := []*client.Client{newClient(t, rs[1-closer].addr), newClient(t, rs[closer].addr)}
		o := deadlockCycle(t, newClient(t, rs[0].addr), cs, fmt.Sprintf("deadlock-replicas/%d", round))
		out = append(out, fmt.Sprintf("closing-on-r%d:%s", closer, o))
	}
	return strings.Join(out, " ")
}

// deadlockKnotRow (C2 #ct2-deadlock, the AND-OR model, 2026-12-07): T1 and
// T2 hold both slots of the semaphore s of 2 and each waits for x, which W
// holds; W waits for a slot. Every holder of the full semaphore is blocked
// (a knot): W's wait, the youngest, is refused naming s and x, T1's and
// T2's keep waiting, and they get x in turn once W releases it.
func deadlockKnotRow(t *testing.T, e *env) string {
	ctx := testCtx(t)
	addr := e.shared.addr
	admin := newClient(t, addr)
	const sem, x = "deadlock-knot/s", "deadlock-knot/x"
	lim := client.WithLimit(2)
	type result struct {
		l   *client.Lock
		err error
	}
	acquire := func(s *client.Session, key string, opts ...client.AcquireOption) *client.Lock {
		l, err := s.Acquire(ctx, key, opts...)
		if err != nil {
			t.Fatalf("Acquire(%s): %v", key, err)
		}
		return l
	}
	start := func(s *client.Session, key string, opts ...client.AcquireOption) <-chan result {
		ch := make(chan result, 1)
		go func() { l, err := s.Acquire(ctx, key, opts...); ch <- result{l, err} }() // ends: granted, refused, or ctx
		return ch
	}
	queued := func(key string, n int) {
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d queued for %s", n, key), func() error {
			info, err := admin.Inspect(ctx, key)
			if err != nil || len(info.Waiters) != n {
				return fmt.Errorf("waiters %v, %v", info.Waiters, err)
			}
			return nil
		})
	}
	t1 := newSession(t, ctx, newClient(t, addr))
	t2 := newSession(t, ctx, newClient(t, addr))
	w := newSession(t, ctx, newClient(t, addr))
	s1, s2, lx := acquire(t1, sem, lim), acquire(t2, sem, lim), acquire(w, x)
	c1 := start(t1, x)
	queued(x, 1)
	c2 := start(t2, x)
	queued(x, 2)
	cw := start(w, sem, lim)
	var r result
	select {
	case r = <-cw:
	case <-time.After(15 * time.Second):
		t.Fatal("W's semaphore wait not refused within 15 s")
	}
	var de *client.DeadlockError
	if !errors.As(r.err, &de) {
		t.Fatalf("W: %v, %v; want a *client.DeadlockError", r.l, r.err)
	}
	keys := strings.NewReplacer(sem, "s", x, "x").Replace(strings.Join(de.Keys, ","))
	holders := "waiting"
	select {
	case o := <-c1:
		holders = fmt.Sprintf("returned(T1: %v)", o.err)
	case o := <-c2:
		holders = fmt.Sprintf("returned(T2: %v)", o.err)
	default:
	}
	if err := lx.Release(ctx); err != nil {
		t.Fatalf("Release(%s): %v", x, err)
	}
	var unwound []string
	for _, c := range []struct {
		name string
		ch   <-chan result
	}{{"T1", c1}, {"T2", c2}} {
		if holders != "waiting" {
			break
		}
		o := <-c.ch
		if o.err != nil {
			unwound = append(unwound, c.name+"="+o.err.Error())
			break
		}
		unwound = append(unwound, c.name)
		if err := o.l.Release(ctx); err != nil {
			t.Fatalf("Release(%s): %v", x, err)
		}
	}
	for _, l := range []*client.Lock{s1, s2} {
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release(%s): %v", sem, err)
		}
	}
	return fmt.Sprintf("refused=W keys=[%s] holders=%s unwound=%s", keys, holders, strings.Join(unwound, ","))
}
