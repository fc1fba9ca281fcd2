package parity

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// More scenarios through an SDK agent: a SIGKILLed holder process,
// semaphores and read/write locks (the Go SDK's versions: scenarios_test.go
// clientSigkill, multi_test.go semaphore and sharedLock).

// multiHoldersOf is multi_test.go's multiHolders for an agent's inspect
// reply: "holders=[K A] limit=2 waiters=[C D]".
func multiHoldersOf(r reply, names map[string]string) string {
	if r.err() != "ok" {
		return "error(" + r.err() + ")"
	}
	if held, _ := r["held"].(bool); !held {
		return "free"
	}
	label := func(id string) string {
		if n, ok := names[id]; ok {
			return n
		}
		return "other"
	}
	var hs, ws []string
	xs, _ := r["holders"].([]any)
	for _, x := range xs {
		h, _ := x.(map[string]any)
		s := label(reply(h).str("session"))
		if m := reply(h).str("mode"); m != "" {
			s += ":" + m
		}
		hs = append(hs, s)
	}
	for _, w := range r.list("waiters") {
		ws = append(ws, label(w))
	}
	return fmt.Sprintf("holders=[%s] limit=%d waiters=[%s]", strings.Join(hs, " "), r.num("limit"), strings.Join(ws, " "))
}

// firstOf waits for the first reply among the named channels and removes
// that channel.
func firstOf(t *testing.T, chs map[string]<-chan reply, what string) (string, reply) {
	t.Helper()
	var whos []string
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(time.After(scenarioTimeout))}}
	for who, ch := range chs {
		whos = append(whos, who)
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	i, v, _ := reflect.Select(cases)
	if i == 0 {
		t.Fatalf("no %s within %v", what, scenarioTimeout)
	}
	delete(chs, whos[i-1])
	return whos[i-1], v.Interface().(reply)
}

func agentClientSigkill(t *testing.T, a *agent, addr string) string {
	const key = "client-sigkill/k"
	holder := startPythonAgent(t) // the process killed
	// Its session dies with it: the suite's ttl, which the waiter's bound counts on.
	hs, hid := holder.session(addr, map[string]any{"ttl": ttl.Seconds()})
	ht := holder.must("acquire", map[string]any{"session": hs, "key": key}).num("token")
	w, _ := a.session(addr, nil)
	c := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	_, granted := a.start("acquire", map[string]any{"session": w, "key": key})
	waitQueuedAgent(t, a, c, key, 1)
	if r := a.call("inspect", map[string]any{"client": c, "key": key}); r.str("session") != hid {
		t.Fatalf("inspect = %v; want held by the holder process's session %s", map[string]any(r), hid)
	}
	killedAt := time.Now()
	holder.kill()
	g := a.await(granted, "the waiter's grant after SIGKILL of the holder")
	if g.err() != "ok" {
		t.Fatalf("waiter acquire: %s", g.err())
	}
	took := g.at().Sub(killedAt)
	within := took <= ttl+slack
	if !within {
		t.Errorf("waiter granted %v after the kill; want within TTL %v + %v", took, ttl, slack)
	}
	t.Logf("waiter granted %v after SIGKILL of the Python holder", took.Round(time.Millisecond))
	return fmt.Sprintf("waiter=ok within-ttl+slack=%v token=%s", within, order(ht, g.num("token")))
}

func agentSemaphore(t *testing.T, a *agent, addr string) string {
	const key = "semaphore/k"
	child := startPythonAgent(t) // K, killed below
	// K's session dies with its process: the suite's ttl, which the bound after the kill counts on.
	ks, kid := child.session(addr, map[string]any{"ttl": ttl.Seconds()})
	kt := child.must("acquire", map[string]any{"session": ks, "key": key, "limit": 2}).num("token")
	c := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	names := map[string]string{kid: "K"}
	sess := map[string]string{}
	for _, who := range []string{"A", "C", "D", "E", "F"} {
		s, id := a.session(addr, nil)
		names[id], sess[who] = who, s
	}
	inspect := func() string {
		return multiHoldersOf(a.call("inspect", map[string]any{"client": c, "key": key}), names)
	}
	mismatch := func(args map[string]any) string {
		args["session"], args["key"], args["timeout"] = sess["F"], key, 5
		r := a.call("acquire", args)
		if r.err() == "ok" {
			a.must("release", map[string]any{"lock": r.str("lock")})
		}
		return r.err()
	}
	la := a.must("acquire", map[string]any{"session": sess["A"], "key": key, "limit": 2})
	out := []string{inspect()}
	out = append(out, "try(E)="+a.call("try_acquire", map[string]any{"session": sess["E"], "key": key, "limit": 2}).err())
	waits := map[string]<-chan reply{}
	for i, who := range []string{"C", "D"} {
		_, waits[who] = a.start("acquire", map[string]any{"session": sess[who], "key": key, "limit": 2})
		waitQueuedAgent(t, a, c, key, i+1)
	}
	out = append(out, "mismatch(limit=3)="+mismatch(map[string]any{"limit": 3}),
		"mismatch(plain)="+mismatch(map[string]any{}),
		"mismatch(shared)="+mismatch(map[string]any{"mode": "shared"}))
	out = append(out, inspect())
	a.must("release", map[string]any{"lock": la.str("lock")})
	who, g := firstOf(t, waits, "the first waiter's slot after a release")
	if g.err() != "ok" {
		t.Fatalf("waiter %s: %s", who, g.err())
	}
	first := g
	waitQueuedAgent(t, a, c, key, 1)
	out = append(out, "release(A)->"+who)
	killedAt := time.Now()
	child.kill()
	who, g = firstOf(t, waits, "the second waiter's slot after SIGKILL of a holder")
	if g.err() != "ok" {
		t.Fatalf("waiter %s: %s", who, g.err())
	}
	second := g
	took := g.at().Sub(killedAt)
	within := took <= ttl+slack
	if !within {
		t.Errorf("waiter granted %v after the kill; want within TTL %v + %v", took, ttl, slack)
	}
	out = append(out, fmt.Sprintf("kill(K)->%s within-ttl+slack=%v", who, within), inspect())
	tokens := "increasing"
	at, ft, st := la.num("token"), first.num("token"), second.num("token")
	if kt == at || max(kt, at) >= ft || ft >= st {
		tokens = fmt.Sprintf("K=%d,A=%d,%d,%d", kt, at, ft, st)
	}
	out = append(out, "tokens="+tokens)
	for _, l := range []reply{first, second} {
		a.must("release", map[string]any{"lock": l.str("lock")})
	}
	return strings.Join(append(out, "end="+inspect()), " ")
}

func agentSharedLock(t *testing.T, a *agent, addr string) string {
	const key = "rwlock/k"
	c := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	names, sess := map[string]string{}, map[string]string{}
	for _, who := range []string{"R1", "R2", "W", "R3", "R4", "F"} {
		s, id := a.session(addr, nil)
		names[id], sess[who] = who, s
	}
	inspect := func() string {
		return multiHoldersOf(a.call("inspect", map[string]any{"client": c, "key": key}), names)
	}
	mismatch := func(args map[string]any) string {
		args["session"], args["key"], args["timeout"] = sess["F"], key, 5
		r := a.call("acquire", args)
		if r.err() == "ok" {
			a.must("release", map[string]any{"lock": r.str("lock")})
		}
		return r.err()
	}
	var readers []reply
	for _, who := range []string{"R1", "R2"} {
		readers = append(readers, a.must("acquire", map[string]any{"session": sess[who], "key": key, "mode": "shared"}))
	}
	out := []string{inspect()}
	waits := map[string]<-chan reply{}
	for i, w := range []struct{ who, mode string }{{"W", "exclusive"}, {"R3", "shared"}} {
		_, waits[w.who] = a.start("acquire", map[string]any{"session": sess[w.who], "key": key, "mode": w.mode})
		waitQueuedAgent(t, a, c, key, i+1)
	}
	out = append(out, "try-shared(R4)="+a.call("try_acquire", map[string]any{"session": sess["R4"], "key": key, "mode": "shared"}).err(),
		"mismatch(plain)="+mismatch(map[string]any{}),
		"mismatch(limit=2)="+mismatch(map[string]any{"limit": 2}))
	out = append(out, inspect())
	a.must("release", map[string]any{"lock": readers[0].str("lock")})
	out = append(out, "release(R1):"+inspect())
	a.must("release", map[string]any{"lock": readers[1].str("lock")})
	who, writer := firstOf(t, waits, "a grant after the last reader's release")
	if writer.err() != "ok" {
		t.Fatalf("%s: %s", who, writer.err())
	}
	out = append(out, "release(R2)->"+who+":"+inspect())
	a.must("release", map[string]any{"lock": writer.str("lock")})
	who, later := firstOf(t, waits, "a grant after the writer's release")
	if later.err() != "ok" {
		t.Fatalf("%s: %s", who, later.err())
	}
	out = append(out, "release(W)->"+who)
	tokens := "readers<writer<reader"
	rt := []uint64{readers[0].num("token"), readers[1].num("token")}
	if rt[0] == rt[1] || slices.Max(rt) >= writer.num("token") || writer.num("token") >= later.num("token") {
		tokens = fmt.Sprintf("R1=%d,R2=%d,%d,%d", rt[0], rt[1], writer.num("token"), later.num("token"))
	}
	out = append(out, "tokens="+tokens)
	a.must("release", map[string]any{"lock": later.str("lock")})
	return strings.Join(append(out, "end="+inspect()), " ")
}

// agentLockdSigkill is scenarios_test.go's lockdSigkill with the holder and
// the waiter in the agent: lockd dies while the holder holds two locks; a
// waiter on a new lockd gets both within TTL + slack, and the holder's SDK
// stopped trusting each lock before the waiter's grant (the agent wrote the
// holder's lost notice before the waiter's grant reply).
func agentLockdSigkill(t *testing.T, a *agent, e *env) string {
	keys := []string{"lockd-sigkill/a", "lockd-sigkill/b"}
	first := e.fresh(t)
	// The holder's session dies with its lockd: the suite's ttl, which the waiter's bound counts on.
	h, _ := a.session(first.addr, map[string]any{"ttl": ttl.Seconds()})
	held := map[string]reply{}
	for _, k := range keys {
		held[k] = a.must("acquire", map[string]any{"session": h, "key": k})
	}
	killedAt := time.Now()
	first.kill(t)
	second := first.restart(t, e.bins)
	readyAfter := time.Since(killedAt)
	w, _ := a.session(second.addr, nil)
	waits := map[string]<-chan reply{}
	for _, k := range keys {
		_, waits[k] = a.start("acquire", map[string]any{"session": w, "key": k})
	}
	var results []string
	firstOK, greater, within := true, true, true
	for range keys {
		k, g := firstOf(t, waits, "a waiter's grant on the new lockd")
		results = append(results, g.err())
		if g.err() != "ok" {
			t.Errorf("waiter acquire(%s) on the new lockd: %s", k, g.err())
			continue
		}
		lost := a.event("the old holder's loss of "+k, func(r reply) bool {
			return r.str("event") == "lost" && r.str("lock") == held[k].str("lock")
		})
		if lost.seq() > g.seq() {
			firstOK = false
			t.Errorf("%s granted to the waiter while the killed lockd's client still trusted it", k)
		}
		if g.num("token") <= held[k].num("token") {
			greater = false
		}
		if took := g.at().Sub(killedAt); took > readyAfter+ttl+slack {
			within = false
			t.Errorf("%s granted %v after the kill (new lockd ready after %v)", k, took, readyAfter)
		}
	}
	tokens := "greater"
	if !greater {
		tokens = "not-greater"
	}
	holderErr := a.must("session_state", map[string]any{"session": h}).str("error")
	return fmt.Sprintf("waiters-on-new-lockd=%s within-ttl+slack=%v holder-trust-ended-first=%v holder-err=%s tokens=%s",
		strings.Join(results, ","), within, firstOK, holderErr, tokens)
}
