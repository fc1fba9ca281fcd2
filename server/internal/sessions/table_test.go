package sessions

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/proto/lockd/v1/wireerr"
	"lock.dev/lockd/store"
)

func limitOf(err error) string {
	var le *LimitError
	if errors.As(err, &le) {
		return le.Limit
	}
	return ""
}

// TestLimits: max-session-opens counts opens in progress, max-sessions
// counts records and opens, max-locks-per-session counts held keys and
// acquires in progress; asking again for a held key is always admitted.
func TestLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxSessionOpens, c.MaxSessions, c.MaxLocksPerSession = 2, 3, 2 })
	rel1, err := f.AdmitOpen("", 0)
	if err != nil {
		t.Fatal(err)
	}
	rel2, _ := f.AdmitOpen("", 0)
	if _, err := f.AdmitOpen("", 0); limitOf(err) != wireerr.LimitSessionOpens || !strings.Contains(err.Error(), "session_opens") {
		t.Fatalf("third open in progress: %v; want the session_opens limit", err)
	}
	rel1()
	f.open(t, "a")
	f.open(t, "b")
	if _, err := f.AdmitOpen("", 0); limitOf(err) != wireerr.LimitSessions {
		t.Fatalf("open with 2 sessions and 1 open in progress of 3: %v; want the sessions limit", err)
	}
	rel2()
	rel3, err := f.AdmitOpen("", 0)
	if err != nil {
		t.Fatalf("open with 2 sessions of 3: %v; want admitted", err)
	}
	rel3()

	r := f.Pin("a")
	defer f.Unpin(r)
	s1, err := f.AdmitAcquire(r, "k1")
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := f.AdmitAcquire(r, "k2")
	if _, err := f.AdmitAcquire(r, "k3"); limitOf(err) != wireerr.LimitLocksPerSession {
		t.Fatalf("third acquire in progress of 2: %v; want locks_per_session", err)
	}
	s1.Done()
	s1.Done() // once is enough
	if f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: "k2", Token: 1, Remaining: testTTL}, s2) != Granted {
		t.Fatal("grant refused")
	}
	s2.Done()
	s3, err := f.AdmitAcquire(r, "k3")
	if err != nil {
		t.Fatalf("one key held of 2: %v; want admitted", err)
	}
	defer s3.Done()
	if s, err := f.AdmitAcquire(r, "k2"); err != nil {
		t.Fatalf("asking again for a held key at the limit: %v; want admitted", err)
	} else {
		s.Done()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opens != 0 || f.acquiring["a"] != 1 {
		t.Errorf("opens %d, acquiring %d; want 0, 1", f.opens, f.acquiring["a"])
	}
}

// TestLimitGrantCountedOnce (LIM-1): a granted Acquire leaves the
// in-progress count in the critical section that tracks its grant, so
// between the grant and the call's return (the window a hook held open on
// the server) the grant counts once and the next key is admitted.
func TestLimitGrantCountedOnce(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxLocksPerSession = 2 })
	r := f.open(t, "a")
	f.Pin("a")
	defer f.Unpin(r)
	slot, err := f.AdmitAcquire(r, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: "k1", Token: 1, Remaining: testTTL}, slot) != Granted {
		t.Fatal("grant refused")
	}
	// The call has not returned (slot.Done not called yet).
	next, err := f.AdmitAcquire(r, "k2")
	if err != nil {
		t.Fatalf("second key with one granted of 2, its call still returning: %v; want admitted (the grant counts once)", err)
	}
	next.Done()
	slot.Done()
}

// TestTrackingGoneTokens: while a grant or seeding read is in flight, a
// grant that goes is remembered (goneTok) so that the late grant is not
// tracked; a newer grant of the key is never replaced by an older one; the
// memory is bounded (overflow refuses tracking) and cleared when the reads
// end.
func TestTrackingGoneTokens(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	r2, _ := f.PinUse("a") // a grant in flight
	if r2 != r {
		t.Fatal("PinUse made a second record")
	}
	f.LockLost("a", "k", 5, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED) // went before its grant reply
	if f.Grant(r, f.CloseMark(r), f.clk.Now(), store.Grant{Key: "k", Token: 5, Remaining: testTTL}, nil) != Granted {
		t.Fatal("grant refused")
	}
	f.mu.Lock()
	_, tracked := r.locks["k"]
	f.mu.Unlock()
	if tracked {
		t.Error("a grant that went while in flight was tracked")
	}
	f.mu.Lock()
	f.trackLocked(r, "k", 7)
	if f.trackLocked(r, "k", 6) || r.locks["k"] != 7 {
		t.Errorf("an older grant replaced a newer one: %d", r.locks["k"])
	}
	for i := range maxGoneKeys + 1 {
		f.goneLocked(r, fmt.Sprint("g", i), 1)
	}
	if !r.goneOverflow || f.trackLocked(r, "new", 1) {
		t.Error("past maxGoneKeys a grant was still tracked")
	}
	f.mu.Unlock()
	f.Untrack("a", "k", 7)
	f.Untrack("nobody", "k", 7)
	f.EndRead(r)
	f.Unpin(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.goneTok != nil || r.goneOverflow || r.reading != 0 {
		t.Errorf("after the reads ended: goneTok %d entries, overflow %v, reading %d; want cleared", len(r.goneTok), r.goneOverflow, r.reading)
	}
	if _, ok := r.locks["k"]; ok {
		t.Error("an untracked grant is still tracked")
	}
}

// TestNoticesAndAcks: a lost grant becomes one notice (pushed and repeated
// in every answer until acknowledged), an older tracked token is reported
// as UNSPECIFIED, an EXPIRED notice says not live, acks drop notices, and
// the queue is bounded.
func TestNoticesAndAcks(t *testing.T) {
	f := newFixture(t)
	var p pushes
	st, _ := f.AddStream(p.push)
	r := f.open(t, "a")
	f.Unpin(mustAttach(t, f, "a", st))
	f.mu.Lock()
	r.locks["k"], r.locks["j"] = 3, 4
	f.mu.Unlock()
	f.LockLost("a", "k", 5, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	f.LockLost("a", "k", 5, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED) // once
	f.LockLost("a", "j", 4, lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED)
	f.LockLost("nobody", "j", 4, lockdv1.LockLostReason_LOCK_LOST_REASON_EXPIRED)
	ps := p.all()
	if len(ps) != 2 {
		t.Fatalf("pushed %d; want 2", len(ps))
	}
	if n := ps[0].Lost[0]; n.Key != "k" || n.Token != 3 || n.Reason != lockdv1.LockLostReason_LOCK_LOST_REASON_UNSPECIFIED || !ps[0].Live {
		t.Errorf("first notice %v (live %v); want k token 3 UNSPECIFIED (an older tracked token), live", n, ps[0].Live)
	}
	if ps[1].Live {
		t.Error("an EXPIRED notice said live")
	}
	r = mustAttach(t, f, "a", st, ps[0].Lost[0].NoticeId)
	resp := f.liveBeat(t, r, testTTL)
	f.Unpin(r)
	if len(resp.Lost) != 1 || resp.Lost[0].Key != "j" {
		t.Errorf("answer repeats %v; want only the unacknowledged j", resp.Lost)
	}
	f.mu.Lock()
	for i := range maxPendingNotices + 5 {
		f.noticeLocked(r, fmt.Sprint("n", i), 1, lockdv1.LockLostReason_LOCK_LOST_REASON_REVOKED)
	}
	n := len(r.notices)
	f.mu.Unlock()
	if n != maxPendingNotices {
		t.Errorf("%d notices kept; want at most %d", n, maxPendingNotices)
	}
}

// TestSeed: an adopted session's grants are read from the store once (or
// before every answer over shared sessions, where a grant gone through
// another replica is forgotten); a failed read seeds nothing.
func TestSeed(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.SharedSessions = shared })
			reads := 0
			grants := []store.Grant{{Key: "a", Token: 1}, {Key: "b", Token: 2}}
			f.be.locksOf = func(store.SessionID) ([]store.Grant, error) { reads++; return grants, nil }
			r := f.Pin("s")
			defer f.Unpin(r)
			if err := f.Seed(context.Background(), r); err != nil || !f.Seeded(r) {
				t.Fatalf("Seed = %v, seeded %v", err, f.Seeded(r))
			}
			resp := f.liveBeat(t, r, testTTL)
			if resp.Held == nil || len(resp.Held.Locks) != 2 {
				t.Fatalf("held = %v; want a and b", resp.Held)
			}
			grants = grants[1:] // a released through another replica
			if err := f.Seed(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			resp = f.liveBeat(t, r, testTTL)
			want, wantReads := 1, 2
			if !shared {
				want, wantReads = 2, 1
			}
			if len(resp.Held.Locks) != want || reads != wantReads {
				t.Errorf("held %v after %d reads; want %d locks, %d reads", resp.Held.Locks, reads, want, wantReads)
			}
		})
	}
	f := newFixture(t)
	f.be.locksOf = func(store.SessionID) ([]store.Grant, error) { return nil, store.ErrUnavailable }
	r := f.Pin("s")
	defer f.Unpin(r)
	if err := f.Seed(context.Background(), r); !errors.Is(err, store.ErrUnavailable) || f.Seeded(r) {
		t.Errorf("failed read: %v, seeded %v; want the error, not seeded", err, f.Seeded(r))
	}
}

// TestStreams: a session follows the stream of its latest heartbeat; a
// stream carries at most MaxSessionsPerStream sessions; a dropped record
// leaves its stream's count.
func TestStreams(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxSessionsPerStream = 1 })
	var p1, p2 pushes
	s1, _ := f.AddStream(p1.push)
	s2, _ := f.AddStream(p2.push)
	r := mustAttach(t, f, "a", s1)
	if _, err := f.Attach("b", s1, nil); !errors.Is(err, ErrStreamFull) {
		t.Fatalf("second session on a full stream: %v; want ErrStreamFull", err)
	}
	mustAttach(t, f, "a", s1) // the same session again: admitted
	f.Unpin(r)
	mustAttach(t, f, "a", s2) // moves
	f.mu.Lock()
	n1, n2 := s1.sessions, s2.sessions
	f.mu.Unlock()
	if n1 != 0 || n2 != 1 {
		t.Errorf("after the move: %d, %d sessions; want 0, 1", n1, n2)
	}
	b := mustAttach(t, f, "b", s1)
	f.Unpin(r)
	f.Unpin(r) // Provisional, unpinned: dropped
	f.Unpin(mustAttach(t, f, "a", nil))
	f.Unpin(b)
	f.mu.Lock()
	n2 = s2.sessions
	f.mu.Unlock()
	if n2 != 0 || f.has("a") {
		t.Errorf("a dropped record still counts on its stream (%d) or is kept (%v)", n2, f.has("a"))
	}
	f.RemoveStream(s1)
	f.RemoveStream(s2)
}

// TestDrain: Drain refuses new streams, tells every open stream to move,
// and ends when they have ended (or at its timeout).
func TestDrain(t *testing.T) {
	f := newFixture(t)
	var p pushes
	st, ok := f.AddStream(p.push)
	if !ok || f.Draining() {
		t.Fatal("stream refused before the drain")
	}
	done := make(chan struct{})
	go func() { defer close(done); f.Drain(context.Background(), time.Hour) }()
	eventually(t, "the drain began", f.Draining)
	if _, ok := f.AddStream(p.push); ok {
		t.Error("a draining table took a new stream")
	}
	eventually(t, "the draining notice", func() bool { return len(p.all()) == 1 })
	if !p.all()[0].Draining {
		t.Errorf("pushed %v; want draining", p.all()[0])
	}
	f.RemoveStream(st)
	await(t, done, "the drain ended")
	f.Drain(context.Background(), time.Hour) // no stream: returns at once
	g := newFixture(t)
	g.AddStream(p.push)
	g.Drain(context.Background(), time.Millisecond) // the timeout ends it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g.Drain(ctx, time.Hour) // so does ctx
}

// TestCloseAll: Live, Expiring and Closing → Draining (Provisional records
// and Gone ones are left); every tracked lock gets a SERVER_SHUTDOWN
// notice; a session is closed once its notices are acknowledged or its
// trust ran out, Draining → Gone; nothing is opened or extended meanwhile;
// at ctx's end the rest is left to expire.
func TestCloseAll(t *testing.T) {
	f := newFixture(t)
	f.be.expire = func(store.SessionID) (store.Expiry, error) { return store.Expiry{Remaining: time.Second}, nil }
	var p pushes
	st, _ := f.AddStream(p.push)
	live := f.open(t, "live")
	f.Unpin(mustAttach(t, f, "live", st))
	f.mu.Lock()
	live.locks["k"] = 1
	f.mu.Unlock()
	exp := f.open(t, "expiring")
	f.clk.Add(testTTL)
	f.step()
	f.liveBeat(t, live, testTTL)
	closing := f.open(t, "closing")
	f.BeginClose(closing)
	prov := f.Pin("provisional")
	if f.state(exp) != Expiring || f.state(closing) != Closing {
		t.Fatalf("setup: %v, %v", f.state(exp), f.state(closing))
	}
	errc := make(chan error, 1)
	go func() { errc <- f.CloseAll(context.Background()) }()
	eventually(t, "the shutdown notice", func() bool { return len(p.all()) == 1 })
	if n := p.all()[0]; !n.Live || n.Lost[0].Reason != lockdv1.LockLostReason_LOCK_LOST_REASON_SERVER_SHUTDOWN {
		t.Errorf("notice %v; want SERVER_SHUTDOWN, live", n)
	}
	for _, r := range []*Record{live, exp, closing} {
		if got := f.state(r); got != Draining && got != Gone {
			t.Errorf("%s: %v; want Draining (or Gone)", r.id, got)
		}
	}
	if got := f.state(prov); got != Provisional {
		t.Errorf("provisional: %v; want left Provisional", got)
	}
	if f.Open(store.Session{ID: "new", TTL: testTTL}, f.clk.Now(), nil, "") {
		t.Error("Open succeeded during CloseAll")
	}
	if resp := f.liveBeat(t, prov, testTTL); resp.Live {
		t.Error("a Provisional session was extended during CloseAll")
	}
	if f.state(prov) != Provisional {
		t.Errorf("provisional: %v", f.state(prov))
	}
	resp := &lockdv1.KeepAliveResponse{}
	if !f.DrainAnswer(live, resp) || len(resp.Lost) != 1 {
		t.Fatalf("DrainAnswer = %v; want the pending notice", resp)
	}
	f.Unpin(mustAttach(t, f, "live", st, resp.Lost[0].NoticeId)) // ack
	if err := await(t, errc, "CloseAll returned"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Record{live, exp, closing} {
		if got := f.state(r); got != Gone {
			t.Errorf("%s after CloseAll: %v; want Gone", r.id, got)
		}
	}
	if f.DrainAnswer(live, resp) {
		t.Error("DrainAnswer on a Gone session")
	}
	f.Unpin(prov)
	if f.Len() != 0 {
		t.Errorf("%d records left", f.Len())
	}
}

// TestCloseAllLeavesUnsafe: a session whose client neither acknowledged
// nor ran out of trust is not closed when ctx ends (left to expire); one
// whose trust ran out is closed without an acknowledgement; a failed close
// is reported.
func TestCloseAllLeavesUnsafe(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	f.mu.Lock()
	r.locks["k"] = 1
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- f.CloseAll(ctx) }()
	awaitBlockedIn(t, "sessions.(*Table).CloseAll")
	cancel()
	if err := await(t, errc, "CloseAll returned"); err == nil || !strings.Contains(err.Error(), "left to expire") {
		t.Errorf("CloseAll = %v; want the sessions left to expire", err)
	}
	if _, c := f.be.calls(); c != 0 || f.state(r) != Draining {
		t.Errorf("closed %d, %v; want none closed, Draining", c, f.state(r))
	}

	g := newFixture(t)
	g.be.close = func(context.Context, store.SessionID) (int, error) { return 0, store.ErrUnavailable }
	q := g.open(t, "a")
	g.mu.Lock()
	q.locks["k"] = 1
	g.mu.Unlock()
	g.clk.Add(testTTL) // its trust ran out
	if err := g.CloseAll(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("CloseAll with a failing close = %v; want the error", err)
	}
	g.be.mu.Lock()
	by, rule, _ := telemetry.CallerOf(g.be.ctxs[0])
	g.be.mu.Unlock()
	if by != "" || rule != telemetry.RuleShutdown {
		t.Error("the shutdown's close was not recorded as the server's")
	}
}

// TestSweepRefilesExtended: a record extended since it was filed is filed
// again at its new deadline, not closed.
func TestSweepRefilesExtended(t *testing.T) {
	f := newFixture(t)
	r := f.open(t, "a")
	f.clk.Add(testTTL / 2)
	f.liveBeat(t, r, testTTL)
	f.clk.Add(testTTL / 2)
	if n := f.step(); n != 0 || f.state(r) != Live {
		t.Fatalf("closed %d, %v; want the extended record refiled", n, f.state(r))
	}
	f.mu.Lock()
	heapAt, expireAt := r.heapAt, r.expireAt
	f.mu.Unlock()
	if !heapAt.Equal(expireAt) {
		t.Errorf("heapAt %v; want its new expireAt %v", heapAt, expireAt)
	}
	if _, wait := f.sweep(); wait != testTTL/2 {
		t.Errorf("the loop would sleep %v; want %v", wait, testTTL/2)
	}
}

// TestSecretAndPrincipal: the record remembers a session's secret hash and
// principal; without a record nothing is remembered.
func TestSecretAndPrincipal(t *testing.T) {
	f := newFixture(t)
	f.open(t, "a")
	if h := f.SecretHash("a"); string(h) != "h" {
		t.Errorf("SecretHash = %q; want the one given at open", h)
	}
	if p, ok := f.Principal("a"); !ok || p != "p" {
		t.Errorf("Principal = %q, %v; want p", p, ok)
	}
	r := f.Pin("b")
	f.SetSecretHash("b", []byte("x"))
	f.SetPrincipal("b", "q")
	if string(f.SecretHash("b")) != "x" {
		t.Error("secret hash not remembered")
	}
	if p, ok := f.Principal("b"); !ok || p != "q" {
		t.Errorf("Principal = %q, %v; want q", p, ok)
	}
	f.Unpin(r)
	f.SetSecretHash("b", []byte("x"))
	f.SetPrincipal("b", "q")
	if f.SecretHash("b") != nil || slices.Contains([]bool{f.has("b")}, true) {
		t.Error("remembered without a record")
	}
	if _, ok := f.Principal("b"); ok {
		t.Error("principal remembered without a record")
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, what, cond)
}

// TestCloseAllConcurrent: CloseAll closes CloseAllConcurrency sessions on
// the store at once, never more. The backend's close holds each call until
// CloseAllConcurrency are in flight together, so closing one at a time
// (the code before issue 23's F3 fix: a flood of sessions overran the
// shutdown bound) never gets past the first and fails at the test's bound.
func TestCloseAllConcurrent(t *testing.T) {
	const sessions = 4 * CloseAllConcurrency
	f := newFixture(t)
	var (
		inflight, most atomic.Int32
		full           = make(chan struct{})
		fullOnce       sync.Once
	)
	f.be.close = func(ctx context.Context, _ store.SessionID) (int, error) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == CloseAllConcurrency {
			fullOnce.Do(func() { close(full) })
		}
		select {
		case <-full:
			return 0, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	for i := range sessions {
		f.open(t, store.SessionID(fmt.Sprintf("s%03d", i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // fails the one-at-a-time code
	defer cancel()
	if err := f.CloseAll(ctx); err != nil {
		first, _, _ := strings.Cut(err.Error(), "\n")
		t.Fatalf("CloseAll = %s … (at most %d closes in flight together); want every session closed, %d at once",
			first, most.Load(), CloseAllConcurrency)
	}
	if _, c := f.be.calls(); c != sessions || most.Load() != CloseAllConcurrency {
		t.Errorf("%d closes, at most %d in flight; want %d, at most %d", c, most.Load(), sessions, CloseAllConcurrency)
	}
	if f.Len() != 0 {
		t.Errorf("%d records left after CloseAll", f.Len())
	}
}
