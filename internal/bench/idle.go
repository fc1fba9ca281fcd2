package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"lock.dev/lockd/client"
	"lock.dev/lockd/server"
	"lock.dev/lockd/store/etcdstore"
)

// EnvChild is set to "1" in the environment of the `lockd serve` child the
// idle scenario starts. lockd's configuration ignores LOCKD_TEST_*
// variables; a test binary that stands in for the lockd executable checks it
// to know it should act as lockd.
const EnvChild = "LOCKD_TEST_BENCH_CHILD"

// sessionsPerClient is how many idle sessions share one SDK client (one
// KeepAlive stream), well below server.MaxSessionsPerStream.
const sessionsPerClient = 1000

// childStartTimeout bounds the start of the lockd child.
const childStartTimeout = 2 * time.Minute

// settleFor is how long the idle sessions run before the measurement
// starts, so that the burst of opening them is over: a quarter of the
// measurement, at most 5 s.
func settleFor(d time.Duration) time.Duration { return min(d/4, 5*time.Second) }

// idleFigures are what one idle measurement found.
type idleFigures struct {
	server Value // CPU % of a core of the server side (NaN: not measurable)
	// backend is the backend's share of server: the etcd process the bench
	// started, or the PostgreSQL backends of the system's connections (NaN:
	// not measurable).
	backend Value
	client  Value // CPU % of a core of this process (the clients)
	rss     Value // lockd child only
	hwm     Value
	alive   int
}

// cpuMeter reads the CPU time of a set of processes.
type cpuMeter []int

func (m cpuMeter) read() (time.Duration, error) {
	var total time.Duration
	for _, pid := range m {
		d, err := procCPU(pid)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// measureIdle waits for the sessions to settle, then measures for d the
// CPU of each of parts (NaN for an empty part: not measurable) and of this
// process.
func measureIdle(ctx context.Context, d time.Duration, parts ...cpuMeter) (pcts []Value, clientPct Value, err error) {
	if err := sleep(ctx, settleFor(d)); err != nil {
		return nil, 0, err
	}
	self := cpuMeter{os.Getpid()}
	read := func() ([]time.Duration, error) {
		ds := make([]time.Duration, len(parts)+1)
		for i, m := range append(slices.Clone(parts), self) {
			if ds[i], err = m.read(); err != nil {
				return nil, err
			}
		}
		return ds, nil
	}
	d0, err := read()
	if err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	if err := sleep(ctx, d); err != nil {
		return nil, 0, err
	}
	d1, err := read()
	if err != nil {
		return nil, 0, err
	}
	window := time.Since(t0).Seconds()
	pct := func(i int) Value { return Value((d1[i] - d0[i]).Seconds() / window * 100) }
	for i, m := range parts {
		v := Value(math.NaN())
		if len(m) > 0 {
			v = pct(i)
		}
		pcts = append(pcts, v)
	}
	return pcts, pct(len(parts)), nil
}

// idle holds cfg.IdleSessions sessions open on a `lockd serve` child for
// cfg.IdleDuration and reports the child's CPU (with the backend's serving
// it, where measurable) and memory; then as many raw sessions: on etcd
// clientv3 concurrency.Sessions and the etcd process's CPU, on PostgreSQL
// pg-session (idlepg.go) and the CPU of the PostgreSQL backend serving it.
func (r *runner) idle(ctx context.Context) ([]Row, error) {
	n := r.cfg.IdleSessions
	lf, note, err := r.idleLockd(ctx)
	if err != nil {
		return nil, err
	}
	rows := []Row{
		{Scenario: scIdle, N: n, Metric: MetricCPU, Lockd: lf.server, Note: note},
		{Scenario: scIdle, N: n, Metric: MetricClientCPU, Lockd: lf.client, Note: note},
		{Scenario: scIdle, N: n, Metric: MetricRSS, Lockd: lf.rss, Note: note},
		{Scenario: scIdle, N: n, Metric: MetricPeakRSS, Lockd: lf.hwm, Note: note},
		{Scenario: scIdle, N: n, Metric: MetricAlive, Lockd: Value(lf.alive), Note: note},
		{Scenario: scIdle, N: n, Metric: MetricCPUPerSessionSec, Lockd: perSessionSecond(lf.server, n), Note: note},
		{Scenario: scIdle, N: n, Metric: MetricClientCPUPerSessionSec, Lockd: perSessionSecond(lf.client, n), Note: note},
	}
	if !math.IsNaN(float64(lf.backend)) {
		rows = append(rows, Row{Scenario: scIdle, N: n, Metric: MetricBackendCPU, Lockd: lf.backend, Note: note})
	}
	var (
		rf       idleFigures
		baseline string
	)
	if r.bed.backend == BackendEtcd {
		rf, baseline, err = r.idleRawEtcd(ctx)
	} else {
		rf, err = r.idleRawPG(ctx)
		baseline = sysPGSession
	}
	if err != nil {
		return nil, err
	}
	raws := map[int]Value{0: rf.server, 1: rf.client, 5: perSessionSecond(rf.server, n), 6: perSessionSecond(rf.client, n)}
	if len(rows) > 7 {
		raws[7] = rf.backend
	}
	for i, v := range raws {
		rows[i].Baseline, rows[i].Raw, rows[i].Ratio = baseline, &v, ratio(rows[i].Lockd, v)
	}
	lockdAtMost(&rows[0], 5)
	if r.bed.backend == BackendEtcd && !math.IsNaN(float64(rf.server)) { // issue 24: ≤ 5 % of a core alone on PostgreSQL
		alsoRatioAtMost(&rows[0], 2.0)
	}
	lockdAtMost(&rows[2], 250)
	lockdAtLeast(&rows[4], float64(n))
	if lf.alive < n {
		rows[4].Note = fmt.Sprintf("idle: %d of %d sessions ended while idle (the server could not keep them alive); the CPU and RSS figures are of a lockd that failed at this load",
			n-lf.alive, n)
	}
	return rows, nil
}

// perSessionSecond converts CPU in % of a core, used by n idle sessions,
// to CPU µs per session and second.
func perSessionSecond(pct Value, n int) Value {
	return pct / 100 * Value(time.Second/time.Microsecond) / Value(n)
}

// idleLockd measures lockd's idle sessions.
func (r *runner) idleLockd(ctx context.Context) (f idleFigures, note string, err error) {
	cfg, b := r.cfg, r.bed
	args := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off",
		"--max-sessions", strconv.Itoa(max(server.DefaultConfig().MaxSessions, cfg.IdleSessions))}
	note = "idle: cpu = the `lockd serve` child process (plus the etcd process when the bench started one); client cpu = the bench process, " +
		"where the SDK clients (lockd), the clientv3 client (etcd-session) or pg-session's connection hold the sessions"
	switch cfg.Backend {
	case BackendEmbedded:
		dir, err := os.MkdirTemp("", "lockd-bench-idle-")
		if err != nil {
			return f, "", fmt.Errorf("idle: data dir: %w", err)
		}
		defer os.RemoveAll(dir)
		args = append(args, "--backend", BackendEmbedded, "--data-dir", dir)
		note += "; with --backend embedded the child runs its own embedded etcd, which is counted, and etcd-session's server cpu " +
			"is not measurable (its etcd shares the bench process): use --backend etcd for that ratio"
	case BackendEtcd:
		args = append(args, "--backend", BackendEtcd, "--etcd-endpoints", strings.Join(b.endpoints, ","),
			"--etcd-prefix", etcdIdlePrefix+b.run+"/")
		if b.etcdProc == nil {
			note += "; the external etcd is not counted"
		}
	case BackendPG:
		args = append(args, "--backend", BackendPG, "--pg-schema", pgIdleSchema)
		note += "; on PostgreSQL cpu also counts the PostgreSQL backend processes serving the system's connections (lockd's pool and " +
			"listener; pg-session's one connection), found by application_name when PostgreSQL runs on this machine (backend cpu: that share); " +
			"PostgreSQL's shared processes (WAL writer, checkpointer, ...) are counted for neither"
	}
	r.progressf("idle: starting the lockd child")
	// PGAPPNAME names the child's PostgreSQL connections, by which their
	// backends are found (pgBackends); a DSN's own application_name wins.
	ch, err := startChild(ctx, cfg.LockdCommand, args, servingLine, append(b.childEnv(), "PGAPPNAME="+appLockdIdle)...)
	if err != nil {
		return f, "", fmt.Errorf("idle: %w", err)
	}
	defer ch.stop()

	n := cfg.IdleSessions
	clients := make([]*client.Client, (n+sessionsPerClient-1)/sessionsPerClient)
	defer closeClients(clients) // before the child stops: close the sessions while it serves
	for i := range clients {
		c, err := client.New(ch.addr)
		if err != nil {
			return f, "", fmt.Errorf("idle: client: %w", err)
		}
		clients[i] = c
	}
	r.progressf("idle: opening %d lockd sessions", n)
	sessions := make([]*client.Session, n)
	opened := time.Now()
	err = parallel(ctx, n, setupWidth, func(ctx context.Context, i int) error {
		s, err := clients[i/sessionsPerClient].NewSession(ctx)
		sessions[i] = s
		return err
	})
	if err != nil {
		return f, "", fmt.Errorf("idle: open %d sessions: %w", n, err)
	}
	r.progressf("idle: %d sessions open after %v; settling %v, measuring %v", n, time.Since(opened).Round(time.Millisecond),
		settleFor(cfg.IdleDuration), cfg.IdleDuration)
	var backend cpuMeter
	switch {
	case b.etcdProc != nil:
		backend = cpuMeter{b.etcdProc.pid()}
	case b.backend == BackendPG:
		if backend, err = pgBackends(ctx, b.pool, appLockdIdle); err != nil {
			return f, "", fmt.Errorf("idle: %w", err)
		}
		if len(backend) == 0 {
			note += "; lockd's PostgreSQL backends were not found on this machine: its cpu is the lockd child's alone"
		}
	}
	pcts, client, err := measureIdle(ctx, cfg.IdleDuration, cpuMeter{ch.pid()}, backend)
	if err != nil {
		return f, "", fmt.Errorf("idle: %w", err)
	}
	f.server, f.backend, f.client = sumPct(pcts...), pcts[1], client
	if f.rss, f.hwm, err = procRSS(ch.pid()); err != nil {
		return f, "", fmt.Errorf("idle: %w", err)
	}
	for _, s := range sessions {
		if s.Err() == nil {
			f.alive++
		}
	}
	r.progressf("idle: lockd cpu %s%% of a core, client cpu %s%%, rss %s MiB, %d of %d sessions alive", f.server, f.client, f.rss, f.alive, n)
	return f, note, nil
}

// idleRawEtcd holds cfg.IdleSessions concurrency.Sessions (a lease each,
// kept alive by clientv3) on one new clientv3 client for cfg.IdleDuration:
// the raw idle baseline. Its server CPU is the etcd process's, when the
// bench started one (NaN otherwise).
func (r *runner) idleRawEtcd(ctx context.Context) (f idleFigures, name string, err error) {
	cli, err := clientv3.New(etcdstore.ClientConfig(r.bed.endpoints, dialTimeout))
	if err != nil {
		return f, "", fmt.Errorf("idle: etcd client: %w", err)
	}
	defer cli.Close()
	n := r.cfg.IdleSessions
	r.progressf("idle: opening %d raw concurrency.Sessions", n)
	sessions := make([]*concurrency.Session, n)
	defer func() { // revoke the leases (Close is bounded by the session's TTL)
		_ = parallel(context.WithoutCancel(ctx), n, setupWidth, func(_ context.Context, i int) error {
			if sessions[i] != nil {
				_ = sessions[i].Close()
			}
			return nil
		})
	}()
	opened := time.Now()
	var retry retrier // etcd may still be applying the lockd sessions' revokes
	err = parallel(ctx, n, setupWidth, func(ctx context.Context, i int) error {
		for {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(sessionTTL/time.Second)))
			if retry.retried(ctx, err) {
				continue
			}
			sessions[i] = s
			return err
		}
	})
	if err != nil {
		return f, "", fmt.Errorf("idle: open %d concurrency sessions: %w", n, err)
	}
	r.progressf("idle: %d raw sessions open after %v", n, time.Since(opened).Round(time.Millisecond))
	var server cpuMeter
	if r.bed.etcdProc != nil {
		server = cpuMeter{r.bed.etcdProc.pid()}
	}
	pcts, client, err := measureIdle(ctx, r.cfg.IdleDuration, server)
	if err != nil {
		return f, "", fmt.Errorf("idle: %w", err)
	}
	f.server, f.backend, f.client = pcts[0], pcts[0], client
	for _, s := range sessions {
		select {
		case <-s.Done():
		default:
			f.alive++
		}
	}
	if f.alive < n {
		return f, "", fmt.Errorf("idle: %d of %d raw concurrency sessions ended while idle", n-f.alive, n)
	}
	r.progressf("idle: etcd-session server cpu %s%% of a core, client cpu %s%%", f.server, f.client)
	return f, sysEtcdSession, nil
}

// child is a running `lockd serve`.
type child struct {
	cmd    *exec.Cmd
	out    io.ReadCloser
	stderr *tailBuffer
	addr   string
}

var servingLine = regexp.MustCompile(`^lockd serving grpc=(\S+) `)

// startChild runs argv+args and waits for its first line to match serving,
// whose first group is the address it serves on; env are variables added
// to its environment (bed.childEnv).
func startChild(ctx context.Context, argv, args []string, serving *regexp.Regexp, env ...string) (*child, error) {
	if len(argv) == 0 {
		return nil, errors.New("no lockd executable to start (LockdCommand)")
	}
	cmd := exec.Command(argv[0], append(argv[1:len(argv):len(argv)], args...)...)
	cmd.Env = append(os.Environ(), EnvChild+"=1")
	cmd.Env = append(cmd.Env, env...)
	ch := &child{cmd: cmd, stderr: &tailBuffer{max: 8 << 10}}
	cmd.Stderr = ch.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start lockd child: %w", err)
	}
	ch.out = out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start lockd child %s: %w", argv[0], err)
	}
	type lineResult struct {
		line string
		err  error
	}
	lines := make(chan lineResult, 1)
	go func() { // exits once the child printed a line or closed stdout (it is killed on failure)
		line, err := bufio.NewReader(out).ReadString('\n')
		lines <- lineResult{line, err}
	}()
	timer := time.NewTimer(childStartTimeout)
	defer timer.Stop()
	var lr lineResult
	select {
	case lr = <-lines:
	case <-timer.C:
		_ = cmd.Process.Kill()
		lr = <-lines
		lr.err = fmt.Errorf("no serving line after %v", childStartTimeout)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		lr = <-lines
		lr.err = ctx.Err()
	}
	m := serving.FindStringSubmatch(lr.line)
	if lr.err != nil || m == nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("lockd child %s: got %q (%v); its stderr ends:\n%s", strings.Join(cmd.Args, " "), lr.line, lr.err, ch.stderr)
	}
	ch.addr = m[1]
	return ch, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// stop interrupts the child (as Ctrl-C would), killing it if it has not
// exited within stopTimeout, and waits for it.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { // exits when the child has exited and its stdout is drained
		_, _ = io.Copy(io.Discard, c.out)
		_ = c.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// tailBuffer keeps the last max bytes written to it. It is safe for
// concurrent use.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// closeClients closes every client made so far (nil entries are not made
// yet), at once: each Close is bounded (client.DefaultCloseTimeout).
func closeClients(clients []*client.Client) {
	var wg sync.WaitGroup
	for _, c := range clients {
		if c != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = c.Close() }()
		}
	}
	wg.Wait()
}
