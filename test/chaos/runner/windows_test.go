package runner

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2/toxics"

	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

// fakeWorker starts a shell script that speaks the worker's protocol as
// w, with every line it prints that starts with "got " collected instead
// of handed to w (the script echoes what it reads that way).
type fakeWorker struct {
	w   *workerProc
	mu  sync.Mutex
	got []string
}

func startFake(t *testing.T, w *workerProc, script string) *fakeWorker {
	t.Helper()
	f := &fakeWorker{w: w}
	p, err := startProcess(w.proc, "/bin/sh", []string{"-c", script}, nil,
		filepath.Join(t.TempDir(), w.proc+".log"), func(l string) string {
			if v, ok := strings.CutPrefix(l, "got "); ok {
				f.mu.Lock()
				f.got = append(f.got, v)
				f.mu.Unlock()
				return ""
			}
			return w.onLine(l)
		})
	if err != nil {
		t.Fatal(err)
	}
	w.p = p
	t.Cleanup(func() { p.kill() })
	return f
}

func (f *fakeWorker) lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.got)
}

func TestSuperseded(t *testing.T) {
	const since = 100
	at := func(key, writer, mode string, token uint64, t int64) fenced.Write {
		return fenced.Write{Key: key, Writer: writer, Mode: mode, Token: token, At: t}
	}
	for _, tc := range []struct {
		name   string
		writes []fenced.Write
		mode   string
		want   bool
	}{
		{"none", nil, "plain", false},
		{"another grant above it", []fenced.Write{at("k", "w1", "", 6, 150)}, "plain", true},
		{"before the pause", []fenced.Write{at("k", "w1", "", 6, 50)}, "plain", false},
		{"its own writer", []fenced.Write{at("k", "w0", "", 6, 150)}, "plain", false},
		{"another key", []fenced.Write{at("k2", "w1", "", 6, 150)}, "plain", false},
		{"a lower token", []fenced.Write{at("k", "w1", "", 4, 150)}, "plain", false},
		{"a slot above it", []fenced.Write{at("k", "w1", fenced.ModeSlot, 6, 150)}, fenced.ModeSlot, true},
		{"a reader after a reader", []fenced.Write{at("k", "w1", fenced.ModeShared, 6, 150)}, fenced.ModeShared, false},
		{"a writer after a reader", []fenced.Write{at("k", "w1", fenced.ModeShared, 6, 150),
			at("k", "w2", fenced.ModeExclusive, 7, 160)}, fenced.ModeShared, true},
		{"a reader after a writer", []fenced.Write{at("k", "w1", fenced.ModeShared, 6, 150)}, fenced.ModeExclusive, true},
	} {
		if got := superseded(tc.writes, "w0", "k", 5, tc.mode, since); got != tc.want {
			t.Errorf("%s: superseded = %v; want %v", tc.name, got, tc.want)
		}
	}
}

// TestPauseLastsUntilSuperseded: a paused holder is resumed only once the
// fenced resource has accepted another grant's write above its own, however
// long after twice the TTL that comes (on the old runner it was resumed at
// twice the TTL whatever had happened, and its late write could find
// nobody had taken the key over).
func TestPauseLastsUntilSuperseded(t *testing.T) {
	clock := history.NewClock(time.Now())
	fs, err := fenced.Start(fenced.Config{CheckTokens: true, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	const ttl = 100 * time.Millisecond
	r := &run{spec: Spec{Name: "t", Fault: PauseHolder}, opts: Options{TTL: ttl}, clock: clock, fenced: fs,
		lastHold: map[string]int64{}}
	w := &workerProc{proc: "w0", state: "free", onHold: r.sawHold}
	// The worker holds only when told to start, after the runner armed its
	// trigger: a hold line read before that is answered "go" at once and
	// never paused (the test then waited for a pause that could not come,
	// seen on a loaded clean-clone CI run).
	f := startFake(t, w, `read s
echo hold k 5 1 plain -
read a; echo got $a
exec sleep 60`)
	r.workers = []*workerProc{w}

	errc := make(chan error, 1)
	go func() { errc <- r.pauseHolderWith(context.Background(), r.targets, nil, nil) }()
	testkit.Eventually(t, 10*time.Second, "the runner armed its pause trigger", func() bool { return w.trig.Load() != nil })
	w.p.answer("start")
	testkit.Eventually(t, 10*time.Second, "the holder paused", w.isStopped)
	paused := time.Now()

	// Writes that do not supersede the paused grant (token 5 of w0 on k).
	for _, wr := range []struct {
		key, writer string
		token       uint64
	}{{"k", "w0", 9}, {"k2", "w1", 10}} {
		if _, _, ok := fs.Accept(wr.key, wr.writer, wr.token); !ok {
			t.Fatalf("write %+v refused", wr)
		}
	}
	// Ten TTLs: the old runner resumed it after two.
	for time.Since(paused) < 10*ttl {
		if !w.isStopped() || len(f.lines()) > 0 {
			t.Fatalf("the holder was resumed %v after its pause (twice the TTL is %v) with no write above its own accepted; read %q",
				time.Since(paused).Round(time.Millisecond), 2*ttl, f.lines())
		}
		time.Sleep(10 * time.Millisecond) // observing that nothing happens for a while
	}
	if _, _, ok := fs.Accept("k", "w1", 10); !ok {
		t.Fatal("the successor's write was refused")
	}
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the pause did not end after a successor's write")
	}
	testkit.Eventually(t, 10*time.Second, "the resumed holder read its answer", func() bool {
		return slices.Equal(f.lines(), []string{"go"})
	})
	if len(r.pauses) != 1 || r.pauses[0].Until-r.pauses[0].At < int64(10*ttl) {
		t.Errorf("pauses recorded %+v; want one of at least %v", r.pauses, 10*ttl)
	}
}

// TestHoldBarrier: a barrier for two keeps the first holder's answer until
// a second holds, then answers both; a hold after it opened is answered at
// once.
func TestHoldBarrier(t *testing.T) {
	const script = `read s
echo hold k 1 1 slot -
read a; echo got $a
exec sleep 60`
	var fs []*fakeWorker
	var ws []*workerProc
	for _, name := range []string{"w0", "w1", "w2"} {
		w := &workerProc{proc: name, state: "free"}
		fs = append(fs, startFake(t, w, script))
		ws = append(ws, w)
	}
	b := newHoldBarrier(2)
	b.arm(ws)
	ws[0].p.answer("start")
	testkit.Eventually(t, 10*time.Second, "w0's hold kept", func() bool { return b.count() == 1 })
	got, err := b.wait(context.Background(), 200*time.Millisecond)
	if err != nil || got != 1 {
		t.Fatalf("wait with one holder = %d, %v; want 1 after the timeout", got, err)
	}
	if l := fs[0].lines(); len(l) != 0 {
		t.Fatalf("w0 was answered %q before a second worker held", l)
	}
	ws[1].p.answer("start")
	if got, err := b.wait(context.Background(), 10*time.Second); err != nil || got != 2 {
		t.Fatalf("wait = %d, %v; want 2", got, err)
	}
	b.open(ws)
	for i := range 2 {
		testkit.Eventually(t, 10*time.Second, ws[i].proc+" answered", func() bool {
			return slices.Equal(fs[i].lines(), []string{"go"})
		})
	}
	ws[2].p.answer("start") // after open: answered by its reader at once
	testkit.Eventually(t, 10*time.Second, "w2 answered", func() bool { return slices.Equal(fs[2].lines(), []string{"go"}) })
	if b.count() != 2 {
		t.Errorf("the barrier holds %d workers; want 2 (none joins after open)", b.count())
	}
}

// TestGateHoldsUpstream: a held link keeps every byte sent through it,
// drops none, and delivers them in order on release.
func TestGateHoldsUpstream(t *testing.T) {
	registerFar.Do(func() { toxics.Register("chaos_far", new(farToxic)) })
	const link = "gate-test"
	px, err := newProxy(link, echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	g := &farLink{name: link, px: px, act: activityOf(link)}
	defer g.close()
	js := `{"name":"gate_upstream","type":"chaos_far","stream":"upstream","toxicity":1,` +
		`"attributes":{"link":"gate-test","latency":0,"observe":""}}`
	if _, err := px.p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", px.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, "open", 5*time.Second); err != nil {
		t.Fatalf("round trip through the open gate: %v", err)
	}
	g.act.hold()
	var ne net.Error
	if err := roundTrip(c, r, "held1", 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("round trip through the held gate: %v; want a timeout", err)
	}
	if err := c.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("held2\n")); err != nil {
		t.Fatal(err)
	}
	g.act.release()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"held1\n", "held2\n"} {
		if got, err := r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("after release read %q, %v; want %q", got, err, want)
		}
	}
	if err := roundTrip(c, r, "after", 5*time.Second); err != nil {
		t.Errorf("round trip after release: %v", err)
	}
}

// TestLinkAnswered: the far-holder pause waits until the answer to the
// last request was delivered, not only until the request's round trip has
// passed (the old rule, "sent nothing for the round trip + 100 ms", took a
// slow answer still on its way for an answered one).
func TestLinkAnswered(t *testing.T) {
	const rtt, apply = 600 * time.Millisecond, 100 * time.Millisecond
	now := time.Now()
	for _, tc := range []struct {
		name     string
		up, down time.Duration // how long ago the last chunk went up, came down
		want     bool
	}{
		{"answered and applied", 900 * time.Millisecond, 200 * time.Millisecond, true},
		{"sent a moment ago", 100 * time.Millisecond, 500 * time.Millisecond, false},
		{"round trip passed, answer not delivered", 800 * time.Millisecond, 900 * time.Millisecond, false},
		{"answer delivered just now", 800 * time.Millisecond, 50 * time.Millisecond, false},
	} {
		a := &linkActivity{stopped: make(chan struct{})}
		a.saw(now.Add(-tc.up), false)
		a.saw(now.Add(-tc.down), true)
		if got, sent := a.answered(rtt, apply); got != tc.want || !sent.Equal(now.Add(-tc.up)) {
			t.Errorf("%s: answered = %v, %v; want %v, the last send", tc.name, got, sent, tc.want)
		}
	}
}

// TestTrustEnded: the far-holder pause skips a hold whose trust already
// ended, which the worker's history shows as a lost op of that grant (a
// pause of it once hit a worker holding nothing: "it held no key then").
func TestTrustEnded(t *testing.T) {
	dir := t.TempDir()
	clock := history.NewClock(time.Now())
	rec, err := history.Create(filepath.Join(dir, "w0.jsonl"), "w0", clock)
	if err != nil {
		t.Fatal(err)
	}
	call := rec.Invoke(history.Acquire, "k", 0)
	rec.Complete(call, history.OK, 5, nil)
	r := &run{histDir: dir}
	w := &workerProc{proc: "w0"}
	if r.trustEnded(w, "k", 5) {
		t.Error("trustEnded before any lost op: true; want false")
	}
	rec.Lost("k", 5, time.Now())
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	if !r.trustEnded(w, "k", 5) {
		t.Error("trustEnded after the grant's lost op: false; want true")
	}
	if r.trustEnded(w, "k", 6) || r.trustEnded(w, "k2", 5) {
		t.Error("trustEnded for another grant: true; want false")
	}
}
