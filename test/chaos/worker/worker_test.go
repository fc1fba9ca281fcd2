package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"lock.dev/lockd/client"
	"lock.dev/lockd/internal/telemetry"
	"lock.dev/lockd/internal/testing/lockdtest"
	"lock.dev/lockd/internal/testing/testkit"
	"lock.dev/lockd/store"
	"lock.dev/lockd/test/chaos/check"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
)

func TestMain(m *testing.M) { lockdtest.Main(m) }

// lines collects a worker's state lines.
type lines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWorkersAgainstRealServer runs three workers in this process (one on
// a fast SDK clock, one on a slow one) against a real lockd over each
// backend for a moment and checks that what they recorded passes every
// checker.
func TestWorkersAgainstRealServer(t *testing.T) {
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
			epoch := time.Now()
			fs, err := fenced.Start(fenced.Config{CheckTokens: true, Clock: history.NewClock(epoch)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fs.Close() })
			dir := t.TempDir()
			keys := []string{"wt/" + backend + "/a", "wt/" + backend + "/b"}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			scales := []float64{1, 1.5, 0.85}
			outs := make([]*lines, len(scales))
			errs := make([]error, len(scales))
			var wg sync.WaitGroup
			for i, scale := range scales {
				outs[i] = &lines{}
				cfg := Config{
					Proc:        fmt.Sprintf("w%d", i),
					Lockd:       []string{srv.Addr},
					FencedURL:   fs.URL(),
					HistoryPath: filepath.Join(dir, fmt.Sprintf("w%d.jsonl", i)),
					Epoch:       epoch,
					Keys:        keys,
					HoldMin:     5 * time.Millisecond,
					HoldMax:     20 * time.Millisecond,
					ClockScale:  scale,
					Seed:        uint64(i),
				}
				wg.Add(1)
				go func() { // returns when ctx ends and the worker has finished its grant
					defer wg.Done()
					errs[i] = Run(ctx, cfg, outs[i])
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for i, out := range outs {
				s := out.String()
				if !strings.Contains(s, "wait ") || !strings.Contains(s, "hold ") || !strings.Contains(s, "free ") {
					t.Errorf("worker %d printed %q; want wait, hold and free lines", i, s)
				}
				// Every hold line names the replica the grant came through,
				// every wait line the session the acquire was sent in (the
				// harness finds it among lockd's waiters).
				for _, line := range strings.Split(s, "\n") {
					f := strings.Fields(line)
					if len(f) > 0 && f[0] == "hold" && (len(f) != 6 || f[3] != "1" || f[4] != "plain" || f[5] != srv.Addr) {
						t.Errorf("worker %d: hold line %q; want hold KEY TOKEN 1 plain %s", i, line, srv.Addr)
					}
					if len(f) > 0 && f[0] == "wait" && (len(f) != 3 || f[2] == "") {
						t.Errorf("worker %d: wait line %q; want wait KEY SESSION", i, line)
					}
				}
			}
			h, err := history.ReadDir(dir, "*.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			acquired := 0
			first := map[string]history.Op{} // proc → its first op
			for _, op := range h {
				if _, ok := first[op.Proc]; !ok {
					first[op.Proc] = op
				}
				if op.Kind == history.Acquire && op.Outcome == history.OK {
					acquired++
				}
			}
			// Each worker first opened its session, for the key of its
			// first acquire (its second op).
			for proc, op := range first {
				var next history.Op
				for _, o := range h {
					if o.Proc == proc && o.Seq == op.Seq+1 {
						next = o
					}
				}
				if op.Kind != history.Open || op.Outcome != history.OK || next.Kind != history.Acquire || next.Key != op.Key {
					t.Errorf("%s began with %v then %v; want an ok open of the key its first acquire asks for", proc, op, next)
				}
			}
			if acquired < 3 {
				t.Errorf("%d acquisitions recorded; want several", acquired)
			}
			writes := fs.Writes()
			if len(writes) < acquired {
				t.Errorf("%d writes accepted for %d grants; want at least one per grant", len(writes), acquired)
			}
			for _, res := range []check.Result{check.FencedSafety(writes), check.OverlappingWriters(writes),
				check.Linearizable(h, check.LinOptions{}), check.NoTrustedOverlap(h), check.TokensIncrease(h)} {
				if !res.OK() {
					t.Errorf("%s", res)
				}
			}
		})
	}
}

// TestSessionOpensAreWants: a worker whose lockd cannot open sessions (its
// store refuses every open as unavailable, the SDK retries) records no
// acquire, only its open attempt, for the key it asks for next: the recovery
// checker sees the want from that open, not granted. Once opens work
// again it acquires that key, and its want dates from the open. With
// opens unrecorded, the history held nothing here and the checker saw no
// want.
func TestSessionOpensAreWants(t *testing.T) {
	var faulty *lockdtest.Faulty
	srv := lockdtest.StartBackend(t, lockdtest.Backends[0], lockdtest.Options{NoClient: true,
		Wrap: func(st store.LockStore) store.LockStore { faulty = lockdtest.NewFaulty(st); return faulty }})
	faulty.Fail(telemetry.OpOpenSession, store.ErrUnavailable)
	epoch := time.Now()
	clock := history.NewClock(epoch)
	fs, err := fenced.Start(fenced.Config{CheckTokens: true, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	dir := t.TempDir()
	path := filepath.Join(dir, "w0.jsonl")
	keys := []string{"wo/a", "wo/b"}
	win := []check.Window{{Fault: "no-open", Start: 0, End: clock.Now()}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lines{}
	done := make(chan error, 1)
	go func() { // returns when ctx ends and the worker has finished its grant
		done <- Run(ctx, Config{Proc: "w0", Lockd: []string{srv.Addr}, FencedURL: fs.URL(), HistoryPath: path,
			Epoch: epoch, Keys: keys, HoldMin: 5 * time.Millisecond, HoldMax: 5 * time.Millisecond, Seed: 7}, out)
	}()

	// Opens fail: the worker's history holds its open, in flight, and no
	// acquire. The recovery checker sees the key wanted and not granted.
	var cut history.History
	testkit.Eventually(t, 10*time.Second, "an open recorded", func() bool {
		cut, err = history.ReadFiles(path)
		return err == nil && len(cut) > 0
	})
	for _, op := range cut {
		if op.Kind != history.Open || op.Key != cut[0].Key || op.Outcome == history.OK {
			t.Fatalf("while opens fail the worker recorded %v; want only failed or pending opens of one key, got %v", op, cut)
		}
	}
	want, from := cut[0].Key, cut[0].Invoke // the worker started after the fault's end
	rgs := check.Regrants(cut, win)
	if len(rgs) != 1 || rgs[0].Key != want || rgs[0].Granted || rgs[0].Waiter != "w0" || rgs[0].From != from {
		t.Fatalf("Regrants while opens fail = %+v; want %q wanted by w0 from its open at %s, not granted",
			rgs, want, history.FormatTime(from))
	}

	// Opens work again: the session opens and the worker acquires the key
	// its open named; its want dates from the (first) open, not from the
	// acquire.
	faulty.Fail(telemetry.OpOpenSession, nil)
	testkit.Eventually(t, 10*time.Second, "a grant", func() bool { return strings.Contains(out.String(), "hold ") })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	h, err := history.ReadFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	var acq history.Op
	opened := false
	for _, op := range h {
		switch {
		case op.Kind == history.Open && op.Outcome == history.OK && acq.Kind == "":
			opened = op.Key == want
		case op.Kind == history.Acquire && acq.Kind == "":
			acq = op
		}
	}
	if !opened || acq.Key != want || acq.Outcome != history.OK {
		t.Fatalf("history %v: want an ok open of %q, then a granted acquire of it", h, want)
	}
	rgs = check.Regrants(h, win)
	var rg check.Regrant
	for _, r := range rgs {
		if r.Key == want {
			rg = r
		}
	}
	if !rg.Granted || rg.From != from || rg.To != acq.Complete || rg.Delay() <= time.Duration(acq.Complete-acq.Invoke) {
		t.Fatalf("Regrants = %+v; want %q wanted from its first open (%s), granted at %s, longer than the acquire alone",
			rgs, want, history.FormatTime(from), history.FormatTime(acq.Complete))
	}
}

func TestScaledClock(t *testing.T) {
	c := newScaledClock(2)
	start := c.Now()
	time.Sleep(20 * time.Millisecond)
	if got := c.Now().Sub(start); got < 40*time.Millisecond {
		t.Errorf("a ×2 clock advanced %v in 20ms of real time; want at least 40ms", got)
	}
	// real() inverts the scaling.
	fake := c.base.Add(10 * time.Second)
	if got := c.real(fake).Sub(c.base); got != 5*time.Second {
		t.Errorf("real(base+10s) on a ×2 clock = base+%v; want base+5s", got)
	}
	fired := make(chan time.Time, 1)
	begin := time.Now()
	c.AfterFunc(40*time.Millisecond, func() { fired <- time.Now() })
	select {
	case at := <-fired:
		if d := at.Sub(begin); d < 20*time.Millisecond || d > 2*time.Second {
			t.Errorf("AfterFunc(40ms) on a ×2 clock fired after %v of real time; want about 20ms", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc never fired")
	}
}

func TestOutcomes(t *testing.T) {
	for _, tc := range []struct {
		err              error
		acquire, release history.Outcome
	}{
		{nil, history.Unknown, history.OK},
		{client.ErrInvalidArgument, history.Fail, history.Fail},
		{fmt.Errorf("release: %w", client.ErrNotOwner), history.Unknown, history.Fail},
		{client.ErrSessionExpired, history.Unknown, history.Unknown},
		{fmt.Errorf("x: %w", client.ErrSessionDead), history.Unknown, history.Unknown},
		{errors.Join(context.DeadlineExceeded, client.ErrUnavailable), history.Unknown, history.Unknown},
	} {
		if tc.err != nil {
			if got := acquireOutcome(tc.err); got != tc.acquire {
				t.Errorf("acquireOutcome(%v) = %s; want %s", tc.err, got, tc.acquire)
			}
		}
		if got := releaseOutcome(tc.err); got != tc.release {
			t.Errorf("releaseOutcome(%v) = %s; want %s", tc.err, got, tc.release)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{Proc: "w1", Lockd: []string{"a"}, FencedURL: "http://x", HistoryPath: "h", Keys: []string{"k"},
		Epoch: time.Now()}
	if err := good.validate(); err != nil || good.Trust != TrustSDK {
		t.Errorf("validate(good) = %v, trust %q; want nil, %q", err, good.Trust, TrustSDK)
	}
	bad := good
	bad.Keys, bad.HoldMin, bad.Trust = nil, time.Second, "nope"
	err := bad.validate()
	for _, want := range []string{"key", "hold", "trust"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validate(bad) = %v; want it to mention %q", err, want)
		}
	}
	if got := ParseList(" a, ,b,"); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("ParseList = %q; want [a b]", got)
	}
}

// TestMultiWorkersAgainstRealServer: three workers on a semaphore of 2 and
// three on a read/write lock, in this process, against a real lockd over
// each backend. What they recorded passes the multi checkers with the keys'
// kinds, and fails them with the kinds of plain locks: the semaphore did
// admit two holders at once, and readers did share.
func TestMultiWorkersAgainstRealServer(t *testing.T) {
	for _, backend := range lockdtest.Backends {
		t.Run(backend, func(t *testing.T) {
			srv := lockdtest.StartBackend(t, backend, lockdtest.Options{NoClient: true})
			c, err := client.New(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			epoch := time.Now()
			fs, err := fenced.Start(fenced.Config{CheckTokens: true, Clock: history.NewClock(epoch),
				SlotHolders: func(ctx context.Context, key string) ([]uint64, error) {
					info, err := c.Inspect(ctx, key)
					var toks []uint64
					for _, h := range info.Holders {
						toks = append(toks, h.Token)
					}
					return toks, err
				}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fs.Close() })
			dir := t.TempDir()
			sem, rw := "mwt/"+backend+"/sem", "mwt/"+backend+"/rw"
			// The workers run until the fenced resource has seen the grants
			// the checks below need (a loaded machine makes fewer in a
			// fixed time), within a bound far above the quiet ~1 s.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs := make([]error, 6)
			var wg sync.WaitGroup
			for i := range 6 {
				cfg := Config{
					Proc:        fmt.Sprintf("w%d", i),
					Lockd:       []string{srv.Addr},
					FencedURL:   fs.URL(),
					HistoryPath: filepath.Join(dir, fmt.Sprintf("w%d.jsonl", i)),
					Epoch:       epoch,
					Keys:        []string{sem},
					Limit:       2,
					HoldMin:     20 * time.Millisecond,
					HoldMax:     60 * time.Millisecond,
					Seed:        uint64(i),
				}
				if i >= 3 {
					cfg.Keys, cfg.Limit, cfg.RW = []string{rw}, 0, true
				}
				wg.Add(1)
				go func() { // returns when ctx ends and the worker has finished its grant
					defer wg.Done()
					errs[i] = Run(ctx, cfg, io.Discard)
				}()
			}
			testkit.Eventually(t, time.Minute, "writes under 3 slot, 3 shared and 1 exclusive grants", func() bool {
				grants := map[string]map[uint64]bool{}
				for _, w := range fs.Writes() {
					if grants[w.Mode] == nil {
						grants[w.Mode] = map[uint64]bool{}
					}
					grants[w.Mode][w.Token] = true
				}
				return len(grants[fenced.ModeSlot]) >= 3 && len(grants[fenced.ModeShared]) >= 3 && len(grants[fenced.ModeExclusive]) >= 1
			})
			cancel()
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("Run: %v", err)
			}
			h, err := history.ReadDir(dir, "*.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			modes := map[string]int{}
			for _, op := range h {
				if op.Kind == history.Acquire && op.Outcome == history.OK {
					modes[op.Mode]++
				}
			}
			if modes[fenced.ModeSlot] < 3 || modes[fenced.ModeShared] < 3 || modes[fenced.ModeExclusive] < 1 || len(modes) != 3 {
				t.Errorf("grants by mode %v; want several slots, shared and exclusive grants and nothing else", modes)
			}
			writes := fs.Writes()
			kinds := map[string]check.Kind{sem: {Limit: 2}, rw: {RW: true}}
			for _, res := range []check.Result{check.FencedSafety(writes), check.TooManyWriters(writes, kinds),
				check.TooManyTrusted(h, kinds), check.TokensIncrease(h)} {
				if !res.OK() {
					t.Errorf("%s", res)
				}
			}
			plain := map[string]check.Kind{}
			if res := check.TooManyTrusted(h, plain); res.Violations == 0 {
				t.Errorf("as plain locks: %s\nwant overlaps (two slots, shared readers)", res)
			}
		})
	}
}
