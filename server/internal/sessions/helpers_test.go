package sessions

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/testkit"
	lockdv1 "lock.dev/lockd/proto/lockd/v1"
	"lock.dev/lockd/store"
)

func TestMain(m *testing.M) { testkit.Main(m, nil) }

// clock is the fake clock of the tests: it moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// backend is a Backend whose answers the test sets; it records the calls.
type backend struct {
	mu      sync.Mutex
	expire  func(id store.SessionID) (store.Expiry, error)
	close   func(ctx context.Context, id store.SessionID) (int, error)
	locksOf func(id store.SessionID) ([]store.Grant, error)
	expires []store.SessionID
	closes  []store.SessionID
	ctxs    []context.Context // of CloseSession
}

func (b *backend) ExpireSession(_ context.Context, id store.SessionID) (store.Expiry, error) {
	b.mu.Lock()
	b.expires = append(b.expires, id)
	f := b.expire
	b.mu.Unlock()
	if f == nil {
		return store.Expiry{Ended: true}, nil
	}
	return f(id)
}

func (b *backend) CloseSession(ctx context.Context, id store.SessionID) (int, error) {
	b.mu.Lock()
	b.closes = append(b.closes, id)
	b.ctxs = append(b.ctxs, ctx)
	f := b.close
	b.mu.Unlock()
	if f == nil {
		return 0, nil
	}
	return f(ctx, id)
}

func (b *backend) LocksOf(_ context.Context, id store.SessionID) ([]store.Grant, error) {
	b.mu.Lock()
	f := b.locksOf
	b.mu.Unlock()
	if f == nil {
		return nil, nil
	}
	return f(id)
}

func (b *backend) calls() (expires, closes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.expires), len(b.closes)
}

// pushes records what a stream was sent.
type pushes struct {
	mu sync.Mutex
	rs []*lockdv1.KeepAliveResponse
}

func (p *pushes) push(r *lockdv1.KeepAliveResponse) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rs = append(p.rs, r)
	return true
}

func (p *pushes) all() []*lockdv1.KeepAliveResponse {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*lockdv1.KeepAliveResponse(nil), p.rs...)
}

// fixture is a table without its silence loop (the test runs sweep and
// closeSilent: step), over a fake backend and clock.
type fixture struct {
	*Table
	be   *backend
	clk  *clock
	lost []string // session_lost reasons reported
	lmu  sync.Mutex
}

const (
	testTTL    = 10 * time.Second
	testMaxTTL = time.Minute
)

func newFixture(t *testing.T, mod ...func(*Config)) *fixture {
	t.Helper()
	f := &fixture{be: &backend{}, clk: &clock{t: time.Unix(1_000_000, 0)}}
	cfg := Config{MaxTTL: testMaxTTL, MaxSessions: 100, MaxSessionOpens: 10, MaxLocksPerSession: 10,
		MaxSessionsPerStream: 10, Now: f.clk.Now,
		Lost: func(_ store.SessionID, reason string) {
			f.lmu.Lock()
			f.lost = append(f.lost, reason)
			f.lmu.Unlock()
		}}
	for _, m := range mod {
		m(&cfg)
	}
	f.Table = newTable(cfg, f.be)
	t.Cleanup(func() {
		f.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.badMoves != 0 {
			t.Errorf("%d moves refused by the transition table; want 0", f.badMoves)
		}
	})
	return f
}

func (f *fixture) lostReasons() []string {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	return append([]string(nil), f.lost...)
}

// step runs one round of the silence loop at the fake clock's now.
func (f *fixture) step() int {
	due, _ := f.sweep()
	for _, r := range due {
		f.closeSilent(r)
	}
	return len(due)
}

// open opens a session here (Live) with TTL and Remaining testTTL.
func (f *fixture) open(t *testing.T, id store.SessionID) *Record {
	t.Helper()
	if !f.Open(store.Session{ID: id, TTL: testTTL, Remaining: testTTL}, f.clk.Now(), []byte("h"), "p") {
		t.Fatalf("Open(%s) = false; want true", id)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recs[id]
}

func (f *fixture) state(r *Record) State { return f.StateOf(r) }

func (f *fixture) has(id store.SessionID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.recs[id] != nil
}

func (f *fixture) inHeap(r *Record) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.heapIdx >= 0
}

func (f *fixture) expireAt(r *Record) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.expireAt
}

// liveBeat answers a heartbeat of r as the store would for a live session
// with Remaining rem; it returns the reply.
func (f *fixture) liveBeat(t *testing.T, r *Record, rem time.Duration) *lockdv1.KeepAliveResponse {
	t.Helper()
	resp := &lockdv1.KeepAliveResponse{}
	mark := f.CloseMark(r)
	answer, err := f.Beat(context.Background(), r, mark, f.clk.Now(), store.Liveness{Live: true, Remaining: rem}, nil, resp)
	if !answer || err != nil {
		t.Fatalf("Beat = %v, %v; want an answer without error", answer, err)
	}
	return resp
}

// awaitBlockedIn waits until some goroutine's stack holds frame (a
// function name): the goroutine reached it and waits there.
func awaitBlockedIn(t *testing.T, frame string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, "a goroutine waiting in "+frame, func() bool {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		return strings.Contains(string(buf[:n]), frame)
	})
}

// await receives from ch, failing the test if nothing comes within 10s
// (a broken table must fail a test, not hang it).
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("not within 10s: %s", what)
		var zero T
		return zero
	}
}

// closeInFlight lets the fake clock reach the deadline of the session the
// fixture opened and runs the silence loop's round in a goroutine, whose
// ExpireSession waits until release is closed and then answers ex, err;
// it returns once that close is in flight (done closes when the round
// ended).
func (f *fixture) closeInFlight(t *testing.T, ex store.Expiry, err error) (release, done chan struct{}) {
	t.Helper()
	entered := make(chan struct{})
	release, done = make(chan struct{}), make(chan struct{})
	f.be.expire = func(store.SessionID) (store.Expiry, error) {
		close(entered)
		<-release
		return ex, err
	}
	f.clk.Add(testTTL)
	go func() { defer close(done); f.step() }()
	await(t, entered, "the close reached the backend")
	return release, done
}
