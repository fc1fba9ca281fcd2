package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// CPU per operation (issue 24): the CPU time each process of a measured
// system used inside a measurement's window, divided by the operations
// counted in that window. The roles of the processes:
const (
	roleClient  = "client"  // the worker process running the system's clients (the SDK for lockd)
	roleServer  = "server"  // lockd's `lockd serve` child (lockd only)
	roleBackend = "backend" // the etcd child the bench started, when it did
)

// cpuWindow reads the CPU time of processes at the opening and the closing
// of a load's measured window. The loads call windowOpened and
// windowClosed; a cpuWindow rides on the context, so loads measured
// without one (the in-process layout, tests) are not metered.
type cpuWindow struct {
	pids map[string]int // role -> pid

	mu           sync.Mutex
	start, end   map[string]time.Duration
	opened, done bool
	err          error
}

type cpuWindowKey struct{}

// withCPUWindow returns ctx carrying w.
func withCPUWindow(ctx context.Context, w *cpuWindow) context.Context {
	return context.WithValue(ctx, cpuWindowKey{}, w)
}

// withoutCPUWindow returns ctx without a cpuWindow: for a warm-up that is a
// load of its own.
func withoutCPUWindow(ctx context.Context) context.Context {
	return context.WithValue(ctx, cpuWindowKey{}, (*cpuWindow)(nil))
}

func cpuWindowOf(ctx context.Context) *cpuWindow {
	w, _ := ctx.Value(cpuWindowKey{}).(*cpuWindow)
	return w
}

func (w *cpuWindow) read() (map[string]time.Duration, error) {
	m := make(map[string]time.Duration, len(w.pids))
	for role, pid := range w.pids {
		d, err := procCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("cpu of the %s process (pid %d): %w", role, pid, err)
		}
		m[role] = d
	}
	return m, nil
}

// windowOpened records the CPU times at the opening of the window of the
// load running under ctx (once; later calls do nothing).
func windowOpened(ctx context.Context) {
	w := cpuWindowOf(ctx)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.opened {
		return
	}
	w.opened = true
	w.start, w.err = w.read()
}

// windowClosed records the CPU times at the closing of the window.
func windowClosed(ctx context.Context) {
	w := cpuWindowOf(ctx)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.opened || w.done || w.err != nil {
		return
	}
	w.done = true
	w.end, w.err = w.read()
}

// used returns the CPU time of each role inside the window.
func (w *cpuWindow) used() (map[string]time.Duration, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.err != nil:
		return nil, w.err
	case !w.opened || !w.done:
		return nil, fmt.Errorf("the load's window was not metered (opened %v, closed %v)", w.opened, w.done)
	}
	m := make(map[string]time.Duration, len(w.end))
	for role, d := range w.end {
		m[role] = d - w.start[role]
	}
	return m, nil
}

// cpuPerOp returns the CPU µs per operation of the given roles of r,
// summed; NaN when r was not metered or counted no operation.
func cpuPerOp(r loadResult, roles ...string) Value {
	if r.cpu == nil || r.ops == 0 {
		return Value(math.NaN())
	}
	var total time.Duration
	for _, role := range roles {
		d, ok := r.cpu[role]
		if !ok {
			return Value(math.NaN())
		}
		total += d
	}
	return Value(float64(total) / float64(time.Microsecond) / float64(r.ops))
}

func cpusPerOp(rs []loadResult, roles ...string) []Value {
	var vs []Value
	for _, r := range rs {
		vs = append(vs, cpuPerOp(r, roles...))
	}
	return vs
}

// Metrics of the CPU rows (per operation of the row's scenario: a pair,
// a hand-over or an acquisition).
const (
	MetricCPUPerOp        = "cpu µs/op"
	MetricServerCPUPerOp  = "server cpu µs/op"
	MetricClientCPUPerOp  = "client cpu µs/op"
	MetricBackendCPUPerOp = "backend cpu µs/op"
	// The idle rows: per session and second of idleness.
	MetricCPUPerSessionSec       = "cpu µs/session-s"
	MetricClientCPUPerSessionSec = "client cpu µs/session-s"
)

// cpuNote explains the CPU rows.
const cpuNote = "cpu µs/op: CPU time inside the measured window / operations counted in it (op = the row's pair, hand-over or acquisition), " +
	"median over rounds; lockd = its `lockd serve` process + the SDK clients' process, a raw baseline = its clients' process; " +
	"server = lockd serve alone; backend = the etcd process the bench started, in the same window of the same system"

// cpuRows returns the CPU rows of one scenario and concurrency: lockd's
// against each baseline of names (if the processes were metered), and
// lockd's server alone. target, if set, applies to the total against the
// primary baseline.
func cpuRows(scenario string, c int, res map[string][]loadResult, names []string, primary string, target float64) []Row {
	lockd := res[sysLockd]
	if len(lockd) == 0 || lockd[0].cpu == nil {
		return nil
	}
	srv := cpusPerOp(lockd, roleServer)
	server := Row{Scenario: scenario, Concurrency: c, Metric: MetricServerCPUPerOp, Lockd: median(srv), LockdRounds: srv, Note: cpuNote}
	rows := []Row{server}
	_, backendMetered := lockd[0].cpu[roleBackend]
	for _, name := range names {
		if name == sysLockd {
			continue
		}
		raw := res[name]
		if len(raw) == 0 || raw[0].cpu == nil {
			continue
		}
		for _, m := range []struct {
			metric      string
			lockd, base []string
		}{
			{MetricServerCPUPerOp, []string{roleServer}, nil}, // lockd-nostats only
			{MetricCPUPerOp, []string{roleServer, roleClient}, []string{roleClient}},
			{MetricClientCPUPerOp, []string{roleClient}, []string{roleClient}},
			{MetricBackendCPUPerOp, []string{roleBackend}, []string{roleBackend}},
		} {
			if m.metric == MetricBackendCPUPerOp && !backendMetered || m.metric == MetricServerCPUPerOp && name != sysLockdNoStats {
				continue
			}
			base := m.base
			if name == sysLockdNoStats { // lockd too: the same roles, its own server
				base = m.lockd
			}
			lv, rv := cpusPerOp(lockd, m.lockd...), cpusPerOp(raw, base...)
			row := compare(scenario, c, m.metric, name, median(lv), median(rv))
			row.LockdRounds, row.RawRounds, row.Note = lv, rv, cpuNote
			if m.metric == MetricCPUPerOp && name == primary && target > 0 {
				ratioAtMost(&row, target)
			}
			rows = append(rows, row)
		}
	}
	return rows
}
