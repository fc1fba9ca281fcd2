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
		Long: `Bench measures lockd (its gRPC server in this process on 127.0.0.1, through
the Go SDK, over a real backend) and the locking a user would build directly
on that backend instead, on the same backend instance, alternating them round
by round, and prints one table with the ratio lockd/raw of every figure.

  --backend embedded   an etcd started in this process (data in --data-dir,
                       default a temporary directory); baselines etcd-txn and
                       etcd-mutex
  --backend etcd       the etcd at --etcd-endpoints; the same baselines
  --backend pg         the PostgreSQL at --pg-dsn; baseline pg-raw (schemas
                       lockd_bench, lockd_bench_raw and lockd_bench_idle are
                       dropped and recreated)

Scenarios (--scenarios, comma-separated; default all):
  distinct   keys of their own per client at concurrency 1, 8, 64: pairs/s
             (acquire + release) and p50/p99 latency of a pair
  contended  one key at concurrency 8, 64: hand-overs/s and fairness
             (max/min acquisitions per client)
  death      one session holding N locks ends, for each N of --death-locks:
             time until the backend holds none of them
  idle       --idle-sessions sessions held open for --idle-duration: CPU and
             RSS of a 'lockd serve' child process

Progress goes to stderr; the table (or --json) to stdout. Each measurement
lasts --duration after a short warm-up and is repeated --rounds times.

--cpuprofile FILE writes a pprof CPU profile of the scenarios (setup
excluded). Samples are labelled by system, so
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
		death     string
		profile   string
		asJSON    bool
	)
	f := cmd.Flags()
	f.StringVar(&cfg.Backend, "backend", bench.BackendEmbedded, "backend: embedded, etcd or pg")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "etcd endpoints, comma-separated (--backend etcd)")
	f.StringVar(&cfg.PGDSN, "pg-dsn", "", "PostgreSQL connection string (--backend pg)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "data directory of the embedded etcd (default: a temporary directory)")
	f.DurationVar(&cfg.Duration, "duration", bench.DefaultDuration, "length of one measurement")
	f.IntVar(&cfg.Rounds, "rounds", bench.DefaultRounds, "rounds per measurement, alternating lockd and the baselines")
	f.StringVar(&scenarios, "scenarios", strings.Join(bench.Scenarios, ","), "scenarios to run, comma-separated")
	f.StringVar(&distinct, "distinct-concurrency", joinInts(bench.DefaultDistinctConcurrency), "client counts of the distinct scenario")
	f.StringVar(&contended, "contended-concurrency", joinInts(bench.DefaultContendedConcurrency), "client counts of the contended scenario")
	f.StringVar(&death, "death-locks", joinInts(bench.DefaultDeathLocks), "locks held by the dying session, comma-separated (one measurement each)")
	f.IntVar(&cfg.IdleSessions, "idle-sessions", bench.DefaultIdleSessions, "sessions of the idle scenario")
	f.DurationVar(&cfg.IdleDuration, "idle-duration", bench.DefaultIdleDuration, "how long the idle sessions are measured")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON instead of a table")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the scenarios to this file (labelled by system)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg.Scenarios = splitList(scenarios)
		var err error
		if cfg.DistinctConcurrency, err = parseInts(distinct); err != nil {
			return usageErrorf("--distinct-concurrency: %v", err)
		}
		if cfg.ContendedConcurrency, err = parseInts(contended); err != nil {
			return usageErrorf("--contended-concurrency: %v", err)
		}
		if cfg.DeathLocks, err = parseInts(death); err != nil {
			return usageErrorf("--death-locks: %v", err)
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
