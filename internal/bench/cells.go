package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/client"
)

// The process layout (issue 24). With Config.InProcess false (the default
// over --backend etcd and pg) every measured system runs in processes of
// its own: lockd's server is one `lockd serve` child for the whole run,
// and each cell (one system, scenario, concurrency and round) runs its
// clients in a `lockd bench worker` child (WorkerCommand), lockd's SDK
// clients as much as a baseline's clientv3 or pgx clients. The bench
// process only starts them, measures the ceilings and the death, idle and
// failover scenarios, and reports.

// layoutOwn and layoutShared describe the two layouts in the report.
const (
	layoutOwn = "own processes: lockd's server is a `lockd serve` child; each cell (system, scenario, concurrency, round) runs its " +
		"clients in a `lockd bench worker` child of its own (lockd's SDK clients and each baseline's alike); " +
		"the ceilings, death, idle, failover and estimate run from the bench process"
	layoutShared = "one process: lockd's server, its SDK clients and the baselines' clients share the bench process and its Go runtime"
)

// ownProcesses reports whether the systems of cfg run in processes of
// their own: not over the embedded etcd (it lives in this process), not
// with a CPU profile (it profiles this process), not when asked.
func ownProcesses(cfg Config) bool {
	return !cfg.InProcess && cfg.Backend != BackendEmbedded && cfg.CPUProfile == nil
}

// cell measures one system in one scenario at concurrency c: in a worker
// process when the bed's systems have processes of their own, else with
// inproc in this process. Either way it refuses a cell whose system counted
// operations while the backend committed nothing (a system that did no
// work: a lock that locks nothing).
func (r *runner) cell(ctx context.Context, scenario string, sys interface{ name() string }, c int, tag string,
	inproc func(context.Context) (loadResult, error)) (loadResult, error) {
	name := sys.name()
	before, err := r.bed.commitPosition(ctx)
	if err != nil {
		return loadResult{}, err
	}
	var lr loadResult
	if r.bed.own {
		job := r.bed.job(name, scenario, c, r.cfg.Duration, tag)
		job.Limit = r.cfg.SemaphoreLimit
		var retries int64
		lr, retries, err = runWorker(ctx, r.cfg.LockdCommand, job)
		r.workerRetries[name] += retries
	} else {
		lr, err = inproc(ctx)
	}
	if err != nil {
		return loadResult{}, err
	}
	after, err := r.bed.commitPosition(ctx)
	if err != nil {
		return loadResult{}, err
	}
	if err := checkWork(name, lr, before, after); err != nil {
		return loadResult{}, err
	}
	return lr, nil
}

// checkWork refuses a measurement that counted operations while the
// backend's commit position (before, after) did not move.
func checkWork(name string, lr loadResult, before, after int64) error {
	if lr.ops > 0 && after <= before {
		return fmt.Errorf("%s counted %d operations but the backend committed nothing meanwhile (commit position %d before and %d after): "+
			"a system that does no work is not measured", name, lr.ops, before, after)
	}
	return nil
}

// commitPosition returns a figure that grows with every commit of the
// backend: etcd's revision, PostgreSQL's WAL insert position.
func (b *bed) commitPosition(ctx context.Context) (int64, error) {
	if b.backend == BackendPG {
		var pos int64
		err := b.pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&pos)
		if err != nil {
			return 0, fmt.Errorf("read postgresql's wal position: %w", err)
		}
		return pos, nil
	}
	resp, err := b.etcd.Get(ctx, etcdCeilPrefix+b.run+"/commit-position", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read etcd's revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// job describes a cell of system name for a worker: where its backend or
// lockd server is, and which processes it meters besides itself.
func (b *bed) job(name, scenario string, c int, dur time.Duration, tag string) workerJob {
	j := workerJob{System: name, Scenario: scenario, C: c, Duration: dur, Tag: tag, Endpoints: b.endpoints, PGDSN: b.dsn,
		Meter: map[string]int{}}
	if b.etcdProc != nil {
		j.Meter[roleBackend] = b.etcdProc.pid()
	}
	switch name {
	case sysLockd, sysLockdAll, sysLockdSortd:
		j.LockdAddr = b.lockdProc.addr
		j.Meter[roleServer] = b.lockdProc.pid()
	case sysLockdNoStats: // lockd's namespace: keys of its own
		j.LockdAddr = b.noStatsProc.addr
		j.Meter[roleServer] = b.noStatsProc.pid()
		j.Tag = "nostats-" + tag
	case sysEtcdTxn:
		j.Prefix = etcdRawPrefix + b.run + "/"
	case sysEtcdMutex:
		j.Prefix = etcdMutexPrefix + b.run + "/"
	case sysEtcdElection:
		j.Prefix = etcdElectPrefix + b.run + "/"
	case sysEtcdSem:
		j.Prefix = etcdSemPrefix + b.run + "/"
	}
	return j
}

// startLockdProcess starts lockd's server for the run as a `lockd serve`
// child over the bed's backend (lockd's keys under lockdPrefix on etcd, its
// tables in pgLockdSchema on PostgreSQL) and connects the bench's own SDK
// client to it (the death scenario's).
func (b *bed) startLockdProcess(ctx context.Context, cfg Config, lockdPrefix string, maxLocks int) error {
	ch, err := b.startServe(ctx, cfg, lockdPrefix, maxLocks)
	if err != nil {
		return fmt.Errorf("start lockd's server: %w", err)
	}
	b.lockdProc, b.lockdAddr = ch, ch.addr
	c, err := client.New(ch.addr)
	if err != nil {
		return fmt.Errorf("lockd client: %w", err)
	}
	b.lockd = c
	b.onClose(func(context.Context) error { return c.Close() })
	b.systems[0].(*lockdSystem).c = c
	return nil
}

// startServe starts a `lockd serve` child over the bed's backend (lockd's
// keys under lockdPrefix on etcd, its tables in pgLockdSchema on
// PostgreSQL) with extra flags after the shared ones; the bed's close stops
// it.
func (b *bed) startServe(ctx context.Context, cfg Config, lockdPrefix string, maxLocks int, extra ...string) (*child, error) {
	args := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "off",
		"--session-ttl", sessionTTL.String(), "--max-locks-per-session", strconv.Itoa(maxLocksPerSession(maxLocks))}
	args = append(args, extra...)
	if b.backend == BackendPG {
		args = append(args, "--backend", BackendPG, "--pg-schema", pgLockdSchema)
	} else {
		args = append(args, "--backend", BackendEtcd, "--etcd-endpoints", strings.Join(b.endpoints, ","), "--etcd-prefix", lockdPrefix)
	}
	ch, err := startChild(ctx, cfg.LockdCommand, args, servingLine, b.childEnv()...)
	if err != nil {
		return nil, err
	}
	b.onClose(func(context.Context) error { ch.stop(); return nil })
	return ch, nil
}

// childEnv is the environment a `lockd serve` child of the bed adds to the
// bench's: over PostgreSQL the DSN (LOCKD_PG_DSN), which is not passed on
// the command line, where ps would show its password.
func (b *bed) childEnv() []string {
	if b.backend == BackendPG {
		return []string{"LOCKD_PG_DSN=" + b.dsn}
	}
	return nil
}

// noteRetries adds a note per system that retried transient errors, in
// this process or in its workers.
func (r *runner) noteRetries(rep *Report) {
	counts := maps.Clone(r.workerRetries)
	for _, sys := range r.bed.named() {
		if rs, ok := sys.(interface{ retries() int64 }); ok {
			counts[sys.name()] += rs.retries()
		}
	}
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[name]; n > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s retried %d transient etcd errors (request timed out / unavailable), as user code would", name, n))
		}
	}
}

// systemNames are the names of the systems of distinct and contended.
func (b *bed) systemNames() []string {
	var names []string
	for _, s := range b.systems {
		names = append(names, s.name())
	}
	return names
}

// named returns every system of the bed once.
func (b *bed) named() []interface{ name() string } {
	var named []interface{ name() string }
	seen := map[string]bool{}
	add := func(s interface{ name() string }) {
		if !seen[s.name()] {
			seen[s.name()] = true
			named = append(named, s)
		}
	}
	for _, s := range b.systems {
		add(s)
	}
	for _, s := range b.electors {
		add(s)
	}
	for _, s := range b.semaphorers {
		add(s)
	}
	return named
}
