package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

// Backends (the values of Config.Backend, as lock.backend).
const (
	BackendEmbedded = "embedded"
	BackendEtcd     = "etcd"
	BackendPG       = "pg"
)

// Scenario names (Config.Scenarios, Row.Scenario).
const (
	scDistinct  = "distinct"
	scContended = "contended"
	scDeath     = "death"
	scIdle      = "idle"
	scFailover  = "failover"
	// scElection is in election.go, scSemaphore in semaphore.go.
	// scCeiling labels the ceiling rows, measured with distinct.
	scCeiling = "ceiling"
)

// Scenarios are every scenario, in the order they run.
var Scenarios = []string{scDistinct, scContended, scElection, scSemaphore, scAcquireAll, scDeath, scIdle, scFailover}

// Defaults of Config (issue 5 §3).
var (
	DefaultDuration              = 5 * time.Second
	DefaultRounds                = 3
	DefaultDistinctConcurrency   = []int{1, 8, 64}
	DefaultContendedConcurrency  = []int{8, 64}
	DefaultElectionConcurrency   = []int{2, 8}
	DefaultSemaphoreConcurrency  = []int{8, 64}
	DefaultSemaphoreLimit        = 4
	DefaultAcquireAllConcurrency = []int{1, 8}
	DefaultDeathLocks            = []int{1, 100, 10000}
	DefaultIdleSessions          = 10000
	DefaultIdleDuration          = 20 * time.Second
	DefaultFailoverKills         = 10
)

// Config configures Run. Zero fields take the defaults above.
type Config struct {
	// Backend is BackendEmbedded (an etcd started in this process in
	// DataDir), BackendEtcd (EtcdEndpoints) or BackendPG (PGDSN).
	Backend       string
	EtcdEndpoints []string
	PGDSN         string
	// DataDir is the embedded etcd's data directory; empty means a
	// temporary directory, removed afterwards.
	DataDir string
	// Duration is the length of one measurement.
	Duration time.Duration
	// Rounds is how many times each measurement is repeated, alternating
	// the systems.
	Rounds int
	// Scenarios selects scenarios by name (see Scenarios); empty means all.
	Scenarios []string
	// DistinctConcurrency and ContendedConcurrency are the numbers of
	// clients of the distinct and contended scenarios.
	DistinctConcurrency  []int
	ContendedConcurrency []int
	// ElectionConcurrency are the numbers of candidates of the election
	// scenario (at least 2: a hand-over needs someone to hand over to).
	ElectionConcurrency []int
	// SemaphoreConcurrency are the numbers of clients of the semaphore
	// scenario, SemaphoreLimit its N (2 to 1024).
	SemaphoreConcurrency []int
	SemaphoreLimit       int
	// AcquireAllConcurrency are the numbers of clients of the acquire-all
	// scenario (acquireall.go).
	AcquireAllConcurrency []int
	// DeathLocks are the numbers of locks the dying session holds: the
	// death scenario is measured once for each.
	DeathLocks []int
	// IdleSessions and IdleDuration size the idle scenario.
	IdleSessions int
	IdleDuration time.Duration
	// FailoverKills is how many times the failover scenario SIGKILLs the
	// replica its holder talks to.
	FailoverKills int
	// ScaleSessions and ScaleReplicas are the points of the scale
	// scenario (every pair), ScaleDuration the window of each (scale.go).
	ScaleSessions []int
	ScaleReplicas []int
	ScaleDuration time.Duration
	// LockdCommand is the argv prefix that runs lockd (the idle scenario
	// appends "serve" and its flags); required when idle runs.
	LockdCommand []string
	// InProcess runs lockd's server, its SDK clients and the baselines'
	// clients in this process, as the bench did before issue 24. Otherwise
	// (--backend etcd and pg) each system runs in processes of its own:
	// see ownProcesses and cells.go. The embedded etcd and CPUProfile
	// imply it.
	InProcess bool
	// SDKs are the SDKs of other languages the distinct scenario also
	// measures lockd through, at each of SDKConcurrency (sdk.go; issue 25).
	SDKs           []SDKWorker
	SDKConcurrency []int
	// StatsOffRows adds the system lockd-nostats to distinct and contended:
	// lockd with lock.server.stats.enabled false, a second server over the
	// same backend (statsoff.go). Only with processes of their own.
	StatsOffRows bool
	// Progress receives one line per measurement; nil discards them.
	Progress io.Writer
	// CPUProfile, when set, receives a pprof CPU profile of this process
	// while the scenarios run (not the setup). Its samples carry the
	// label "system": lockd (SDK, gRPC server, store and its backend
	// client), etcd-txn, etcd-mutex or pg-raw (the baselines' clients), or
	// backend (an embedded etcd), so `go tool pprof -tagfocus
	// system=lockd` shows lockd's own CPU.
	CPUProfile io.Writer
}

func (c Config) withDefaults() Config {
	if c.Backend == "" {
		c.Backend = BackendEmbedded
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = Scenarios
	}
	if len(c.DistinctConcurrency) == 0 {
		c.DistinctConcurrency = DefaultDistinctConcurrency
	}
	if len(c.ContendedConcurrency) == 0 {
		c.ContendedConcurrency = DefaultContendedConcurrency
	}
	if len(c.ElectionConcurrency) == 0 {
		c.ElectionConcurrency = DefaultElectionConcurrency
	}
	if len(c.SemaphoreConcurrency) == 0 {
		c.SemaphoreConcurrency = DefaultSemaphoreConcurrency
	}
	if len(c.AcquireAllConcurrency) == 0 {
		c.AcquireAllConcurrency = DefaultAcquireAllConcurrency
	}
	if c.SemaphoreLimit == 0 {
		c.SemaphoreLimit = DefaultSemaphoreLimit
	}
	if len(c.DeathLocks) == 0 {
		c.DeathLocks = DefaultDeathLocks
	}
	if c.IdleSessions == 0 {
		c.IdleSessions = DefaultIdleSessions
	}
	if c.IdleDuration == 0 {
		c.IdleDuration = DefaultIdleDuration
	}
	if c.FailoverKills == 0 {
		c.FailoverKills = DefaultFailoverKills
	}
	if len(c.ScaleSessions) == 0 {
		c.ScaleSessions = DefaultScaleSessions
	}
	if len(c.ScaleReplicas) == 0 {
		c.ScaleReplicas = DefaultScaleReplicas
	}
	if c.ScaleDuration == 0 {
		c.ScaleDuration = DefaultScaleDuration
	}
	if len(c.SDKConcurrency) == 0 {
		c.SDKConcurrency = DefaultSDKConcurrency
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate checks c (after defaults) and names the offending setting.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Backend {
	case BackendEmbedded:
	case BackendEtcd:
		if len(c.EtcdEndpoints) == 0 && len(c.LockdCommand) == 0 {
			bad("backend etcd without etcd endpoints starts etcd itself and needs the lockd executable")
		}
	case BackendPG:
		if c.PGDSN == "" {
			bad("backend pg needs a PostgreSQL DSN")
		}
	default:
		bad("backend %q is not one of embedded, etcd, pg", c.Backend)
	}
	if c.Duration < 10*time.Millisecond {
		bad("duration %v is below 10ms", c.Duration)
	}
	if c.StatsOffRows && !ownProcesses(c) {
		bad("the stats-off rows need lockd's servers in processes of their own (--backend etcd or pg, without --in-process or a CPU profile)")
	}
	if c.Rounds < 1 {
		bad("rounds %d must be at least 1", c.Rounds)
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) && !slices.Contains(Optional, s) {
			bad("unknown scenario %q (want some of %s)", s, strings.Join(slices.Concat(Scenarios, Optional), ","))
		}
	}
	for _, n := range slices.Concat(c.DistinctConcurrency, c.ContendedConcurrency, c.SemaphoreConcurrency, c.AcquireAllConcurrency) {
		if n < 1 || n > 10000 {
			bad("concurrency %d out of [1, 10000]", n)
		}
	}
	for _, n := range c.ElectionConcurrency {
		if n < 2 || n > 10000 {
			bad("election candidates %d out of [2, 10000]", n)
		}
	}
	if c.SemaphoreLimit < 2 || c.SemaphoreLimit > 1024 {
		bad("semaphore limit %d out of [2, 1024]", c.SemaphoreLimit)
	}
	for _, n := range c.DeathLocks {
		if n < 1 || n > 1000000 {
			bad("death locks %d out of [1, 1000000]", n)
		}
	}
	if c.IdleSessions < 1 {
		bad("idle sessions %d must be at least 1", c.IdleSessions)
	}
	if c.IdleDuration < 100*time.Millisecond {
		bad("idle duration %v is below 100ms", c.IdleDuration)
	}
	if slices.Contains(c.Scenarios, scIdle) && len(c.LockdCommand) == 0 {
		bad("the idle scenario needs the lockd executable")
	}
	if slices.Contains(c.Scenarios, scFailover) && len(c.LockdCommand) == 0 {
		bad("the failover scenario needs the lockd executable")
	}
	if c.FailoverKills < 1 || c.FailoverKills > 1000 {
		bad("failover kills %d out of [1, 1000]", c.FailoverKills)
	}
	if slices.Contains(c.Scenarios, scScale) && len(c.LockdCommand) == 0 {
		bad("the scale scenario needs the lockd executable")
	}
	for _, n := range c.ScaleSessions {
		if n < 1 || n > 1000000 {
			bad("scale sessions %d out of [1, 1000000]", n)
		}
	}
	for _, n := range c.ScaleReplicas {
		if n < 1 || n > 64 {
			bad("scale replicas %d out of [1, 64]", n)
		}
	}
	if c.ScaleDuration < 100*time.Millisecond {
		bad("scale duration %v is below 100ms", c.ScaleDuration)
	}
	errs = append(errs, c.validateSDKs()...)
	return errors.Join(errs...)
}

// runner runs the scenarios of one Run on its bed.
type runner struct {
	cfg Config
	bed *bed
	// workerRetries counts, by system, the transient errors its worker
	// processes retried.
	workerRetries map[string]int64
}

func (r *runner) progressf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// Run starts the backend and lockd, runs the selected scenarios and
// returns the report. It stops everything it started before returning.
// A scenario that fails does not stop the others: Run then returns the
// report of the rest (with a note) and an error naming the failures. When
// ctx ends it stops early and returns no report and an error matching
// ctx.Err().
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cfg = cfg.withDefaults()
	rep = &Report{Start: time.Now(), Machine: machine()}
	var scenarios []string // in run order
	for _, s := range slices.Concat(Scenarios, Optional) {
		if slices.Contains(cfg.Scenarios, s) {
			scenarios = append(scenarios, s)
		}
	}
	rep.Settings = Settings{
		Backend:               cfg.Backend,
		Duration:              cfg.Duration.String(),
		Rounds:                cfg.Rounds,
		Scenarios:             scenarios,
		DistinctConcurrency:   cfg.DistinctConcurrency,
		ContendedConcurrency:  cfg.ContendedConcurrency,
		DeathLocks:            cfg.DeathLocks,
		ElectionConcurrency:   cfg.ElectionConcurrency,
		SemaphoreConcurrency:  cfg.SemaphoreConcurrency,
		SemaphoreLimit:        cfg.SemaphoreLimit,
		AcquireAllConcurrency: cfg.AcquireAllConcurrency,
		AcquireAllKeys:        acquireAllKeys,
		IdleSessions:          cfg.IdleSessions,
		IdleDuration:          cfg.IdleDuration.String(),
		FailoverKills:         cfg.FailoverKills,
		SessionTTL:            sessionTTL.String(),
		SystemOrder:           "order rotated by one each round",
		Processes:             layoutShared,
	}
	if slices.Contains(scenarios, scScale) {
		rep.Settings.ScaleSessions, rep.Settings.ScaleReplicas = cfg.ScaleSessions, cfg.ScaleReplicas
		rep.Settings.ScaleDuration = cfg.ScaleDuration.String()
	}
	for _, s := range cfg.SDKs {
		rep.Settings.SDKs = append(rep.Settings.SDKs, s.Name)
	}
	if len(cfg.SDKs) > 0 {
		rep.Settings.SDKConcurrency = cfg.SDKConcurrency
	}
	if ownProcesses(cfg) {
		rep.Settings.Processes = layoutOwn
	}
	if cfg.StatsOffRows {
		rep.Notes = append(rep.Notes, statsOffNote)
	}
	b, err := newBed(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer func() {
		if cerr := b.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("bench: stop: %w", cerr))
		}
	}()
	rep.Settings.BackendVersion = b.version
	rep.Settings.PGPoolMaxConns = b.maxConns
	rep.Settings.LockdPGMaxConns = b.lockdConns
	rep.Settings.BackendProcess = b.process
	rep.Settings.Durability = b.durability
	rep.Settings.DataDir = b.dataDir
	rep.Settings.DataDirFS = fsType(b.dataDir)
	rep.Settings.DataDirNote = b.dataDirNote
	r := &runner{cfg: cfg, bed: b, workerRetries: map[string]int64{}}
	if cfg.CPUProfile != nil {
		if err := pprof.StartCPUProfile(cfg.CPUProfile); err != nil {
			return nil, fmt.Errorf("bench: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile() // before the bed stops (deferred earlier, runs later)
	}
	var failed []error
	for _, s := range scenarios {
		var (
			rows []Row
			serr error
		)
		switch s {
		case scDistinct:
			rows, serr = r.distinct(ctx)
		case scContended:
			rows, serr = r.contended(ctx)
		case scElection:
			rows, serr = r.election(ctx)
		case scSemaphore:
			rows, serr = r.semaphore(ctx)
		case scAcquireAll:
			rows, serr = r.acquireAll(ctx)
		case scDeath:
			rows, serr = r.death(ctx)
		case scIdle:
			rows, serr = r.idle(ctx)
		case scFailover:
			rows, serr = r.failover(ctx)
		case scEstimate:
			rows, serr = r.estimate(ctx)
		case scScale:
			rows, serr = r.scale(ctx)
		}
		if serr != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("bench: %w", serr)
			}
			// Keep what the other scenarios measure.
			r.progressf("scenario %s failed: %v", s, serr)
			rep.Notes = append(rep.Notes, fmt.Sprintf("scenario %s FAILED: %v", s, serr))
			failed = append(failed, fmt.Errorf("scenario %s: %w", s, serr))
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	r.noteRetries(rep)
	rep.Machine.LoadEnd = loadavg()
	rep.Took = time.Since(rep.Start).Round(time.Second).String()
	if len(failed) > 0 {
		return rep, fmt.Errorf("bench: %w", errors.Join(failed...))
	}
	return rep, nil
}

// primaryBaseline is the raw baseline the ratio targets refer to.
func (r *runner) primaryBaseline() string {
	if r.bed.backend == BackendPG {
		return sysPGRaw
	}
	return sysEtcdTxn
}

// entry is one thing a round measures: a system's load or a ceiling.
type entry struct {
	name string
	run  func(ctx context.Context, round int) (loadResult, string, error)
}

// systemEntries makes the entries of systems, each measured by one.
func systemEntries(systems []system, one func(ctx context.Context, sys system, round int) (loadResult, string, error)) []entry {
	var es []entry
	for _, sys := range systems {
		es = append(es, entry{sys.name(), func(ctx context.Context, round int) (loadResult, string, error) { return one(ctx, sys, round) }})
	}
	return es
}

// rounds measures every entry rounds times and returns the results by
// name. Each round starts one entry later than the one before (round 2
// runs entries 2, 3, …, 1), so that no system always runs first. The
// cyclic order stays: a system runs right after the same other one in
// every round it does not open (etcd-txn after lockd).
func (r *runner) rounds(ctx context.Context, what string, entries []entry) (map[string][]loadResult, error) {
	out := map[string][]loadResult{}
	for round := 1; round <= r.cfg.Rounds; round++ {
		for i := range entries {
			e := entries[(i+round-1)%len(entries)]
			res, summary, err := e.run(ctx, round)
			if err != nil {
				return nil, fmt.Errorf("%s round %d: %w", what, round, err)
			}
			r.progressf("%-22s round %d/%d  %-14s %s", what, round, r.cfg.Rounds, e.name, summary)
			out[e.name] = append(out[e.name], res)
		}
	}
	return out, nil
}

// compare builds the row of one metric, lockd against one baseline.
func compare(scenario string, c int, metric, baseline string, lockd, raw Value) Row {
	return Row{Scenario: scenario, Concurrency: c, Metric: metric, Lockd: lockd, Baseline: baseline, Raw: &raw, Ratio: ratio(lockd, raw)}
}

// ratioAtLeast sets the target "ratio ≥ x".
func ratioAtLeast(row *Row, x float64) {
	row.Target = fmt.Sprintf("ratio>=%.1f", x)
	met := row.Ratio != nil && float64(*row.Ratio) >= x
	row.Met = &met
}

// ratioAtMost sets the target "ratio ≤ x".
func ratioAtMost(row *Row, x float64) {
	row.Target = fmt.Sprintf("ratio<=%.1f", x)
	met := row.Ratio != nil && float64(*row.Ratio) <= x
	row.Met = &met
}

// alsoRatioAtMost adds "ratio ≤ x" to the target row already has.
func alsoRatioAtMost(row *Row, x float64) {
	met := row.Ratio != nil && float64(*row.Ratio) <= x && (row.Met == nil || *row.Met)
	row.Target += fmt.Sprintf(" & ratio<=%.1f", x)
	row.Met = &met
}

// lockdAtLeast sets the target "lockd's figure ≥ x".
func lockdAtLeast(row *Row, x float64) {
	row.Target = fmt.Sprintf("lockd>=%g", x)
	met := float64(row.Lockd) >= x
	row.Met = &met
}

// lockdAtMost sets the target "lockd's figure ≤ x".
func lockdAtMost(row *Row, x float64) {
	row.Target = fmt.Sprintf("lockd<=%g", x)
	met := float64(row.Lockd) <= x
	row.Met = &met
}

// machine describes this machine.
func machine() Machine {
	m := Machine{
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion:  runtime.Version(),
		OSArch:     runtime.GOOS + "/" + runtime.GOARCH,
		LoadStart:  loadavg(),
	}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// loadavg returns the 1, 5 and 15 minute load averages ("" where unknown).
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
