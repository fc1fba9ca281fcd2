// Command etcd runs one etcd server (go.etcd.io/etcd/server/v3/embed,
// through internal/embedetcd) as a process of its own, for the suites that
// need etcd outside the lockd process: the parity suite (test/parity) starts
// a single node and points `lockd serve --backend etcd --etcd-endpoints ...`
// at it; the chaos suite (test/chaos) starts one node or the members of a
// small cluster, cuts lockd from them with a proxy, kills and restarts them.
// It is test tooling, not a production etcd and not part of the product
// (which is cmd/lockd alone).
//
//	etcd --data-dir DIR [--client-url URL] [--peer-url URL] [--advertise-peer-url URL]
//	     [--name NAME --initial-cluster NAME=PEERURL,... --initial-cluster-state new|existing]
//	     [--tick-ms 100 --election-ms 1000]
//	     [--cert-file FILE --key-file FILE --client-ca-file FILE]
//
// Both URLs must be http on a loopback address; an empty URL picks a free
// 127.0.0.1 port. With --cert-file, --key-file and --client-ca-file (all
// three, PEM) etcd serves its clients over TLS (an https client URL) and
// requires client certificates signed by the client CA: an external etcd
// reached over mTLS (lock.etcd.tls.*; the parity suite's etcd-tls row). Without --initial-cluster the server is a cluster of its
// own. Once etcd serves clients it prints one line to stdout:
//
//	etcd serving endpoints=http://127.0.0.1:PORT   (https:// with TLS)
//
// etcd's warnings go to stderr as JSON lines. SIGINT or SIGTERM stops the
// server cleanly (exit 0); the data directory stays, so a restart on it keeps
// etcd's revision (lockd's fencing tokens). A member removed from its cluster
// (etcdctl member remove, clientv3's MemberRemove) stops by itself and exits
// 0 at once, as etcd does; a member added to a running cluster is started with
// --initial-cluster-state existing, an empty data directory and the
// --initial-cluster the member add answered. A command-line error exits with
// status 2, any other failure with 1.
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
	// Removed from the cluster: exit at once, as etcd's own main does.
	err := runWith(ctx, os.Args[1:], os.Stdout, os.Stderr, func() { os.Exit(0) })
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) { // -h: flag already printed the usage
			fmt.Fprintln(os.Stderr, "etcd:", err)
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
// serves until ctx ends or the server stops by itself.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run with a hook: removed, if set, is called once the server
// has stopped by itself (a member removed from its cluster), before the
// server is closed. main exits there, as etcd's main does (without the
// graceful close, which waits up to etcd's request timeout, 7 s here, for
// the clients' streams to end), so the clients' connections end at once.
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, removed func()) error {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg embedetcd.Config
	fs.StringVar(&cfg.DataDir, "data-dir", "", "etcd data directory (required; created if missing)")
	fs.StringVar(&cfg.ClientURL, "client-url", "", "client URL, http on loopback (empty: a free 127.0.0.1 port)")
	fs.StringVar(&cfg.PeerURL, "peer-url", "", "peer URL, http on loopback (empty: a free 127.0.0.1 port)")
	fs.StringVar(&cfg.AdvertisePeerURL, "advertise-peer-url", "", "peer URL the other members dial, e.g. a proxy (empty: --peer-url)")
	fs.StringVar(&cfg.Name, "name", "lockd", "member name (kept in the data directory)")
	fs.StringVar(&cfg.InitialCluster, "initial-cluster", "", "the cluster's members, NAME=PEERURL,... (empty: this member alone)")
	fs.StringVar(&cfg.ClusterState, "initial-cluster-state", "new", "new or existing")
	fs.UintVar(&cfg.TickMs, "tick-ms", 100, "heartbeat interval in milliseconds")
	fs.UintVar(&cfg.ElectionMs, "election-ms", 1000, "election timeout in milliseconds")
	var tlsFiles embedetcd.TLSFiles
	fs.StringVar(&tlsFiles.CertFile, "cert-file", "", "PEM certificate for the client URL (TLS; with --key-file and --client-ca-file)")
	fs.StringVar(&tlsFiles.KeyFile, "key-file", "", "PEM private key of --cert-file")
	fs.StringVar(&tlsFiles.ClientCAFile, "client-ca-file", "", "PEM CA bundle client certificates must chain to (required with TLS)")
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
	if cfg.ClusterState != "new" && cfg.ClusterState != "existing" {
		return fmt.Errorf("%w: --initial-cluster-state %q: want new or existing", errUsage, cfg.ClusterState)
	}
	switch set := tlsFiles != (embedetcd.TLSFiles{}); {
	case set && (tlsFiles.CertFile == "" || tlsFiles.KeyFile == "" || tlsFiles.ClientCAFile == ""):
		return fmt.Errorf("%w: --cert-file, --key-file and --client-ca-file go together", errUsage)
	case set:
		cfg.ClientTLS = &tlsFiles
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil))

	srv, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil { // stopped by a signal while starting
			return nil
		}
		return err
	}
	if _, err := fmt.Fprintf(stdout, "etcd serving endpoints=%s\n", strings.Join(srv.Endpoints(), ",")); err != nil {
		return errors.Join(fmt.Errorf("print endpoints: %w", err), srv.Close())
	}
	select {
	case <-ctx.Done():
		return srv.Close()
	case err := <-srv.Err():
		return errors.Join(fmt.Errorf("serve: %w", err), srv.Close())
	case <-srv.Stopped():
		fmt.Fprintln(stderr, "etcd: server stopped (removed from the cluster?)")
		if removed != nil {
			removed()
		}
		return srv.Close()
	}
}
