// Command chaos-worker is one client process of the chaos suite (package
// lock.dev/lockd/test/chaos/worker): the harness in test/chaos builds it,
// starts several, and pauses and kills them. It is not meant to be run by
// hand. The run's epoch comes from the environment (history.EpochEnv).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"lock.dev/lockd/test/chaos/history"
	"lock.dev/lockd/test/chaos/worker"
)

func main() {
	var (
		cfg         worker.Config
		lockd, keys string
		trust       string
	)
	fs := flag.NewFlagSet("chaos-worker", flag.ContinueOnError)
	fs.StringVar(&cfg.Proc, "proc", "", "process id in the history (unique per incarnation)")
	fs.StringVar(&lockd, "lockd", "", "lockd gRPC addresses, comma-separated")
	fs.StringVar(&cfg.FencedURL, "fenced", "", "fenced resource base URL")
	fs.StringVar(&cfg.HistoryPath, "history", "", "history file to create")
	fs.StringVar(&keys, "keys", "", "lock keys, comma-separated")
	fs.DurationVar(&cfg.SessionTTL, "ttl", 0, "session TTL (0: the server's)")
	fs.DurationVar(&cfg.HoldMin, "hold-min", 0, "least time between the two writes of a grant")
	fs.DurationVar(&cfg.HoldMax, "hold-max", 0, "most time between the two writes of a grant")
	fs.Float64Var(&cfg.ClockScale, "clock-scale", 1, "rate of the SDK's clock relative to real time")
	fs.StringVar(&trust, "trust", string(worker.TrustSDK), "sdk, or receive-ttl or ignore-done (controls)")
	var limit uint
	fs.UintVar(&limit, "limit", 0, "take every key as a semaphore of this limit (2 or more)")
	fs.BoolVar(&cfg.RW, "rw", false, "take every key as a read/write lock (shared or exclusive grants)")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", 0, "heartbeat interval (0: the server's)")
	fs.BoolVar(&cfg.Pairs, "pairs", false, "take -keys' first key, then, holding it, its second (the deadlock scenario)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the random choices")
	holdAck := fs.Bool("hold-ack", false, "after each hold line, wait for a line on stdin before the grant's second write")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *holdAck {
		cfg.HoldAck = bufio.NewReader(os.Stdin)
	}
	cfg.Lockd, cfg.Keys, cfg.Trust = worker.ParseList(lockd), worker.ParseList(keys), worker.Trust(trust)
	if limit > 1024 {
		fmt.Fprintf(os.Stderr, "chaos-worker: -limit %d: at most 1024\n", limit)
		os.Exit(2)
	}
	cfg.Limit = uint32(limit)
	epoch, err := history.ParseEpoch(os.Getenv(history.EpochEnv))
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos-worker: %s: %v\n", history.EpochEnv, err)
		os.Exit(2)
	}
	cfg.Epoch = epoch

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := worker.Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "chaos-worker: %v\n", err)
		os.Exit(1)
	}
}
