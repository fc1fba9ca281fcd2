package storetest

// Admin reads: Inspect, List and LocksOf.

import (
	"slices"
	"testing"
	"time"

	"lock.dev/lockd/store"
)

func (s *suite) testInspectAndList(t *testing.T) {
	insts := s.instances(t, 2)
	a, b := insts[0], insts[1]
	id := openSession(t, a)
	keys := []string{"ls/a", "ls/b", "ls/c/1", "ls/c/2", "other/x", "ls", "lsz"}
	grants := map[string]store.Grant{}
	for _, k := range keys {
		grants[k] = mustTry(t, a, id, k)
	}
	w := openSession(t, b)
	ch := startAcquire(t, ctxT(t), b, w, "ls/b")
	waitersAre(t, a, "ls/b", []store.SessionID{w})
	info, found := inspect(t, b, "ls/b")
	if !found || info.Key != "ls/b" || info.Session != id || info.Token != grants["ls/b"].Token || info.AcquiredAt.IsZero() {
		t.Fatalf("Inspect(ls/b) = %+v, %v; want holder %s token %d with an acquired-at", info, found, id, grants["ls/b"].Token)
	}
	if _, found := inspect(t, b, "ls/none"); found {
		t.Fatal("Inspect(ls/none) found a holder")
	}
	l, err := b.List(ctxT(t), "ls/", "", 0)
	var got []string
	for _, i := range l {
		got = append(got, i.Key)
	}
	if err != nil || !slices.Equal(got, []string{"ls/a", "ls/b", "ls/c/1", "ls/c/2"}) {
		t.Fatalf("List(ls/) = %v, %v; want ls/a ls/b ls/c/1 ls/c/2", got, err)
	}
	if len(l[1].Waiters) != 1 || l[1].Waiters[0] != w {
		t.Fatalf("List(ls/) ls/b waiters = %v, want [%s]", l[1].Waiters, w)
	}
	// Paging.
	var paged []string
	after := ""
	for range 10 {
		page, err := a.List(ctxT(t), "ls", after, 2)
		if err != nil {
			t.Fatalf("List(ls, after %q, 2): %v", after, err)
		}
		if len(page) > 2 {
			t.Fatalf("List limit 2 returned %d", len(page))
		}
		if len(page) == 0 {
			break
		}
		for _, i := range page {
			paged = append(paged, i.Key)
		}
		after = page[len(page)-1].Key
	}
	if want := []string{"ls", "ls/a", "ls/b", "ls/c/1", "ls/c/2", "lsz"}; !slices.Equal(paged, want) {
		t.Fatalf("paged List(ls) = %v, want %v", paged, want)
	}
	all, err := a.List(ctxT(t), "", "", 0)
	if err != nil || len(all) != len(keys) {
		t.Fatalf("List(\"\") = %d entries, %v; want %d", len(all), err, len(keys))
	}
	if _, err := a.CloseSession(ctxT(t), id); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	if r := recvResult(t, ch, 10*time.Second, "waiter"); r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
}

func (s *suite) testLocksOf(t *testing.T) {
	insts := s.instances(t, 2)
	id := openSession(t, insts[0])
	other := openSession(t, insts[1])
	mustTry(t, insts[0], id, "lo/b")
	ga := mustTry(t, insts[0], id, "lo/a")
	mustTry(t, insts[1], other, "lo/c")
	got, err := insts[0].LocksOf(ctxT(t), id)
	if err != nil || len(got) != 2 || got[0].Key != "lo/a" || got[0].Token != ga.Token || got[1].Key != "lo/b" {
		t.Fatalf("LocksOf = %+v, %v; want lo/a (token %d), lo/b", got, err, ga.Token)
	}
	// A revoke from elsewhere shows up: LocksOf reads the backend.
	if _, _, err := insts[1].Revoke(ctxT(t), "lo/b"); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	got, err = insts[0].LocksOf(ctxT(t), id)
	if err != nil || len(got) != 1 || got[0].Key != "lo/a" {
		t.Fatalf("LocksOf after revoke = %+v, %v; want only lo/a", got, err)
	}
}
