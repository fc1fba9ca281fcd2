package sessions

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

// docLines are the lines of doc.go, and the states by name.
func docLines(t *testing.T) ([]string, map[string]State) {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]State{}
	for i, n := range stateNames {
		byName[n] = State(i)
	}
	return strings.Split(string(src), "\n"), byName
}

// docTransitions reads the transition table of doc.go: from → to.
func docTransitions(t *testing.T) map[State][]State {
	t.Helper()
	lines, byName := docLines(t)
	out := map[State][]State{}
	in := false
	for _, line := range lines {
		if !strings.HasPrefix(line, "//\t") {
			in = in && strings.TrimSpace(line) != "//"
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, "//"))
		switch {
		case len(fields) >= 3 && fields[0] == "from" && fields[1] == "to":
			in = true
		case in:
			if strings.HasPrefix(fields[2], "Test") {
				continue // the list of tests, not the table
			}
			from, ok1 := byName[fields[0]]
			to, ok2 := byName[fields[1]]
			if !ok1 || !ok2 {
				t.Fatalf("doc.go transition line %q names no state", line)
			}
			out[from] = append(out[from], to)
		}
	}
	if len(out) == 0 {
		t.Fatal("doc.go has no transition table")
	}
	return out
}

// docTests reads doc.go's list of the tests of each transition.
func docTests(t *testing.T) map[[2]State][]string {
	t.Helper()
	lines, byName := docLines(t)
	out := map[[2]State][]string{}
	for _, line := range lines {
		if !strings.HasPrefix(line, "//\t") {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, "//"))
		if len(fields) < 3 || !strings.HasPrefix(fields[2], "Test") {
			continue
		}
		from, ok1 := byName[fields[0]]
		to, ok2 := byName[fields[1]]
		if !ok1 || !ok2 {
			t.Fatalf("doc.go test line %q names no state", line)
		}
		out[[2]State{from, to}] = fields[2:]
	}
	return out
}

// testFuncs are the names of the package's test functions.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			if rest, ok := strings.CutPrefix(line, "func Test"); ok {
				out["Test"+rest[:strings.IndexByte(rest, '(')]] = true
			}
		}
	}
	return out
}

// TestTransitionTable: the code's table (transitions) is doc.go's, every
// transition has its tests listed in doc.go and they exist, and move
// refuses every transition the table lacks.
func TestTransitionTable(t *testing.T) {
	doc := docTransitions(t)
	tests, funcs := docTests(t), testFuncs(t)
	for from, tos := range doc {
		for _, to := range tos {
			names := tests[[2]State{from, to}]
			if len(names) == 0 {
				t.Errorf("doc.go lists no test of %v → %v", from, to)
			}
			for _, n := range names {
				if !funcs[n] {
					t.Errorf("doc.go names %s for %v → %v; no such test", n, from, to)
				}
			}
		}
	}
	for tr := range tests {
		if !slices.Contains(doc[tr[0]], tr[1]) {
			t.Errorf("doc.go lists tests of %v → %v, which its table lacks", tr[0], tr[1])
		}
	}
	for from := Provisional; from <= Gone; from++ {
		want := doc[from]
		got := transitions[from]
		slices.Sort(want)
		got = slices.Sorted(slices.Values(got))
		if !slices.Equal(got, want) {
			t.Errorf("transitions[%v] = %v; doc.go says %v", from, got, want)
		}
	}
	if len(transitions) != len(stateNames) {
		t.Errorf("transitions has %d states; want %d", len(transitions), len(stateNames))
	}
	f := newFixture(t)
	for from := Provisional; from <= Gone; from++ {
		for to := Provisional; to <= Gone; to++ {
			r := newRecord("s")
			r.state = from
			f.mu.Lock()
			before := f.badMoves
			ok := f.move(r, to)
			refused := f.badMoves - before
			f.badMoves = before
			f.mu.Unlock()
			want := from == to || slices.Contains(doc[from], to)
			if ok != want || (r.state == to) != want || (refused == 1) == want {
				t.Errorf("move %v → %v = %v (state %v, refused %d); want allowed=%v", from, to, ok, r.state, refused, want)
			}
		}
	}
	if Gone.String() != "Gone" || State(99).String() != "State(?)" {
		t.Errorf("State.String: %q, %q", Gone, State(99))
	}
}

// TestOpenAndPin: (none) → Live by Open; (none) → Provisional by Pin; a
// Provisional record is dropped when unpinned, a Live one is kept.
func TestOpenAndPin(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	if got := f.state(r); got != Live || !f.Seeded(r) || !f.inHeap(r) {
		t.Fatalf("opened record: %v, seeded %v, in heap %v; want Live, seeded, watched", got, f.Seeded(r), f.inHeap(r))
	}
	if want := f.clk.Now().Add(testTTL); !f.expireAt(r).Equal(want) {
		t.Errorf("expireAt = %v; want open + TTL %v", f.expireAt(r), want)
	}
	p := f.Pin("b")
	if got := f.state(p); got != Provisional || f.inHeap(p) {
		t.Fatalf("pinned unknown session: %v, in heap %v; want Provisional, not watched", got, f.inHeap(p))
	}
	if f.Pin("b") != p {
		t.Fatal("a second Pin of the same id made a second record")
	}
	f.Unpin(p)
	f.Unpin(p)
	if f.has("b") {
		t.Error("an unpinned Provisional record stayed in the table")
	}
	f.Unpin(f.Pin("a"))
	if !f.has("a") {
		t.Error("a Live record was dropped when unpinned")
	}
	if f.Len() != 1 {
		t.Errorf("Len = %d; want 1", f.Len())
	}
}

// TestAdoptByHeartbeat: Provisional → Live when the store answers a
// heartbeat live; the record is adopted and learns the TTL from it.
func TestAdoptByHeartbeat(t *testing.T) {
	f := newFixture(t)
	r := f.Pin("a")
	defer f.Unpin(r)
	resp := f.liveBeat(t, r, 7*time.Second)
	if !resp.Live || resp.RemainingMs != 7000 {
		t.Fatalf("reply = %v; want live, 7000 ms", resp)
	}
	if resp.Held != nil {
		t.Errorf("held = %v for a session whose grants are not seeded; want none", resp.Held)
	}
	f.mu.Lock()
	st, adopted, kept, ttl, guess := r.state, r.adopted, r.kept, r.ttl, r.expireGuess
	f.mu.Unlock()
	if st != Live || !adopted || !kept || ttl != 7*time.Second || guess {
		t.Fatalf("after the beat: %v adopted=%v kept=%v ttl=%v guess=%v; want Live, adopted, kept, 7s, no guess", st, adopted, kept, ttl, guess)
	}
	if want := f.clk.Now().Add(7 * time.Second); !f.expireAt(r).Equal(want) {
		t.Errorf("expireAt = %v; want recv + Remaining %v", f.expireAt(r), want)
	}
}

// TestAdoptByGrantGuessesMaxTTL: Provisional → Live by a grant; the TTL is
// unknown, so the silence deadline rests on max-ttl until a heartbeat
// teaches the TTL, which may bring it earlier — never before the trust
// granted.
func TestAdoptByGrantGuessesMaxTTL(t *testing.T) {
	f := newFixture(t)
	r, ending := f.PinUse("a")
	defer f.Unpin(r)
	defer f.EndRead(r)
	if ending {
		t.Fatal("PinUse of a new session says ending")
	}
	recv := f.clk.Now()
	slot, err := f.AdmitAcquire(r, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Done()
	if got := f.Grant(r, f.CloseMark(r), recv, store.Grant{Key: "k", Token: 3, Remaining: 2 * time.Second}, slot); got != Granted {
		t.Fatalf("Grant = %v; want Granted", got)
	}
	if got, want := f.expireAt(r), recv.Add(testMaxTTL); !got.Equal(want) {
		t.Fatalf("expireAt after an adopting grant = %v; want recv + max-ttl %v", got, want)
	}
	f.clk.Add(time.Second)
	f.liveBeat(t, r, 5*time.Second)
	// The heartbeat's Remaining (5s) taught the TTL: the deadline comes
	// in from the guess, to recv + 5s.
	if got, want := f.expireAt(r), f.clk.Now().Add(5*time.Second); !got.Equal(want) {
		t.Errorf("expireAt after the first heartbeat = %v; want %v", got, want)
	}
}

// TestSilenceClose: Live → Expiring when the deadline passes, → Gone when
// ExpireSession ends the session; the loss is reported once, the stream
// told, the record dropped.
func TestSilenceClose(t *testing.T) {
	f := newFixture(t)
	var p pushes
	st, _ := f.AddStream(p.push)
	r := f.open(t, "a")
	f.Unpin(mustAttach(t, f, "a", st))
	f.clk.Add(testTTL - time.Millisecond)
	if n := f.step(); n != 0 {
		t.Fatalf("closed %d sessions before the deadline", n)
	}
	f.clk.Add(time.Millisecond)
	if n := f.step(); n != 1 {
		t.Fatalf("closed %d sessions at the deadline; want 1", n)
	}
	if e, c := f.be.calls(); e != 1 || c != 0 {
		t.Errorf("ExpireSession ×%d, CloseSession ×%d; want 1, 0", e, c)
	}
	if got := f.state(r); got != Gone || f.has("a") {
		t.Errorf("after the close: %v, in table %v; want Gone, dropped", got, f.has("a"))
	}
	if got := f.lostReasons(); !slices.Equal(got, []string{telemetry.LostClientSilent}) {
		t.Errorf("session_lost reasons = %v; want [client_silent]", got)
	}
	if ps := p.all(); len(ps) != 1 || ps[0].Live || ps[0].SessionId != "a" {
		t.Errorf("stream got %v; want one not-live answer for a", ps)
	}
}

func mustAttach(t *testing.T, f *fixture, id store.SessionID, st *Stream, acks ...uint64) *Record {
	t.Helper()
	r, err := f.Attach(id, st, acks)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestSilenceCloseAlreadyGone: an ExpireSession that finds the session
// dead ends the record without reporting the loss (whoever ended it did).
func TestSilenceCloseAlreadyGone(t *testing.T) {
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) { return store.Expiry{}, store.ErrSessionDead }
	r := f.open(t, "a")
	f.clk.Add(testTTL)
	f.step()
	if got := f.state(r); got != Gone || len(f.lostReasons()) != 0 {
		t.Errorf("after a close of a dead session: %v, lost %v; want Gone, none reported", got, f.lostReasons())
	}
}

// TestSilenceCloseRefusedThenRevived: Expiring stays Expiring when the
// backend refuses the close (filed again just before its expiry), extends
// nothing meanwhile, and Expiring → Live (revive) when a call reaches the
// server.
func TestSilenceCloseRefusedThenRevived(t *testing.T) {
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) { return store.Expiry{Remaining: 3 * time.Second}, nil }
	r := f.open(t, "a")
	f.clk.Add(testTTL)
	f.step()
	if got := f.state(r); got != Expiring {
		t.Fatalf("after a refused close: %v; want Expiring", got)
	}
	if f.Ending(r) {
		t.Error("an Expiring record says ending; only the backend ends a silent session")
	}
	if got, want := f.expireAt(r), f.clk.Now().Add(3*time.Second-expireEarly); !got.Equal(want) {
		t.Errorf("refiled at %v; want the backend's expiry less expireEarly %v", got, want)
	}
	// A second refusal keeps it Expiring.
	f.clk.Add(3 * time.Second)
	f.step()
	if got := f.state(r); got != Expiring {
		t.Fatalf("after a second refused close: %v; want Expiring", got)
	}
	resp := f.liveBeat(t, r, testTTL)
	if got := f.state(r); got != Live || !resp.Live {
		t.Fatalf("after a heartbeat: %v, reply live=%v; want Live, live (revived)", got, resp.Live)
	}
	if got, want := f.expireAt(r), f.clk.Now().Add(testTTL); !got.Equal(want) {
		t.Errorf("revived expireAt = %v; want now + TTL %v", got, want)
	}
	if len(f.lostReasons()) != 0 {
		t.Errorf("lost reported %v for a session the backend kept", f.lostReasons())
	}
}

// TestSilenceCloseFailsAndRetries: a failed ExpireSession keeps the record
// Expiring, filed again with backoff and logged; the next attempt ends it.
func TestSilenceCloseFailsAndRetries(t *testing.T) {
	fails := 1
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) {
		if fails > 0 {
			fails--
			return store.Expiry{}, store.ErrUnavailable
		}
		return store.Expiry{Ended: true}, nil
	}
	r := f.open(t, "a")
	f.clk.Add(testTTL)
	f.step()
	if got := f.state(r); got != Expiring || !f.inHeap(r) {
		t.Fatalf("after a failed close: %v, in heap %v; want Expiring, filed again", got, f.inHeap(r))
	}
	if got, want := f.expireAt(r), f.clk.Now().Add(closeRetryMin<<1); !got.Equal(want) {
		t.Errorf("retry at %v; want %v", got, want)
	}
	f.clk.Add(closeRetryMin << 1)
	f.step()
	if got := f.state(r); got != Gone {
		t.Errorf("after the retry: %v; want Gone", got)
	}
}

// TestGoneDuringFailedCloseIsDropped: a record that went Gone while its
// failed silence close was in flight is dropped, not filed again (before,
// it stayed in the table for ever, counted against max-sessions).
func TestGoneDuringFailedCloseIsDropped(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	release, done := f.closeInFlight(t, store.Expiry{}, store.ErrUnavailable)
	f.MarkGone(r) // e.g. a heartbeat's store answer: dead
	close(release)
	await(t, done, "the close ended")
	if f.has("a") || f.inHeap(r) || f.Len() != 0 {
		t.Errorf("a Gone record whose close failed: in table %v, in heap %v; want dropped", f.has("a"), f.inHeap(r))
	}
}

// TestCloseOverlapExtendsNothing: a store answer taken before a silence
// close began extends nothing after it (ErrCloseOverlap; a grant is
// GrantOverlapped), even once the close was refused and the record revived.
func TestCloseOverlapExtendsNothing(t *testing.T) {
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) { return store.Expiry{Remaining: time.Second}, nil }
	r := f.open(t, "a")
	mark := f.CloseMark(r) // the call asks the store …
	f.clk.Add(testTTL)
	f.step() // … while a silence close begins and is refused
	before := f.expireAt(r)
	resp := &lockdv1.KeepAliveResponse{}
	_, err := f.Beat(context.Background(), r, mark, f.clk.Now(), store.Liveness{Live: true, Remaining: testTTL}, nil, resp)
	if !errors.Is(err, ErrCloseOverlap) || !errors.Is(err, store.ErrContention) {
		t.Fatalf("Beat over a stale answer: %v; want ErrCloseOverlap (contention)", err)
	}
	if resp.RemainingMs != 0 {
		t.Errorf("the overlapping reply granted %d ms", resp.RemainingMs)
	}
	if got := f.state(r); got != Live {
		t.Errorf("after the call: %v; want Live (revived, the client is calling)", got)
	}
	if got := f.expireAt(r); got.After(f.clk.Now().Add(testTTL)) || got.Before(before) {
		t.Errorf("expireAt = %v; want the revival's now + TTL only", got)
	}
	slot, _ := f.AdmitAcquire(r, "k")
	defer slot.Done()
	if got := f.Grant(r, mark, f.clk.Now(), store.Grant{Key: "k", Token: 1, Remaining: testTTL}, slot); got != GrantOverlapped {
		t.Errorf("Grant over a stale answer = %v; want GrantOverlapped", got)
	}
	// A fresh mark extends again.
	if got := f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: "k", Token: 1, Remaining: testTTL}, slot); got != Granted {
		t.Errorf("Grant with a fresh mark = %v; want Granted", got)
	}
}

// TestReplyWaitsForCloseInFlight: a reply waits while a silence close is in
// flight and follows its outcome: dead once the close ended the session.
func TestReplyWaitsForCloseInFlight(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	f.Pin("a")
	defer f.Unpin(r)
	release, closed := f.closeInFlight(t, store.Expiry{Ended: true}, nil)
	if m, gen := f.CloseMark(r), func() uint64 { f.mu.Lock(); defer f.mu.Unlock(); return r.closeGen }(); m != gen-1 {
		t.Errorf("CloseMark during a close in flight = %d; want closeGen-1 = %d", m, gen-1)
	}
	type result struct {
		answer bool
		err    error
		resp   *lockdv1.KeepAliveResponse
	}
	got := make(chan result, 1)
	go func() {
		resp := &lockdv1.KeepAliveResponse{}
		// The store's answer came after the close began: mark is fresh.
		mark := f.CloseMark(r) + 1
		a, err := f.Beat(context.Background(), r, mark, f.clk.Now(), store.Liveness{Live: true, Remaining: testTTL}, nil, resp)
		got <- result{a, err, resp}
	}()
	awaitBlockedIn(t, "sessions.(*Table).lockSettled")
	select {
	case res := <-got:
		t.Fatalf("the reply did not wait for the close in flight: %+v", res)
	default:
	}
	close(release)
	await(t, closed, "the close ended")
	res := await(t, got, "the reply")
	if !res.answer || res.err != nil || res.resp.Live {
		t.Errorf("reply after the close ended the session: answer %v, %v, live %v; want a dead answer", res.answer, res.err, res.resp.Live)
	}
}

// TestClose: Live → Closing by CloseSession (ending: grants refused, no
// revival); a failed close is retried by the silence loop as the caller's
// close; Closing → Gone when it succeeds. A Provisional record closed
// (Provisional → Closing) is not retried and is dropped when unpinned.
func TestClose(t *testing.T) {
	f := newFixture(t)
	fail := true
	f.be.close = func(context.Context, store.SessionID) (int, error) {
		if fail {
			fail = false
			return 0, store.ErrUnavailable
		}
		return 0, nil
	}
	r := f.open(t, "a")
	f.Pin("a")
	f.BeginClose(r)
	if got := f.state(r); got != Closing || !f.Ending(r) || f.inHeap(r) {
		t.Fatalf("after BeginClose: %v, ending %v, in heap %v; want Closing, ending, not watched", got, f.Ending(r), f.inHeap(r))
	}
	if resp := f.liveBeat(t, r, testTTL); resp.Live {
		t.Error("a Closing session was answered live")
	}
	if got := f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: "k", Token: 1}, nil); got != GrantEnding {
		t.Errorf("Grant on a Closing session = %v; want GrantEnding", got)
	}
	f.RetryCloseLater(r, "alice", "r1", true)
	f.Unpin(r)
	f.clk.Add(closeRetryMin)
	f.step() // fails: filed again with backoff
	if got := f.state(r); got != Closing {
		t.Fatalf("after a failed retry: %v; want Closing", got)
	}
	f.clk.Add(closeRetryMax)
	f.step()
	if got := f.state(r); got != Gone || f.has("a") {
		t.Fatalf("after the retry: %v, in table %v; want Gone, dropped", got, f.has("a"))
	}
	f.be.mu.Lock()
	by, rule, ok := telemetry.CallerOf(f.be.ctxs[len(f.be.ctxs)-1])
	f.be.mu.Unlock()
	if !ok || by != "alice" || rule != "r1" {
		t.Errorf("retried close recorded as %q %q %v; want the caller alice r1", by, rule, ok)
	}
	if len(f.lostReasons()) != 0 {
		t.Errorf("a close the client asked for reported session_lost %v", f.lostReasons())
	}

	p := f.Pin("b")
	f.BeginClose(p)
	f.RetryCloseLater(p, "", "", false)
	if got := f.state(p); got != Closing || f.inHeap(p) {
		t.Fatalf("a Provisional record closed: %v, in heap %v; want Closing, not retried", got, f.inHeap(p))
	}
	f.Unpin(p)
	if f.has("b") {
		t.Error("a record closed while Provisional stayed in the table")
	}
}

// TestCloseDuringSilenceClose: Expiring → Closing when the client closes
// while its silence close waits for a retry; the retry is then the
// caller's unconditional close.
func TestCloseDuringSilenceClose(t *testing.T) {
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) { return store.Expiry{Remaining: time.Second}, nil }
	r := f.open(t, "a")
	f.clk.Add(testTTL)
	f.step()
	f.Pin("a")
	f.BeginClose(r)
	if got := f.state(r); got != Closing {
		t.Fatalf("BeginClose on Expiring: %v; want Closing", got)
	}
	f.RetryCloseLater(r, "", "", false)
	f.Unpin(r)
	f.clk.Add(closeRetryMin)
	f.step()
	if e, c := f.be.calls(); e != 1 || c != 1 || f.state(r) != Gone {
		t.Errorf("ExpireSession ×%d, CloseSession ×%d, %v; want 1, 1, Gone", e, c, f.state(r))
	}
}

// TestEndFromEveryState: every state but Gone → Gone when the store says
// the session is dead; an unpinned Gone record is dropped; Gone is final.
func TestEndFromEveryState(t *testing.T) {
	for _, from := range []State{Provisional, Live, Expiring, Closing, Draining} {
		t.Run(from.String(), func(t *testing.T) {
			f := newFixture(t)
			r := f.Pin("a")
			f.mu.Lock()
			r.state, r.kept = from, from != Provisional
			f.mu.Unlock()
			f.MarkGone(r)
			if got := f.state(r); got != Gone {
				t.Fatalf("MarkGone from %v: %v; want Gone", from, got)
			}
			f.MarkGone(r) // Gone is final: again is nothing
			f.BeginClose(r)
			if got := f.state(r); got != Gone {
				t.Fatalf("BeginClose on Gone: %v; want Gone", got)
			}
			if !f.has("a") {
				t.Fatal("a pinned Gone record was dropped")
			}
			f.Unpin(r)
			if f.has("a") {
				t.Error("an unpinned Gone record stayed in the table")
			}
		})
	}
}

// TestBeatAnswers: what a heartbeat's reply says for each store answer.
func TestBeatAnswers(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	f.Pin("a")
	defer f.Unpin(r)
	if resp := f.liveBeat(t, r, testTTL); !resp.Live || resp.Held == nil || len(resp.Held.Locks) != 0 {
		t.Errorf("live answer of a seeded session: %v; want live with an empty held set", resp)
	}
	resp := &lockdv1.KeepAliveResponse{}
	answer, err := f.Beat(context.Background(), r, f.CloseMark(r), f.clk.Now(), store.Liveness{}, store.ErrUnavailable, resp)
	if !answer || !errors.Is(err, store.ErrUnavailable) || !resp.Live || resp.RemainingMs != 0 {
		t.Errorf("transient error: %v, %v, %v; want the error, live (not read as dead), nothing granted", answer, err, resp)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if answer, _ := f.Beat(ctx, r, f.CloseMark(r), f.clk.Now(), store.Liveness{Live: true}, nil, resp); answer {
		t.Error("a beat whose caller left was answered")
	}
	resp = &lockdv1.KeepAliveResponse{}
	answer, err = f.Beat(context.Background(), r, f.CloseMark(r), f.clk.Now(), store.Liveness{}, store.ErrSessionDead, resp)
	if !answer || err != nil || resp.Live || f.state(r) != Gone {
		t.Errorf("dead: %v, %v, live %v, %v; want a dead answer, Gone", answer, err, resp.Live, f.state(r))
	}
	q := f.Pin("b")
	defer f.Unpin(q)
	_, _ = f.Beat(context.Background(), q, f.CloseMark(q), f.clk.Now(), store.Liveness{Live: false}, nil, resp)
	if got := f.state(q); got != Gone {
		t.Errorf("not live: %v; want Gone", got)
	}
}

// TestLoopOwned: New starts the silence loop, which closes a silent
// session on its own (real clock); Close stops it and waits (goleak in
// TestMain checks that nothing is left).
func TestLoopOwned(t *testing.T) {
	be := &backend{}
	tb := New(Config{MaxTTL: time.Minute, MaxSessions: 10, MaxSessionOpens: 10}, be)
	defer tb.Close()
	tb.Open(store.Session{ID: "a", TTL: time.Millisecond, Remaining: time.Millisecond}, time.Now(), nil, "")
	tb.Open(store.Session{ID: "b", TTL: time.Hour, Remaining: time.Hour}, time.Now(), nil, "")
	testkit.Eventually(t, 10*time.Second, "the loop closed the silent session", func() bool { return tb.Len() == 1 })
	tb.Close()
	tb.Close() // again: nothing more
	if e, _ := be.calls(); e != 1 {
		t.Errorf("ExpireSession ×%d; want 1", e)
	}
}
