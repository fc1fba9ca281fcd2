package parity

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
)

// Watch scenarios through an SDK agent (the Go SDK's versions:
// scenarios_test.go watchOrder, election_test.go holderIdentity,
// delay_test.go maxHoldRow).

// watchEvent waits for the next event of watch w.
func watchEvent(a *agent, w, what string) reply {
	a.t.Helper()
	r := a.event(what, func(r reply) bool { return r.str("event") == "watch" && r.str("watch") == w })
	if e := r.str("error"); e != "" {
		a.t.Fatalf("watch broke (%s): %s", what, e)
	}
	return r
}

func agentWatchOrder(t *testing.T, a *agent, addr string) string {
	const prefix, key, end = "watch/", "watch/k", "watch/zz-end"
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	sa, ida := a.session(addr, nil)
	sb, idb := a.session(addr, nil)
	sc, idc := a.session(addr, nil)
	names := map[string]string{ida: "A", idb: "B", idc: "C"}
	w := a.must("watch", map[string]any{"client": admin, "prefix": prefix}).str("watch")
	la := a.must("acquire", map[string]any{"session": sa, "key": key})
	_, granted := a.start("acquire", map[string]any{"session": sb, "key": key})
	waitQueuedAgent(t, a, admin, key, 1)
	a.must("release", map[string]any{"lock": la.str("lock")})
	lb := a.await(granted, "B's grant")
	if lb.err() != "ok" {
		t.Fatalf("B acquire: %s", lb.err())
	}
	a.must("revoke", map[string]any{"client": admin, "key": key})
	lc := a.must("acquire", map[string]any{"session": sc, "key": key})
	a.must("close_session", map[string]any{"session": sc})
	lend := a.must("acquire", map[string]any{"session": sa, "key": end})
	want := []uint64{la.num("token"), la.num("token"), lb.num("token"), lb.num("token"), lc.num("token"),
		lc.num("token"), lend.num("token")}
	var seen []string
	var tokens []uint64
	for {
		ev := watchEvent(a, w, fmt.Sprintf("watch event after %v", seen))
		label := names[ev.str("session")]
		if label == "" {
			label = "other"
		}
		if ev.str("key") == end {
			label += ":end"
		}
		seen = append(seen, fmt.Sprintf("%s(%s)", ev.str("kind"), label))
		tokens = append(tokens, ev.num("token"))
		if ev.str("key") == end || len(seen) > 20 {
			break
		}
	}
	match := "match"
	if fmt.Sprint(tokens) != fmt.Sprint(want) {
		match = fmt.Sprint(tokens)
	}
	a.must("stop_watch", map[string]any{"watch": w})
	return "events=" + strings.Join(seen, ",") + " tokens=" + match
}

func labelsOf(r reply) map[string]string {
	out := map[string]string{}
	m, _ := r["labels"].(map[string]any)
	for k, v := range m {
		out[k], _ = v.(string)
	}
	return out
}

func agentHolderIdentity(t *testing.T, a *agent, addr string) string {
	const key = "holder-id/k"
	reader := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	w := a.must("watch", map[string]any{"client": reader, "prefix": "holder-id/", "holders": true}).str("watch")
	labels := map[string]string{"job": "deploy/api"}
	s, _ := a.session(addr, map[string]any{"owner": "web-3", "labels": labels})
	l := a.must("acquire", map[string]any{"session": s, "key": key, "value": "v1"})
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "wrong"
	}
	var out []string
	i := a.call("inspect", map[string]any{"client": reader, "key": key})
	out = append(out, "inspect="+ok(i.err() == "ok" && i.str("owner") == "web-3" && maps.Equal(labelsOf(i), labels) && i.str("value") == "v1"))
	page := a.call("list", map[string]any{"client": reader, "prefix": "holder-id/"})
	locks, _ := page["locks"].([]any)
	first := reply{}
	if len(locks) == 1 {
		m, _ := locks[0].(map[string]any)
		first = reply(m)
	}
	out = append(out, "list="+ok(page.err() == "ok" && len(locks) == 1 && first.str("owner") == "web-3" && first.str("value") == "v1"))
	a.must("set_value", map[string]any{"lock": l.str("lock"), "value": "v2"})
	i = a.call("inspect", map[string]any{"client": reader, "key": key})
	out = append(out, "set-value="+ok(i.err() == "ok" && i.num("token") == l.num("token") && i.str("value") == "v2"))
	var acquired, valued bool
	for !valued {
		ev := watchEvent(a, w, "acquired and value events")
		switch {
		case ev.str("kind") == "acquired" && ev.str("owner") == "web-3" && maps.Equal(labelsOf(ev), labels):
			acquired = true
		case ev.str("kind") == "value" && ev.num("token") == l.num("token") && ev.str("value") == "v2":
			valued = true
		}
	}
	a.must("stop_watch", map[string]any{"watch": w})
	return strings.Join(append(out, "watch=acquired(owner):"+ok(acquired)+",value(v2):"+ok(valued)), " ")
}

func agentMaxHold(t *testing.T, a *agent, addr string) string {
	const key = "maxhold/k"
	const hold = time.Second
	watcher := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	w := a.must("watch", map[string]any{"client": watcher, "prefix": "maxhold/"}).str("watch")
	s, _ := a.session(addr, nil)
	start := time.Now()
	l := a.must("acquire", map[string]any{"session": s, "key": key, "max_hold": hold.Seconds()})
	lost := a.event("the lock's loss to its maximum hold", func(r reply) bool {
		return r.str("event") == "lost" && r.str("lock") == l.str("lock")
	})
	var out []string
	if took := lost.at().Sub(start); lost.str("error") == "ErrMaxHold" && took >= hold {
		out = append(out, "lost=max_hold")
	} else {
		out = append(out, fmt.Sprintf("lost=%s(after %v)", lost.str("error"), took))
	}
	for {
		ev := watchEvent(a, w, "the grant's end")
		if ev.num("token") == l.num("token") && ev.str("kind") != "acquired" {
			out = append(out, "watch="+ev.str("kind"))
			break
		}
	}
	l2 := a.must("try_acquire", map[string]any{"session": s, "key": key})
	a.must("stop_watch", map[string]any{"watch": w})
	return strings.Join(append(out, fmt.Sprintf("same-session-again=granted token-higher=%v", l2.num("token") > l.num("token"))), " ")
}

// agentOutcome is delay_test.go's outcome for an agent reply.
func agentOutcome(r reply) string {
	switch r.err() {
	case "ok":
		return "granted"
	case "ErrLocked":
		return "locked"
	}
	return "error(" + r.err() + ")"
}

func agentLockDelay(t *testing.T, a *agent, addr string) string {
	const key = "delay/k"
	admin := a.must("client", map[string]any{"addresses": []string{addr}}).str("client")
	sa, _ := a.session(addr, nil)
	sb, _ := a.session(addr, nil)
	sc, _ := a.session(addr, nil)
	delay := parityDelay.Seconds()
	var out []string
	la := a.must("acquire", map[string]any{"session": sa, "key": key, "lock_delay": delay})
	i := a.must("inspect", map[string]any{"client": admin, "key": key})
	d, _ := i["lock_delay"].(json.Number)
	secs, _ := d.Float64()
	out = append(out, "inspect="+time.Duration(secs*float64(time.Second)).String())
	a.must("release", map[string]any{"lock": la.str("lock")})
	lb := a.call("try_acquire", map[string]any{"session": sb, "key": key, "lock_delay": delay})
	out = append(out, "after-release="+agentOutcome(lb))
	if lb.err() != "ok" {
		t.Fatalf("try_acquire after the release: %s", lb.err())
	}
	revoked := time.Now()
	a.must("revoke", map[string]any{"client": admin, "key": key})
	a.event("the revoked lock's loss", func(r reply) bool { return r.str("event") == "lost" && r.str("lock") == lb.str("lock") })
	out = append(out, "after-revoke="+agentOutcome(a.call("try_acquire", map[string]any{"session": sc, "key": key})))
	i = a.call("inspect", map[string]any{"client": admin, "key": key})
	held, _ := i["held"].(bool)
	left, _ := i["delay_remaining"].(json.Number)
	lf, _ := left.Float64()
	out = append(out, fmt.Sprintf("inspect-free=delay-left:%v", i.err() == "ok" && !held && lf > 0))
	lc := a.must("acquire", map[string]any{"session": sc, "key": key})
	waited := "waited-delay"
	if el := time.Since(revoked); el < parityDelay {
		waited = fmt.Sprintf("early(%v)", el)
	}
	out = append(out, "wait="+waited)
	if lc.num("token") > lb.num("token") && lb.num("token") > la.num("token") {
		out = append(out, "tokens=increasing")
	} else {
		out = append(out, fmt.Sprintf("tokens=%d,%d,%d", la.num("token"), lb.num("token"), lc.num("token")))
	}
	return strings.Join(out, " ")
}
