package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"

	"lock.dev/lockd/client"
	"lock.dev/lockd/store/etcdstore"
)

// WorkerCommand is the hidden subcommand of `lockd bench` (the arguments
// after the lockd executable) that measures one cell in a process of its
// own: it reads a workerJob as JSON on stdin, opens the clients of one
// system, runs one scenario's load on them and writes a workerResult as
// JSON on stdout. `lockd bench` starts one per system and cell, so that
// every system's clients have a Go runtime and a process of their own
// (issue 24: sharing one made the baselines run slower than they run
// alone).
var WorkerCommand = []string{"bench", "worker"}

// workerJob is one cell: a system, a scenario, a concurrency, a window.
type workerJob struct {
	System   string        `json:"system"`
	Scenario string        `json:"scenario"`
	C        int           `json:"c"`
	Limit    int           `json:"limit,omitempty"` // the semaphore's N
	Duration time.Duration `json:"duration"`
	Tag      string        `json:"tag"`
	// Where the system is: lockd's server address, or the backend.
	LockdAddr string   `json:"lockd_addr,omitempty"`
	Endpoints []string `json:"endpoints,omitempty"`
	Prefix    string   `json:"prefix,omitempty"` // etcd baselines' key prefix
	PGDSN     string   `json:"pg_dsn,omitempty"`
	// Meter are the processes (role -> pid) whose CPU the worker reads at
	// the window's opening and closing, besides its own (roleClient).
	Meter map[string]int `json:"meter,omitempty"`
}

// workerResult is a workerJob's loadResult (durations in nanoseconds).
type workerResult struct {
	Ops       int              `json:"ops"`
	Elapsed   time.Duration    `json:"elapsed"`
	Lat       []time.Duration  `json:"lat,omitempty"`
	ObsLat    []time.Duration  `json:"obs_lat,omitempty"`
	PerClient []int            `json:"per_client"`
	Most      int              `json:"most,omitempty"`
	CPU       map[string]int64 `json:"cpu_ns"`
	Retries   int64            `json:"retries,omitempty"`
	Error     string           `json:"error,omitempty"`
}

// RunWorker is the body of the hidden `lockd bench worker`: one workerJob
// from in, its workerResult to out. A failed measurement is reported in
// the result's error (and returned).
func RunWorker(ctx context.Context, in io.Reader, out io.Writer) error {
	var job workerJob
	if err := json.NewDecoder(in).Decode(&job); err != nil {
		return fmt.Errorf("bench worker: read job: %w", err)
	}
	res, err := job.run(ctx)
	if err != nil {
		res = workerResult{Error: err.Error()}
	}
	if werr := json.NewEncoder(out).Encode(res); werr != nil {
		return errors.Join(err, fmt.Errorf("bench worker: write result: %w", werr))
	}
	if err != nil {
		return fmt.Errorf("bench worker: %w", err)
	}
	return nil
}

func (j workerJob) run(ctx context.Context) (workerResult, error) {
	sys, closeSys, err := j.open(ctx)
	if err != nil {
		return workerResult{}, err
	}
	defer closeSys()
	w := &cpuWindow{pids: map[string]int{roleClient: os.Getpid()}}
	for role, pid := range j.Meter {
		w.pids[role] = pid
	}
	mctx := withCPUWindow(ctx, w)
	var lr loadResult
	switch j.Scenario {
	case scAcquireAll:
		s, ok := sys.(system)
		if !ok {
			return workerResult{}, fmt.Errorf("%s has no locks", j.System)
		}
		lr, err = measure(mctx, s, j.C, j.Duration, j.Tag, takeLoad)
	case scDistinct, scContended:
		s, ok := sys.(system)
		if !ok {
			return workerResult{}, fmt.Errorf("%s has no locks", j.System)
		}
		run := distinctLoad
		if j.Scenario == scContended {
			run = contendedLoad
		}
		lr, err = measure(mctx, s, j.C, j.Duration, j.Tag, run)
	case scElection:
		el, ok := sys.(elector)
		if !ok {
			return workerResult{}, fmt.Errorf("%s has no election", j.System)
		}
		lr, err = measureElection(mctx, el, j.C, j.Duration, j.Tag)
	case scSemaphore:
		sm, ok := sys.(semaphorer)
		if !ok {
			return workerResult{}, fmt.Errorf("%s has no semaphore", j.System)
		}
		lr, err = measureSemaphore(mctx, sm, j.C, j.Limit, j.Duration, j.Tag)
	default:
		return workerResult{}, fmt.Errorf("scenario %q does not run in a worker", j.Scenario)
	}
	if err != nil {
		return workerResult{}, err
	}
	used, err := w.used()
	if err != nil {
		return workerResult{}, err
	}
	res := workerResult{Ops: lr.ops, Elapsed: lr.elapsed, Lat: lr.lat, ObsLat: lr.obsLat, PerClient: lr.perClient, Most: lr.most,
		CPU: map[string]int64{}}
	for role, d := range used {
		res.CPU[role] = int64(d)
	}
	if rs, ok := sys.(interface{ retries() int64 }); ok {
		res.Retries = rs.retries()
	}
	return res, nil
}

// open builds the job's system, connected as the bench's own would be.
func (j workerJob) open(ctx context.Context) (sys any, closeFn func(), err error) {
	switch j.System {
	case sysLockd, sysLockdNoStats, sysLockdAll, sysLockdSortd:
		c, err := client.New(j.LockdAddr)
		if err != nil {
			return nil, nil, fmt.Errorf("lockd client: %w", err)
		}
		s := &lockdSystem{c: c}
		switch j.System {
		case sysLockdAll, sysLockdSortd:
			return &lockdSetSystem{base: s, all: j.System == sysLockdAll}, func() { _ = c.Close() }, nil
		case sysLockdNoStats:
			s.label = j.System
		}
		return s, func() { _ = c.Close() }, nil
	case sysEtcdTxn, sysEtcdMutex, sysEtcdElection, sysEtcdSem:
		cli, err := clientv3.New(etcdstore.ClientConfig(j.Endpoints, dialTimeout))
		if err != nil {
			return nil, nil, fmt.Errorf("connect to etcd %v: %w", j.Endpoints, err)
		}
		closeFn := func() { _ = cli.Close() }
		switch j.System {
		case sysEtcdTxn:
			return &etcdTxnSystem{cli: cli, prefix: j.Prefix}, closeFn, nil
		case sysEtcdMutex:
			return &etcdMutexSystem{cli: cli, prefix: j.Prefix}, closeFn, nil
		case sysEtcdElection:
			return &etcdElectionSystem{cli: cli, prefix: j.Prefix}, closeFn, nil
		}
		return &etcdSemSystem{etcdTxnSystem{cli: cli, prefix: j.Prefix}}, closeFn, nil
	case sysPGRaw, sysPGRawMin, sysPGRawDef, sysPGSem:
		pcfg, err := pgxpool.ParseConfig(j.PGDSN)
		if err != nil {
			return nil, nil, fmt.Errorf("parse the PostgreSQL DSN: %w", err)
		}
		setup, err := openWarmPool(ctx, pcfg, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("connect to postgresql: %w", err)
		}
		return newPGRawSystem(j.System, pcfg, setup), setup.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown system %q", j.System)
}

// newPGRawSystem is the PostgreSQL system called name over the schemas the
// bench created, with pools from base and setup for its own queries.
func newPGRawSystem(name string, base *pgxpool.Config, setup *pgxpool.Pool) *pgRawSystem {
	s := &pgRawSystem{sysName: name, sized: name != sysPGRawDef, base: base, setup: setup, q: newPGRawQueries(pgRawSchema, false)}
	if name == sysPGRawMin {
		s.minimal, s.q = true, newPGRawQueries(pgMinSchema, true)
	}
	return s
}

// workerStartTimeout bounds a worker's setup and tear-down on top of its
// load (warm-up, window, and the wait for a contended window's first
// grant).
const workerStartTimeout = 2 * time.Minute

// runWorker runs job in a `lockd bench worker` child of argv and returns
// its result as a loadResult with the CPU of each metered role.
func runWorker(ctx context.Context, argv []string, job workerJob) (loadResult, int64, error) {
	if len(argv) == 0 {
		return loadResult{}, 0, errors.New("no lockd executable to start (LockdCommand)")
	}
	return runJob(ctx, append(slices.Clone(argv), WorkerCommand...), []string{EnvChild + "=1"}, job)
}

// runJob runs job in a worker child of argv (with env added to this
// process's environment): the job as JSON on its stdin, its result as JSON
// on its stdout.
func runJob(ctx context.Context, argv, env []string, job workerJob) (loadResult, int64, error) {
	in, err := json.Marshal(job)
	if err != nil {
		return loadResult{}, 0, fmt.Errorf("worker job: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, workerStartTimeout+firstGrantTimeout+2*job.Duration)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	stderr := &tailBuffer{max: 8 << 10}
	cmd.Stdout, cmd.Stderr = &out, stderr
	err = cmd.Run()
	var res workerResult
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil {
		return loadResult{}, 0, fmt.Errorf("worker %s %s c=%d: %v; no result (%v); its stderr ends:\n%s", job.System, job.Scenario, job.C, err, jerr, stderr)
	}
	if res.Error != "" {
		return loadResult{}, 0, fmt.Errorf("%s (worker process)", strings.TrimPrefix(res.Error, "bench worker: "))
	}
	if err != nil {
		return loadResult{}, 0, fmt.Errorf("worker %s: %w; its stderr ends:\n%s", job.System, err, stderr)
	}
	lr := loadResult{ops: res.Ops, elapsed: res.Elapsed, lat: res.Lat, obsLat: res.ObsLat, perClient: res.PerClient, most: res.Most,
		cpu: map[string]time.Duration{}}
	for role, ns := range res.CPU {
		lr.cpu[role] = time.Duration(ns)
	}
	return lr, res.Retries, nil
}
