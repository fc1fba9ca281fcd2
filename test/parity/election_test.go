package parity

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/client"
)

// Rows of issue #15: holder identity (§1) and leader election (§2).

// holderIdentity: the owner, labels and value of a holder reach another
// client through Inspect, List and a Watch with holders; SetValue keeps the
// token and is a value event.
func holderIdentity(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const key = "holder-id/k"
	reader := newClient(t, e.shared.addr)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := reader.Watch(wctx, "holder-id/", client.WithHolders())
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	labels := map[string]string{"job": "deploy/api"}
	s := newSession(t, ctx, newClient(t, e.shared.addr), client.WithOwner("web-3", labels))
	l, err := s.Acquire(ctx, key, client.WithValue([]byte("v1")))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "wrong"
	}
	var out []string
	info, err := reader.Inspect(ctx, key)
	out = append(out, "inspect="+ok(err == nil && info.Owner == "web-3" && maps.Equal(info.Labels, labels) && bytes.Equal(info.Value, []byte("v1"))))
	page, _, err := reader.List(ctx, "holder-id/", client.ListOptions{})
	out = append(out, "list="+ok(err == nil && len(page) == 1 && page[0].Owner == "web-3" && bytes.Equal(page[0].Value, []byte("v1"))))
	if err := l.SetValue(ctx, []byte("v2")); err != nil {
		t.Fatalf("SetValue: %v", err)
	}
	info, err = reader.Inspect(ctx, key)
	out = append(out, "set-value="+ok(err == nil && info.Token == l.Token() && bytes.Equal(info.Value, []byte("v2"))))
	var acquired, valued bool
	for !valued {
		ev := awaitEvent(t, events)
		switch {
		case ev.Kind == client.EventAcquired && ev.Owner == "web-3" && maps.Equal(ev.Labels, labels):
			acquired = true
		case ev.Kind == client.EventValue && ev.Token == l.Token() && bytes.Equal(ev.Value, []byte("v2")):
			valued = true
		}
	}
	out = append(out, "watch=acquired(owner):"+ok(acquired)+",value(v2):"+ok(valued))
	return strings.Join(out, " ")
}

func awaitEvent(t *testing.T, events <-chan client.Event) client.Event {
	t.Helper()
	select {
	case ev, open := <-events:
		if !open || ev.Err != nil {
			t.Fatalf("watch ended: %v", ev.Err)
		}
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no watch event within 20s")
	}
	return client.Event{}
}

// election: three candidates in FIFO order; Observe reports no leader, each
// leader with its value (Proclaim included, same token), and no leader at
// the end. "No leader" between two leaders depends on the timing of the
// hand-over, so the row lists the leaders and the first and last states.
func election(t *testing.T, e *env) string {
	ctx := testCtx(t)
	const name = "election/e"
	observer := newClient(t, e.shared.addr)
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	obs, err := observer.Observe(octx, name)
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	var seen []string
	next := func() client.Observation {
		t.Helper()
		select {
		case o, open := <-obs:
			if !open || o.Err != nil {
				t.Fatalf("observe ended after %v: %v", seen, o.Err)
			}
			return o
		case <-time.After(20 * time.Second):
			t.Fatalf("no observation within 20s after %v", seen)
		}
		return client.Observation{}
	}
	// until records observations until one is want (owner:value, or none).
	until := func(want string) {
		t.Helper()
		for {
			o := next()
			s := "none"
			if o.Leader {
				if len(o.Value) == 0 {
					continue // the grant before its value is set
				}
				s = fmt.Sprintf("%s:%s", o.Owner, o.Value)
			}
			if len(seen) == 0 || seen[len(seen)-1] != s {
				seen = append(seen, s)
			}
			if s == want {
				return
			}
		}
	}
	until("none")
	var leads []*client.Leadership
	got := make(chan *client.Leadership, 3)
	for i, who := range []string{"A", "B", "C"} {
		s := newSession(t, ctx, newClient(t, e.shared.addr), client.WithOwner(who, nil))
		go func() {
			l, err := s.Campaign(ctx, name, []byte(strings.ToLower(who)+"1"))
			if err != nil {
				t.Errorf("%s Campaign: %v", who, err)
			}
			got <- l
		}()
		if i == 0 {
			leads = append(leads, <-got)
			continue
		}
		waitQueued(t, ctx, observer, name, i)
	}
	until("A:a1")
	token := leads[0].Token()
	if err := leads[0].Proclaim(ctx, []byte("a2")); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	until("A:a2")
	same := leads[0].Token() == token
	for i := range 2 {
		if err := leads[i].Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		l := <-got
		if l == nil {
			t.FailNow()
		}
		leads = append(leads, l)
		until(fmt.Sprintf("%s:%s1", []string{"B", "C"}[i], []string{"b", "c"}[i]))
	}
	if err := leads[2].Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	until("none")
	inc := "increasing"
	for i := 1; i < len(leads); i++ {
		if leads[i].Token() <= leads[i-1].Token() {
			inc = "not-increasing"
		}
	}
	var leaders []string
	for _, s := range seen {
		if s != "none" {
			leaders = append(leaders, s)
		}
	}
	return fmt.Sprintf("first=%s leaders=%s last=%s proclaim-token=%v tokens=%s",
		seen[0], strings.Join(leaders, ","), seen[len(seen)-1], map[bool]string{true: "same", false: "changed"}[same], inc)
}
