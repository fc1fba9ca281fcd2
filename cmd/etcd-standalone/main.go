// Command etcd-standalone runs a single-node etcd server (go.etcd.io/etcd/server/v3/embed,
// through internal/embedetcd) as a process of its own, so that tests can run
// lockd against an external etcd: the parity suite (test/parity) starts it
// and points `lockd serve --backend etcd --etcd-endpoints ...` at it.
//
//	etcd-standalone --data-dir DIR [--client-url http://127.0.0.1:PORT] [--peer-url http://127.0.0.1:PORT]
//
// Both URLs must be http on a loopback address; an empty URL picks a free
// 127.0.0.1 port. Once etcd serves clients it prints one line to stdout:
//
//	etcd serving endpoints=http://127.0.0.1:PORT
//
// etcd's warnings go to stderr as JSON lines. SIGINT or SIGTERM stops the
// server cleanly (exit 0); the data directory stays, so a restart on it keeps
// etcd's revision (lockd's fencing tokens). It is a test and development
// tool, not a production etcd.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"lock.dev/lockd/internal/embedetcd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) { // -h: flag already printed the usage
			fmt.Fprintln(os.Stderr, "etcd-standalone:", err)
		}
		if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// errUsage marks a command-line error (exit status 2).
var errUsage = errors.New("usage")

// run starts etcd as configured by args, prints its endpoints to stdout and
// serves until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("etcd-standalone", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg embedetcd.Config
	fs.StringVar(&cfg.DataDir, "data-dir", "", "etcd data directory (required; created if missing)")
	fs.StringVar(&cfg.ClientURL, "client-url", "", "client URL, http on loopback (empty: a free 127.0.0.1 port)")
	fs.StringVar(&cfg.PeerURL, "peer-url", "", "peer URL, http on loopback (empty: a free 127.0.0.1 port)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if cfg.DataDir == "" {
		return fmt.Errorf("%w: --data-dir is required", errUsage)
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil))

	srv, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "etcd serving endpoints=%s\n", strings.Join(srv.Endpoints(), ",")); err != nil {
		return errors.Join(fmt.Errorf("print endpoints: %w", err), srv.Close())
	}
	<-ctx.Done()
	return srv.Close()
}
