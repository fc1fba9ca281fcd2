package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/internal/testing/pgtest"
	"lock.dev/lockd/internal/testing/testkit"
)

// The scenarios themselves run against real backends in the smoke test of
// `lockd bench` (internal/cli/bench_test.go); these tests cover the pure
// parts.

func TestMain(m *testing.M) { testkit.Main(pgtest.M{M: m}, []func(){etcdtest.Stop}) }

func TestMedian(t *testing.T) {
	inf := Value(math.Inf(1))
	for _, tc := range []struct {
		in   []Value
		want Value
	}{
		{[]Value{3}, 3},
		{[]Value{3, 1, 2}, 2},
		{[]Value{4, 1, 3, 2}, 2.5},
		{[]Value{1, inf, 2}, 2},
		{[]Value{1, inf}, inf},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := median(nil); !math.IsNaN(float64(got)) {
		t.Errorf("median(nil) = %v, want NaN", got)
	}
}

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want Value
	}{{50, 50}, {99, 99}, {100, 100}, {0.1, 1}} {
		if got := percentile(lat, tc.p); got != tc.want {
			t.Errorf("percentile(1..100 ms, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile([]time.Duration{1500 * time.Microsecond}, 99); got != 1.5 {
		t.Errorf("percentile of one 1.5ms sample = %v, want 1.5", got)
	}
}

func TestFairnessAndRatio(t *testing.T) {
	if got := fairness([]int{10, 11, 12}); got != 1.2 {
		t.Errorf("fairness(10,11,12) = %v, want 1.2", got)
	}
	if got := fairness([]int{5, 0}); !math.IsInf(float64(got), 1) {
		t.Errorf("fairness with a starved client = %v, want +Inf", got)
	}
	if r := ratio(3, 2); r == nil || *r != 1.5 {
		t.Errorf("ratio(3, 2) = %v, want 1.5", r)
	}
	for _, tc := range [][2]Value{{1, 0}, {Value(math.Inf(1)), 2}, {1, Value(math.Inf(1))}, {Value(math.NaN()), 1}} {
		if r := ratio(tc[0], tc[1]); r != nil {
			t.Errorf("ratio(%v, %v) = %v, want nil", tc[0], tc[1], *r)
		}
	}
}

func TestValueFormats(t *testing.T) {
	for _, tc := range []struct {
		v    Value
		want string
	}{{1234.4, "1234"}, {12.34, "12.3"}, {1.234, "1.23"}, {0.1234, "0.123"}, {20, "20"}, {Value(math.Inf(1)), "inf"}} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("Value(%v).String() = %q, want %q", float64(tc.v), got, tc.want)
		}
	}
	b, err := json.Marshal([]Value{1.5, Value(math.Inf(1))})
	if err != nil || string(b) != "[1.5,null]" {
		t.Errorf("json of [1.5, +Inf] = %s, %v; want [1.5,null]", b, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{Config{LockdCommand: []string{"lockd"}}, ""},
		{Config{Scenarios: []string{"distinct"}}, ""},
		{Config{}, "idle scenario needs the lockd executable"},
		{Config{Backend: "mysql", Scenarios: []string{"death"}}, `backend "mysql"`},
		{Config{Backend: BackendEtcd, Scenarios: []string{"death"}}, "needs the lockd executable"},
		{Config{Backend: BackendEtcd, Scenarios: []string{"death"}, LockdCommand: []string{"lockd"}}, ""},
		{Config{Backend: BackendEtcd, Scenarios: []string{"death"}, EtcdEndpoints: []string{"http://127.0.0.1:2379"}}, ""},
		{Config{Backend: BackendPG, Scenarios: []string{"death"}}, "PostgreSQL DSN"},
		{Config{Scenarios: []string{"nope"}}, `unknown scenario "nope"`},
		{Config{Scenarios: []string{"estimate"}}, ""},
		{Config{Scenarios: []string{"death"}, DistinctConcurrency: []int{0}}, "concurrency 0"},
		{Config{Scenarios: []string{"death"}, Duration: time.Millisecond}, "duration 1ms"},
		{Config{Scenarios: []string{"death"}, Rounds: -1}, "rounds -1"},
		{Config{Scenarios: []string{"death"}, DeathLocks: []int{1, 0}}, "death locks 0"},
		{Config{Scenarios: []string{"election"}, ElectionConcurrency: []int{2, 1}}, "election candidates 1"},
		{Config{Scenarios: []string{"semaphore"}, SemaphoreLimit: 1}, "semaphore limit 1"},
		{Config{Scenarios: []string{"semaphore"}, SemaphoreLimit: 1025}, "semaphore limit 1025"},
		{Config{Scenarios: []string{"semaphore"}, SemaphoreConcurrency: []int{0}}, "concurrency 0"},
		{Config{Scenarios: []string{"distinct"}, SDKs: []SDKWorker{{Name: "python", Command: []string{"py"}}}}, ""},
		{Config{Scenarios: []string{"death"}, SDKs: []SDKWorker{{Name: "python", Command: []string{"py"}}}}, "with the distinct scenario"},
		{Config{Scenarios: []string{"distinct"}, SDKs: []SDKWorker{{Name: "go-sdk", Command: []string{"x"}}}}, `sdk "go-sdk"`},
		{Config{Scenarios: []string{"distinct"}, SDKs: []SDKWorker{{Name: "python"}}}, `sdk "python"`},
		{Config{Scenarios: []string{"distinct"}, SDKConcurrency: []int{0}}, "sdk concurrency 0"},
		{Config{Backend: BackendEtcd, LockdCommand: []string{"lockd"}, Scenarios: []string{"distinct"}, StatsOffRows: true}, ""},
		{Config{Scenarios: []string{"distinct"}, StatsOffRows: true}, "stats-off rows need"},
		{Config{Backend: BackendEtcd, LockdCommand: []string{"lockd"}, Scenarios: []string{"distinct"}, StatsOffRows: true, InProcess: true},
			"stats-off rows need"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Validate(%+v) = %v, want nil", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Validate(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestParallel(t *testing.T) {
	var calls atomic.Int64
	if err := parallel(context.Background(), 100, 7, func(context.Context, int) error { calls.Add(1); return nil }); err != nil || calls.Load() != 100 {
		t.Errorf("parallel(100) = %v after %d calls, want nil after 100", err, calls.Load())
	}
	boom := errors.New("boom")
	calls.Store(0)
	err := parallel(context.Background(), 10000, 4, func(ctx context.Context, i int) error {
		calls.Add(1)
		if i == 10 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls.Load() >= 10000 {
		t.Errorf("parallel with a failing call = %v after %d calls, want boom and an early stop", err, calls.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := parallel(ctx, 10, 2, func(context.Context, int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("parallel on a cancelled context = %v, want context.Canceled", err)
	}
}

func TestProcReadings(t *testing.T) {
	pid := os.Getpid()
	cpu0, err := procCPU(pid)
	if err != nil {
		t.Fatalf("procCPU(self): %v", err)
	}
	for x, start := 0, time.Now(); time.Since(start) < 50*time.Millisecond; x++ {
		_ = x * x // burn some CPU
	}
	cpu1, err := procCPU(pid)
	if err != nil || cpu1 <= cpu0 {
		t.Errorf("procCPU(self) went from %v to %v (%v) after 50ms of work; want it to grow", cpu0, cpu1, err)
	}
	if st, err := procStatCPU(pid); err != nil || st <= 0 {
		t.Errorf("procStatCPU(self) = %v, %v; want > 0", st, err)
	}
	rss, peak, err := procRSS(pid)
	if err != nil || rss <= 0 || peak < rss {
		t.Errorf("procRSS(self) = %v, %v, %v; want 0 < rss <= peak", rss, peak, err)
	}
}

func TestCeilingShare(t *testing.T) {
	if got := ceilingShare(100, 400); got == nil || *got != 50 {
		t.Errorf("ceilingShare(100 pairs/s, 400 commits/s) = %v, want 50 (%%)", got)
	}
	if got := ceilingShare(100, Value(math.NaN())); got != nil {
		t.Errorf("ceilingShare without a ceiling = %v, want nil", *got)
	}
}

func TestFsyncCeiling(t *testing.T) {
	dir := t.TempDir()
	res, err := measureCeiling(context.Background(), fsyncCeiling(dir), 2, 50*time.Millisecond, "t")
	if err != nil || res.ops < 2 || len(res.perClient) != 2 || res.elapsed < 50*time.Millisecond {
		t.Fatalf("fsync ceiling = %+v, %v; want ops from both workers over at least 50ms", res, err)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("fsync ceiling left %v (%v) in its directory", left, err)
	}
	if fs := fsType(dir); fs == "" || strings.HasPrefix(fs, "unknown") {
		t.Errorf("fsType(%s) = %q, want a filesystem type", dir, fs)
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 5}
	for _, s := range []string{"abc", "defg", "h"} {
		if n, err := tb.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := tb.String(); got != "defgh" {
		t.Errorf("tail = %q, want %q", got, "defgh")
	}
}

func TestWriteTable(t *testing.T) {
	raw := Value(100)
	rep := &Report{
		Start:   time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Took:    "1m0s",
		Machine: Machine{Hostname: "h", NumCPU: 2, GOMAXPROCS: 2, GoVersion: "go1.26", OSArch: "linux/amd64"},
		Settings: Settings{Backend: "pg", BackendVersion: "PostgreSQL 15", Duration: "5s", Rounds: 3, Scenarios: Scenarios, SessionTTL: "15s", PGPoolMaxConns: 4, LockdPGMaxConns: 16,
			Durability: "pg fsync=on synchronous_commit=on wal_sync_method=fdatasync", DataDir: "/data", DataDirFS: "ext2/3/4 (statfs type 0xef53)"},
	}
	ceil := Value(4000)
	ceilRow := Row{Scenario: scCeiling, Concurrency: 64, Metric: MetricOpsPerSec, Lockd: Value(math.NaN()), Baseline: ceilPGInsert, Raw: &ceil}
	row := compare(scDistinct, 64, MetricPairsPerSec, sysPGRaw, 80, raw)
	row.LockdCeil, row.RawCeil = ceilingShare(80, ceil), ceilingShare(raw, ceil)
	row.Flags = []string{"raw<50%ceil"}
	ratioAtLeast(&row, 1.0)
	idle := compare(scIdle, 0, MetricCPU, sysEtcdSession, 3.5, 2)
	idle.N, idle.Note = 10000, "a note"
	lockdAtMost(&idle, 5)
	alsoRatioAtMost(&idle, 2.0)
	rep.Rows = []Row{ceilRow, row, idle}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "etcd-mutex") {
		t.Errorf("the legend of a pg run explains etcd-mutex:\n%s", out)
	}
	for _, want := range []string{
		"lockd bench  2026-01-02T03:04:05Z  (took 1m0s)\n",
		"nproc 2, GOMAXPROCS 2, go1.26 linux/amd64\n",
		"backend:   pg (PostgreSQL 15), lockd's pool 16 conns (lock.pg.max-conns), pgxpool default 4 conns (pg-raw-defpool)",
		"durable:   pg fsync=on synchronous_commit=on wal_sync_method=fdatasync\n",
		"data dir:  /data on ext2/3/4 (statfs type 0xef53)\n",
		"SCENARIO  C/N      METRIC           LOCKD  BASELINE      RAW   LOCKD/RAW  LOCKD%CEIL  RAW%CEIL  TARGET                     FLAGS\n",
		"ceiling   c=64     ops/s            -      pg-insert     4000  -          -           -         -                          -\n",
		"distinct  c=64     pairs/s          80     pg-raw        100   0.8        4%          5%        ratio>=1.0 MISSED          raw<50%ceil\n",
		"idle      N=10000  cpu % of a core  3.50   etcd-session  2     1.75       -           -         lockd<=5 & ratio<=2.0 met  -\n",
		"  pg-raw          raw PostgreSQL",
		"  pg-insert       ceiling:",
		"notes:\n  a note\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var back struct{ Rows []map[string]any }
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || len(back.Rows) != 3 || back.Rows[1]["ratio"] != 0.8 || back.Rows[1]["met"] != false ||
		back.Rows[1]["raw_ceiling_pct"] != 5.0 || back.Rows[0]["lockd"] != nil || back.Rows[0]["raw"] != 4000.0 {
		t.Errorf("json round trip = %+v, %v; want 3 rows: a ceiling row without lockd figure, raw 4000; a row with ratio 0.8, met false, raw at 5%% of the ceiling\n%s",
			back, err, b.String())
	}
}

// chanElector is an in-process election for testing the election load: a
// slot of capacity 1 held from campaign to resign. With overlap set it
// frees the slot as soon as it grants it, so two candidates lead at once:
// the load must refuse that (the control of its check).
type chanElector struct {
	slot    chan struct{}
	overlap bool
	mu      sync.Mutex
	next    uint64
	seen    []func(uint64)
}

func (e *chanElector) name() string { return "chan" }

func (e *chanElector) candidate(context.Context) (candidate, error) { return chanCandidate{e}, nil }

func (e *chanElector) observe(ctx context.Context, _ string, seen func(uint64)) error {
	e.mu.Lock()
	e.seen = append(e.seen, seen)
	e.mu.Unlock()
	<-ctx.Done()
	e.mu.Lock()
	e.seen = nil
	e.mu.Unlock()
	return nil
}

type chanCandidate struct{ e *chanElector }

func (c chanCandidate) campaign(ctx context.Context, _ string, _ []byte) (uint64, func(context.Context) error, error) {
	select {
	case c.e.slot <- struct{}{}:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	}
	if c.e.overlap {
		<-c.e.slot
	}
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.e.next++
	for _, seen := range c.e.seen {
		seen(c.e.next)
	}
	return c.e.next, func(context.Context) error {
		if !c.e.overlap {
			<-c.e.slot
		}
		return nil
	}, nil
}

func (chanCandidate) close(context.Context) error { return nil }

func TestElectionLoad(t *testing.T) {
	for _, c := range []int{2, 5} {
		el := &chanElector{slot: make(chan struct{}, 1)}
		res, err := measureElection(context.Background(), el, c, 50*time.Millisecond, "t")
		if err != nil {
			t.Fatalf("c=%d: %v", c, err)
		}
		if res.ops < 1 || len(res.lat) != res.ops || len(res.obsLat) != res.ops || res.observedPct() != 100 || res.elapsed < 50*time.Millisecond {
			t.Errorf("c=%d: %d hand-overs, %d latencies, %d observed (%v%%) in %v; want at least one, each with a latency, all observed, in at least 50ms",
				c, res.ops, len(res.lat), len(res.obsLat), res.observedPct(), res.elapsed)
		}
		for _, d := range slices.Concat(res.lat, res.obsLat) {
			if d <= 0 {
				t.Errorf("c=%d: latency %v, want > 0", c, d)
			}
		}
	}
	// The control: an election that lets two candidates lead at once.
	el := &chanElector{slot: make(chan struct{}, 1), overlap: true}
	if _, err := measureElection(context.Background(), el, 2, 50*time.Millisecond, "t"); err == nil || !strings.Contains(err.Error(), "two leaders at once") {
		t.Errorf("an election with two leaders at once: %v, want the load to refuse it", err)
	}
}

// chanSem is an in-process semaphore for testing the semaphore load: a
// channel of capacity slots, one element per holder.
type chanSem struct{ slots chan struct{} }

func (s *chanSem) name() string { return "chan" }

func (s *chanSem) slotHolder(context.Context) (slotHolder, error) { return chanSlotHolder{s}, nil }

type chanSlotHolder struct{ s *chanSem }

func (h chanSlotHolder) takeSlot(ctx context.Context, _ string, _ int) (func(context.Context) error, error) {
	select {
	case h.s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return func(context.Context) error { <-h.s.slots; return nil }, nil
}

func (chanSlotHolder) close(context.Context) error { return nil }

// barrier lets holders go on only in groups of n: the hold of the test's
// semaphore load, so that a group of n holds its slots at one moment
// whatever the scheduling.
type barrier struct {
	mu      sync.Mutex
	n, in   int
	release chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, release: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	b.in++
	rel := b.release
	if b.in == b.n {
		b.in, b.release = 0, make(chan struct{})
		close(rel)
	}
	b.mu.Unlock()
	select {
	case <-rel:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestSemaphoreLoad(t *testing.T) {
	const n = 3
	for _, c := range []int{n, 8} {
		sm := &chanSem{slots: make(chan struct{}, n)}
		holders := make([]slotHolder, c)
		for i := range holders {
			holders[i], _ = sm.slotHolder(context.Background())
		}
		res, err := semaphoreLoad(context.Background(), holders, n, newBarrier(n).wait, 10*time.Millisecond, 50*time.Millisecond, "t")
		if err != nil {
			t.Fatalf("c=%d: %v", c, err)
		}
		if res.ops < n || len(res.lat) != res.ops || res.most != n || len(res.perClient) != c || res.elapsed < 50*time.Millisecond {
			t.Errorf("c=%d: %d acquisitions, %d waits, most %d holders, %d clients in %v; want at least %d, a wait each, most %d, %d clients, at least 50ms",
				c, res.ops, len(res.lat), res.most, len(res.perClient), res.elapsed, n, n, c)
		}
	}
	// The control: a semaphore of n that admits n+1 (a channel of n+1),
	// whose holders hold in groups of n+1: the load must refuse it.
	sm := &chanSem{slots: make(chan struct{}, n+1)}
	holders := make([]slotHolder, 8)
	for i := range holders {
		holders[i], _ = sm.slotHolder(context.Background())
	}
	_, err := semaphoreLoad(context.Background(), holders, n, newBarrier(n+1).wait, 10*time.Millisecond, 50*time.Millisecond, "t")
	if err == nil || !strings.Contains(err.Error(), "4 holders of a semaphore of 3 at once") {
		t.Errorf("a semaphore of 3 admitting 4: %v, want the load to refuse it", err)
	}
}

func TestSlope(t *testing.T) {
	if got := slope([]Value{1, 5, 10}, []Value{3, 7, 12}); math.Abs(float64(got)-1) > 1e-9 {
		t.Errorf("slope of y = x + 2 = %v, want 1", got)
	}
	if got := slope([]Value{1, 5, 10}, []Value{5, 4, 3.2}); !(got < 0) {
		t.Errorf("slope of a falling line = %v, want < 0", got)
	}
	for _, xs := range [][]Value{{1}, {2, 2}} {
		if got := slope(xs, make([]Value, len(xs))); !math.IsNaN(float64(got)) {
			t.Errorf("slope over xs %v = %v, want NaN (no two distinct points)", xs, got)
		}
	}
}
