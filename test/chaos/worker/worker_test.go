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
	"lock.dev/lockd/internal/lockdtest"
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
			}
			h, err := history.ReadDir(dir, "*.jsonl")
			if err != nil {
				t.Fatal(err)
			}
			acquired := 0
			for _, op := range h {
				if op.Kind == history.Acquire && op.Outcome == history.OK {
					acquired++
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
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
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
