package storetest

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
)

// listSessions lists every page of st's sessions matching q (q.Limit per
// page) and checks the pages are in strictly increasing id order.
func listSessions(t *testing.T, st store.LockStore, q store.SessionQuery) []store.SessionInfo {
	t.Helper()
	var all []store.SessionInfo
	for pages := 0; ; pages++ {
		page, err := st.ListSessions(ctxT(t), q)
		if err != nil {
			t.Fatalf("ListSessions(%+v): %v", q, err)
		}
		all = append(all, page...)
		if q.Limit == 0 || len(page) < q.Limit {
			break
		}
		if pages > 100 {
			t.Fatalf("ListSessions(%+v): more than 100 pages", q)
		}
		q.After = page[len(page)-1].ID
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].ID >= all[i].ID {
			t.Fatalf("ListSessions(%+v): ids out of order: %q then %q", q, all[i-1].ID, all[i].ID)
		}
	}
	return all
}

func sessionIDsOf(infos []store.SessionInfo) []store.SessionID {
	var ids []store.SessionID
	for _, in := range infos {
		ids = append(ids, in.ID)
	}
	return ids
}

// testListSessions checks C2 #ct2-list-sessions: live sessions in id order
// with their principal, owner, labels, TTL, a Remaining within the TTL and
// their lock count; paging, the principal filter, closed and expired
// sessions gone, bad input refused; every instance lists the sessions
// opened through any instance.
func (s *suite) testListSessions(t *testing.T) {
	sts := s.instances(t, 2)
	st, other := sts[0], sts[1]
	ctx := ctxT(t)
	labels := map[string]string{"env": "test"}
	open := func(opts ...store.SessionOption) store.Session {
		t.Helper()
		sess, err := st.OpenSession(ctx, LongTTL, opts...)
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		return sess
	}
	a := open(store.WithPrincipal("alice"), store.WithOwner("svc-a", labels))
	b := open(store.WithPrincipal("bob"))
	c := open()
	mustTry(t, st, a.ID, "ls/1")
	mustTry(t, st, a.ID, "ls/2")
	mustTry(t, st, c.ID, "ls/3")
	want := []store.SessionID{a.ID, b.ID, c.ID}
	slices.Sort(want)

	all := listSessions(t, st, store.SessionQuery{})
	if got := sessionIDsOf(all); !slices.Equal(got, want) {
		t.Fatalf("ListSessions = %v; want %v", got, want)
	}
	for _, in := range all {
		if in.Remaining <= 0 || in.Remaining > in.TTL {
			t.Errorf("ListSessions: %s Remaining %v; want in (0, TTL %v]", in.ID, in.Remaining, in.TTL)
		}
		switch in.ID {
		case a.ID:
			if in.Principal != "alice" || in.Owner != "svc-a" || !maps.Equal(in.Labels, labels) || in.TTL != a.TTL || in.Locks != 2 {
				t.Errorf("ListSessions: %+v; want principal alice, owner svc-a, labels %v, TTL %v, 2 locks", in, labels, a.TTL)
			}
		case b.ID:
			if in.Principal != "bob" || in.Owner != "" || len(in.Labels) != 0 || in.Locks != 0 {
				t.Errorf("ListSessions: %+v; want principal bob, no owner or labels, 0 locks", in)
			}
		case c.ID:
			if in.Principal != "" || in.Locks != 1 {
				t.Errorf("ListSessions: %+v; want no principal, 1 lock", in)
			}
		}
	}
	if got := sessionIDsOf(listSessions(t, st, store.SessionQuery{Limit: 1})); !slices.Equal(got, want) {
		t.Errorf("ListSessions by pages of 1 = %v; want %v", got, want)
	}
	if got := sessionIDsOf(listSessions(t, st, store.SessionQuery{Principal: "alice", ByPrincipal: true})); !slices.Equal(got, []store.SessionID{a.ID}) {
		t.Errorf("ListSessions(principal alice) = %v; want [%s]", got, a.ID)
	}
	if got := sessionIDsOf(listSessions(t, st, store.SessionQuery{ByPrincipal: true})); !slices.Equal(got, []store.SessionID{c.ID}) {
		t.Errorf("ListSessions(no principal) = %v; want [%s]", got, c.ID)
	}
	// Every instance lists every session, whichever instance opened it
	// (so every replica answers the same), with the backend's lock counts:
	// a session opened and locked through the other instance is listed by
	// both, and the other instance lists this instance's sessions.
	d, err := other.OpenSession(ctx, LongTTL, store.WithPrincipal("dave"), store.WithOwner("svc-d", nil))
	if err != nil {
		t.Fatalf("OpenSession on another instance: %v", err)
	}
	mustTry(t, other, d.ID, "ls/4")
	wantAll := append(slices.Clone(want), d.ID)
	slices.Sort(wantAll)
	for i, inst := range []store.LockStore{st, other} {
		got := listSessions(t, inst, store.SessionQuery{})
		if ids := sessionIDsOf(got); !slices.Equal(ids, wantAll) {
			t.Errorf("ListSessions on instance %d = %v; want %v (sessions opened through either instance)", i, ids, wantAll)
			continue
		}
		for _, in := range got {
			wantLocks := map[store.SessionID]int{a.ID: 2, b.ID: 0, c.ID: 1, d.ID: 1}[in.ID]
			if in.Locks != wantLocks || in.Remaining <= 0 || in.Remaining > in.TTL {
				t.Errorf("ListSessions on instance %d: %+v; want %d locks, Remaining in (0, TTL]", i, in, wantLocks)
			}
			if in.ID == d.ID && (in.Principal != "dave" || in.Owner != "svc-d") {
				t.Errorf("ListSessions on instance %d: %+v; want principal dave, owner svc-d", i, in)
			}
		}
	}
	if _, err := other.CloseSession(ctx, d.ID); err != nil {
		t.Fatalf("CloseSession on another instance: %v", err)
	}

	for _, q := range []store.SessionQuery{{Limit: -1}, {Limit: store.MaxListLimit + 1}, {After: "bad\x00id"}, {Principal: "bad\xff", ByPrincipal: true}} {
		if _, err := st.ListSessions(ctx, q); !errors.Is(err, store.ErrInvalidArgument) {
			t.Errorf("ListSessions(%+v) = %v; want ErrInvalidArgument", q, err)
		}
	}

	// A closed session is not listed; an expired one stops being listed
	// (listing keeps nothing alive).
	if _, err := st.CloseSession(ctx, b.ID); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	s.cfg.Expire(t, st, c.ID)
	testkit.Eventually(t, s.expiryBound(), "closed and expired sessions gone from ListSessions", func() bool {
		return slices.Equal(sessionIDsOf(listSessions(t, st, store.SessionQuery{})), []store.SessionID{a.ID})
	})
}
