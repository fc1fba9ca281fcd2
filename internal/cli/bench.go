package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"lock.dev/lockd/internal/bench"
)

func newBenchCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure lockd side by side with raw etcd / PostgreSQL locking on the same backend",
		Long: `Bench measures lockd (its gRPC server on 127.0.0.1, through the Go SDK, over
a real backend) and the locking a user would build directly on that backend
instead, on the same backend instance, alternating them round by round, and
prints one table with the ratio lockd/raw of every figure.

Processes: with --backend etcd and pg every system runs in processes of its
own. lockd's server is a 'lockd serve' child for the whole run; each cell
(system, scenario, concurrency, round) of distinct, contended, election and
semaphore runs its clients in a child of its own (lockd's SDK clients as much
as a baseline's clientv3 or pgx clients). Those rows come with the CPU per
operation (pair, hand-over, acquisition) of each process inside the measured
window: lockd's server, its clients' process, a baseline's clients' process,
and the etcd process when the bench started it. --in-process (implied by
--backend embedded and --cpuprofile) runs everything in this process instead,
without CPU rows. A cell whose system counted operations while the backend
committed nothing is refused.

  --backend etcd       an etcd in a process of its own, started by the bench
                       (data in --data-dir, default a temporary directory),
                       or the etcd at --etcd-endpoints; baselines etcd-txn
                       (primary: raw Txn + watch) and etcd-mutex (reference
                       only), etcd-session for idle
  --backend embedded   an etcd inside the bench process (as 'lockd serve'
                       runs it); the same baselines, but etcd shares one Go
                       runtime with lockd and the baselines' clients
  --backend pg         the PostgreSQL at --pg-dsn; baselines pg-raw (primary:
                       sessions + cascade, a pool of c connections opened
                       before the clock starts), pg-raw-min (primary key
                       only) and pg-raw-defpool (pgxpool's default pool);
                       schemas lockd_bench, lockd_bench_raw, lockd_bench_min
                       and lockd_bench_idle are dropped and recreated

With the distinct scenario come the ceilings of the same run, measured at the
same concurrencies on the same data directory: fsync-4k (4 KiB write +
fdatasync per worker), etcd-put or pg-insert (autocommit INSERT). Each
system's commits/s (2 per pair) is shown as a share of the backend's ceiling;
a baseline below 50 % of it, or slower than at a lower concurrency, is
flagged. The report records where the backend runs, its durability settings
and the data directory's filesystem. The order of the systems rotates by one
each round.

Scenarios (--scenarios, comma-separated; default all but estimate and scale):
  distinct   keys of their own per client at concurrency 1, 8, 64: pairs/s
             (acquire + release) and p50/p99 latency of a pair
  contended  one key at concurrency 8, 64: hand-overs/s and fairness
             (max/min acquisitions per client)
  election   leader election with 2, 8 candidates (--election-concurrency)
             campaigning in a loop, each leader resigning once every other
             candidate campaigns, and one observer: hand-overs/s, hand-over
             latency (Resign start until the next leader's Campaign
             returns) and observed latency (until the observer reports the
             next leader), p50/p99, and the share of leaders observed.
             Baselines: etcd-election (etcd's own concurrency.Election:
             Campaign, Resign, Observe) and etcd-txn (its lock with the
             value, Get + watch to observe); on PostgreSQL pg-raw (its lock
             on a leaders table with a value, observed by polling the row
             every 2-10 ms: PostgreSQL has no election library)
  semaphore  8, 64 clients (--semaphore-concurrency) loop taking one of the
             N slots (--semaphore-limit, default 4) of one counting
             semaphore, holding it 1 ms and freeing it: acquisitions/s,
             wait p50/p99 (until the slot is granted), fairness and the
             most holders at once (more than N fails the run). lockd:
             Acquire with WithLimit(N). Baselines (etcd's concurrency
             package and PostgreSQL have no semaphore): etcd-sem, the raw
             N-slot recipe (a waiter key per client on its lease, admitted
             while fewer than N keys have a lower create revision, else
             watching for deletes of those); pg-sem, N slot rows taken with
             UPDATE ... (SELECT ... FOR UPDATE SKIP LOCKED), polled every
             2-10 ms when none is free
  acquire-all
             1, 8 clients (--acquire-all-concurrency), each with keys of its
             own, loop taking a set of 4 keys and releasing them, on lockd
             both ways through the Go SDK: lockd-all (Session.AcquireAll,
             one commit for a set of free keys) against lockd-sorted
             (Session.Acquire of each key in ascending order); sets/s and
             the take's p50/p99 (until the whole set is held)
  death      one session holding N locks ends, for each N of --death-locks:
             time until the backend holds none of them
  idle       --idle-sessions sessions held open for --idle-duration: CPU and
             RSS of a 'lockd serve' child process (with the etcd process
             the bench started, or the PostgreSQL backends serving its
             connections when PostgreSQL runs on this machine), against as
             many raw sessions: on etcd clientv3 concurrency.Sessions
             (etcd-session: the etcd process's CPU), on PostgreSQL
             pg-session (a row per session with expires_at, all renewed by
             one UPDATE per TTL/3 and expired rows deleted every second,
             on one connection: its PostgreSQL backend's CPU)
  failover   three 'lockd serve' children over the backend, one holder
             given every address: --failover-kills times, SIGKILL the
             replica it talks to and time its next heartbeat answered
             through another (p50/p99 ms; target under TTL/3)
  estimate   (not in the default run: name it) the wait estimate (issue 27):
             as many clients as the first --contended-concurrency loop on one key,
             holding it 10-50 ms (uniform), each polling Inspect every 5 ms
             while it waits: |estimate - actual| p50/p90 (and the signed
             median: the bias) over the waits
             after the warm-up, from the first answer listing the waiter
             to its grant; lockd only, its clients in the bench process
  scale      (not in the default run: name it; a few minutes) idle sessions
             on lockd replicas over a 3-member etcd the scenario starts
             (each member its own process, whatever --backend is): for
             every N of --scale-sessions (default 1000,5000,10000) and R of
             --scale-replicas (default 1,3), N sessions spread over R
             'lockd serve' children, measured for --scale-duration (default
             15s): CPU of the etcd leader, of the followers, of the
             replicas and of the clients (this process), and the leader's
             and lockd's CPU per 1000 sessions

SDK rows (issue 25): with --python-sdk DIR (sdk/python of a lockd checkout,
run by --python, default /usr/bin/python3 with Debian's python3-grpcio and
python3-protobuf) and/or --typescript-sdk DIR (sdk/typescript after npm ci,
run by --node), the distinct scenario also measures lockd through those
SDKs at --sdk-concurrency (default 1,64): each cell runs its clients in a
worker process of that SDK, beside the same cell through the Go SDK
(go-sdk) in the same rounds, and every figure (pairs/s, p50, p99) is shown
as a ratio to the Go SDK's.

Progress goes to stderr; the table (or --json) to stdout. Each measurement
lasts --duration after a short warm-up and is repeated --rounds times.

--cpuprofile FILE writes a pprof CPU profile of the scenarios (setup
excluded), with every system in this process (--in-process). Samples are labelled by system, so
  go tool pprof -tagfocus system=lockd lockd FILE
shows what lockd itself (SDK, gRPC server, store) costs; the other values
are the baselines' names and "backend" (the embedded etcd).`,
		Args: exactArgs(0, "no arguments"),
	}
	var (
		cfg       bench.Config
		scenarios string
		distinct  string
		contended string
		election  string
		semaphore string
		acqAll    string
		death     string
		profile   string
		asJSON    bool
		pySDK     string
		python    string
		tsSDK     string
		node      string
		sdkConc   string
		scaleN    string
		scaleR    string
	)
	f := cmd.Flags()
	f.StringVar(&cfg.Backend, "backend", bench.BackendEmbedded, "backend: embedded, etcd or pg")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "etcd endpoints, comma-separated (--backend etcd; default: start etcd in a process of its own)")
	f.StringVar(&cfg.PGDSN, "pg-dsn", "", "PostgreSQL connection string (--backend pg)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "data directory of the etcd the bench starts (default: a temporary directory)")
	f.DurationVar(&cfg.Duration, "duration", bench.DefaultDuration, "length of one measurement")
	f.IntVar(&cfg.Rounds, "rounds", bench.DefaultRounds, "rounds per measurement, alternating lockd and the baselines")
	f.StringVar(&scenarios, "scenarios", strings.Join(bench.Scenarios, ","), "scenarios to run, comma-separated")
	f.StringVar(&distinct, "distinct-concurrency", joinInts(bench.DefaultDistinctConcurrency), "client counts of the distinct scenario")
	f.StringVar(&contended, "contended-concurrency", joinInts(bench.DefaultContendedConcurrency), "client counts of the contended scenario")
	f.StringVar(&election, "election-concurrency", joinInts(bench.DefaultElectionConcurrency), "candidate counts of the election scenario (at least 2)")
	f.StringVar(&semaphore, "semaphore-concurrency", joinInts(bench.DefaultSemaphoreConcurrency), "client counts of the semaphore scenario")
	f.IntVar(&cfg.SemaphoreLimit, "semaphore-limit", bench.DefaultSemaphoreLimit, "N of the semaphore scenario's semaphore (2 to 1024)")
	f.StringVar(&acqAll, "acquire-all-concurrency", joinInts(bench.DefaultAcquireAllConcurrency), "client counts of the acquire-all scenario")
	f.StringVar(&death, "death-locks", joinInts(bench.DefaultDeathLocks), "locks held by the dying session, comma-separated (one measurement each)")
	f.IntVar(&cfg.IdleSessions, "idle-sessions", bench.DefaultIdleSessions, "sessions of the idle scenario")
	f.DurationVar(&cfg.IdleDuration, "idle-duration", bench.DefaultIdleDuration, "how long the idle sessions are measured")
	f.IntVar(&cfg.FailoverKills, "failover-kills", bench.DefaultFailoverKills, "replica kills of the failover scenario")
	f.StringVar(&scaleN, "scale-sessions", joinInts(bench.DefaultScaleSessions), "session counts of the scale scenario, comma-separated")
	f.StringVar(&scaleR, "scale-replicas", joinInts(bench.DefaultScaleReplicas), "lockd replica counts of the scale scenario (every pair with --scale-sessions)")
	f.DurationVar(&cfg.ScaleDuration, "scale-duration", bench.DefaultScaleDuration, "how long each point of the scale scenario is measured")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON instead of a table")
	f.BoolVar(&cfg.StatsOffRows, "stats-off-rows", false, "also measure lockd with --stats-enabled=false (the system lockd-nostats) in distinct and contended: the statistics' cost")
	f.BoolVar(&cfg.InProcess, "in-process", false, "run lockd's server and every system's clients in this process (the layout before issue 24)")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the scenarios to this file (labelled by system)")
	f.StringVar(&pySDK, "python-sdk", "", "sdk/python of a lockd checkout: add the Python SDK's rows to distinct")
	f.StringVar(&python, "python", "/usr/bin/python3", "the interpreter of --python-sdk (with python3-grpcio and python3-protobuf)")
	f.StringVar(&tsSDK, "typescript-sdk", "", "sdk/typescript of a lockd checkout after npm ci: add the TypeScript SDK's rows to distinct")
	f.StringVar(&node, "node", "node", "the node of --typescript-sdk")
	f.StringVar(&sdkConc, "sdk-concurrency", joinInts(bench.DefaultSDKConcurrency), "client counts of the SDK rows")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg.Scenarios = splitList(scenarios)
		var err error
		if cfg.DistinctConcurrency, err = parseInts(distinct); err != nil {
			return usageErrorf("--distinct-concurrency: %v", err)
		}
		if cfg.ContendedConcurrency, err = parseInts(contended); err != nil {
			return usageErrorf("--contended-concurrency: %v", err)
		}
		if cfg.ElectionConcurrency, err = parseInts(election); err != nil {
			return usageErrorf("--election-concurrency: %v", err)
		}
		if cfg.SemaphoreConcurrency, err = parseInts(semaphore); err != nil {
			return usageErrorf("--semaphore-concurrency: %v", err)
		}
		if cfg.AcquireAllConcurrency, err = parseInts(acqAll); err != nil {
			return usageErrorf("--acquire-all-concurrency: %v", err)
		}
		if cfg.DeathLocks, err = parseInts(death); err != nil {
			return usageErrorf("--death-locks: %v", err)
		}
		if cfg.SDKConcurrency, err = parseInts(sdkConc); err != nil {
			return usageErrorf("--sdk-concurrency: %v", err)
		}
		if cfg.ScaleSessions, err = parseInts(scaleN); err != nil {
			return usageErrorf("--scale-sessions: %v", err)
		}
		if cfg.ScaleReplicas, err = parseInts(scaleR); err != nil {
			return usageErrorf("--scale-replicas: %v", err)
		}
		if pySDK != "" {
			s, err := bench.PythonSDK(pySDK, python)
			if err != nil {
				return usageErrorf("--python-sdk: %v", err)
			}
			cfg.SDKs = append(cfg.SDKs, s)
		}
		if tsSDK != "" {
			s, err := bench.TypeScriptSDK(tsSDK, node)
			if err != nil {
				return usageErrorf("--typescript-sdk: %v", err)
			}
			cfg.SDKs = append(cfg.SDKs, s)
		}
		if exe, err := os.Executable(); err == nil {
			cfg.LockdCommand = []string{exe}
		}
		cfg.Progress = e.stderr
		if err := cfg.Validate(); err != nil {
			return usageErrorf("%v", err)
		}
		var pf *os.File
		if profile != "" {
			if pf, err = os.Create(profile); err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			cfg.CPUProfile = pf
		}
		rep, err := bench.Run(cmd.Context(), cfg)
		if pf != nil {
			if cerr := pf.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("--cpuprofile: %w", cerr))
			}
		}
		if rep == nil {
			return err
		}
		// A failed scenario still leaves the others' figures to print.
		write := rep.WriteTable
		if asJSON {
			write = rep.WriteJSON
		}
		return errors.Join(write(e.stdout), err)
	}
	cmd.AddCommand(newBenchEtcdServerCmd(e), newBenchWorkerCmd(e))
	return cmd
}

// newBenchWorkerCmd is the hidden `lockd bench worker`: one cell of one
// system (a job as JSON on stdin, its figures as JSON on stdout), which
// `lockd bench` starts as a process of its own per system and cell.
func newBenchWorkerCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:    bench.WorkerCommand[len(bench.WorkerCommand)-1],
		Short:  "Measure one cell of one system (started by lockd bench)",
		Args:   exactArgs(0, "no arguments"),
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.RunWorker(cmd.Context(), e.stdin, e.stdout)
		},
	}
}

// newBenchEtcdServerCmd is the hidden `lockd bench etcd-server`: only an
// embedded etcd, which `lockd bench --backend etcd` starts as a process of
// its own.
func newBenchEtcdServerCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:    bench.EtcdServerCommand[len(bench.EtcdServerCommand)-1],
		Short:  "Run only an embedded etcd (started by lockd bench --backend etcd)",
		Args:   exactArgs(0, "no arguments"),
		Hidden: true,
	}
	var (
		dir string
		m   bench.EtcdMember
	)
	f := cmd.Flags()
	f.StringVar(&dir, "data-dir", "", "etcd's data directory")
	f.StringVar(&m.Name, "name", "", "member name (with --initial-cluster; default: a single node)")
	f.StringVar(&m.InitialCluster, "initial-cluster", "", "the cluster's members, NAME=PEERURL,... (default: this member alone)")
	f.StringVar(&m.ClientURL, "client-url", "", "client URL, http on loopback (default: a free 127.0.0.1 port)")
	f.StringVar(&m.PeerURL, "peer-url", "", "peer URL, http on loopback (default: a free 127.0.0.1 port)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return bench.ServeEtcd(cmd.Context(), dir, m, e.stdout)
	}
	return cmd
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
