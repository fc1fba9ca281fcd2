package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"

	"lock.dev/lockd/internal/embedetcd"
)

// EtcdServerCommand is the hidden subcommand of `lockd bench` (the
// arguments after the lockd executable) that runs only an embedded etcd:
// with --backend etcd and no endpoints the bench starts etcd this way, in a
// process of its own, so that etcd, lockd and the baselines' clients do not
// share one Go runtime.
var EtcdServerCommand = []string{"bench", "etcd-server"}

// etcdServingLine is the line ServeEtcd prints once etcd serves.
var etcdServingLine = regexp.MustCompile(`^etcd serving client=(\S+)`)

// etcdDurability describes the durability of an etcd the bench starts
// itself (embedded or in its own process): embedetcd never sets
// --unsafe-no-fsync.
const etcdDurability = "etcd fsync on (--unsafe-no-fsync off): every commit fdatasyncs the WAL"

// EtcdMember makes the etcd of ServeEtcd one member of a cluster (the
// scale scenario's three, scale.go); the zero value is a single node on
// free loopback ports.
type EtcdMember struct {
	// Name is the member's name, InitialCluster the members as
	// NAME=PEERURL,...; ClientURL and PeerURL are this member's loopback
	// http URLs.
	Name, InitialCluster, ClientURL, PeerURL string
}

// ServeEtcd runs an etcd with its data in dataDir until ctx ends: the body
// of the hidden `lockd bench etcd-server`. A single node unless m makes it
// a member of a cluster. Once etcd serves it writes "etcd serving
// client=URL" and a newline to out.
func ServeEtcd(ctx context.Context, dataDir string, m EtcdMember, out io.Writer) error {
	if dataDir == "" {
		return fmt.Errorf("bench etcd-server: --data-dir is required")
	}
	s, err := embedetcd.Start(ctx, embedetcd.Config{DataDir: dataDir, Name: m.Name, InitialCluster: m.InitialCluster,
		ClientURL: m.ClientURL, PeerURL: m.PeerURL})
	if err != nil {
		return fmt.Errorf("bench etcd-server: %w", err)
	}
	defer s.Close()
	if _, err := fmt.Fprintf(out, "etcd serving client=%s\n", s.Endpoints()[0]); err != nil {
		return fmt.Errorf("bench etcd-server: %w", err)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.Err():
		return fmt.Errorf("bench etcd-server: %w", err)
	}
}
