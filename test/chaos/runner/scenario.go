package runner

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"lock.dev/lockd/client"

	"lock.dev/lockd/internal/testing/pgserver"
	"lock.dev/lockd/test/chaos/check"
	"lock.dev/lockd/test/chaos/fenced"
	"lock.dev/lockd/test/chaos/history"
	"lock.dev/lockd/test/chaos/worker"
)

// Backend is where a scenario's lockd keeps its state.
type Backend string

// Backends.
const (
	// Embedded: `lockd serve --backend embedded`, etcd inside the lockd
	// process (killing lockd kills its etcd too).
	Embedded Backend = "embedded"
	// Etcd: one test/cmd/etcd process; lockd reaches it through the proxy
	// when the scenario cuts the link.
	Etcd Backend = "etcd"
	// EtcdCluster: three test/cmd/etcd processes (etcdClusterSize).
	EtcdCluster Backend = "etcd-3"
	// PG: PostgreSQL from the local binaries (the shared server with a
	// database of the scenario's own, or a private server for restarts).
	PG Backend = "pg"
)

// Fault is what a scenario does to the system, one bounded cycle at a time.
type Fault string

// Faults.
const (
	// PauseHolder SIGSTOPs a holder between its two writes for twice the
	// TTL and until the fenced resource has accepted another grant's write
	// above its own (pauseHolderWith), then SIGCONTs it.
	PauseHolder Fault = "pause-holder"
	// KillHolder SIGKILLs a holder between its two writes and starts a new
	// incarnation of the worker.
	KillHolder Fault = "kill-holder"
	// KillLockd SIGKILLs lockd right after a worker sent an acquire, then
	// restarts it on the same address (and data directory).
	KillLockd Fault = "kill-lockd"
	// PartitionShort cuts lockd from its backend for half the TTL.
	PartitionShort Fault = "partition-0.5ttl"
	// PartitionLong cuts lockd from its backend for three TTLs.
	PartitionLong Fault = "partition-3ttl"
	// PGRestartFast restarts PostgreSQL with a fast shutdown.
	PGRestartFast Fault = "pg-restart-fast"
	// PGRestartImmediate restarts PostgreSQL with an immediate shutdown
	// (crash recovery).
	PGRestartImmediate Fault = "pg-restart-immediate"
	// PartitionReplica runs two lockd replicas on one backend and cuts
	// only replica 0 from it for three TTLs, while replica 1 keeps serving;
	// holds last up to 1.5 TTLs, so holders rely on heartbeats. Replica 0's
	// clients must stop trusting before the backend lets replica 1's have
	// their keys.
	PartitionReplica Fault = "partition-replica-3ttl"
	// ClockSkew runs workers 0 and 1 on fast (×1.5) and slow (×0.85) SDK
	// clocks and pauses them while they hold.
	ClockSkew Fault = "clock-skew"
	// ReplicaDeath runs two lockd replicas on one backend, workers spread
	// over both, and SIGKILLs one (alternately) while its clients' sessions
	// are live, restarting it two TTLs later.
	ReplicaDeath Fault = "replica-death"
	// LeaderKill SIGKILLs the leader of the three-member etcd cluster and
	// restarts it.
	LeaderKill Fault = "etcd-leader-kill"
	// FarHolder puts worker 0 far from lockd (farLatency each way through a
	// toxiproxy proxy, far.go), runs lockd with a small safety margin, and
	// pauses worker 0 while it holds and no request of it is in flight: the
	// send-time rule (C2 #ct2-deadline) is what keeps its trust inside the
	// backend's lifetime.
	FarHolder Fault = "far-holder"
)

// Control names a run that breaks a rule on purpose and must be caught.
type Control string

// Controls.
const (
	// NoControl: a real scenario; every checker must find 0 violations.
	NoControl Control = ""
	// FencingOff turns the fenced resource's token check off under
	// PauseHolder: check.OverlappingWriters must find overlapping writers.
	FencingOff Control = "fencing-off"
	// ReceiveTTL makes worker 0 trust each grant for a full TTL from the
	// receipt of the acquire reply, ignoring Done, under UpstreamHold (its
	// grant's reply arrives long after lockd last heard from it, upstream.go):
	// check.NoTrustedOverlap must find overlaps.
	ReceiveTTL Control = "receive-ttl"
	// SlowClock runs worker 0 on an SDK clock at a quarter of real speed
	// (slowScale), beyond what the safety margin absorbs, and pauses it
	// while it holds the scenario's one key: check.NoTrustedOverlap must
	// find overlaps.
	SlowClock Control = "slow-clock"
	// RecvTimeSDK runs worker 0 of FarHolder on an SDK built with the tag
	// lockd_recvtime_control, which counts Remaining from the receipt of a
	// reply instead of the send of its request, over a link slower
	// downstream than upstream (far.go), on one key: check.NoTrustedOverlap
	// must find overlaps.
	RecvTimeSDK Control = "recvtime-sdk"
	// StaleRecord: see replicas.go.
)

// Spec is one scenario.
type Spec struct {
	Name    string
	Backend Backend
	Fault   Fault
	Control Control
	// Cycles is how many fault cycles the short mode runs (default 2). A
	// control with its break runs cycles until its violation is in the
	// histories instead: at least one, at most controlMaxCycles.
	Cycles int
	// TTL, if set, replaces Options.TTL (lockd's session TTL) for this
	// scenario.
	TTL time.Duration
	// Pending, if set, names the fix a scenario waits for: it is in the
	// suite and fails until that fix lands (Table shows it with the
	// failure).
	Pending string
	// BreakOff runs a control's scenario and trigger with its deliberate
	// break removed (the fenced resource's check on, the correct trust
	// rule, SDK, clock, limit, lockd binary, a healed link): it is judged
	// as a real scenario, every checker must find 0 violations. It shows
	// that what the control catches is its break, not its trigger
	// (LOCKD_CHAOS_BREAK_OFF, package chaos).
	BreakOff bool
	// SDK is the SDK the workers run on: GoSDK (default), PythonSDK
	// (python.go) or TypeScriptSDK (typescript.go).
	SDK SDK
}

// breaks reports whether the scenario runs control c with its break on.
func (s Spec) breaks(c Control) bool { return s.Control == c && !s.BreakOff }

// judgedReal reports whether the scenario is judged as a real one: no
// control, or a control with its break off.
func (s Spec) judgedReal() bool { return s.Control == NoControl || s.BreakOff }

// Options are the settings every scenario of a suite shares.
type Options struct {
	// TTL and Margin are lockd's session TTL and safety margin.
	TTL, Margin time.Duration
	// Reaper is the PostgreSQL reaper interval.
	Reaper time.Duration
	// Workers and Keys: how many worker processes contend for how many
	// keys.
	Workers, Keys int
	// HoldMin and HoldMax bound the time between a grant's two writes.
	HoldMin, HoldMax time.Duration
	// Duration is the fault phase of each scenario in long mode; 0 is the
	// short mode (Spec.Cycles cycles).
	Duration time.Duration
	// LivenessSlack is the slack of check.LivenessBound.
	LivenessSlack time.Duration
	// LinTimeout bounds the linearizability search per key.
	LinTimeout time.Duration
	// Seed seeds the random choices of the harness and the workers.
	Seed uint64
	// Logf, if set, receives progress lines.
	Logf func(format string, args ...any)
}

// DefaultOptions are the short-mode settings: the shortest TTL lockd
// allows, so that the faults that wait for expiry are quick.
func DefaultOptions() Options {
	return Options{
		TTL:           2 * time.Second,
		Margin:        500 * time.Millisecond,
		Reaper:        200 * time.Millisecond,
		Workers:       4,
		Keys:          2,
		HoldMin:       20 * time.Millisecond,
		HoldMax:       80 * time.Millisecond,
		LivenessSlack: 3 * time.Second, // liveness, not safety: room for a loaded CI machine
		LinTimeout:    check.DefaultLinTimeout,
		Seed:          1,
	}
}

// run is one scenario in progress.
type run struct {
	spec    Spec
	opts    Options
	env     *Env
	dir     string
	histDir string
	clock   *history.Clock
	hrec    *history.Recorder // the harness's own history: crash ops
	fenced  *fenced.Server
	rng     *rand.Rand
	seed    uint64
	keys    []string
	kinds   map[string]check.Kind // the multi scenarios' keys (multi.go)

	slotClient atomic.Pointer[client.Client] // lockd client of the fenced resource's slot check
	fencePool  *pgxpool.Pool                 // the fenced resource's PostgreSQL fence (fencepg.go); nil with the check off

	etcd    []*etcdNode
	peers   *peerNet // LeaderIsolate: the etcd members' peer links
	members *members // MemberReplace: removed members, ports used (members.go)
	pg      *pgserver.Server
	db      string // the run's database on pg
	pgOwn   bool   // pg is private to this run
	proxy   *proxy
	front   *proxy // ReplicaSwitch: between the workers and replica 0
	lockds  []*lockdProc
	far     *farLink // FarHolder: worker 0's link to lockd
	gate    *farLink // UpstreamHold: worker 0's link to lockd

	workerSpecs []workerSpec

	mu       sync.Mutex
	workers  []*workerProc // current incarnation per slot
	incarn   []int
	deaths   []check.Death // pauses past the TTL (crashes come from the history)
	pauses   []check.Death // pauses of holders (check.PausesHitHolders)
	windows  []check.Window
	lastHold map[string]int64 // key → run time of its latest grant (a hold line)
	faults   int
	problems []string
}

func (r *run) logf(format string, args ...any) {
	if r.opts.Logf != nil {
		r.opts.Logf("%s: "+format, append([]any{r.spec.Name}, args...)...)
	}
}

func (r *run) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// nameHash derives a scenario's own random stream from its name.
func nameHash(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs one scenario in dir (which must exist and be empty) and checks
// what it recorded. An error means the scenario could not be run; a
// Report with a failing Verdict means it ran and something is wrong.
func Run(ctx context.Context, env *Env, spec Spec, opts Options, dir string) (rep *Report, err error) {
	if spec.Cycles == 0 {
		spec.Cycles = 2
	}
	if spec.TTL > 0 {
		opts.TTL = spec.TTL
	}
	start := time.Now()
	epoch := time.Now()
	r := &run{
		spec:     spec,
		opts:     opts,
		env:      env,
		dir:      dir,
		histDir:  filepath.Join(dir, "history"),
		clock:    history.NewClock(epoch),
		rng:      rand.New(rand.NewPCG(opts.Seed, nameHash(spec.Name))),
		seed:     opts.Seed,
		lastHold: map[string]int64{},
	}
	r.farSettings()
	keys := opts.Keys
	if spec.Control == ReceiveTTL || spec.Control == SlowClock || spec.Control == RecvTimeSDK {
		// One key: while worker 0 holds it every other worker waits for
		// it, so lockd hands it on the moment it frees it, inside the
		// window the control's break opens (a waiter is certain, not
		// likely among keys picked at random).
		keys = 1
	}
	if r.multi() {
		r.multiKeys()
	} else {
		for i := range keys {
			r.keys = append(r.keys, fmt.Sprintf("chaos/%s/k%d", spec.Name, i))
		}
	}
	if err := ensureDir(r.histDir); err != nil {
		return nil, err
	}
	r.hrec, err = history.Create(filepath.Join(r.histDir, "harness.jsonl"), "harness", r.clock)
	if err != nil {
		return nil, err
	}
	checkTokens := !spec.breaks(FencingOff) && !spec.breaks(IgnoreDone)
	if checkTokens {
		// Plain writes go through the shipped PostgreSQL fence (fencepg.go).
		if r.fencePool, err = r.startFencePG(); err != nil {
			return nil, errors.Join(err, r.hrec.Close())
		}
	}
	r.fenced, err = fenced.Start(fenced.Config{CheckTokens: checkTokens,
		Clock: r.clock, SlotCheck: r.slotCheck, PGFence: r.fencePool})
	if err != nil {
		if r.fencePool != nil {
			r.fencePool.Close()
		}
		return nil, errors.Join(err, r.hrec.Close())
	}

	runErr := r.execute(ctx)
	stopErr := r.teardown()
	if err := errors.Join(runErr, stopErr); err != nil {
		return nil, fmt.Errorf("scenario %s: %w (logs in %s)", spec.Name, err, dir)
	}
	rep, err = r.evaluate()
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", spec.Name, err)
	}
	rep.Wall = time.Since(start)
	return rep, nil
}

// execute starts the system, runs the fault cycles and stops the workers.
func (r *run) execute(ctx context.Context) error {
	if r.spec.SDK == TypeScriptSDK {
		if err := r.env.typescriptBuilt(); err != nil {
			return err
		}
	}
	if err := r.startBackend(); err != nil {
		return err
	}
	if err := r.startLockd(); err != nil {
		return err
	}
	if err := r.startFar(); err != nil {
		return err
	}
	if err := r.startGate(); err != nil {
		return err
	}
	if err := r.startSlotClient(); err != nil {
		return err
	}
	r.planWorkers()
	for slot := range r.workerSpecs {
		w, err := r.startWorker(slot, 1)
		if err != nil {
			return err
		}
		r.workers = append(r.workers, w)
		r.incarn = append(r.incarn, 1)
	}
	r.logf("started: lockd %v, %d workers on %v", r.lockdAddrs(), len(r.workers), r.keys)
	if err := r.warmUp(ctx); err != nil {
		return err
	}
	if err := r.faultPhase(ctx); err != nil {
		return err
	}
	if err := r.awaitRegrants(ctx); err != nil {
		return err
	}
	if err := sleep(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	return r.stopWorkers()
}

// warmUpTimeout bounds the warm-up: every worker's first grant.
const warmUpTimeout = 60 * time.Second

// warmUp waits until every worker has held a key once (sessions open,
// queues formed), then a moment more.
func (r *run) warmUp(ctx context.Context) error {
	deadline := time.Now().Add(warmUpTimeout)
	for {
		ready := true
		r.mu.Lock()
		for _, w := range r.workers {
			ready = ready && w.holds.Load() > 0
		}
		r.mu.Unlock()
		if ready {
			return sleep(ctx, 500*time.Millisecond)
		}
		if err := r.checkAlive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("warm-up: not every worker was granted a key within %v", warmUpTimeout)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// etcdClusterSize is how many members an EtcdCluster has.
const etcdClusterSize = 3

// controlMaxCycles bounds the short mode's cycles of a control with its
// break on, which runs until its violation is in the histories (caught).
// Every control's window is made on purpose, so controlMinCycles cycles
// are enough; the rest is a backstop for a cycle
// whose wall-clock bound a stalled machine overran, and the log says so.
const controlMaxCycles = 4

// controlMinCycles is how many cycles a control needs to make every
// violation its verdict asks for: ignore-done makes its semaphore's in even
// cycles and its read/write lock's in odd ones, the others all in one.
func (s Spec) controlMinCycles() int {
	if s.Control == IgnoreDone {
		return 2
	}
	return 1
}

// untilCaught reports whether the short mode runs the control until its
// violation is in the histories so far. NoSync's cannot be: its violation
// is a want that is never granted, an open or acquire still in flight —
// recorded when the run stops its workers — so it runs its Spec.Cycles
// (one per original member: then lockd reaches no etcd, certainly) and is
// judged at the end like any scenario.
func (s Spec) untilCaught() bool {
	return !s.judgedReal() && s.Control != NoSync
}

// faultPhase runs fault cycles: Spec.Cycles in short mode, for
// Options.Duration in long mode, with a random quiet gap between cycles.
// In short mode a control with its break on runs cycles until its checker
// has caught it (caught), at most controlMaxCycles, and fails the scenario
// with what it did not find if it has not by then.
func (r *run) faultPhase(ctx context.Context) error {
	end := time.Now().Add(r.opts.Duration)
	untilCaught := r.opts.Duration == 0 && r.spec.untilCaught()
	for i := 0; ; i++ {
		if untilCaught && i >= r.spec.controlMinCycles() {
			ok, why, err := r.caught()
			if err != nil {
				return err
			}
			if ok {
				r.logf("control caught after %d cycle(s)", i)
				return nil
			}
			if i >= controlMaxCycles {
				return fmt.Errorf("control not caught in %d cycles: %s", i, why)
			}
			r.logf("control not caught after cycle %d (%s): another cycle", i, why)
		}
		if r.opts.Duration == 0 && !untilCaught && i >= r.spec.Cycles {
			return nil
		}
		if r.opts.Duration > 0 && time.Now().After(end) {
			return nil
		}
		if err := r.checkAlive(); err != nil {
			return err
		}
		if err := r.cycle(ctx, i); err != nil {
			return fmt.Errorf("fault cycle %d: %w", i+1, err)
		}
		if r.opts.Duration > 0 {
			if err := sleep(ctx, time.Duration(r.rng.Int64N(int64(1500*time.Millisecond)))); err != nil {
				return err
			}
		}
	}
}

// caught reports whether the histories so far hold the violations the
// control must be caught with (Report.controlVerdict), and if not, what is
// missing. Every grant the cycle paused or kept has been released by then
// (each cycle lets its targets go and waits before it returns), so no trust
// interval is left open by a process that stopped trusting.
func (r *run) caught() (bool, string, error) {
	var (
		rep *Report
		err error
	)
	// A worker incarnation started a moment ago may not have written its
	// history's first line yet: read again.
	for try := 0; try < 5; try++ {
		if rep, err = r.evaluateWith(false); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // a retry of a read, not synchronisation
	}
	if err != nil {
		return false, "", fmt.Errorf("control: check the histories so far: %w", err)
	}
	if rep.Acquisitions == 0 {
		return false, "no acquisitions yet", nil
	}
	ok, why := rep.controlVerdict()
	return ok, why, nil
}

// checkAlive reports a worker that exited without being killed.
func (r *run) checkAlive() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.p.done() && !w.wasKilled() {
			return fmt.Errorf("worker %s died on its own: %w", w.proc, w.p.failure())
		}
	}
	return nil
}

func (r *run) lockdAddrs() []string {
	var a []string
	for _, l := range r.lockds {
		a = append(a, l.Addr())
	}
	return a
}

// partitioned reports whether the scenario puts a proxy between lockd and
// its backend.
func (r *run) partitioned() bool {
	return r.spec.Fault == PartitionShort || r.spec.Fault == PartitionLong || r.spec.Fault == PartitionReplica
}

// viaProxy reports whether replica i reaches the backend through the proxy:
// all of them for the plain partitions, only replica 0 for PartitionReplica.
func (r *run) viaProxy(i int) bool {
	return r.proxy != nil && (r.spec.Fault != PartitionReplica || i == 0)
}

func (r *run) startBackend() error {
	switch r.spec.Backend {
	case Embedded:
		return nil
	case Etcd, EtcdCluster:
		n := 1
		if r.spec.Backend == EtcdCluster {
			n = etcdClusterSize
		}
		var nodes []*etcdNode
		var err error
		if r.spec.Fault == LeaderIsolate {
			nodes, r.peers, err = startEtcdIsolable(r.env.bins.Etcd, r.dir, n)
		} else {
			nodes, err = startEtcd(r.env.bins.Etcd, r.dir, n)
		}
		if err != nil {
			return err
		}
		r.etcd = nodes
		if r.partitioned() {
			u, err := url.Parse(nodes[0].clientURL)
			if err != nil {
				return err
			}
			if r.proxy, err = newProxy(r.spec.Name, u.Host); err != nil {
				return err
			}
		}
		return nil
	case PG:
		var err error
		if r.spec.Fault == PGRestartFast || r.spec.Fault == PGRestartImmediate {
			r.pg, r.db, err = r.env.privatePG(r.spec.Name)
			r.pgOwn = err == nil
		} else {
			r.pg, r.db, err = r.env.sharedDB()
		}
		if err != nil {
			return err
		}
		if r.partitioned() {
			if r.proxy, err = newProxy(r.spec.Name, r.pg.Addr()); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown backend %q", r.spec.Backend)
}

// pgDSN is the DSN replica i uses: through the proxy when viaProxy.
func (r *run) pgDSN(i int) string {
	host := r.pg.Addr()
	if r.viaProxy(i) {
		host = r.proxy.addr()
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", host, r.db)
}

func (r *run) startLockd() error {
	replicas := 1
	if r.spec.Fault == ReplicaDeath || r.spec.Fault == PartitionReplica || r.spec.Fault == ReplicaSwitch || r.spec.Fault == LockdPause {
		replicas = 2
	}
	bin := r.env.bins.Lockd
	if r.replicaFault() {
		replicas = 3
	}
	if r.spec.breaks(StaleRecord) {
		bin = r.env.bins.LockdStale
	}
	if r.spec.breaks(DeadlockOff) {
		bin = r.env.bins.LockdDeadlockOff
	}
	cfg := lockdConfig{
		bin:     bin,
		dir:     r.dir,
		backend: string(r.spec.Backend),
		ttl:     r.opts.TTL,
		margin:  r.opts.Margin,
		reaper:  r.opts.Reaper,
		prefix:  "/chaos/",
	}
	if r.spec.Backend == Etcd || r.spec.Backend == EtcdCluster {
		cfg.backend = "etcd"
	}
	for i := range replicas {
		c := cfg
		c.name = fmt.Sprintf("lockd%d", i)
		switch r.spec.Backend {
		case Etcd, EtcdCluster:
			c.etcd = endpoints(r.etcd)
			if r.viaProxy(i) {
				c.etcd = []string{"http://" + r.proxy.addr()}
			}
			c.autoSync = r.lockdAutoSync(i)
		case PG:
			c.pgDSN = r.pgDSN(i)
		}
		l, err := startLockd(c)
		if err != nil {
			return err
		}
		r.lockds = append(r.lockds, l)
	}
	return r.startFront()
}

// planWorkers decides what every worker slot runs.
func (r *run) planWorkers() {
	addrs := r.clientAddrs()
	workers := r.opts.Workers
	if r.multi() {
		workers = multiWorkers
	}
	for slot := range workers {
		ws := workerSpec{clockScale: 1, trust: worker.TrustSDK, holdMin: r.opts.HoldMin, holdMax: r.opts.HoldMax,
			sdk: r.spec.SDK}
		if r.spec.Fault == PartitionReplica {
			// Holds across heartbeats, some longer than the TTL: trust
			// must be kept by heartbeats, and lost when they fail.
			ws.holdMin, ws.holdMax = 300*time.Millisecond, r.opts.TTL*3/2
		}
		if r.spec.Fault == ReplicaSwitch {
			ws.holdMin, ws.holdMax = switchHolds(r.opts.TTL)
		}
		if r.replicaFault() {
			ws.holdMin, ws.holdMax = r.replicaHolds()
		}
		if r.spec.Control == NoHeal {
			ws.sessionTTL = r.noHealSessionTTL()
		}
		for i := range addrs { // spread the workers over the replicas
			ws.lockd = append(ws.lockd, addrs[(slot+i)%len(addrs)])
		}
		switch {
		case r.spec.Fault == ClockSkew && slot == 0:
			ws.clockScale = 1.5
		case r.spec.Fault == ClockSkew && slot == 1:
			ws.clockScale = 0.85
		case r.spec.Fault == UpstreamHold && slot == 0:
			r.planUpstream(&ws)
		case r.spec.Control == SlowClock && slot == 0:
			ws.heartbeatInterval = slowHeartbeat
			if r.spec.breaks(SlowClock) {
				ws.clockScale = slowScale
			}
		case r.spec.Fault == FarHolder && slot == 0:
			r.planFar(&ws)
		}
		if r.multi() {
			r.planMulti(slot, &ws)
		}
		if r.deadlocks() {
			r.planPairs(slot, &ws)
		}
		r.workerSpecs = append(r.workerSpecs, ws)
	}
}

// targets reports which workers a pause or kill may hit.
func (r *run) targets(w *workerProc) bool {
	switch {
	case r.spec.Fault == ClockSkew:
		return w.slot == 0 || w.slot == 1
	case r.spec.Control == SlowClock, r.spec.Fault == FarHolder:
		return w.slot == 0
	}
	return true
}

// triggerTimeout bounds the wait for a worker to reach the state a fault
// aims at.
const triggerTimeout = 45 * time.Second

// onNext arms a trigger on every current worker that filter accepts and
// waits until one prints a line in state on ("wait", or "hold" for a
// pausable hold); action runs in that worker's reader at once.
func (r *run) onNext(ctx context.Context, on string, filter func(*workerProc) bool, action func(*workerProc)) (*workerProc, error) {
	tr := &trigger{on: on, fired: make(chan *workerProc, 1), action: action}
	r.mu.Lock()
	armed := append([]*workerProc(nil), r.workers...)
	r.mu.Unlock()
	n := 0
	for _, w := range armed {
		if filter(w) && !w.p.done() && !w.isStopped() {
			w.trig.Store(tr)
			n++
		}
	}
	defer func() {
		for _, w := range armed {
			w.trig.CompareAndSwap(tr, nil)
		}
	}()
	if n == 0 {
		return nil, errors.New("no worker to target")
	}
	t := time.NewTimer(triggerTimeout)
	defer t.Stop()
	select {
	case w := <-tr.fired:
		return w, nil
	case <-t.C:
		return nil, fmt.Errorf("no targeted worker reached state %q within %v", on, triggerTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (r *run) countFault() {
	r.mu.Lock()
	r.faults++
	r.mu.Unlock()
}

// cycle runs fault cycle i, its recovery included.
func (r *run) cycle(ctx context.Context, i int) error {
	ttl := r.opts.TTL
	switch r.spec.Fault {
	case PauseHolder, ClockSkew:
		return r.pauseHolder(ctx)
	case FarHolder:
		return r.pauseFarHolder(ctx)
	case UpstreamHold:
		return r.upstreamHold(ctx)
	case KillHolder:
		return r.killHolder(ctx)
	case KillLockd:
		l := r.lockds[0]
		var start int64
		if _, err := r.onNext(ctx, "wait", func(*workerProc) bool { return true },
			func(*workerProc) { start = r.clock.Now(); l.proc().signal(syscall.SIGKILL) }); err != nil {
			return err
		}
		l.down()
		r.countFault()
		r.logf("killed lockd mid-acquire")
		if err := sleep(ctx, 300*time.Millisecond); err != nil {
			return err
		}
		if err := l.restart(); err != nil {
			return err
		}
		r.faultWindow(start)
		return sleep(ctx, 2*ttl)
	case PartitionShort, PartitionLong, PartitionReplica:
		d := ttl / 2
		if r.spec.Fault != PartitionShort {
			d = 3 * ttl
		}
		var start int64
		if r.spec.Fault == PartitionReplica {
			// Cut while a client of replica 0 holds a key, so that its
			// trust must end by its deadline, not by its release.
			var perr error
			if _, err := r.onNext(ctx, "hold", func(w *workerProc) bool { return w.slot%2 == 0 },
				func(*workerProc) { start, perr = r.clock.Now(), r.proxy.partition() }); err != nil {
				return err
			}
			if perr != nil {
				return perr
			}
		} else {
			start = r.clock.Now()
			if err := r.proxy.partition(); err != nil {
				return err
			}
		}
		r.countFault()
		r.logf("cut %s from the backend for %v", r.lockds[0].cfg.name, d)
		if err := sleep(ctx, d); err != nil {
			return err
		}
		if r.spec.Control == NoHeal {
			return r.noHeal(ctx, start)
		}
		if err := r.proxy.heal(); err != nil {
			return err
		}
		r.faultWindow(start)
		return sleep(ctx, 2*ttl)
	case PGRestartFast, PGRestartImmediate:
		mode := pgserver.Fast
		if r.spec.Fault == PGRestartImmediate {
			mode = pgserver.Immediate
		}
		// Not ctx: a restart, once begun, completes, so the server is up
		// for the stop at the end of the run.
		start := r.clock.Now()
		if err := r.pg.Restart(context.Background(), mode); err != nil {
			return err
		}
		r.faultWindow(start)
		r.countFault()
		r.logf("restarted postgresql (%s)", mode)
		return sleep(ctx, 2*ttl)
	case ReplicaSwitch:
		return r.replicaSwitch(ctx)
	case ReplicaDeath:
		l := r.lockds[i%len(r.lockds)]
		start := r.clock.Now()
		l.kill()
		r.countFault()
		r.logf("killed replica %s", l.cfg.name)
		if err := sleep(ctx, 2*ttl); err != nil {
			return err
		}
		if err := l.restart(); err != nil {
			return err
		}
		r.faultWindow(start)
		return sleep(ctx, ttl)
	case MultiPauseKill:
		return r.multiCycle(ctx, i)
	case DeadlockPairs:
		return r.deadlockCycle(ctx)
	case LeaderKill:
		leader, err := etcdLeader(ctx, r.etcd)
		if err != nil {
			return err
		}
		start := r.clock.Now()
		leader.kill()
		r.countFault()
		r.logf("killed etcd leader %s", leader.name)
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
		if err := leader.restart(); err != nil {
			return err
		}
		r.faultWindow(start)
		return sleep(ctx, 2*ttl)
	}
	if handled, err := r.cycle11(ctx, i); handled {
		return err
	}
	if handled, err := r.cycle13(ctx); handled {
		return err
	}
	if handled, err := r.cycle21(ctx, i); handled {
		return err
	}
	return fmt.Errorf("unknown fault %q", r.spec.Fault)
}

// pauseHolder SIGSTOPs a targeted holder between its two writes for twice
// the TTL and until another grant's write supersedes its own
// (pauseHolderWith), then resumes it.
func (r *run) pauseHolder(ctx context.Context) error { return r.pauseHolderWhere(ctx, r.targets, nil) }

// pauseHolderWhere is pauseHolder of a worker that filter accepts, at the
// first of its holds for which when (if set) is true at the hold's line.
func (r *run) pauseHolderWhere(ctx context.Context, filter, when func(*workerProc) bool) error {
	return r.pauseHolderWith(ctx, filter, when, nil)
}

// pauseHolderWith is pauseHolderWhere that also calls during (if set) once
// the holder is stopped; the holder stays stopped until during returns,
// and the error of during ends the cycle.
//
// The pause lasts twice the TTL and then until the fenced resource has
// accepted another grant's write above the paused one (superseded): the
// paused holder's late write, sent after SIGCONT, comes after a successor's
// write by construction, so it is refused (check.PausesHitHolders), or with
// the token check off it overlaps that write (the fencing-off control).
// Twice the TTL alone made that likely, not certain: nobody else may want
// the key in time on a loaded machine.
func (r *run) pauseHolderWith(ctx context.Context, filter, when func(*workerProc) bool,
	during func(ctx context.Context, w *workerProc) error) error {
	var (
		at      int64
		w       *workerProc
		paused  bool
		skipped int
		key     string
		token   uint64
		mode    string
	)
	for end := time.Now().Add(triggerTimeout); !paused; skipped++ {
		if time.Now().After(end) {
			return fmt.Errorf("no targeted holder was pausable within %v", triggerTimeout)
		}
		var err error
		w, err = r.onNext(ctx, "hold", filter, func(w *workerProc) {
			if when != nil && !when(w) {
				return
			}
			paused = true
			at = r.clock.Now()
			key, token, mode = w.held()
			w.markStopped(true)
			if !w.p.pause() { // before onLine answers the hold line
				r.logf("%s: not every thread stopped within %v of SIGSTOP", w.proc, pauseWait)
			}
		})
		if err != nil {
			return err
		}
	}
	r.countFault()
	r.logf("paused %s holding %q (token %d; %d holds skipped)", w.proc, key, token, skipped-1)
	serr := sleep(ctx, 2*r.opts.TTL)
	if serr == nil {
		serr = r.awaitSuperseded(ctx, w, key, token, mode, at)
	}
	if serr == nil && during != nil {
		serr = during(ctx, w)
	}
	until := r.clock.Now()
	w.p.signal(syscall.SIGCONT)
	w.markStopped(false)
	r.faultWindow(at)
	r.mu.Lock()
	r.deaths = append(r.deaths, check.Death{Proc: w.proc, At: at})
	r.pauses = append(r.pauses, check.Death{Proc: w.proc, At: at, Until: until})
	r.mu.Unlock()
	if serr != nil {
		return serr
	}
	return sleep(ctx, r.opts.TTL/2)
}

// killHolder SIGKILLs a holder between its two writes (recording the crash
// first) and starts the slot's next incarnation.
func (r *run) killHolder(ctx context.Context) error { return r.killHolderWhere(ctx, r.targets) }

// killHolderWhere is killHolder of a holder that filter accepts.
func (r *run) killHolderWhere(ctx context.Context, filter func(*workerProc) bool) error {
	var at int64
	w, err := r.onNext(ctx, "hold", filter, func(w *workerProc) {
		at = r.clock.Now()
		r.hrec.Crash(w.proc, at)
		w.markKilled()
		w.p.signal(syscall.SIGKILL)
	})
	if err != nil {
		return err
	}
	<-w.p.exited
	r.faultWindow(at)
	r.countFault()
	r.logf("killed %s", w.proc)
	r.mu.Lock()
	r.incarn[w.slot]++
	n := r.incarn[w.slot]
	r.mu.Unlock()
	nw, err := r.startWorker(w.slot, n)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.workers[w.slot] = nw
	r.mu.Unlock()
	return sleep(ctx, r.opts.TTL+time.Second)
}

// stopWorkers resumes and stops every worker; one that does not exit in
// time is killed (its crash recorded first).
func (r *run) stopWorkers() error {
	r.mu.Lock()
	ws := append([]*workerProc(nil), r.workers...)
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		if w.p.done() {
			continue
		}
		wg.Add(1)
		go func() { // returns once the worker has exited
			defer wg.Done()
			w.p.signal(syscall.SIGCONT)
			if !w.started(startTimeout) {
				r.problem("worker %s had not started (no history file) %v after the stop began", w.proc, startTimeout)
			}
			w.p.signal(syscall.SIGTERM)
			t := time.NewTimer(20 * time.Second)
			defer t.Stop()
			select {
			case <-w.p.exited:
			case <-t.C:
				r.hrec.Crash(w.proc, r.clock.Now())
				w.markKilled()
				w.p.kill()
				r.problem("worker %s did not stop within 20s of SIGTERM; killed it", w.proc)
			}
		}()
	}
	wg.Wait()
	var errs []error
	for _, w := range ws {
		if !w.wasKilled() && w.p.err() != nil {
			errs = append(errs, w.p.failure())
		}
	}
	return errors.Join(errs...)
}

// teardown stops everything the run started. Errors are servers that died
// on their own.
func (r *run) teardown() error {
	var errs []error
	r.mu.Lock()
	ws := append([]*workerProc(nil), r.workers...)
	r.mu.Unlock()
	for _, w := range ws {
		if !w.p.done() {
			r.hrec.Crash(w.proc, r.clock.Now())
			w.markKilled()
			w.p.kill()
		}
	}
	if c := r.slotClient.Load(); c != nil {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("slot check client: %w", err))
		}
	}
	for _, l := range r.lockds {
		if err := l.stop(); err != nil {
			errs = append(errs, err)
		}
		l.releaseAddr() // held if a cycle failed between a kill and its restart
	}
	if r.proxy != nil {
		r.proxy.close()
	}
	if r.far != nil {
		r.far.close()
	}
	if r.gate != nil {
		r.gate.close()
	}
	if r.front != nil {
		r.front.close()
	}
	for _, nd := range r.etcd {
		if r.retired(nd) { // a cycle failed between a removal and its replacement
			continue
		}
		if err := nd.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if r.peers != nil {
		r.peers.close()
	}
	r.closeMembers()
	if r.pgOwn {
		if err := r.pg.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.fenced.Close(); err != nil {
		errs = append(errs, fmt.Errorf("fenced resource: %w", err))
	}
	if r.fencePool != nil {
		r.fencePool.Close()
	}
	if err := r.hrec.Close(); err != nil {
		errs = append(errs, fmt.Errorf("harness history: %w", err))
	}
	return errors.Join(errs...)
}
