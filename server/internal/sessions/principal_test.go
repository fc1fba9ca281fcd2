package sessions

import (
	"testing"

	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

// TestPrincipalSessionShare: under a share (C5 #ct5-principal-limits) a
// principal's sessions kept plus its opens in progress are bounded, other
// principals (and anonymous, "") are not affected, a session dropped or
// adopted is counted once, and share 0 bounds nothing per principal.
func TestPrincipalSessionShare(t *testing.T) {
	f := newFixture(t)
	const share = 2
	openAs := func(p string, id store.SessionID) {
		t.Helper()
		rel, err := f.AdmitOpen(p, share)
		if err != nil {
			t.Fatalf("AdmitOpen(%q) for %s: %v; want admitted", p, id, err)
		}
		if !f.Open(store.Session{ID: id, TTL: testTTL, Remaining: testTTL}, f.clk.Now(), []byte("h"), p) {
			t.Fatalf("Open(%s) = false", id)
		}
		rel()
	}
	refused := func(p, what string) {
		t.Helper()
		if _, err := f.AdmitOpen(p, share); limitOf(err) != wireerr.LimitPrincipalSessions {
			t.Fatalf("%s: AdmitOpen(%q) = %v; want the principal_sessions limit", what, p, err)
		}
	}

	// Opens in progress count.
	rel1, err := f.AdmitOpen("alice", share)
	if err != nil {
		t.Fatal(err)
	}
	rel2, _ := f.AdmitOpen("alice", share)
	refused("alice", "two opens in progress")
	rel1()
	rel2()

	openAs("alice", "a1")
	openAs("alice", "a2")
	refused("alice", "two sessions kept")
	if n := f.PrincipalSessions("alice"); n != 2 {
		t.Fatalf("PrincipalSessions(alice) = %d; want 2", n)
	}
	openAs("bob", "b1")
	openAs("", "anon1")
	openAs("", "anon2")
	refused("", "anonymous is one principal")
	if rel, err := f.AdmitOpen("alice", 0); err != nil {
		t.Fatalf("share 0: %v; want admitted (no per-principal bound)", err)
	} else {
		rel()
	}

	// A session gone and dropped gives its place back.
	r := f.Pin("a1")
	f.MarkGone(r)
	f.Unpin(r)
	if f.has("a1") {
		t.Fatal("a1 still in the table after Gone and unpinned")
	}
	if n := f.PrincipalSessions("alice"); n != 1 {
		t.Fatalf("after a1 dropped: PrincipalSessions(alice) = %d; want 1", n)
	}
	openAs("alice", "a3")
	refused("alice", "a2 and a3 kept")

	// An adopted session counts once its principal is known (set twice:
	// counted once) and no longer once dropped.
	x := f.Pin("x")
	f.SetPrincipal("x", "carol")
	f.SetPrincipal("x", "carol")
	if n := f.PrincipalSessions("carol"); n != 1 {
		t.Fatalf("adopted x: PrincipalSessions(carol) = %d; want 1", n)
	}
	f.Unpin(x)
	if n := f.PrincipalSessions("carol"); n != 0 {
		t.Fatalf("x dropped: PrincipalSessions(carol) = %d; want 0", n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.opensBy) != 0 {
		t.Errorf("opensBy = %v after every open returned; want empty", f.opensBy)
	}
}

// TestStreamSessions: a stream carries the sessions attached to it —
// a Provisional one while pinned, a live one until it is dropped — and
// none once they are gone (the server ends a stream carrying none after a
// request naming no live session, issue 23 F2).
func TestStreamSessions(t *testing.T) {
	f := newFixture(t)
	var p pushes
	st, _ := f.AddStream(p.push)
	if n := f.StreamSessions(st); n != 0 {
		t.Fatalf("new stream carries %d; want 0", n)
	}
	x := mustAttach(t, f, "x", st) // Provisional: no such session yet
	if n := f.StreamSessions(st); n != 1 {
		t.Fatalf("with x pinned: %d; want 1", n)
	}
	f.MarkGone(x)
	f.Unpin(x)
	if n := f.StreamSessions(st); n != 0 {
		t.Fatalf("x gone: %d; want 0", n)
	}
	f.open(t, "a")
	f.Unpin(mustAttach(t, f, "a", st))
	if n := f.StreamSessions(st); n != 1 {
		t.Fatalf("live a attached: %d; want 1", n)
	}
	r := f.Pin("a")
	f.MarkGone(r)
	f.Unpin(r)
	if n := f.StreamSessions(st); n != 0 {
		t.Fatalf("a gone: %d; want 0", n)
	}
}
