package parity

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
)

// The issue 26 rows through the agents (check, no_deadlock_check,
// acquire_all): each does what its Go row (checktoken_test.go,
// deadlock_test.go, acquireall_test.go) does, through the agent's ops, and
// reports the same outcome string.

// agentCheckToken is checkTokenRow through an agent's check op.
func agentCheckToken(t *testing.T, a *agent, addr string) string {
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	sa, _ := a.session(addr, nil)
	sb, _ := a.session(addr, nil)
	const key = "check-token/k"
	var out []string
	check := func(key string, token uint64, cached bool) reply {
		t.Helper()
		return a.must("check", map[string]any{"client": admin, "key": key, "token": token, "cached": cached})
	}
	verdict := func(r reply) string {
		if cur, _ := r["current"].(bool); cur {
			return "current"
		}
		return fmt.Sprintf("stale(tokens=%d)", len(r["tokens"].([]any)))
	}
	cachedUntil := func(token uint64, want string) string {
		t.Helper()
		var got string
		testkit.Eventually(t, 10*time.Second, "cached check of "+key+" = "+want, func() error {
			if got = verdict(check(key, token, true)); got != want {
				return fmt.Errorf("got %s", got)
			}
			return nil
		})
		return got
	}

	la := a.must("acquire", map[string]any{"session": sa, "key": key})
	ta := la.num("token")
	out = append(out, "A:lin="+verdict(check(key, ta, false)), "A:cached="+verdict(check(key, ta, true)))
	testkit.Eventually(t, 10*time.Second, "a cached check answered by the index", func() error {
		r := check(key, ta, true)
		if cached, _ := r["cached"].(bool); !cached || verdict(r) != "current" {
			return fmt.Errorf("answer %v", map[string]any(r))
		}
		return nil
	})
	out = append(out, "A:index=current", "above-A="+verdict(check(key, ta+1000, false)))

	a.must("release", map[string]any{"lock": la.str("lock")})
	lb := a.must("acquire", map[string]any{"session": sb, "key": key})
	tb := lb.num("token")
	if tb <= ta {
		t.Fatalf("B's token %d not above A's %d", tb, ta)
	}
	out = append(out, "after-B:A:lin="+verdict(check(key, ta, false)), "A:cached="+cachedUntil(ta, "stale(tokens=1)"),
		"B:lin="+verdict(check(key, tb, false)), "B:cached="+cachedUntil(tb, "current"))

	a.must("revoke", map[string]any{"client": admin, "key": key})
	out = append(out, "after-revoke:B:lin="+verdict(check(key, tb, false)), "B:cached="+cachedUntil(tb, "stale(tokens=0)"))

	const sem = "check-token/sem"
	var slots []string
	for _, s := range []string{sa, sb} {
		l := a.must("acquire", map[string]any{"session": s, "key": sem, "limit": 2})
		defer a.call("release", map[string]any{"lock": l.str("lock")})
		slots = append(slots, l.str("lock"))
	}
	for i, h := range slots {
		r := check(sem, a.must("lock_state", map[string]any{"lock": h}).num("token"), false)
		slots[i] = fmt.Sprintf("%s(tokens=%d)", verdict(r), len(r["tokens"].([]any)))
	}
	out = append(out, "semaphore="+strings.Join(slots, ","))
	zero := a.call("check", map[string]any{"client": admin, "key": key, "token": 0})
	out = append(out, "never-held="+verdict(check("check-token/never", 1, false)), "token0="+zero.err())
	return strings.Join(out, " ")
}

// awaitWithin is await with a bound of its own; ok false when it passed.
func awaitWithin(ch <-chan reply, d time.Duration) (reply, bool) {
	select {
	case r := <-ch:
		return r, true
	case <-time.After(d):
		return nil, false
	}
}

// agentDeadlock is deadlockRow through an agent's acquire op and its
// no_deadlock_check argument.
func agentDeadlock(t *testing.T, a *agent, addr string) string {
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	var out []string
	for _, optOut := range []bool{false, true} {
		ka, kb := "deadlock/a", "deadlock/b"
		if optOut {
			ka, kb = "deadlock/opt/a", "deadlock/opt/b"
		}
		sa, _ := a.session(addr, nil)
		sb, _ := a.session(addr, nil)
		la := a.must("acquire", map[string]any{"session": sa, "key": ka}).str("lock")
		lb := a.must("acquire", map[string]any{"session": sb, "key": kb}).str("lock")
		_, aw := a.start("acquire", map[string]any{"session": sa, "key": kb})
		waitQueuedAgent(t, a, admin, kb, 1)
		args := map[string]any{"session": sb, "key": ka}
		prefix := ""
		if optOut {
			args["no_deadlock_check"], prefix = true, "opt-out:"
		}
		_, bw := a.start("acquire", args)
		victim, other, name, give, keep := bw, aw, "closing(B)", lb, la
		if optOut {
			victim, other, name, give, keep = aw, bw, "older(A)", la, lb
		}
		r, ok := awaitWithin(victim, 15*time.Second)
		if !ok {
			t.Fatal("no wait refused within 15 s")
		}
		if r.err() != "ErrDeadlock" {
			t.Fatalf("victim %s: %s %s; want ErrDeadlock", name, r.err(), r.str("message"))
		}
		keys := strings.NewReplacer(ka, "a", kb, "b").Replace(strings.Join(r.list("keys"), ","))
		state := "waiting"
		select {
		case o := <-other:
			state = fmt.Sprintf("returned(%s)", o.err())
		default:
		}
		a.must("release", map[string]any{"lock": give})
		after := "granted"
		if state == "waiting" {
			if o := a.await(other, "the other wait's grant"); o.err() != "ok" {
				after = fmt.Sprintf("error(%s)", o.err())
			} else {
				a.must("release", map[string]any{"lock": o.str("lock")})
			}
		}
		a.must("release", map[string]any{"lock": keep})
		out = append(out, fmt.Sprintf("%srefused=%s keys=[%s] other=%s after-release=%s", prefix, name, keys, state, after))
	}
	return strings.Join(out, " ")
}

// agentLocks is an acquire_all reply's locks: handle, key, token.
type agentLock struct {
	lock, key string
	token     uint64
}

func agentLocks(r reply) []agentLock {
	var out []agentLock
	xs, _ := r["locks"].([]any)
	for _, x := range xs {
		m, _ := x.(map[string]any)
		l := reply(m)
		out = append(out, agentLock{l.str("lock"), l.str("key"), l.num("token")})
	}
	return out
}

// agentAcquireAll is acquireAllRow through an agent's acquire_all and
// try_acquire_all ops.
func agentAcquireAll(t *testing.T, a *agent, addr string) string {
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	sa, ida := a.session(addr, nil)
	sb, idb := a.session(addr, nil)
	names := map[string]string{ida: "A", idb: "B"}
	const ka, kb, kc = "acquire-all/a", "acquire-all/b", "acquire-all/c"
	keys := []string{kc, ka, kb}
	var out []string
	held := func() string {
		var hs []string
		for _, k := range []string{ka, kb, kc} {
			r := a.call("inspect", map[string]any{"client": admin, "key": k})
			if held, _ := r["held"].(bool); r.err() != "ok" || held {
				hs = append(hs, strings.TrimPrefix(k, "acquire-all/")+"="+holderOf(r, names))
			}
		}
		if len(hs) == 0 {
			return "none"
		}
		return strings.Join(hs, ",")
	}

	lb := a.must("acquire", map[string]any{"session": sa, "key": kb})
	out = append(out, "try="+a.call("try_acquire_all", map[string]any{"session": sb, "keys": keys}).err(), "held="+held())
	out = append(out, "wait(300ms)="+a.call("acquire_all", map[string]any{"session": sb, "keys": keys, "timeout": 0.3}).err(),
		"held="+held())
	_, bw := a.start("acquire_all", map[string]any{"session": sb, "keys": keys})
	waitQueuedAgent(t, a, admin, kb, 1)
	out = append(out, "while-waiting="+held())
	a.must("release", map[string]any{"lock": lb.str("lock")})
	r, ok := awaitWithin(bw, 15*time.Second)
	if !ok {
		t.Fatal("no grant of B's acquire_all within 15 s of A's release")
	}
	if r.err() != "ok" {
		t.Fatalf("B's acquire_all: %s %s", r.err(), r.str("message"))
	}
	ls := agentLocks(r)
	if len(ls) != len(keys) {
		t.Fatalf("B's acquire_all: %d locks for %d keys", len(ls), len(keys))
	}
	order, tokens := "asked", "own"
	for i, l := range ls {
		if l.key != keys[i] {
			order = "other"
		}
		info := a.call("inspect", map[string]any{"client": admin, "key": l.key})
		if info.err() != "ok" || info.str("session") != idb || info.num("token") != l.token {
			tokens = fmt.Sprintf("mismatch(%s: %v)", l.key, map[string]any(info))
		}
	}
	if ls[2].token <= lb.num("token") {
		tokens = "b-not-greater"
	}
	out = append(out, fmt.Sprintf("grants=%d order=%s tokens=%s", len(ls), order, tokens))
	for _, l := range ls {
		a.must("release", map[string]any{"lock": l.lock})
	}
	out = append(out, "after-release="+held())
	out = append(out, "opposite-orders="+agentOppositeOrders(t, a, addr))
	return strings.Join(out, " ")
}

// agentOppositeOrders is oppositeOrders through the agent: two sessions
// take {x, y, z} in opposite orders and release it, 5 rounds each, at once.
func agentOppositeOrders(t *testing.T, a *agent, addr string) string {
	sets := [][]string{{"acquire-all/x", "acquire-all/y", "acquire-all/z"}, {"acquire-all/z", "acquire-all/y", "acquire-all/x"}}
	// A round's outcome: "ok", an error name of the agent, or err when a
	// request could not be written (the test's goroutine fails the test).
	type result struct {
		outcome string
		err     error
	}
	done := make(chan result, len(sets))
	for _, set := range sets {
		s, _ := a.session(addr, nil)
		go func() { // ends after its rounds, on an error, or when a reply is overdue
			// call is a.call that reports a failed write instead of failing
			// the test (t.Fatal is for the test's goroutine only).
			call := func(op string, args map[string]any) (reply, error) {
				_, ch, err := a.send(op, args)
				if err != nil {
					return nil, err
				}
				if r, ok := awaitWithin(ch, 30*time.Second); ok {
					return r, nil
				}
				return reply{"error": "no-reply(" + op + ")"}, nil
			}
			for range 5 {
				r, err := call("acquire_all", map[string]any{"session": s, "keys": set})
				if err != nil || r.err() != "ok" {
					done <- result{r.err(), err}
					return
				}
				for _, l := range agentLocks(r) {
					if r, err := call("release", map[string]any{"lock": l.lock}); err != nil || r.err() != "ok" {
						done <- result{r.err(), err}
						return
					}
				}
			}
			done <- result{outcome: "ok"}
		}()
	}
	var errs []string
	for range sets {
		var r result
		select {
		case r = <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("both sessions' rounds: not done within 60 s")
		}
		if r.err != nil {
			t.Fatalf("opposite orders: %v", r.err)
		}
		if r.outcome != "ok" {
			errs = append(errs, r.outcome)
		}
	}
	if len(errs) > 0 {
		slices.Sort(errs)
		return "failed(" + strings.Join(errs, ",") + ")"
	}
	return "no-deadlock"
}

// agentDeadlock3 is deadlock3Row through an agent's acquire op: three
// sessions S0..S2, each holding k<i> and waiting for k<i+1 mod 3>; S2's
// wait closes the cycle and is refused, S1 then S0 are granted as the
// cycle unwinds from S2's release.
func agentDeadlock3(t *testing.T, a *agent, addr string) string {
	return agentDeadlockCycle(t, a, []string{addr, addr, addr}, "deadlock3")
}

// agentDeadlockCycle is deadlockCycle through an agent: session i opened
// on a client of addrs[i] alone.
func agentDeadlockCycle(t *testing.T, a *agent, addrs []string, prefix string) string {
	n := len(addrs)
	admin := a.must("client", map[string]any{"addresses": []string{addrs[0]}}).str("client")
	keys := make([]string, n)
	ss := make([]string, n)
	held := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("%s/k%d", prefix, i)
		ss[i], _ = a.session(addrs[i], nil)
		held[i] = a.must("acquire", map[string]any{"session": ss[i], "key": keys[i]}).str("lock")
	}
	chans := make([]<-chan reply, n)
	for i := range n {
		_, chans[i] = a.start("acquire", map[string]any{"session": ss[i], "key": keys[(i+1)%n]})
		if i < n-1 {
			waitQueuedAgent(t, a, admin, keys[(i+1)%n], 1)
		}
	}
	victim := n - 1
	r, ok := awaitWithin(chans[victim], 15*time.Second)
	if !ok {
		t.Fatal("no wait refused within 15 s")
	}
	if r.err() != "ErrDeadlock" {
		t.Fatalf("S%d (the closing wait): %s %s; want ErrDeadlock", victim, r.err(), r.str("message"))
	}
	got := strings.ReplaceAll(strings.Join(r.list("keys"), ","), prefix+"/", "")
	for i := range n - 1 {
		select {
		case o := <-chans[i]:
			t.Errorf("S%d's wait returned beside the victim: %s", i, o.err())
			return fmt.Sprintf("refused=closing(S%d) keys=[%s] others=S%d-returned(%s)", victim, got, i, o.err())
		default:
		}
	}
	a.must("release", map[string]any{"lock": held[victim]})
	var unwound []string
	for j := victim - 1; j >= 0; j-- {
		o := a.await(chans[j], fmt.Sprintf("S%d's grant", j))
		if o.err() != "ok" {
			unwound = append(unwound, fmt.Sprintf("S%d:error(%s)", j, o.err()))
			t.Errorf("S%d: %s %s", j, o.err(), o.str("message"))
			continue
		}
		unwound = append(unwound, fmt.Sprintf("S%d", j))
		a.must("release", map[string]any{"lock": o.str("lock")})
		a.must("release", map[string]any{"lock": held[j]})
	}
	return fmt.Sprintf("refused=closing(S%d) keys=[%s] others=waiting unwound=%s", victim, got, strings.Join(unwound, ","))
}

// agentDeadlockReplicas is deadlockReplicas through an agent.
func agentDeadlockReplicas(t *testing.T, a *agent, e *replicaEnv) string {
	rs := e.replicas(t, 2)
	var out []string
	for round, closer := range []int{1, 0} {
		o := agentDeadlockCycle(t, a, []string{rs[1-closer].addr, rs[closer].addr}, fmt.Sprintf("deadlock-replicas/%d", round))
		out = append(out, fmt.Sprintf("closing-on-r%d:%s", closer, o))
	}
	return strings.Join(out, " ")
}

// agentDeadlockKnot is deadlockKnotRow through an agent's acquire op (a
// semaphore is acquire with a limit): T1 and T2 hold both slots of s and
// each waits for x, which W holds; W's wait for a slot is refused naming s
// and x, T1's and T2's keep waiting and get x in turn once W releases it.
func agentDeadlockKnot(t *testing.T, a *agent, addr string) string {
	const sem, x = "deadlock-knot/s", "deadlock-knot/x"
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	t1, _ := a.session(addr, nil)
	t2, _ := a.session(addr, nil)
	w, _ := a.session(addr, nil)
	s1 := a.must("acquire", map[string]any{"session": t1, "key": sem, "limit": 2}).str("lock")
	s2 := a.must("acquire", map[string]any{"session": t2, "key": sem, "limit": 2}).str("lock")
	lx := a.must("acquire", map[string]any{"session": w, "key": x}).str("lock")
	_, c1 := a.start("acquire", map[string]any{"session": t1, "key": x})
	waitQueuedAgent(t, a, admin, x, 1)
	_, c2 := a.start("acquire", map[string]any{"session": t2, "key": x})
	waitQueuedAgent(t, a, admin, x, 2)
	_, cw := a.start("acquire", map[string]any{"session": w, "key": sem, "limit": 2})
	r, ok := awaitWithin(cw, 15*time.Second)
	if !ok {
		t.Fatal("W's semaphore wait not refused within 15 s")
	}
	if r.err() != "ErrDeadlock" {
		t.Fatalf("W: %s %s; want ErrDeadlock", r.err(), r.str("message"))
	}
	keys := strings.NewReplacer(sem, "s", x, "x").Replace(strings.Join(r.list("keys"), ","))
	holders := "waiting"
	select {
	case o := <-c1:
		holders = fmt.Sprintf("returned(T1: %s)", o.err())
	case o := <-c2:
		holders = fmt.Sprintf("returned(T2: %s)", o.err())
	default:
	}
	a.must("release", map[string]any{"lock": lx})
	var unwound []string
	for _, c := range []struct {
		name string
		ch   <-chan reply
	}{{"T1", c1}, {"T2", c2}} {
		if holders != "waiting" {
			break
		}
		o := a.await(c.ch, c.name+"'s grant of "+x)
		if o.err() != "ok" {
			unwound = append(unwound, c.name+"="+o.err())
			break
		}
		unwound = append(unwound, c.name)
		a.must("release", map[string]any{"lock": o.str("lock")})
	}
	a.must("release", map[string]any{"lock": s1})
	a.must("release", map[string]any{"lock": s2})
	return fmt.Sprintf("refused=W keys=[%s] holders=%s unwound=%s", keys, holders, strings.Join(unwound, ","))
}
