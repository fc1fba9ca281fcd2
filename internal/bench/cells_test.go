package bench

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/internal/testing/etcdtest"
	"lock.dev/lockd/store/etcdstore"
)

// idleSystem is a system that does no work: its acquire returns at once
// and commits nothing, so that it counts pairs at any rate it likes. The
// bench must refuse to measure it (the control of checkWork).
type idleSystem struct{}

func (idleSystem) name() string { return "idle-control" }

func (idleSystem) open(context.Context) (locker, error) { return idleSystem{}, nil }

func (idleSystem) acquire(context.Context, string) (func(context.Context) error, error) {
	return func(context.Context) error { return nil }, nil
}

func (idleSystem) close(context.Context) error { return nil }

// TestCellChecksWork measures one tiny distinct cell of etcd-txn and of a
// system that does no work against a real etcd: the first passes, the
// second is refused because etcd's revision did not move.
func TestCellChecksWork(t *testing.T) {
	cli, err := clientv3.New(etcdstore.ClientConfig(etcdtest.Endpoints(t), dialTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const dur = 50 * time.Millisecond
	r := &runner{cfg: Config{Duration: dur}, bed: &bed{backend: BackendEtcd, etcd: cli, run: "cellcheck"}, workerRetries: map[string]int64{}}
	ctx := context.Background()
	cell := func(sys system) (loadResult, error) {
		return r.cell(ctx, scDistinct, sys, 2, "cellcheck", func(ctx context.Context) (loadResult, error) {
			return measure(ctx, sys, 2, dur, "cellcheck", distinctLoad)
		})
	}
	txn := &etcdTxnSystem{cli: cli, prefix: "/" + t.Name() + "/"}
	if res, err := cell(txn); err != nil || res.ops < 2 {
		t.Fatalf("etcd-txn cell = %d pairs, %v; want at least one pair per client and no error", res.ops, err)
	}
	res, err := cell(idleSystem{})
	if err == nil || !strings.Contains(err.Error(), "a system that does no work is not measured") {
		t.Errorf("a system that does no work: %d pairs, %v; want the cell refused", res.ops, err)
	}
}

// TestCPUWindow meters this process over a distinct load's window: the
// window opens and closes once (not in the warm-up), and the load's pairs
// used CPU.
func TestCPUWindow(t *testing.T) {
	w := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	res, err := measure(withCPUWindow(context.Background(), w), idleSystem{}, 2, 50*time.Millisecond, "t", distinctLoad)
	if err != nil {
		t.Fatal(err)
	}
	used, err := w.used()
	if err != nil || used[roleClient] <= 0 {
		t.Fatalf("cpu used in the window = %v, %v; want the client's > 0", used, err)
	}
	res.cpu = used
	if v := cpuPerOp(res, roleClient); !(v > 0) || math.IsInf(float64(v), 0) {
		t.Errorf("cpu per pair = %v over %d pairs, want > 0", v, res.ops)
	}
	if v := cpuPerOp(res, roleServer); !math.IsNaN(float64(v)) {
		t.Errorf("cpu per pair of an unmetered role = %v, want NaN", v)
	}
	unmetered := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	windowOpened(withoutCPUWindow(withCPUWindow(context.Background(), unmetered)))
	if _, err := unmetered.used(); err == nil {
		t.Errorf("a window opened under withoutCPUWindow was metered")
	}
}

// slowLocker grants every acquire after d, and never blocks a release: a
// system slower than the bench's window.
type slowLocker struct{ d time.Duration }

func (l slowLocker) acquire(ctx context.Context, _ string) (func(context.Context) error, error) {
	select {
	case <-time.After(l.d):
		return func(context.Context) error { return nil }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (slowLocker) close(context.Context) error { return nil }

// TestWindowOpensAtItsEvent: a window opens at its first event, which it
// counts, and its CPU is metered for at least its duration even when the
// event's goroutine reads the clocks a second after the event (a loaded
// machine); a system slower than the window still has its one grant
// counted. (The window used to open when its controller goroutine ran: run
// 100 ms late, it closed at once and metered no CPU for the grants it
// counted, "lockd figure 0"; opened at that reading instead, it counted no
// grant of a slow system, "hand-overs/s: lockd figure 0".)
func TestWindowOpensAtItsEvent(t *testing.T) {
	w := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	ctx, cancel := context.WithCancelCause(withCPUWindow(context.Background(), w))
	defer cancel(nil)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	const dur = 50 * time.Millisecond
	win := startWindow(ctx, cancel, wcancel, dur, "event")
	at := time.Now().Add(-time.Second)
	opened := time.Now()
	win.open(ctx, at)
	win.open(ctx, time.Now()) // a later event: the window is open already
	<-win.done
	if err := context.Cause(ctx); err != nil {
		t.Fatal(err)
	}
	if !win.start.Equal(at) || win.end.Sub(opened) < dur {
		t.Errorf("window from %v to %v after the clocks were read; want it to start at the event (%v) and end at least %v after the reading",
			win.start.Sub(opened), win.end.Sub(opened), at.Sub(opened), dur)
	}
	if wctx.Err() == nil {
		t.Error("the window's end did not end its context")
	}
	if _, err := w.used(); err != nil {
		t.Errorf("the window was not metered: %v", err)
	}

	slow := []locker{slowLocker{3 * dur}, slowLocker{3 * dur}}
	res, err := contendedLoad(withCPUWindow(context.Background(), &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}),
		slow, 0, dur, "slow")
	if err != nil || res.ops < 1 {
		t.Errorf("a system slower than the window: %d grants, %v; want its first grant counted", res.ops, err)
	}
}

// TestCPURows checks the CPU rows' arithmetic: per operation, lockd's
// server and clients summed against the baseline's clients, the backend
// alone, and the target on the primary baseline.
func TestCPURows(t *testing.T) {
	ms := time.Millisecond
	res := map[string][]loadResult{
		sysLockd:   {{ops: 10, cpu: map[string]time.Duration{roleServer: 2 * ms, roleClient: ms, roleBackend: 4 * ms}}},
		sysEtcdTxn: {{ops: 20, cpu: map[string]time.Duration{roleClient: 2 * ms, roleBackend: 2 * ms}}},
	}
	rows := cpuRows(scDistinct, 8, res, []string{sysLockd, sysEtcdTxn}, sysEtcdTxn, 2.0)
	want := []struct {
		metric     string
		lockd, raw Value
		target     string
	}{
		{MetricServerCPUPerOp, 200, -1, ""},
		{MetricCPUPerOp, 300, 100, "ratio<=2.0"},
		{MetricClientCPUPerOp, 100, 100, ""},
		{MetricBackendCPUPerOp, 400, 100, ""},
	}
	if len(rows) != len(want) {
		t.Fatalf("cpu rows = %+v, want %d rows", rows, len(want))
	}
	for i, w := range want {
		r := rows[i]
		raw := Value(-1)
		if r.Raw != nil {
			raw = *r.Raw
		}
		if r.Metric != w.metric || r.Lockd != w.lockd || raw != w.raw || r.Target != w.target {
			t.Errorf("row %d = %s lockd %v raw %v target %q; want %s lockd %v raw %v target %q", i, r.Metric, r.Lockd, raw, r.Target,
				w.metric, w.lockd, w.raw, w.target)
		}
	}
	if rows[1].Met == nil || *rows[1].Met {
		t.Errorf("cpu µs/op 3x raw: met = %v, want missed", rows[1].Met)
	}
	if got := perSessionSecond(50, 1000); got != 500 {
		t.Errorf("half a core over 1000 sessions = %v µs per session-second, want 500", got)
	}
	// lockd-nostats is lockd: its server and clients against lockd's,
	// and a server row of its own.
	res[sysLockdNoStats] = []loadResult{{ops: 10, cpu: map[string]time.Duration{roleServer: ms, roleClient: ms, roleBackend: 4 * ms}}}
	rows = cpuRows(scDistinct, 8, res, []string{sysLockd, sysLockdNoStats}, sysEtcdTxn, 2.0)
	want = []struct {
		metric     string
		lockd, raw Value
		target     string
	}{
		{MetricServerCPUPerOp, 200, -1, ""},
		{MetricServerCPUPerOp, 200, 100, ""},
		{MetricCPUPerOp, 300, 200, ""},
		{MetricClientCPUPerOp, 100, 100, ""},
		{MetricBackendCPUPerOp, 400, 400, ""},
	}
	if len(rows) != len(want) {
		t.Fatalf("lockd-nostats: cpu rows = %+v, want %d rows", rows, len(want))
	}
	for i, w := range want {
		r := rows[i]
		raw := Value(-1)
		if r.Raw != nil {
			raw = *r.Raw
		}
		if r.Metric != w.metric || r.Lockd != w.lockd || raw != w.raw || r.Target != w.target {
			t.Errorf("lockd-nostats: row %d = %s lockd %v raw %v target %q; want %s lockd %v raw %v target %q", i, r.Metric, r.Lockd, raw,
				r.Target, w.metric, w.lockd, w.raw, w.target)
		}
	}
	if rows := cpuRows(scDistinct, 8, map[string][]loadResult{sysLockd: {{ops: 1}}}, []string{sysLockd}, "", 0); rows != nil {
		t.Errorf("unmetered results gave cpu rows %+v, want none", rows)
	}
}
