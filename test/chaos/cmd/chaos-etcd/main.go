// Command chaos-etcd is an etcd member in its own process for the chaos
// suite (test/chaos): a single node, or one member of a small cluster, on
// loopback only, so that the harness can cut lockd from it with a proxy and
// kill it. Once it serves clients it prints one line to stdout:
//
//	etcd serving name=NAME client=URL
//
// SIGTERM or SIGINT stops it; the data directory stays, so a restart on the
// same directory keeps the revision (lockd's fencing token). It is not meant
// to be run by hand.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"

	"lock.dev/lockd/internal/embedetcd"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "chaos-etcd: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		name, dir, clientURL, peerURL, cluster, state string
		tickMs, electionMs                            uint
	)
	fs := flag.NewFlagSet("chaos-etcd", flag.ContinueOnError)
	fs.StringVar(&name, "name", "chaos", "member name")
	fs.StringVar(&dir, "data-dir", "", "data directory (required)")
	fs.StringVar(&clientURL, "client-url", "", "client URL, http://127.0.0.1:PORT (required)")
	fs.StringVar(&peerURL, "peer-url", "", "peer URL, http://127.0.0.1:PORT (required)")
	fs.StringVar(&cluster, "initial-cluster", "", "NAME=PEERURL,... (default: this member alone)")
	fs.StringVar(&state, "initial-cluster-state", "new", "new or existing")
	fs.UintVar(&tickMs, "tick-ms", 100, "heartbeat interval")
	fs.UintVar(&electionMs, "election-ms", 1000, "election timeout")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if dir == "" || clientURL == "" || peerURL == "" {
		return fmt.Errorf("-data-dir, -client-url and -peer-url are required")
	}
	cu, err := url.Parse(clientURL)
	if err != nil {
		return fmt.Errorf("client url: %w", err)
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return fmt.Errorf("peer url: %w", err)
	}
	if cluster == "" {
		cluster = name + "=" + peerURL
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	ec := embed.NewConfig()
	ec.Name = name
	ec.Dir = dir
	ec.Logger = "zap"
	ec.LogLevel = "warn"
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(embedetcd.ZapLogger(logger))
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = cluster
	ec.ClusterState = state
	ec.InitialClusterToken = "lockd-chaos"
	ec.TickMs, ec.ElectionMs = tickMs, electionMs
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = "1h"

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer func() {
		e.Close()
		<-e.Server.StopNotify()
	}()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("start: %w", err)
	case <-ctx.Done():
		return nil
	}
	fmt.Printf("etcd serving name=%s client=%s\n", name, clientURL)
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("serve: %w", err)
	}
}
