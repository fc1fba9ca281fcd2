package backend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"lock.dev/lockd/internal/backend"
	"lock.dev/lockd/internal/embedetcd"
	"lock.dev/lockd/internal/testing/testkit"
)

// TestEtcdFollowsMembers replaces the only member of an etcd cluster under
// an open backend (C5 #ct5-etcd-members): a member b is added (as a learner,
// so that the cluster keeps its quorum while b starts) and started on an
// empty data directory, then promoted; the backend's client learns it from
// the member list; then the configured member a is removed and stopped.
// The backend still serves, through b, which lock.etcd.endpoints never
// named, and the session it opened before keeps its lock. On a backend
// that does not follow the member list, it never learns b.
func TestEtcdFollowsMembers(t *testing.T) {
	ctx := testkit.Context(t, 2*time.Minute)
	dir := t.TempDir()
	testkit.AwaitGone(t, 15*time.Second, testkit.PeerConnFrames...) // etcd members in this process
	a := startMember(t, ctx, embedetcd.Config{DataDir: filepath.Join(dir, "a"), Name: "a"})
	aPeer := "http://" + a.PeerAddrs()[0].String()

	cfg := backend.DefaultConfig()
	cfg.Kind, cfg.EtcdEndpoints, cfg.EtcdPrefix = backend.Etcd, a.Endpoints(), "/members-test/"
	cfg.EtcdAutoSyncInterval = backend.MinEtcdAutoSyncInterval
	b, err := backend.Open(ctx, cfg, nil, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	s, err := b.OpenSession(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	if _, ok, err := b.TryInsert(ctx, s.ID, "k"); err != nil || !ok {
		t.Fatalf("TryInsert(k) = %v, %v; want granted", ok, err)
	}

	bPeer := "http://" + freeAddr(t)
	admin := adminClient(t, a.Endpoints())
	add, err := admin.MemberAddAsLearner(ctx, []string{bPeer})
	if err != nil {
		t.Fatalf("MemberAddAsLearner(%s): %v", bPeer, err)
	}
	m := startMember(t, ctx, embedetcd.Config{DataDir: filepath.Join(dir, "b"), Name: "b", PeerURL: bPeer,
		InitialCluster: fmt.Sprintf("a=%s,b=%s", aPeer, bPeer), ClusterState: "existing"})
	bURL := m.Endpoints()[0]
	// Each wait below is for one of etcd's own steps (a learner catching
	// up, an election, the 5 s etcd waits before it lets a member go) or
	// one sync interval plus its MemberList call, which clientv3 bounds at
	// 5 s: 20 s leaves room for a loaded 2-core machine.
	const within = 20 * time.Second
	testkit.Eventually(t, within, "learner b promoted", func() error {
		_, err := admin.MemberPromote(ctx, add.Member.ID)
		return err
	})
	testkit.Eventually(t, within, "the backend's etcd client lists the added member "+bURL, func() bool {
		return slices.Contains(b.Endpoints(), bURL)
	})

	list, err := admin.MemberList(ctx)
	if err != nil {
		t.Fatalf("MemberList: %v", err)
	}
	var aID uint64
	for _, mem := range list.Members {
		if mem.Name == "a" {
			aID = mem.ID
		}
	}
	if aID == 0 {
		t.Fatalf("member a not in the member list %v", list.Members)
	}
	// The removal goes to b, the member that stays: sent to a, the member
	// being removed, its answer can be lost as a leaves (the next attempt
	// then finds a gone, "member not found"). etcd refuses to remove a
	// member until the others have been connected for 5 s ("unhealthy
	// cluster"); each attempt gets 7 s, past that wait and a loaded 2-core
	// machine's election, and an attempt that finds a already gone means an
	// earlier one was applied.
	toB := adminClient(t, []string{bURL})
	testkit.Eventually(t, within, "member a removed", func() error {
		rctx, cancel := context.WithTimeout(ctx, 7*time.Second)
		defer cancel()
		_, err := toB.MemberRemove(rctx, aID)
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return nil
		}
		return err
	})
	if err := a.Close(); err != nil {
		t.Fatalf("stop a: %v", err)
	}

	testkit.Eventually(t, within, "a session opened and a key granted through member b alone", func() error {
		octx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		s2, err := b.OpenSession(octx, 30*time.Second)
		if err != nil {
			return err
		}
		if _, ok, err := b.TryInsert(octx, s2.ID, "k2"); err != nil || !ok {
			return fmt.Errorf("TryInsert(k2) = %v, %v", ok, err)
		}
		return nil
	})
	if eps := b.Endpoints(); !slices.Equal(eps, []string{bURL}) {
		t.Errorf("Endpoints() = %v after a's removal, want [%s]", eps, bURL)
	}
	s3, err := b.OpenSession(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	if _, ok, err := b.TryInsert(ctx, s3.ID, "k"); err != nil || ok {
		t.Errorf("TryInsert(k) by another session = %v, %v; want refused (the first session still holds k)", ok, err)
	}
}

// startMember starts an etcd member that the test stops at its end.
func startMember(t *testing.T, ctx context.Context, cfg embedetcd.Config) *embedetcd.Server {
	t.Helper()
	s, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start etcd member %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// adminClient is a plain clientv3 client for the cluster's member API.
func adminClient(t *testing.T, eps []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		AutoSyncInterval: time.Second})
	if err != nil {
		t.Fatalf("clientv3.New(%v): %v", eps, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// freeAddr returns a free loopback host:port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
